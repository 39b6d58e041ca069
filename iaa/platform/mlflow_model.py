"""The reader as an MLflow ``pyfunc`` model: weights, vocabulary, config and code in one artifact.

``mlflow.pyfunc.load_model(uri).predict(df)`` takes the columns of ``iaa-cli predict``'s JSON
Lines (``id``, ``document``, ``query``, ``candidates``, optionally ``answer``) and returns the
same rows: ``{"id", "prediction", "probs"[, "correct"], "absent_candidates", "unknown_share",
"unknown_candidates"[, "warning"]}``. A model holds one checkpoint (its probabilities scaled by the temperature the
checkpoint holds), or the members of a seed ensemble (their probabilities are averaged, then
scaled by the temperature its ``calibration`` artifact holds).
The ``iaa`` package travels in ``code_paths``, so the model loads and serves without this
repository (``mlflow models serve -m models:/NAME/1 --env-manager local``).

The model is logged as code (MLflow's models-from-code): ``python_model`` is the path of a code
file that the composition root names (:mod:`iaa.cli.logged_model`). MLflow copies the file into
the model and runs it when it loads the model, with ``code_paths`` on ``sys.path``; the file
calls :func:`set_reader` with the job's loader, so loading unpickles nothing (the weights are
read with ``weights_only=True``). Models logged by older versions hold a pickled :class:`ReaderModel`, which
MLflow still unpickles (unless ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false``).

Each model is an MLflow 3 logged model created for its run through the client, so no global
MLflow run state is touched: it is named by its sweep and trial (``SWEEP-trial-0003``), by its
ensemble and seed (``ENSEMBLE-seed-7``), or else after its run, and no other model of the store
has its name (:func:`logged_name`). It carries the run's ``valid_acc`` (its best check: the
checkpoint it holds) and ``test_acc`` where measured, the run's ``best_in_sweep`` and ``seed``
tags, a signature (the predict columns in, the predict rows out) and an input example; its
requirements are plain package-index pins, and ``mlflow.search_logged_models`` and the
experiment's Models tab list and rank it. Its metrics name the dataset they were measured on (the
run's dataset input), which is how MLflow 3 shows a logged model's dataset. ``register`` makes it a version of a registered model,
with the description and tags of the job's :class:`~iaa.jobs.ports.ModelCard` (what it is, how good, where it came from).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import mlflow
import mlflow.pyfunc
import pandas as pd
from mlflow.models import ModelSignature, set_model
from mlflow.tracking import MlflowClient

import iaa
from iaa.data.prepared.manifest import MANIFEST, VOCAB
from iaa.errors import IaaError, brief
from iaa.jobs.ports import Answerer, LoadedModel, ModelCard, ModelCode, ModelFiles
from iaa.platform.tracking.connection import TRANSIENT, quiet_store_logs
from iaa.platform.tracking.store import dataset_summary, manifest_digest

_log = logging.getLogger(__name__)

ARTIFACT = "model"               # the artifact folder of every logged model
MODEL_TAGS = ("best_in_sweep", "sweep", "trial_id", "kind", "seed", "member")   # run tags the logged model carries too
FILES_TAG = "iaa.checkpoints_sha256"   # a logged model's tag: the digest of the checkpoints it was made of
BAD_NAME_CHARS = "/:.%\"'"      # not allowed in a logged model's name
DATA_FILES = (MANIFEST, VOCAB)
CALIBRATION = "calibration.json"   # an ensemble's temperature: {"temperature": T}, its artifact ``calibration``
PROGRESS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
URI_ENVS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


class ReaderModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper around the predictor that ``load`` rebuilds from the model's members and data.

    A logged model's code file (models-from-code, :func:`set_reader`) builds it when MLflow loads
    the model. Models logged by older versions of iaa hold a pickled instance instead, with
    ``load`` pickled by reference; they still load through this class."""

    load: Callable[[Sequence[Path], Path], Answerer] | None = None   # None in pickled models logged before it was carried

    def __init__(self, load: Callable[[Sequence[Path], Path], Answerer]) -> None:
        self.load = load

    def load_context(self, context: Any) -> None:
        if self.load is None:
            raise IaaError("this model was logged by an older iaa that did not store how to load its reader; "
                           "log it again (iaa-cli train, tune or ensemble with `register`), or serve its "
                           "files with iaa-cli serve `model_uri` URI")
        members = sorted(k for k in context.artifacts if k.startswith("member_"))
        self.predictor = self.load([Path(context.artifacts[k]) for k in members], Path(context.artifacts["data"]),
                                   temperature=temperature(context.artifacts))

    # A DataFrame hint is one MLflow derives no schema from (the signature describes the columns),
    # so it neither validates against it nor advises adding hints.
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        """Rows of ``iaa-cli predict`` for the questions of ``model_input`` (a DataFrame, or records)."""
        records = model_input.to_dict(orient="records") if hasattr(model_input, "to_dict") else list(model_input)
        return self.predictor.predict_records([_plain(r) for r in records])


def set_reader(load: Callable[[Sequence[Path], Path], Answerer]) -> None:
    """Make a :class:`ReaderModel` running ``load`` the model of the code file MLflow is running
    (``mlflow.models.set_model``): the one call of a logged model's code file."""
    set_model(ReaderModel(load))


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    """A DataFrame row as JSON types: numpy arrays become lists, NaN/None answers are dropped."""
    out = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in record.items()}
    if out.get("answer") is None or out.get("answer") != out.get("answer"):
        out.pop("answer", None)
    return out


def _model_only(state: dict[str, Any], out: Path, write: Callable[[Path, dict[str, Any]], Path]) -> Path:
    """A checkpoint's state without optimizer and loop state (what inference needs), with its digest."""
    return write(out, {k: state[k] for k in ("format", "config", "model", "vocab_hash", "vocab", "temperature") if k in state})


def _stage(files: ModelFiles, folder: Path, code: ModelCode) -> tuple[dict[str, str], dict[str, Any]]:
    """The model's artifacts (vocabulary, manifest, inference-only members and, for an ensemble,
    :data:`CALIBRATION`) in ``folder``, and its metadata; ``code`` reads and writes
    checkpoints."""
    checkpoints, prepared, temperature = files.checkpoints, files.prepared, files.temperature
    if not checkpoints:
        raise IaaError("a model needs at least one checkpoint")
    data = folder / "data"
    data.mkdir()
    for name in DATA_FILES:
        shutil.copy2(Path(prepared) / name, data / name)
    artifacts = {"data": str(data)}
    config: dict[str, Any] = {}
    for i, path in enumerate(checkpoints):
        state = code.read(Path(path))
        config = config or state["config"]           # the first member's config describes the model
        artifacts[f"member_{i:02d}"] = str(_model_only(state, folder / f"member_{i:02d}.pt", code.write))
    metadata = {"iaa_config": config, "members": len(checkpoints), "dataset": config.get("dataset"),
                "manifest_digest": manifest_digest(prepared)}
    if temperature is not None:
        (folder / CALIBRATION).write_text(json.dumps({"temperature": temperature}), encoding="utf-8")
        artifacts["calibration"] = str(folder / CALIBRATION)
    return artifacts, metadata


def temperature(artifacts: Mapping[str, Any]) -> float | None:
    """The temperature a model's ``calibration`` artifact holds (an ensemble's); None for a model
    without one: a single reader answers at its checkpoint's own."""
    path = artifacts.get("calibration")
    return None if path is None else float(json.loads(Path(path).read_text(encoding="utf-8"))["temperature"])


def signature() -> ModelSignature:
    """The predict columns in (``answer`` optional) and the predict rows out."""
    from mlflow.types.schema import Array, ColSpec, Map, Schema

    inputs = Schema([ColSpec("string", "id"), ColSpec("string", "document"), ColSpec("string", "query"),
                     ColSpec(Array("string"), "candidates"), ColSpec("string", "answer", required=False)])
    outputs = Schema([ColSpec("string", "id"), ColSpec("string", "prediction"), ColSpec(Map("double"), "probs"),
                      ColSpec("boolean", "correct", required=False),
                      ColSpec(Array("string"), "absent_candidates", required=False),
                      ColSpec("double", "unknown_share", required=False),
                      ColSpec(Array("string"), "unknown_candidates", required=False),
                      ColSpec("string", "warning", required=False)])
    return ModelSignature(inputs=inputs, outputs=outputs)


def input_example(placeholder: str) -> Any:
    """One small question in the dataset's placeholder convention."""
    import pandas as pd

    return pd.DataFrame([{"id": "example-1", "document": "mary went to the garden . john went to the kitchen .",
                          "query": f"{placeholder} went to the garden", "candidates": ["mary", "john"]}])


def _placeholder(prepared: Path) -> str:
    from iaa.data.prepared.vocab import Vocab

    return Vocab.load(Path(prepared) / VOCAB).placeholder


def _log_kwargs(files: ModelFiles, folder: Path, code: ModelCode, model_file: Path) -> dict[str, Any]:
    """``model_file`` is the model's code (models-from-code): MLflow copies it into the model and
    runs it, with the ``iaa`` package of ``code_paths`` importable, to rebuild the model."""
    artifacts, metadata = _stage(files, folder, code)
    return dict(python_model=str(model_file), artifacts=artifacts, code_paths=[str(Path(iaa.__file__).resolve().parent)],
                pip_requirements=requirements(), metadata=metadata, signature=signature(),
                input_example=input_example(_placeholder(files.prepared)))


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars while saving: they would glue to a ``--json`` line."""
    bar = os.environ.get(PROGRESS_ENV)
    os.environ[PROGRESS_ENV] = "false"
    try:
        yield
    finally:
        if bar is None:
            os.environ.pop(PROGRESS_ENV, None)
        else:
            os.environ[PROGRESS_ENV] = bar


def requirements() -> list[str]:
    """Pinned to what runs here, so ``serve`` without ``--env-manager local`` rebuilds the same.

    A local version label (``torch==2.13.0+cpu``) is dropped: the package index has no such
    file, and the plain release is the same code.
    """
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in ("mlflow", "torch", "pyarrow", "numpy", "pandas", "pyyaml")]


def log(uri: str, run_id: str, files: ModelFiles, code: ModelCode, register: str | None = None, *,
        model_file: Path, card: ModelCard | None = None) -> str:
    """Log the model made of ``files`` as a logged model of run ``run_id``, once for the same
    checkpoints: a run whose newest model was made of them (their digest, :data:`FILES_TAG`) keeps
    it, and its tags are the run's again, as a resumed sweep's new best changes ``best_in_sweep``;
    a run resumed since (other weights) gets a new model. Register it as ``register``, the
    version described and tagged by ``card``.
    ``model_file`` is the model's code file, which MLflow runs to load it (:func:`_log_kwargs`); an
    ensemble's temperature travels as its :data:`CALIBRATION` artifact.

    Returns the model URI: ``models:/<model id>``, or ``models:/NAME/VERSION`` when registered.
    """
    from mlflow.entities import LoggedModelOutput

    from iaa.data.prepared.shards import file_sha256

    client = MlflowClient(uri)
    digest = ",".join(file_sha256(Path(c)) for c in files.checkpoints)
    model_id = logged_model_id(uri, run_id, digest)
    run = client.get_run(run_id)
    run_tags = {k: run.data.tags[k] for k in MODEL_TAGS if k in run.data.tags}
    if model_id is not None and run_tags:
        client.set_logged_model_tags(model_id, run_tags)
    if model_id is None:
        kind = "ensemble" if len(files.checkpoints) > 1 else "reader"
        tags = {"iaa.members": str(len(files.checkpoints)), FILES_TAG: digest, **run_tags}
        model = client.create_logged_model(run.info.experiment_id, name=logged_name(client, run),
                                           source_run_id=run_id, params=dict(run.data.params),
                                           model_type=f"iaa-{kind}", tags=tags)
        model_id = model.model_id
        with tempfile.TemporaryDirectory(prefix="iaa-model-") as tmp, _quiet(), _store(uri):
            mlflow.pyfunc.log_model(name=ARTIFACT, model_id=model_id,
                                    **_log_kwargs(files, Path(tmp), code, model_file))
        client.log_outputs(run_id, [LoggedModelOutput(model_id, step=0)])
        data = dataset_summary(files.prepared)
        client.log_batch(run_id, metrics=model_metrics(client, run_id, model_id, (data["name"], data["digest"])))
    model_uri = f"models:/{model_id}"
    if register:
        model_uri = register_model(uri, run_id, register, model_id, card)
    client.set_tag(run_id, "iaa.model_uri", model_uri)
    return model_uri


def model_name(run_name: str | None) -> str:
    """A logged model's name: its run's, with the characters MLflow refuses in one made ``_``."""
    name = "".join("_" if c in BAD_NAME_CHARS else c for c in (run_name or "")).strip()
    return name or ARTIFACT


def logged_name(client: MlflowClient, run: Any) -> str:
    """The name of ``run``'s logged model, unique in the store: ``SWEEP-trial-0003`` for a sweep's
    trial (its ``trial_number`` tag), the member's name (``ENSEMBLE-seed-7``) for an ensemble member, else the run's name;
    a name taken already gets ``-2``, ``-3``, ..."""
    tags = run.data.tags
    if tags.get("member"):
        base = tags["member"]
    elif tags.get("sweep") and tags.get("trial_id"):
        base = f"{tags['sweep']}-trial-{tags.get('trial_number') or trial_number(tags['trial_id'])}"
    else:
        base = run.info.run_name
    return free_model_name(client, model_name(base))


def trial_number(trial_id: str) -> str:
    """A trial's index in its Tune run from an id that ends with it (``29acd_00003`` -> ``0003``);
    else the id as it is (a searcher's trials have ids without one)."""
    digits = re.search(r"_(\d{5})$", trial_id)
    return f"{int(digits.group(1)):04d}" if digits else trial_id


def free_model_name(client: MlflowClient, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``, ... : the first that no logged model of the store has."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    taken = {m.name for m in client.search_logged_models(experiments, filter_string=f"name LIKE '{name}%'",
                                                         max_results=1000)} if experiments else set()
    candidates = (name if i == 1 else f"{name}-{i}" for i in range(1, len(taken) + 2))
    return next(c for c in candidates if c not in taken)


def model_metrics(client: MlflowClient, run_id: str, model_id: str,
                  dataset: tuple[str, str] | None = None) -> list[Any]:
    """The run's accuracies as the logged model's metrics: the check of ``valid_acc`` the checkpoint
    holds (the run's best; the earliest of equal ones) and the last ``test_acc`` where the run
    measured it. Each is a point of the run's own history, logged again with the model's id (as
    ``mlflow.log_model`` does), so the run's curves gain no point.

    ``dataset`` (name, digest: the run's dataset input, :func:`~iaa.platform.tracking.store.dataset_summary`)
    is what they were measured on: MLflow 3 links a logged model to its datasets through its
    metrics, so the model's page and the Models tab's Datasets column name it."""
    from mlflow.entities import Metric

    points = []
    for key, pick in (("valid_acc", lambda h: max(h, key=lambda m: (m.value, -m.step))),
                      ("test_acc", lambda h: h[-1])):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        if history:
            m = pick(history)
            name, digest = dataset or (None, None)
            points.append(Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id, run_id=run_id,
                                 dataset_name=name, dataset_digest=digest))
    return points


def logged_model_id(uri: str, run_id: str, digest: str | None = None) -> str | None:
    """The id of run ``run_id``'s newest finished logged model (one this module logged), or None;
    with ``digest``, None also where that model was made of other checkpoints (:data:`FILES_TAG`;
    a model logged before the tag counts as other)."""
    client = MlflowClient(uri)
    experiment = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models([experiment], filter_string=f"source_run_id = '{run_id}'", max_results=50,
                                        order_by=[{"field_name": "creation_time", "ascending": False}])
    ready = [m for m in found if str(m.status).endswith("READY") and "iaa.members" in (m.tags or {})]
    if not ready or (digest is not None and ready[0].tags.get(FILES_TAG) != digest):
        return None
    return ready[0].model_id


@contextmanager
def _store(uri: str | None) -> Iterator[None]:
    """``log_model`` and ``models:/`` downloads use the global tracking and registry URIs: point
    both at ``uri`` for the call only (None: leave them).

    ``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI`` in the environment, which the
    next command of this process would take as the user's choice: globals and environment are
    put back as they were.
    """
    from iaa.platform.tracking.mlflow_internals import restore_registry_uri, set_uris

    if uri is None:
        yield
        return
    saved = (*set_uris(), {k: os.environ.get(k) for k in URI_ENVS})
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved[0])       # None: unset again
        restore_registry_uri(saved[1])
        for key, value in saved[2].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def try_log(uri: str, run_id: str, files: ModelFiles, code: ModelCode, register: str | None = None,
            run: Any = None, *, model_file: Path, card: ModelCard | None = None) -> str | None:
    """:func:`log`, where a failing store is a warning on stderr (the trained model stands).

    With ``run`` (the ``tracking.Run`` being logged), the failure is also recorded as lost on it,
    so that the run ends FAILED and the command says what was not logged.
    """
    try:
        return log(uri, run_id, files, code, register, model_file=model_file, card=card)
    except TRANSIENT as err:
        _log.warning(f"could not log the model of run {run_id} to MLflow at {uri} ({brief(err)}); "
                     f"the checkpoint is still at {files.checkpoints[0]}")
        if run is not None:
            run.lose(f"the model{' and its registration as ' + repr(register) if register else ''} "
                     f"(the checkpoint is at {files.checkpoints[0]})", err)
        return None


# What the registry's page of a registered model says, above its versions (each says what it is)
REGISTERED_DESCRIPTION = ("Cloze readers (Iterative Alternating Attention, or an ensemble of them) registered by "
                          "iaa-cli. Each version's description and tags say what it is, the data it was trained on, "
                          "its valid accuracy with its 95% interval, and the run it came from.")


def register_model(uri: str, run_id: str, name: str, model_id: str, card: ModelCard | None = None) -> str:
    """A new version of registered model ``name`` from logged model ``model_id``: ``models:/NAME/V``,
    with ``card``'s description and tags (what the registry's page of the version shows)."""
    client = MlflowClient(uri)
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name, description=REGISTERED_DESCRIPTION)
    source = client.get_logged_model(model_id).artifact_location
    about = {"description": card.description, "tags": dict(card.tags)} if card is not None else {}
    version = client.create_model_version(name, source=source, run_id=run_id, model_id=model_id, **about)
    return f"models:/{name}/{version.version}"


def load(model_uri: str, uri: str | None = None) -> Any:
    """``mlflow.pyfunc.load_model`` against the store ``uri``."""
    if uri:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
    return mlflow.pyfunc.load_model(model_uri)


def fetch(model_uri: str, tracking_uri: str | None = None) -> LoadedModel:
    """Download the model at ``model_uri`` and name its files (members, prepared data), its
    name and its version: ``models:/NAME/VERSION`` and ``models:/NAME@ALIAS`` give the registry's,
    a logged model (``models:/<id>``) or a run's model its name and id."""
    from mlflow.models import Model

    quiet_store_logs()
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    name, version = _name_version(client, model_uri)
    try:
        with _store(tracking_uri):
            local = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=tempfile.mkdtemp(prefix="iaa-serve-")))
    except mlflow.exceptions.MlflowException as err:
        raise IaaError(f"cannot fetch the model {model_uri} from {tracking_uri or mlflow.get_tracking_uri()}: "
                       f"{str(err).splitlines()[0][:300]}") from err
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    artifacts = {k: local / v["path"] for k, v in (flavor.get("artifacts") or {}).items()}
    members = tuple(artifacts[k] for k in sorted(artifacts) if k.startswith("member_"))
    if not members or "data" not in artifacts:
        raise IaaError(f"{model_uri} is not an iaa reader model (its MLmodel lists no member_* and data artifacts)")
    return LoadedModel(members, artifacts["data"], name, version, temperature(artifacts))


def _name_version(client: MlflowClient, model_uri: str) -> tuple[str, str]:
    ref = model_uri.removeprefix("models:/")
    try:
        if model_uri.startswith("runs:/"):
            run_id = model_uri.removeprefix("runs:/").split("/")[0]
            return client.get_run(run_id).info.run_name or run_id, run_id
        if "@" in ref:
            name, alias = ref.split("@", 1)
            return name, str(client.get_model_version_by_alias(name, alias).version)
        if "/" in ref:
            name, version = ref.split("/", 1)
            if version == "latest":
                version = str(max(int(v.version) for v in client.search_model_versions(f"name = '{name}'")))
            return name, version
        logged = client.get_logged_model(ref)
        return logged.name, logged.model_id
    except (mlflow.exceptions.MlflowException, ValueError) as err:
        raise IaaError(f"no model {model_uri} in the MLflow store: {str(err).splitlines()[0][:300]}") from err
