"""Checkpoints: the one place that saves, loads, verifies and unwraps models.

A checkpoint is a plain dict of CPU tensors and primitives, so it loads with
``torch.load(weights_only=True)`` on any machine, with or without a GPU. It holds the whole job
config, so the model can be rebuilt from the file alone; its vocabulary (``vocab``: the prepared
``vocab.json`` text and the dataset's lowercasing, :func:`iaa.data.prepared.manifest.vocab_card`), so it
answers raw questions alone; the temperature that calibrates its answers (:func:`temperature`);
and the RNG and loop state, so ``--resume`` continues exactly. Checkpoints written before the
vocabulary was embedded still load; they need the prepared folder they were trained on. Since
format 2 it also holds a sha256 digest of everything else, so a flipped bit in a tensor (which
``torch.load`` does not notice) is caught on load; since format 3 every file has one (format 2's
model-only copies in logged MLflow models did not), and a file without it, of a format this
version does not know, with a vocabulary other than its ``vocab_hash`` or with a config that
does not describe its weights is refused.

Every expected failure (a missing, empty, truncated or damaged file, a file that is no
checkpoint, a resume with another config or other data) raises :class:`CheckpointError` with
the file's path and what to do.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from iaa.data.prepared.vocab import Vocab
from iaa.errors import IaaError, printable
from iaa.files import atomic_path
from iaa.jobs.config.job_config import IMPLEMENTATION_KEYS, ConfigError, JobConfig, from_dict, to_dict
from iaa.jobs.workdir.paths import BEST, LAST
from iaa.model.reader import build_reader

_log = logging.getLogger(__name__)

FORMAT = 3
ZIP_MAGIC = b"PK\x03\x04"    # how every file that torch.save writes begins (a zip archive)
# Settings a resumed run may change: its budget, threads and precision, and the model's
# implementation switches (same function, other code). Anything else (the model, the data, the
# optimiser's settings) would silently continue a different run.
RESUMABLE_CHANGES = ("train.max_epochs", "train.max_minutes", *IMPLEMENTATION_KEYS)


class CheckpointError(IaaError):
    """A checkpoint file is missing, damaged, or does not belong to this run."""


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DistributedDataParallel (or ``model`` itself)."""
    return model.module if hasattr(model, "module") else model


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor inside (nested dicts, lists, tuples) copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def digest(value: Any) -> str:
    """sha256 of a nested state: keys, primitives, and each tensor's dtype, shape and bytes."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, dict):
        h.update(b"{")
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def save(path: Path, state: dict[str, Any], shown_as: Path | None = None) -> Path:
    """Write ``state`` atomically (a temporary file beside ``path``, then a rename), with its digest.

    A full disk raises :class:`iaa.files.DiskFullError` naming ``shown_as`` (default ``path``), the
    free space and the checkpoint's size, and leaves no partial file.
    """
    state = {k: v for k, v in state.items() if k != "digest"}
    with atomic_path(path, needs=tensor_bytes(state), shown_as=shown_as) as tmp:
        torch.save({**state, "digest": digest(state)}, tmp)
    return Path(path)


def tensor_bytes(value: Any) -> int:
    """The bytes of every tensor inside ``value`` (nested dicts, lists, tuples): a checkpoint's size, about."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def make_state(
    cfg: JobConfig,
    model: nn.Module,
    optimizer: Any = None,
    progress: Mapping[str, Any] | None = None,
    vocab_hash: str = "",
    temperature: float = 1.0,
) -> dict[str, Any]:
    """A checkpoint of ``model`` (on any device), optionally with the training state.

    ``temperature``: the one that calibrates the reader's answers on valid (:func:`temperature`).
    ``optimizer`` is anything with ``state_dict()`` (``iaa.jobs.training.step.Optimizer``). Tensors are
    copied to the CPU, so the file loads anywhere; the RNG states of the CPU and, when in use, of
    the current CUDA device are kept for an exact resume.
    """
    state: dict[str, Any] = {
        "format": FORMAT,
        "config": to_dict(cfg),
        "model": to_cpu(unwrap(model).state_dict()),
        "vocab_hash": vocab_hash,
        "temperature": float(temperature),
    }
    if optimizer is not None:
        state["optimizer"] = to_cpu(optimizer.state_dict())
        state["rng"] = torch.get_rng_state()
        device = model_device(model)
        if device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(device)          # the model's GPU, not GPU 0
    if progress is not None:
        state["progress"] = dict(progress)
    return state


def temperature(state: Mapping[str, Any]) -> float:
    """The temperature the reader's candidate distributions are scaled by when it answers alone
    (:func:`iaa.jobs.evaluation.calibration.scaled`): fitted on valid at the check that wrote the
    checkpoint; 1.0 for a checkpoint written before readers were calibrated."""
    return float(state.get("temperature", 1.0))


def vocabulary(state: Mapping[str, Any], source: Path | str) -> tuple[Vocab, bool] | None:
    """The vocabulary a checkpoint carries, and whether its dataset lowercases; None for an older
    checkpoint without one."""
    card = state.get("vocab")
    if not card:
        return None
    return Vocab.from_json(card["json"], source), bool(card.get("lowercase", False))


def check_vocab(state: Mapping[str, Any], vocab_hash: str, source: Path | str, data: Path | str, todo: str) -> None:
    """Refuse a checkpoint trained on another vocabulary than the data's (``vocab_hash``).

    Raises:
        CheckpointError: both hashes are known and differ; the message ends with ``todo``.
    """
    ours = state.get("vocab_hash", "")
    if ours and vocab_hash and ours != vocab_hash:
        raise CheckpointError(f"{source} was trained on other data than {data} (vocabulary "
                              f"{ours[:12]}, the data's {vocab_hash[:12]}): {todo}")


def restore_rng(state: Mapping[str, Any], device: torch.device | str = "cpu") -> None:
    """Set the RNG states saved by ``make_state``: the CPU's, and the CUDA one on ``device`` when
    the run continues on a GPU (each rank restores its own GPU's generator)."""
    torch.set_rng_state(state["rng"])
    device = torch.device(device)
    if "cuda_rng" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], device)


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any)."""
    return next((p.device for p in unwrap(model).parameters()), torch.device("cpu"))


def load(path: Path) -> dict[str, Any]:
    """Load and verify a checkpoint onto the CPU (``weights_only=True``: no pickled code is run).

    Raises:
        CheckpointError: no such file, an empty, truncated or damaged file, or no checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): the run that wrote it was "
                              "probably killed; use another checkpoint or train again")
    with path.open("rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC:
        raise CheckpointError(f"{path} is not a readable checkpoint (not a file that torch.save writes: it begins "
                              f"{head!r}); use another checkpoint or train again")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, OSError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
            KeyError, IndexError, TypeError, AttributeError) as err:
        reason = _first_sentence(str(err)) or type(err).__name__
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated, damaged or another "
                              f"kind of file: {reason}); use another checkpoint or train again") from err
    _verify(path, state)
    return state


def _first_sentence(text: str, most: int = 160) -> str:
    """The first sentence of an error's text (torch's go on with advice), at most ``most`` characters."""
    first = text.strip().split("\n")[0].split(". ")[0].rstrip(".")
    return first if len(first) <= most else first[:most - 3] + "..."


def _verify(path: Path, state: Any) -> None:
    """Refuse what is no checkpoint, an unknown format, a missing or wrong digest, and an
    embedded vocabulary other than the one ``vocab_hash`` records. Format 1 (before digests)
    still loads."""
    if not isinstance(state, dict) or not {"config", "model"} <= state.keys():
        raise CheckpointError(f"{path} is a torch file but no iaa checkpoint (it lacks 'config' "
                              "and 'model'); give a checkpoint written by `iaa-cli train`")
    version = state.get("format", 1)
    if type(version) is not int or not 1 <= version <= FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format {version!r} (this version reads 1 to {FORMAT}); "
                              "use a checkpoint written by this version of `iaa-cli train`, or upgrade iaa")
    # Format 2's inference copies inside logged MLflow models were written without a digest.
    legacy_model_only = version == 2 and not {"optimizer", "progress"} & state.keys()
    if "digest" not in state and version >= 2 and not legacy_model_only:
        raise CheckpointError(f"checkpoint {path} has no digest (format {version} writes one): it was edited "
                              "after it was written; use another checkpoint or train again")
    if "digest" in state:
        expected = state.pop("digest")
        if digest(state) != expected:
            raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match the "
                                  "digest written with it; use another checkpoint or train again")
    card, recorded = state.get("vocab"), state.get("vocab_hash", "")
    if card and recorded:
        text = card.get("json") if isinstance(card, dict) else None
        if not isinstance(text, str) or hashlib.sha256(text.encode("utf-8")).hexdigest() != recorded:
            raise CheckpointError(f"checkpoint {path}: its vocabulary does not match its vocab_hash "
                                  f"({recorded[:12]}): it was swapped or edited; use another checkpoint or train again")


def load_weights(model: nn.Module, state: Mapping[str, Any], path: Path | str) -> None:
    """``model.load_state_dict(state["model"])``; a checkpoint whose config does not describe its
    weights (another kind, size or vocabulary) raises :class:`CheckpointError` naming ``path``."""
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError) as err:
        reason = " ".join(str(err).split())
        raise CheckpointError(f"checkpoint {path}: its config does not match its weights ({reason[:200]}); "
                              "use another checkpoint or train again") from None


def load_latest(folder: Path, *, warn: bool = True) -> tuple[dict[str, Any], Path] | None:
    """The state to resume from in ``folder``: ``last.pt``, or ``best.pt`` with a warning when
    ``last.pt`` is missing or damaged. None when the folder holds neither. ``warn=False`` leaves
    the warning to a later load that resumes (a caller that only checks what a resume would
    continue: the session that resumes gives it).

    Raises:
        CheckpointError: both files exist and neither loads (the message names both).
    """
    last, best = Path(folder) / LAST, Path(folder) / BEST
    if not last.exists() and not best.exists():
        return None
    try:
        return load(last), last
    except CheckpointError as err:
        if not best.exists():
            raise
        try:
            state = load(best)
        except CheckpointError as best_err:
            raise CheckpointError(f"cannot resume: {err}; and {best_err}") from best_err
        if warn:
            said = str(err).split("; use another checkpoint")[0]
            _log.warning(printable(f"{said}; resuming from {best} instead, an earlier step: the steps after it "
                                   "are trained again"))
        return state, best


def check_resumable(state: Mapping[str, Any], cfg: JobConfig, vocab_hash: str, source: str) -> dict[str, Any]:
    """Refuse to resume ``cfg`` on data ``vocab_hash`` from a checkpoint of another run; returns the
    settings of ``RESUMABLE_CHANGES`` that ``cfg`` changes (dotted key -> its value now).

    Raises:
        CheckpointError: the data's vocabulary or a setting outside ``RESUMABLE_CHANGES`` differs.
    """
    check_vocab(state, vocab_hash, f"cannot resume from {source}: it", "the data given now",
                "use the same `data` or `dataset`, or start a fresh run without `resume`")
    try:
        saved = from_dict(state["config"])
    except ConfigError as err:
        raise CheckpointError(f"cannot resume from {source}: its config is not readable ({err})") from err
    differences = list(_differences(asdict(saved), asdict(cfg)))
    changed = [f"{key}: {old!r} in the checkpoint, {new!r} now"
               for key, old, new in differences if key not in RESUMABLE_CHANGES]
    if changed:
        raise CheckpointError(f"cannot resume from {source}: the config differs ({'; '.join(changed[:5])}); "
                              "resume with the same config, or start a fresh run without `resume` "
                              "(or in another `run_dir`)")
    return {key: new for key, _, new in differences}


def _differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = ""):
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            yield from _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            yield f"{prefix}{key}", a, b


def load_model(path: Path, device: torch.device | str = "cpu",
               precision: str = "fp32") -> tuple[nn.Module, JobConfig, dict[str, Any]]:
    """Rebuild the model of a checkpoint on ``device`` in eval mode, computing in ``precision``
    (fp32 | bf16), with its config and raw state."""
    state = load(path)
    try:
        cfg = from_dict(state["config"])
    except ConfigError as err:
        raise CheckpointError(f"{path}: its config is not readable by this version ({err})") from err
    with torch.device("meta"):              # no initialisation: the checkpoint's weights replace it
        model = build_reader(cfg.model, device, precision)
    model = model.to_empty(device=device)
    load_weights(model, state, path)
    return model.eval(), cfg, state
