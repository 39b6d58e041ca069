"""Checkpoints: device-independent files, devices on resume, and a clear message for each fault.

Every damaged or foreign checkpoint raises ``CheckpointError`` (an ``IaaError``: one line in the
CLI) naming the file and what to do, and leaves the run folder as it was.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from _faults import as_shown, assert_says
from iaa.errors import IaaError
from iaa.jobs.modeling import checkpoint
from iaa.jobs.datasets import resolve
from iaa.jobs.train import train as train_job
from iaa.jobs.modeling.checkpoint import CheckpointError
from iaa.jobs.training import loop
from iaa.jobs.training.session import SessionBase
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _cfg(prepared: Path, *extra: str):
    return resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, "train.threads=1", *extra))


@pytest.fixture(scope="module")
def finished(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder of a finished tiny run (1 epoch): checkpoints/last.pt, best.pt, metrics."""
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train_job.run(_cfg(tiny, "train.max_epochs=1"), tiny, run_dir, show_progress=False)
    return run_dir


@pytest.fixture
def run_dir(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _resume(tiny: Path, run_dir: Path, *extra: str) -> dict:
    return train_job.run(_cfg(tiny, "train.max_epochs=2", *extra), tiny, run_dir, resume=True, show_progress=False)


# --- devices ------------------------------------------------------------------------------------


class _MetaSession(SessionBase):
    """Resumes a CPU checkpoint onto the 'meta' device: a stand-in for any other device (a GPU),
    so that a model left on the CPU while the optimiser's state is loaded shows here too."""

    resumed_from = "last.pt"

    def __init__(self, prepared: Path, state: dict, batch_size: int) -> None:
        from iaa.data.loading.loader import PreparedData

        data = PreparedData.open(prepared)
        super().__init__(data.table("train"), data.table("valid"), batch_size=batch_size, seed=0, device="meta")
        self.state = state

    def latest_state(self):
        return self.state


class _FirstStep(Exception):
    pass


def test_optimizer_state_is_on_the_parameters_device_after_resume(tiny, finished, monkeypatch) -> None:
    cfg = _cfg(tiny, "train.max_epochs=2")
    state = checkpoint.load(finished / "checkpoints" / checkpoint.LAST)
    seen = {}

    def first_step(model, optimizer, batch, **kwargs):
        seen["devices"] = [(p.device, t.device) for p in model.parameters()
                           for t in optimizer.adam.state[p].values() if t.dim() > 0]  # not the step count
        raise _FirstStep

    monkeypatch.setattr(loop, "train_step", first_step)
    with pytest.raises(_FirstStep):
        loop.fit(cfg, _MetaSession(tiny, state, cfg.train.batch_size), show_progress=False)
    assert seen["devices"] and all(p == t == torch.device("meta") for p, t in seen["devices"])


def test_checkpoints_hold_cpu_tensors_and_verify_their_digest(finished) -> None:
    path = finished / "checkpoints" / checkpoint.LAST
    raw = torch.load(path, weights_only=True)                        # no map_location
    tensors = [v for v in _leaves(raw) if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert raw["format"] == checkpoint.FORMAT and len(raw["digest"]) == 64
    state = checkpoint.load(path)
    assert "digest" not in state and checkpoint.digest(state) == raw["digest"]
    assert sorted(p.name for p in path.parent.iterdir()) == [checkpoint.BEST, checkpoint.LAST]  # no staging left


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


# --- damaged files ---------------------------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "text":
        path.write_text("101\nnot a checkpoint\n")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "bit-flipped":                                       # inside the first tensor's data
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0x10
        path.write_bytes(bytes(flipped))


DAMAGE = {"empty": "empty", "text": "not a file that torch.save writes: it begins b'101", "truncated": "not a readable checkpoint",
          "bit-flipped": "damaged"}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_a_clear_error(finished, tmp_path, how) -> None:
    path = tmp_path / "model.pt"
    shutil.copyfile(finished / "checkpoints" / checkpoint.BEST, path)
    _damage(path, how)
    before = path.read_bytes()
    with pytest.raises(CheckpointError) as err:
        checkpoint.load_model(path)
    message = str(err.value)
    assert str(path) in message and DAMAGE[how] in message
    assert "use another checkpoint or train again" in message and "\n" not in message
    assert "If you are seeing" not in message                  # torch's advice after its first sentence
    assert path.read_bytes() == before


@pytest.mark.parametrize("how", ["empty", "truncated", "bit-flipped", "missing"])
def test_resume_falls_back_to_best_when_last_is_damaged(tiny, run_dir, how, caplog) -> None:
    last = run_dir / "checkpoints" / checkpoint.LAST
    best_step = checkpoint.load(run_dir / "checkpoints" / checkpoint.BEST)["progress"]["step"]
    if how == "missing":
        last.unlink()
    else:
        _damage(last, how)
    with caplog.at_level(logging.WARNING, logger="iaa"):
        result = _resume(tiny, run_dir)
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert_says(said, last, f"resuming from {run_dir / 'checkpoints' / checkpoint.BEST} instead", "an earlier step")
    assert "use another checkpoint" not in said and "\n" not in said
    assert result.steps > best_step and result.stop_reason == "max-epochs"
    assert checkpoint.load(last)["progress"]["step"] == result.steps   # a good last.pt again


def test_load_latest_can_leave_its_warning_to_the_load_that_resumes(run_dir, caplog) -> None:
    folder = run_dir / "checkpoints"
    _damage(folder / checkpoint.LAST, "truncated")
    with caplog.at_level(logging.WARNING, logger="iaa"):
        state, source = checkpoint.load_latest(folder, warn=False)
    assert source == folder / checkpoint.BEST and caplog.records == []
    assert checkpoint.digest(state) == checkpoint.digest(checkpoint.load(source))
    with caplog.at_level(logging.WARNING, logger="iaa"):
        assert checkpoint.load_latest(folder)[1] == source
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert_says(said, f"resuming from {source} instead", "an earlier step")


def test_a_tracked_resume_says_once_that_it_resumes_from_best(tiny, run_dir, caplog) -> None:
    """The check before the tracked run reopens reads the same fallback silently; the session
    that resumes says it."""
    from fakes import FakeTracker
    from iaa.jobs.ports import TrainRun

    _damage(run_dir / "checkpoints" / checkpoint.LAST, "truncated")
    with caplog.at_level(logging.WARNING, logger="iaa"):
        result = train_job.run_tracked(TrainRun(_cfg(tiny, "train.max_epochs=2"), tiny, run_dir, resume=True,
                                                show_progress=False), FakeTracker())
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert_says(said, f"resuming from {run_dir / 'checkpoints' / checkpoint.BEST} instead", "an earlier step")
    assert result.stop_reason == "max-epochs"


def test_resume_with_both_checkpoints_damaged_changes_nothing(tiny, run_dir) -> None:
    for name in (checkpoint.LAST, checkpoint.BEST):
        _damage(run_dir / "checkpoints" / name, "text")
    before = _snapshot(run_dir)
    with pytest.raises(CheckpointError, match="cannot resume") as err:
        _resume(tiny, run_dir)
    assert checkpoint.LAST in str(err.value) and checkpoint.BEST in str(err.value)
    assert _snapshot(run_dir) == before


def test_resume_with_another_config_is_refused(tiny, run_dir) -> None:
    before = _snapshot(run_dir)
    with pytest.raises(CheckpointError) as err:
        _resume(tiny, run_dir, "model.hidden_dim=6", "train.lr=0.01")
    message = str(err.value)
    assert str(run_dir / "checkpoints" / checkpoint.LAST) in message
    assert "model.hidden_dim: 8 in the checkpoint, 6 now" in message and "train.lr" in message
    assert "without --resume" in as_shown(message)
    assert _snapshot(run_dir) == before


def test_resume_with_other_data_is_refused(tiny, run_dir, tmp_path) -> None:
    other = make_tiny_prepared(tmp_path / "other", sizes={"train": 96, "valid": 32, "test": 32})
    before = _snapshot(run_dir)
    with pytest.raises(IaaError, match="trained on other data"):
        train_job.run(_cfg(other, "train.max_epochs=2"), other, run_dir, resume=True, show_progress=False)
    assert _snapshot(run_dir) == before


def test_resume_may_extend_the_budget(tiny, run_dir) -> None:
    done = checkpoint.load(run_dir / "checkpoints" / checkpoint.LAST)["progress"]
    assert done["stop_reason"] == "max-epochs"
    result = _resume(tiny, run_dir, "train.max_minutes=60")          # 2 epochs instead of 1
    assert result.stop_reason == "max-epochs" and result.steps == 2 * done["step"]


# --- the session base's report -------------------------------------------------------------------


class _Recorder(SessionBase):
    def __init__(self, rank: int) -> None:
        import pyarrow as pa

        super().__init__(pa.table({"x": [1]}), pa.table({"x": [1]}), batch_size=1, seed=0)
        self.rank = rank
        self.published: list = []

    def publish(self, metrics, folder, is_best):
        staged = folder / "checkpoint.pt" if folder is not None else None
        self.published.append((metrics, staged and checkpoint.load(staged), is_best))


def test_report_writes_the_checkpoint_on_rank_0_only_and_adds_the_progress(finished) -> None:
    state = checkpoint.load(finished / "checkpoints" / checkpoint.LAST)
    for rank in (0, 1):
        session = _Recorder(rank)
        session.report({"valid_acc": 0.5, "step": 3}, state, True)
        (metrics, written, is_best), = session.published
        assert is_best and metrics["valid_acc"] == 0.5 and metrics["is_best"] is True
        assert metrics["steps"] == state["progress"]["step"] and metrics["stop_reason"] == "max-epochs"
        assert (written is not None) == (rank == 0)
        if written is not None:
            assert checkpoint.digest(written) == checkpoint.digest(state)


# --- loading without initialising ----------------------------------------------------------------


@pytest.mark.parametrize("variant", [(), ("model.halting=act",), ("model.kind=iaa-fixed-query",),
                                     ("model.kind=as-reader",)], ids=["iaa", "act", "fixed-query", "as-reader"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_loaded_reader_answers_as_one_built_and_given_the_weights(tiny, tmp_path, variant, precision) -> None:
    """``load_model`` builds the reader without initialising it (the weights are replaced), and
    the kernels it selects are those of a reader built as in training."""
    from iaa.model.reader import build_reader
    from tests._model_inputs import random_batch

    result = train_job.run(_cfg(tiny, "train.max_epochs=1", *variant), tiny, tmp_path / "run",
                           show_progress=False)
    loaded, cfg, state = checkpoint.load_model(Path(result.checkpoint), precision=precision)
    built = build_reader(cfg.model, "cpu", precision)
    built.load_state_dict(state["model"])
    built.eval()
    batch = random_batch([9, 7, 5], [4, 3, 4], vocab=cfg.model.vocab_size)
    with torch.no_grad():
        assert torch.equal(loaded(batch).log_probs, built(batch).log_probs)
    assert {name for name, _ in loaded.named_parameters()} == {name for name, _ in built.named_parameters()}
