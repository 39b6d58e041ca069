"""The reader as an MLflow ``pyfunc`` model: weights, vocabulary, config and code in one artifact.

``mlflow.pyfunc.load_model(uri).predict(df)`` takes the columns of ``iaa-cli predict``'s JSON
Lines (``id``, ``document``, ``query``, ``candidates``, optionally ``answer``) and returns the
same rows: ``{"id", "prediction", "probs"[, "correct"]}``. A model holds one checkpoint, or the
members of a seed ensemble (their probabilities are averaged). The ``iaa`` package travels in
``code_paths``, so the model loads and serves without this repository
(``mlflow models serve -m models:/NAME/1 --env-manager local``).

Models are written with ``save_model`` and stored as the run's ``model`` artifacts through the
client, like every other artifact here, so no global MLflow run state is touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import mlflow
import mlflow.pyfunc
from mlflow.tracking import MlflowClient

import iaa
from iaa.errors import IaaError

ARTIFACT = "model"
DATA_FILES = ("manifest.json", "vocab.json")
PROGRESS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def _drop_warning(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``warnings.showwarning`` (MLflow resets filters to "once" inside its calls)."""


# MLflow advises type hints on ``predict`` when the class is defined; ours takes a DataFrame of
# the predict columns, which its hint-based validation cannot describe.
with warnings.catch_warnings():
    warnings.showwarning = _drop_warning

    class ReaderModel(mlflow.pyfunc.PythonModel):
        """pyfunc wrapper around :class:`iaa.jobs.predict.Predictor`."""

        def load_context(self, context: Any) -> None:
            from iaa.jobs.predict import Predictor

            members = sorted(k for k in context.artifacts if k.startswith("member_"))
            self.predictor = Predictor.load([Path(context.artifacts[k]) for k in members], Path(context.artifacts["data"]))

        def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
            """Rows of ``iaa-cli predict`` for the questions of ``model_input`` (a DataFrame)."""
            from iaa.jobs.raw_text import from_record

            placeholder = self.predictor.vocab.placeholder
            records = model_input.to_dict(orient="records") if hasattr(model_input, "to_dict") else list(model_input)
            questions = [from_record(_plain(r), f"row {i}", placeholder) for i, r in enumerate(records, 1)]
            return self.predictor.predict(questions)


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    """A DataFrame row as JSON types: numpy arrays become lists, NaN/None answers are dropped."""
    out = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in record.items()}
    if out.get("answer") is None or out.get("answer") != out.get("answer"):
        out.pop("answer", None)
    return out


def manifest_digest(prepared: Path) -> str:
    """A short digest of the prepared data's manifest (which holds every shard's sha256)."""
    return hashlib.sha256((Path(prepared) / "manifest.json").read_bytes()).hexdigest()[:16]


def _model_only(checkpoint: Path, out: Path) -> Path:
    """The checkpoint without optimizer and loop state: what inference needs."""
    import torch

    from iaa.jobs import checkpoint as ckpt

    state = ckpt.load(checkpoint)
    torch.save({k: state[k] for k in ("format", "config", "model", "vocab_hash") if k in state}, out)
    return out


def save(checkpoints: Sequence[Path], prepared: Path, out: Path) -> Path:
    """Write the pyfunc model of ``checkpoints`` (one, or an ensemble's members) to folder ``out``."""
    from iaa.jobs import checkpoint as ckpt

    if not checkpoints:
        raise IaaError("a model needs at least one checkpoint")
    with tempfile.TemporaryDirectory(prefix="iaa-model-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        for name in DATA_FILES:
            shutil.copy2(Path(prepared) / name, data / name)
        artifacts = {"data": str(data)}
        for i, path in enumerate(checkpoints):
            artifacts[f"member_{i:02d}"] = str(_model_only(Path(path), Path(tmp) / f"member_{i:02d}.pt"))
        config = ckpt.load(Path(checkpoints[0]))["config"]
        with _quiet():
            mlflow.pyfunc.save_model(
                str(out), python_model=ReaderModel(), artifacts=artifacts,
                code_paths=[str(Path(iaa.__file__).resolve().parent)],
                pip_requirements=_requirements(),
                metadata={"iaa_config": config, "members": len(checkpoints), "dataset": config.get("dataset"),
                          "manifest_digest": manifest_digest(prepared)},
            )
    return Path(out)


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars (they would glue to a ``--json`` line) and no advice about type hints or
    CloudPickle while saving: the model's predict takes a DataFrame and the model is our code."""
    bar = os.environ.get(PROGRESS_ENV)
    os.environ[PROGRESS_ENV] = "false"
    logger = logging.getLogger("mlflow.pyfunc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _drop_warning
            yield
    finally:
        logger.setLevel(level)
        if bar is None:
            os.environ.pop(PROGRESS_ENV, None)
        else:
            os.environ[PROGRESS_ENV] = bar


def _requirements() -> list[str]:
    """Pinned to what runs here, so ``serve`` without ``--env-manager local`` rebuilds the same."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("mlflow", "torch", "pyarrow", "numpy", "pandas", "pyyaml")]


def log(uri: str, run_id: str, checkpoints: Sequence[Path], prepared: Path, register: str | None = None) -> str:
    """Store the model as run ``run_id``'s ``model`` artifacts; register it as ``register``.

    Returns the model URI (``runs:/<id>/model``, or ``models:/NAME/VERSION`` when registered).
    """
    client = MlflowClient(uri)
    with tempfile.TemporaryDirectory(prefix="iaa-model-") as tmp:
        folder = save(checkpoints, prepared, Path(tmp) / ARTIFACT)
        client.log_artifacts(run_id, str(folder), ARTIFACT)
    model_uri = f"runs:/{run_id}/{ARTIFACT}"
    if register:
        model_uri = register_model(uri, run_id, register)
    client.set_tag(run_id, "iaa.model_uri", model_uri)
    return model_uri


def try_log(uri: str, run_id: str, checkpoints: Sequence[Path], prepared: Path,
            register: str | None = None, run: Any = None) -> str | None:
    """:func:`log`, where a failing store is a warning on stderr (the trained model stands).

    With ``run`` (the ``tracking.Run`` being logged), the failure is also recorded as lost on it,
    so that the run ends FAILED and the command says what was not logged.
    """
    import sys

    from iaa.platform.tracking import TRANSIENT

    try:
        return log(uri, run_id, checkpoints, prepared, register)
    except TRANSIENT as err:
        print(f"warning: could not log the model of run {run_id} to MLflow at {uri} ({str(err)[:300]}); "
              f"the checkpoint is still at {checkpoints[0]}", file=sys.stderr)
        if run is not None:
            run.lose(f"the model{' and its registration as ' + repr(register) if register else ''} "
                     f"(the checkpoint is at {checkpoints[0]})", err)
        return None


def register_model(uri: str, run_id: str, name: str) -> str:
    """A new version of registered model ``name`` from run ``run_id``'s model: ``models:/NAME/V``."""
    client = MlflowClient(uri)
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name)
    source = f"{client.get_run(run_id).info.artifact_uri}/{ARTIFACT}"
    version = client.create_model_version(name, source=source, run_id=run_id)
    return f"models:/{name}/{version.version}"


def load(model_uri: str, uri: str | None = None) -> Any:
    """``mlflow.pyfunc.load_model`` against the store ``uri``."""
    if uri:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
    return mlflow.pyfunc.load_model(model_uri)


def dataset_summary(prepared: Path) -> dict[str, Any]:
    manifest = json.loads((Path(prepared) / "manifest.json").read_text(encoding="utf-8"))
    return {"name": manifest.get("dataset", Path(prepared).name), "source": str(Path(prepared).resolve()),
            "digest": manifest_digest(prepared)}
