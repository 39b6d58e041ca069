"""The training loop of one run: Adam, half-epoch checks, lr decay on plateau, early stopping.

The loop knows nothing of Ray: it talks to a :class:`~iaa.jobs.training.session.Session`. It is fully
deterministic on CPU for a given seed, and a run resumed from its last checkpoint reaches the
same result as an uninterrupted one: the checkpoint holds the model, the optimizer, the RNG
state and the position in the epoch, and the batch order is a pure function of (seed, epoch).

Devices are handled here, once: the model is moved to the session's device before the
optimiser is built or its saved state loaded, so Adam's moments always live beside their
parameters; checkpoints hold CPU tensors (:mod:`iaa.jobs.modeling.checkpoint`), so a run trained on a GPU
resumes or evaluates on a CPU and the other way round. The reader is built for the session's
device and ``train.precision``: bf16 gives its matmuls bf16 operands (training and validation);
parameters, gradients and Adam's state stay fp32. ``auto`` (the default) is bf16 where this machine runs it faster
(:mod:`iaa.jobs.modeling.precision_policy`).

On one CUDA device with ``train.cuda_graphs`` (the default) each step is replayed from a CUDA
graph (:mod:`iaa.jobs.training.captured`) where the reader allows it; otherwise, and always on
the CPU, the eager ``train_step`` runs. The result names the reason a reader was refused.
On the CPU the batches' widths are padded to multiples (``iaa.data.loading.batch.pad_to_multiple``):
with a new width at every batch, a long run's heap grows with its steps.
"""

from __future__ import annotations

import math
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psutil
import torch

from iaa import logs
from iaa.data.loading.batch import Batch, pad_to_buckets, pad_to_multiple
from iaa.data.loading.prefetch import prefetch
from iaa.errors import IaaError
from iaa.jobs.modeling import checkpoint, precision_policy as precision
from iaa.jobs.config.job_config import JobConfig
from iaa.jobs.ports import WorkerData, WorkerLink
from iaa.jobs.evaluation import calibration
from iaa.jobs.evaluation.evaluate import score_batches
from iaa.jobs.modeling import graphs
from iaa.jobs.modeling.objective import Objective
from iaa.jobs.training import captured
from iaa.jobs.training.progress import Progress
from iaa.jobs.training.session import Session
from iaa.jobs.training.step import build_optimizer, train_step
from iaa.model.reader import build_reader


TIME_CHECK_EVERY = 10  # steps between (all-reduced) wall-clock budget checks, and between loss checks on a GPU
PREFETCH_DEPTH = 3     # batches padded and copied ahead on a GPU (iaa.data.loading.prefetch)


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
        self.capture_refused: str | None = None                            # why steps run eagerly on CUDA
        self.model, self.optimizer, self.progress = self._load()
        self.captured = self._captured_step()
        # validation replays the forward pass from graphs where the steps are
        self.forward = graphs.CapturedForward(checkpoint.unwrap(self.model)) if self.captured is not None else None
        self.n_batches = session.num_train_batches()
        if self.n_batches == 0:
            raise IaaError("the training split is empty: prepare the dataset with training examples")
        self.max_steps = self.tc.max_steps(self.n_batches)
        self.progress.resume(max_steps=self.max_steps, max_seconds=self.tc.max_minutes * 60)
        self.start_step = self.progress.step                               # where this process began
        shown = show_progress and session.rank == 0
        self.bar = logs.progress(f"train {cfg.model.kind}", "ex", total=self.examples(self.max_steps) if shown else 0,
                                 shown=shown, initial=self.examples(self.progress.step) if shown else 0,
                                 unit_scale=True, dynamic_ncols=True)
        self.window = _LossWindow()
        self.last: dict[str, Any] = {}
        self._clock_base = self.progress.elapsed_s - time.perf_counter()

    def _load(self):
        """The model on the session's device, then its optimiser, then the saved state if any."""
        torch.manual_seed(self.tc.seed)
        model = build_reader(self.cfg.model, self.session.device, self.precision).to(self.session.device)
        capturable = (self._wants_graphs()
                      and captured.refusal(model, self.session.device, compile=self.tc.compile) is None)
        optimizer = build_optimizer(model, lr=self.tc.lr, embed_l2=self.tc.embed_l2, capturable=capturable)
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

    def examples(self, steps: int) -> int:
        """The examples that the run's first ``steps`` steps train, as the bar counts them: this
        rank's, epoch after epoch (a batch that holds fewer than ``batch_size`` counts what it
        holds), times the ranks."""
        epochs, batches = divmod(steps, self.n_batches)
        whole = sum(self.session.train_examples(epoch, self.n_batches) for epoch in range(epochs))
        return (whole + self.session.train_examples(epochs, batches)) * self.session.world_size

    def _wants_graphs(self) -> bool:
        """``train.cuda_graphs`` on one CUDA device (DDP's gradient all-reduce is not captured)."""
        return self.tc.cuda_graphs and self.session.device.type == "cuda" and self.session.world_size == 1

    def _captured_step(self) -> captured.CapturedStep | None:
        """The step replayed from CUDA graphs where ``train.cuda_graphs`` asks for it and the
        reader allows it (else None, with the reason in ``capture_refused``)."""
        if not self._wants_graphs():
            return None
        self.capture_refused = captured.refusal(self.model, self.session.device, compile=self.tc.compile)
        if self.capture_refused is not None:
            return None
        return captured.CapturedStep(self.model, self.optimizer, clip=self.tc.clip, objective=self.objective)

    def fit(self) -> dict[str, Any]:
        """Train until the budget, the step limit or early stopping ends the run."""
        try:
            for _ in self.steps():
                pass
        finally:
            self.bar.close()            # a stopped run's bar ends its line too (Ctrl-C: the stop's line follows)
        return self.finish()

    def steps(self) -> Iterator[None]:
        """``fit``'s training one batch at a time: each item is one batch trained (with the check
        that falls after it, if any); the run is over when it ends (then call ``finish``)."""
        self.model.train()
        if self.progress.step >= self.max_steps:
            self.progress.stop("max-epochs")
        while not self.progress.stop_reason:
            yield from self._run_epoch()

    def finish(self) -> dict[str, Any]:
        """The run's final figures (after ``steps`` has ended): its last check's metrics
        (:meth:`_metrics`; none where this process made no check, as a resume with nothing left to
        train), then the run's progress, which stands where the two share a name.

        ``steps`` is how many steps the run has trained in all, across its resumes (the result's
        field); ``step`` is the step its figures were measured at, the key that every check's
        metrics carry (the x axis of its tracked curves). A run ends on a check, so here they are
        one number, and ``epoch`` is it in epochs; ``trained_steps`` are those this process trained.
        """
        self.bar.close()
        p = self.progress
        return {**self.last, "step": p.step, "epoch": p.step / self.n_batches, "checks": p.checks,
                "best_valid_acc": p.best_valid_acc, "best_step": p.best_step, "steps": p.step,
                "stop_reason": p.stop_reason, "train_seconds": p.elapsed_s, "precision": self.precision,
                "trained_steps": p.step - self.start_step,
                "cuda_graphs": self.captured is not None and self.captured.failed is None,
                "cuda_graphs_refused": self.capture_refused or (self.captured.failed if self.captured else None)}

    def _run_epoch(self) -> Iterator[None]:
        """The rest of the current epoch, with the checks that fall in it (one item per batch)."""
        p = self.progress
        batches = self.session.train_batches(p.epoch, skip=p.batch)
        device = self.session.device
        if self.tc.compile or self.captured is not None:
            batches = map(pad_to_buckets, batches)                         # few shapes to compile or capture
        elif device.type == "cpu":
            batches = map(pad_to_multiple, batches)                        # few sizes, so the heap stops growing
        with closing(prefetch(batches, device, depth=PREFETCH_DEPTH if device.type == "cuda" else 0)) as ready:
            for batch in ready:
                self._run_batch(batch)
                if p.stop_reason or self._check_due():
                    self._check()
                    if p.stop_reason:
                        yield
                        return
                yield
        p.finish_epoch()

    def _run_batch(self, batch: Batch) -> None:
        """One training step (``batch`` on the device), then the step and time budgets."""
        p, tc = self.progress, self.tc
        if self.captured is not None:
            loss = self.captured(batch)
        else:
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
        return self.tc.check_due(self.progress.step, self.progress.batch, self.n_batches)

    def _check(self) -> None:
        """Validate; let the progress decide lr decay and early stopping; report a checkpoint."""
        p, tc = self.progress, self.tc
        if self.session.device.type == "cuda":
            torch.cuda.synchronize(self.session.device)                    # the window's steps are done
        train_seconds = time.perf_counter() - self.window.start
        self._stop_if_diverged(self.window.total)                          # before a checkpoint is written
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []       # each batch's probabilities and answers
        sums = score_batches(checkpoint.unwrap(self.model), self.session.valid_batches(), self.session.device,
                             forward=self.forward, kept=kept)
        correct, total, nll = self.session.all_reduce_sum(sums)
        temperature = calibration.fit_temperature(*calibration.stacked(kept), total=self.session.all_reduce_sum)
        valid_seconds = time.perf_counter() - self.window.start - train_seconds
        acc = correct / max(total, 1)
        # a check due only because the budget ended (between two scheduled ones) decides nothing
        improved = p.record_check(acc, lr_decay=tc.lr_decay, patience=tc.patience,
                                  decides=not p.stop_reason or self._check_due())
        self.optimizer.set_lr(tc.lr * p.lr_scale)
        self.last = self._metrics(acc, nll / max(total, 1), temperature, train_seconds, valid_seconds)
        state = checkpoint.make_state(self.cfg, self.model, self.optimizer, p.to_dict(), self.vocab_hash,
                                      temperature=temperature)
        self.session.report(self.last, state, improved)
        self.bar.set_postfix(loss=f"{self.last['train_loss']:.3f}", valid_acc=f"{acc:.3f}",
                             best=f"{p.best_valid_acc:.3f}")
        self.window = _LossWindow()
        self.model.train()

    def _metrics(self, valid_acc: float, valid_loss: float, temperature: float, train_seconds: float,
                 valid_seconds: float) -> dict[str, Any]:
        """The metrics of a check: validation, the training loss and speed since the last one,
        at ``step`` (the run's steps so far; ``epoch`` is it in epochs).

        ``temperature``: the one that calibrates the reader's answers on valid at this check
        (:func:`iaa.jobs.evaluation.calibration.fit_temperature`), saved in its checkpoint.

        ``train_examples_per_s`` counts the training steps' time only (from the end of the last
        check to the start of this one); the validation's own time is ``valid_seconds``.
        ``resident_mb`` is the training processes' resident memory after the validation, summed
        over the workers: its curve over a run shows a heap that grows with the steps.
        ``precision`` (fp32 | bf16, not a number: trackers keep it as the run's tag) is what the
        reader multiplies in, decided on this worker where the config left ``auto``.
        """
        resident = psutil.Process().memory_info().rss / 2**20
        loss_sum, batches, resident = self.session.all_reduce_sum([float(self.window.total), self.window.batches,
                                                                   resident])
        seconds = max(train_seconds, 1e-9)
        return {
            "step": self.progress.step,
            "epoch": self.progress.step / self.n_batches,
            "train_loss": loss_sum / max(batches, 1),
            "valid_acc": valid_acc,
            "valid_loss": valid_loss,
            "temperature": temperature,
            "best_valid_acc": self.progress.best_valid_acc,
            "lr": self.optimizer.lr,
            "train_examples_per_s": self.window.batches * self.tc.batch_size * self.session.world_size / seconds,
            "valid_seconds": valid_seconds,
            "resident_mb": resident,
            "precision": self.precision,
        }


def fit(cfg: JobConfig, session: Session, *, show_progress: bool = True, vocab_hash: str = "") -> dict[str, Any]:
    """Train ``cfg.model`` on the session's data; returns the final metrics and progress."""
    return Trainer(cfg, session, show_progress=show_progress, vocab_hash=vocab_hash).fit()


def fit_on_worker(cfg: JobConfig, link: WorkerLink, data: WorkerData, *, threads: int) -> dict[str, Any]:
    """The loop on a cluster worker (a :class:`~iaa.jobs.ports.WorkerFit`): on the given ``train`` and
    ``valid`` tables of ``data`` (a one-worker trial), else on this rank's rows of its ``prepared``
    folder's training split and the whole validation split (each rank scores its own share of it)."""
    from iaa.data.loading.loader import PreparedData
    from iaa.data.prepared.manifest import vocab_card
    from iaa.jobs.training.session import ClusterSession

    train, valid, vocab = data.train, data.valid, data.vocab
    if train is None:
        prepared = PreparedData.open(Path(data.prepared))
        vocab = vocab_card(Path(data.prepared))
        train, valid = prepared.rank_rows("train", link.rank, link.world_size), prepared.table("valid")
        if train.num_rows == 0:
            raise IaaError(f"rank {link.rank} of {link.world_size} has no training rows: use fewer workers")
    session = ClusterSession(link, train, valid, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                             threads=threads, vocab=vocab)
    return fit(cfg, session, show_progress=data.show_progress, vocab_hash=data.vocab_hash)
