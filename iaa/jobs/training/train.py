"""The training loop of one run: Adam, half-epoch checks, lr decay on plateau, early stopping.

The loop knows nothing of Ray: it talks to a :class:`~iaa.jobs.training.session.Session`. It is fully
deterministic on CPU for a given seed, and a run resumed from its last checkpoint reaches the
same result as an uninterrupted one: the checkpoint holds the model, the optimizer, the RNG
state and the position in the epoch, and the batch order is a pure function of (seed, epoch).

Devices are handled here, once: the model is moved to the session's device before the
optimiser is built or its saved state loaded, so Adam's moments always live beside their
parameters; checkpoints hold CPU tensors (:mod:`iaa.jobs.training.checkpoint`), so a run trained on a GPU
resumes or evaluates on a CPU and the other way round. The reader is built for the session's
device and ``train.precision``: bf16 gives its matmuls bf16 operands (training and validation);
parameters, gradients and Adam's state stay fp32. ``auto`` (the default) is bf16 where this machine runs it faster
(:mod:`iaa.jobs.training.precision_policy`).
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from tqdm import tqdm

from iaa.data.batch import Batch, pad_to_buckets
from iaa.data.prefetch import prefetch
from iaa.errors import IaaError
from iaa.jobs.training import checkpoint, precision_policy as precision
from iaa.jobs.training.config import JobConfig, to_dict
from iaa.jobs.ports import Launcher, Tracker, WorkerLink, WorkersRequest
from iaa.jobs.inference.evaluate import score_batches
from iaa.jobs.training.objective import Objective
from iaa.jobs.inference.predict import MODEL_CODE
from iaa.jobs.training.progress import Progress
from iaa.jobs.training.session import MetricsCallback, Session
from iaa.jobs.training.step import build_optimizer, retain_freed_memory, train_step
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, RunFolder, Workdir
from iaa.model.reader import build_reader

TIME_CHECK_EVERY = 10  # steps between (all-reduced) wall-clock budget checks, and between loss checks on a GPU
PREFETCH_DEPTH = 3     # batches padded and copied ahead on a GPU (iaa.data.prefetch)
LOG_PROGRESS_S = 30.0  # the progress bar's interval when stderr is a file or a pipe (a terminal: 0.1 s)


class DivergedError(IaaError):
    """The training loss became NaN or infinite: the weights are lost, so the run stops."""


@dataclass
class _LossWindow:
    """Training losses since the last check, and when that window started.

    The losses are summed as device tensors and read once, at the check: reading each step's
    loss would make the host wait for the GPU every step.
    """

    total: torch.Tensor | float = 0.0
    batches: int = 0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor) -> None:
        self.total = self.total + loss
        self.batches += 1


class Trainer:
    """One run of the loop on one session; ``fit`` is the whole of it."""

    def __init__(self, cfg: JobConfig, session: Session, *, show_progress: bool = True,
                 vocab_hash: str = "") -> None:
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        self.cfg, self.tc, self.session, self.vocab_hash = cfg, cfg.train, session, vocab_hash
        self.precision = precision.resolve(cfg.train.precision, session.device)   # fp32 | bf16
        self.objective = Objective.from_config(cfg)
        self.model, self.optimizer, self.progress = self._load()
        self.n_batches = session.num_train_batches()
        if self.n_batches == 0:
            raise IaaError("the training split is empty: prepare the dataset with training examples")
        # Rounded down, so that a budget like 1.5 epochs ends on the mid-epoch check (batch n // 2)
        # instead of one step later, in an extra check of a single batch.
        self.max_steps = max(1, math.floor(self.tc.max_epochs * self.n_batches + 1e-9))
        self.progress.resume(max_steps=self.max_steps, max_seconds=self.tc.max_minutes * 60)
        examples = self.tc.batch_size * session.world_size
        self.bar = tqdm(total=self.max_steps * examples, initial=self.progress.step * examples, unit="ex",
                        unit_scale=True, dynamic_ncols=True, desc=f"train {cfg.model.kind}",
                        mininterval=0.1 if sys.stderr.isatty() else LOG_PROGRESS_S,
                        disable=not (show_progress and session.rank == 0))
        self.window = _LossWindow()
        self.last: dict[str, Any] = {}
        self._clock_base = self.progress.elapsed_s - time.perf_counter()

    def _load(self):
        """The model on the session's device, then its optimiser, then the saved state if any."""
        torch.manual_seed(self.tc.seed)
        model = build_reader(self.cfg.model, self.session.device, self.precision).to(self.session.device)
        optimizer = build_optimizer(model, lr=self.tc.lr, embed_l2=self.tc.embed_l2)
        progress = Progress()
        saved = self.session.latest_state()
        if saved is not None:
            source = getattr(self.session, "resumed_from", "") or "the last checkpoint"
            checkpoint.check_resumable(saved, self.cfg, self.vocab_hash, source)
            checkpoint.load_weights(model, saved, source)
            optimizer.load_state_dict(saved["optimizer"])
            checkpoint.restore_rng(saved, self.session.device)
            progress = Progress.from_dict(saved["progress"], lr_scale=optimizer.lr / self.tc.lr)
        optimizer.set_lr(self.tc.lr * progress.lr_scale)
        if self.tc.compile:
            model.compile_reads(mode="reduce-overhead" if self.session.device.type == "cuda" else None)
        return self.session.prepare_model(model), optimizer, progress

    def fit(self) -> dict[str, Any]:
        """Train until the budget, the step limit or early stopping ends the run."""
        self.model.train()
        if self.progress.step >= self.max_steps:
            self.progress.stop("max-epochs")
        while not self.progress.stop_reason:
            self._run_epoch()
        self.bar.close()
        p = self.progress
        return {**self.last, "best_valid_acc": p.best_valid_acc, "best_step": p.best_step, "steps": p.step,
                "stop_reason": p.stop_reason, "train_seconds": p.elapsed_s, "precision": self.precision}

    def _run_epoch(self) -> None:
        """The rest of the current epoch, with the checks that fall in it."""
        p = self.progress
        batches = self.session.train_batches(p.epoch, skip=p.batch)
        if self.tc.compile:
            batches = map(pad_to_buckets, batches)                         # few shapes to compile
        device = self.session.device
        with closing(prefetch(batches, device, depth=PREFETCH_DEPTH if device.type == "cuda" else 0)) as ready:
            for batch in ready:
                self._run_batch(batch)
                if p.stop_reason or self._check_due():
                    self._check()
                    if p.stop_reason:
                        return
        p.finish_epoch()

    def _run_batch(self, batch: Batch) -> None:
        """One training step (``batch`` on the device), then the step and time budgets."""
        p, tc = self.progress, self.tc
        loss = train_step(self.model, self.optimizer, batch, clip=tc.clip, objective=self.objective)
        p.finish_batch(self._clock_base + time.perf_counter())
        self.window.add(loss)
        if self.session.device.type != "cuda" or p.step % TIME_CHECK_EVERY == 0:   # reading it waits for a GPU
            self._stop_if_diverged(self.window.total)
        self.bar.update(len(batch) * self.session.world_size)
        if p.step >= self.max_steps:
            p.stop("max-epochs")
        elif tc.max_minutes > 0 and p.step % TIME_CHECK_EVERY == 0:
            over = p.elapsed_s > tc.max_minutes * 60
            if self.session.all_reduce_sum([float(over)])[0] > 0:
                p.stop("max-time")

    def _stop_if_diverged(self, loss: torch.Tensor | float) -> None:
        """Raise :class:`DivergedError` when ``loss`` (a sum of the window's losses) is not finite.

        Every later step would only carry the NaN on, and a checkpoint or model of NaN weights
        would answer every question alike; so the run stops before it writes one.
        """
        value = float(loss)
        if not math.isfinite(value):
            raise DivergedError(
                f"training diverged: the loss became {value} by step {self.progress.step} (epoch "
                f"{self.progress.step / self.n_batches:.2f}); the run stops without logging a model or a checkpoint of it: "
                f"lower train.lr (now {self.tc.lr:g}) or train.clip (now {self.tc.clip:g}), or check the data")

    def _check_due(self) -> bool:
        """Every ``check_every`` steps, else at mid-epoch and at the end of the epoch."""
        if self.tc.check_every:
            return self.progress.step % self.tc.check_every == 0
        return self.progress.batch in (max(1, self.n_batches // 2), self.n_batches)

    def _check(self) -> None:
        """Validate; let the progress decide lr decay and early stopping; report a checkpoint."""
        p, tc = self.progress, self.tc
        if self.session.device.type == "cuda":
            torch.cuda.synchronize(self.session.device)                    # the window's steps are done
        train_seconds = time.perf_counter() - self.window.start
        self._stop_if_diverged(self.window.total)                          # before a checkpoint is written
        sums = score_batches(checkpoint.unwrap(self.model), self.session.valid_batches(), self.session.device)
        correct, total, nll = self.session.all_reduce_sum(sums)
        valid_seconds = time.perf_counter() - self.window.start - train_seconds
        acc = correct / max(total, 1)
        improved = p.record_check(acc, lr_decay=tc.lr_decay, patience=tc.patience)
        self.optimizer.set_lr(tc.lr * p.lr_scale)
        self.last = self._metrics(acc, nll / max(total, 1), train_seconds, valid_seconds)
        state = checkpoint.make_state(self.cfg, self.model, self.optimizer, p.to_dict(), self.vocab_hash)
        self.session.report(self.last, state, improved)
        self.bar.set_postfix(loss=f"{self.last['train_loss']:.3f}", valid_acc=f"{acc:.3f}",
                             best=f"{p.best_valid_acc:.3f}")
        self.window = _LossWindow()
        self.model.train()

    def _metrics(self, valid_acc: float, valid_loss: float, train_seconds: float,
                 valid_seconds: float) -> dict[str, Any]:
        """The metrics of a check: validation, the training loss and speed since the last one.

        ``train_examples_per_s`` counts the training steps' time only (from the end of the last
        check to the start of this one); the validation's own time is ``valid_seconds``.
        """
        loss_sum, batches = self.session.all_reduce_sum([float(self.window.total), self.window.batches])
        seconds = max(train_seconds, 1e-9)
        return {
            "step": self.progress.step,
            "epoch": self.progress.step / self.n_batches,
            "train_loss": loss_sum / max(batches, 1),
            "valid_acc": valid_acc,
            "valid_loss": valid_loss,
            "best_valid_acc": self.progress.best_valid_acc,
            "lr": self.optimizer.lr,
            "train_examples_per_s": self.window.batches * self.tc.batch_size * self.session.world_size / seconds,
            "valid_seconds": valid_seconds,
        }


def fit(cfg: JobConfig, session: Session, *, show_progress: bool = True, vocab_hash: str = "") -> dict[str, Any]:
    """Train ``cfg.model`` on the session's data; returns the final metrics and progress."""
    return Trainer(cfg, session, show_progress=show_progress, vocab_hash=vocab_hash).fit()


def fit_on_worker(cfg: JobConfig, link: WorkerLink, *, threads: int, vocab_hash: str, prepared: str = "",
                  train: Any = None, valid: Any = None, vocab: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The loop on a cluster worker (a :class:`~iaa.jobs.ports.WorkerFit`): on the given ``train`` and
    ``valid`` tables (a one-worker trial), else on this rank's rows of the ``prepared`` folder's
    training split and the whole validation split (each rank scores its own share of it)."""
    from iaa.data.loader import PreparedData
    from iaa.data.manifest import vocab_card
    from iaa.jobs.training.session import ClusterSession

    if train is None:
        data = PreparedData.open(Path(prepared))
        vocab = vocab_card(Path(prepared))
        train, valid = data.rank_rows("train", link.rank, link.world_size), data.table("valid")
        if train.num_rows == 0:
            raise IaaError(f"rank {link.rank} of {link.world_size} has no training rows: use fewer workers")
    session = ClusterSession(link, train, valid, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                             threads=threads, vocab=vocab)
    return fit(cfg, session, show_progress=False, vocab_hash=vocab_hash)


def run(
    cfg: JobConfig,
    data_dir: Path,
    run_dir: Path,
    *,
    resume: bool = False,
    on_metrics: MetricsCallback | None = None,
    show_progress: bool = True,
    device: str = "cpu",
    train_rows: Any = None,
) -> dict[str, Any]:
    """Train in this process; returns the metrics with the best checkpoint's path.

    ``train_rows`` (a pyarrow Table in the shards' schema, e.g. with a teacher column) replaces
    the prepared training split. An entry point: it opts this process into
    ``retain_freed_memory`` (faster CPU steps).
    """
    from iaa.jobs.training.session import LocalSession

    retain_freed_memory()
    session = LocalSession(data_dir, run_dir, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                           resume=resume, on_metrics=on_metrics, device=device, train_rows=train_rows)
    result = fit(cfg, session, show_progress=show_progress, vocab_hash=session.data.manifest.get("vocab_hash", ""))
    return {**result, "checkpoint": str(session.best_checkpoint), "run_dir": str(run_dir)}


def run_tracked(
    cfg: JobConfig,
    prepared: Path,
    run_dir: Path,
    tracker: Tracker,
    *,
    launcher: Launcher | None = None,
    resume: bool = False,
    workers: int = 0,
    gpus_per_worker: float = 0.0,
    storage: str = "",
    show_progress: bool = True,
    register: str | None = None,
    train_rows: Any = None,
    teacher: Path | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``iaa-cli train``: one run, in this process (``workers == 0``) or on the launcher's workers,
    tracked in ``tracker``, with its model logged at the end.

    A run resumed with ``resume`` continues the tracked run that its run folder had (found by the
    ``run_dir`` tag), so one folder has one run whose metrics go on where they stopped.
    ``train_rows`` (a pyarrow Table) replaces the prepared training split, in process only: the
    distillation job passes the rows with their teacher distributions, and ``teacher`` (the
    teacher's Parquet file) is then logged as an input of the run.
    """
    if workers > 0 and launcher is None:
        raise IaaError("training on workers needs a launcher")
    if train_rows is not None and workers > 0:
        raise ValueError("training on given rows (distillation) runs in process, not on Ray Train workers")
    folder = RunFolder(Path(run_dir))
    experiment = f"train-{cfg.dataset}"
    tags = {"dataset": cfg.dataset, "model": cfg.model.kind, "run_dir": str(run_dir), "workers": str(workers),
            **(tags or {})}
    resume_id = previous_run(tracker, experiment, folder.path) if resume else None
    # auto -> fp32 or bf16 here, once: the tracked params record it, and every worker uses it
    cfg = precision.resolved(cfg, "cuda" if gpus_per_worker > 0 else "cpu")
    with tracker.run(experiment, folder.path.name, tags=tags, resume_id=resume_id) as tracked:
        if resume_id is None:
            tracked.log_params(to_dict(cfg))
            tracked.log_dataset(prepared)
            if teacher is not None:
                tracked.log_file_input(Path(teacher), context="teacher")
        log = lambda metrics: tracked.log_metrics(metrics, step=int(metrics.get("step", 0)))  # noqa: E731
        if workers <= 0:
            device = "cuda" if gpus_per_worker > 0 else "cpu"  # in process: --gpus-per-worker > 0 means this GPU
            result = run(cfg, prepared, folder.path, resume=resume, on_metrics=log, show_progress=show_progress,
                         device=device, train_rows=train_rows)
        else:
            assert launcher is not None
            result = launcher.train_workers(WorkersRequest(
                cfg=cfg, prepared=prepared, folder=folder, fit=fit_on_worker, workers=workers, storage=storage,
                gpus_per_worker=gpus_per_worker, resume=resume, on_metrics=log, show_progress=show_progress))
        tracked.set_tags({"checkpoint": result.get("checkpoint", "")})
        if result.get("checkpoint"):
            result["model_uri"] = tracker.log_model(tracked, [Path(result["checkpoint"])], prepared, register,
                                                    code=MODEL_CODE)
        tracked.log_metrics({"final_best_valid_acc": result.get("best_valid_acc", 0.0)}, step=int(result.get("steps", 0)))
    return {**result, "valid_acc": result.get("best_valid_acc"), "tracking_uri": tracker.uri,
            "mlflow_run_id": tracked.run_id}


@dataclass(frozen=True)
class TrainRequest:
    """What ``iaa-cli train`` asks for: the data (``dataset`` or a prepared ``data`` folder), the
    config (model kind, YAML file, ``--set`` overrides), the run folder and where it trains."""

    dataset: str | None
    data: Path | None
    model_kind: str | None = None
    config_file: Path | None = None
    sets: tuple[str, ...] = ()
    run_dir: Path | None = None              # default: WORKDIR/runs/DATASET-MODEL-seedN
    resume: bool = False
    overwrite: bool = False
    register: str | None = None
    workers: int = 0                         # Ray Train workers; 0 trains in this process
    gpus_per_worker: float = 0.0
    tracking_uri: str | None = None
    storage_path: str | None = None
    workdir: Path = Path(DEFAULT_WORKDIR)
    show_progress: bool = True

    def __post_init__(self) -> None:
        from iaa.jobs.workdir import names

        names.registered_name(self.register)


def run_request(req: TrainRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher | None) -> dict[str, Any]:
    """``iaa-cli train``: resolve the data, config and run folder (never over an input), claim the
    folder and train tracked in the store ``open_tracker(uri)``."""
    from iaa.jobs.workdir import outputs, rundir
    from iaa.jobs.datasets import resolve

    work = Workdir(req.workdir)
    work.writable()
    uri = work.tracking_uri(req.tracking_uri)
    dataset, data, handoff = data_of(req)
    name, prepared = resolve.data_dir(dataset, data, req.workdir)
    cfg = resolve.job_config(name, prepared, model_kind=req.model_kind, config_file=req.config_file, sets=req.sets)
    if "sweep" in handoff:                      # on stderr, with --json too: what this run is
        print(best_config_notice(handoff["sweep"], cfg), file=sys.stderr)
    run_dir = resolve.run_dir(name, cfg, req.run_dir, req.workdir)
    outputs.refuse_inputs(run_dir, {"the prepared data": prepared, "the tracking database": work.tracking_db(uri)},
                          flag="--run-dir", folder=True)
    tracker = open_tracker(uri)
    with rundir.claim(run_dir, resume=req.resume, overwrite=req.overwrite) as folder:
        result = run_tracked(cfg, prepared, folder, tracker, launcher=launcher, resume=req.resume,
                             workers=req.workers, gpus_per_worker=req.gpus_per_worker,
                             storage=work.storage(req.storage_path), show_progress=req.show_progress,
                             register=req.register)
    return with_baseline(result, prepared)


def with_baseline(result: dict[str, Any], prepared: Path) -> dict[str, Any]:
    """``result`` with the most-frequent-candidate accuracy on the valid split beside its best
    accuracy, and a warning when the reader is not above it."""
    from iaa.jobs.reports import frequency

    base = frequency.run(prepared, "valid")["accuracy"]
    acc = result.get("best_valid_acc")
    warnings = frequency.below_warning(acc, base, "the run") if acc is not None else []
    return {**result, "baseline_valid_acc": base, "warnings": [*result.get("warnings", []), *warnings]}


def data_of(req: TrainRequest) -> tuple[str | None, Path | None, dict[str, Any]]:
    """``--dataset``/``--data``; with neither, what the ``--config`` file names (a sweep's
    best_config.yaml names its ``data`` folder, or only its ``dataset``), and the file's handoff keys."""
    from iaa.jobs.training.config import read_handoff, read_yaml

    handoff = read_handoff(req.config_file) if req.config_file is not None else {}
    if req.dataset is not None or req.data is not None:
        return req.dataset, req.data, handoff
    if req.config_file is None:
        raise IaaError("give --dataset NAME, --data PREPARED_DIR or a --config file that names its data")
    tree = read_yaml(req.config_file)
    dataset = tree.get("dataset") if isinstance(tree, dict) else None
    if "data" not in handoff and not dataset:
        raise IaaError(f"{req.config_file}: names no data (no 'data' or 'dataset' key); give --dataset NAME "
                       "or --data PREPARED_DIR")
    return dataset or None, Path(handoff["data"]) if "data" in handoff else None, handoff


def best_config_notice(sweep: Mapping[str, Any], cfg: JobConfig) -> str:
    """What ``train --config best_config.yaml`` is about to do, against what the sweep's trial did."""
    acc = sweep.get("best_valid_acc")
    trial = (f" (trial {sweep.get('trial', '?')}: valid accuracy {acc:.4f} in at most "
             f"{sweep.get('trial_max_epochs', '?')} epochs)" if isinstance(acc, (int, float)) else "")
    return (f"training the best configuration of sweep {sweep.get('name', '?')}{trial} to its early stop: "
            f"up to {cfg.train.max_epochs:g} epochs, ending after {cfg.train.patience} checks without improvement")


def previous_run(tracker: Tracker, experiment: str, run_dir: Path) -> str | None:
    """The newest tracked run of ``run_dir`` (tagged with it as given or as an absolute path)."""
    for spelling in dict.fromkeys([str(run_dir), str(run_dir.resolve())]):
        runs = tracker.find_runs(experiment, {"run_dir": spelling})
        if runs:
            return runs[0].run_id
    return None
