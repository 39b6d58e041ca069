"""The training loop of one run: Adam, half-epoch checks, lr decay on plateau, early stopping.

The loop knows nothing of Ray: it talks to a :class:`~iaa.jobs.session.Session`. It is fully
deterministic on CPU for a given seed, and a run resumed from its last checkpoint reaches the
same result as an uninterrupted one: the checkpoint holds the model, the optimizer, the RNG
state and the position in the epoch, and the batch order is a pure function of (seed, epoch).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from iaa.jobs import checkpoint
from iaa.jobs.config import JobConfig
from iaa.jobs.evaluate import score_batches
from iaa.jobs.session import MetricsCallback, Session
from iaa.jobs.step import build_optimizer, train_step
from iaa.model.reader import build_reader

TIME_CHECK_EVERY = 10  # steps between (all-reduced) wall-clock budget checks


@dataclass
class Progress:
    """Loop state saved in every checkpoint."""

    epoch: int = 0
    batch: int = 0            # batches done in the current epoch
    step: int = 0             # batches done in all
    checks: int = 0
    best_valid_acc: float = -1.0
    best_step: int = 0
    bad_checks: int = 0       # consecutive checks without improvement
    elapsed_s: float = 0.0    # training wall time, summed across resumptions
    stop_reason: str = ""


def _set_lr(optimizer: torch.optim.Optimizer, factor: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] *= factor
    return float(optimizer.param_groups[0]["lr"])


def fit(cfg: JobConfig, session: Session, *, show_progress: bool = True, vocab_hash: str = "") -> dict[str, Any]:
    """Train ``cfg.model`` on the session's data; returns the final metrics and progress."""
    tc = cfg.train
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    model = build_reader(cfg.model)
    optimizer = build_optimizer(model, lr=tc.lr, embed_l2=tc.embed_l2)
    progress = Progress()
    saved = session.latest_state()
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        progress = Progress(**saved["progress"])
    model = session.prepare_model(model)

    n_batches = session.num_train_batches()
    half = max(1, n_batches // 2)

    def due(p: Progress) -> bool:
        """A validation check is due: every ``check_every`` steps, else at mid-epoch and epoch end."""
        if tc.check_every:
            return p.step % tc.check_every == 0
        return p.batch in (half, n_batches)

    max_steps = max(1, math.ceil(tc.max_epochs * n_batches))
    main = session.rank == 0
    bar = tqdm(
        total=max_steps * tc.batch_size * session.world_size,
        initial=progress.step * tc.batch_size * session.world_size,
        unit="ex", unit_scale=True, dynamic_ncols=True,
        disable=not (show_progress and main), desc=f"train {cfg.model.kind}",
    )
    last: dict[str, Any] = {}
    loss_sum, loss_n, window_start = 0.0, 0, time.perf_counter()

    def check() -> bool:
        """Validate, decay lr, report with a checkpoint; True when training should stop."""
        nonlocal loss_sum, loss_n, window_start, last
        correct, total, nll = session.all_reduce_sum(score_batches(checkpoint.unwrap(model), session.valid_batches(), session.device))
        acc = correct / max(total, 1)
        progress.checks += 1
        improved = acc > progress.best_valid_acc
        if improved:
            progress.best_valid_acc, progress.best_step, progress.bad_checks = acc, progress.step, 0
        else:
            progress.bad_checks += 1
            _set_lr(optimizer, tc.lr_decay)
        if progress.bad_checks >= tc.patience:
            progress.stop_reason = progress.stop_reason or "early-stopped"
        train_loss = session.all_reduce_sum([loss_sum, loss_n])
        now = time.perf_counter()
        last = {
            "step": progress.step,
            "epoch": progress.step / n_batches,
            "train_loss": train_loss[0] / max(train_loss[1], 1),
            "valid_acc": acc,
            "valid_loss": nll / max(total, 1),
            "best_valid_acc": progress.best_valid_acc,
            "lr": float(optimizer.param_groups[0]["lr"]),
            "train_examples_per_s": loss_n * tc.batch_size * session.world_size / max(now - window_start, 1e-9),
        }
        state = checkpoint.make_state(cfg, model, optimizer, asdict(progress), vocab_hash)
        session.report(last, state, improved)
        bar.set_postfix(valid_acc=f"{acc:.3f}", best=f"{progress.best_valid_acc:.3f}")
        loss_sum, loss_n, window_start = 0.0, 0, time.perf_counter()
        model.train()
        return bool(progress.stop_reason)

    model.train()
    if n_batches == 0:
        raise ValueError("the training split is empty")
    resumed_elapsed, started = progress.elapsed_s, time.perf_counter()
    stop = progress.stop_reason != "" or progress.step >= max_steps
    while not stop:
        for batch in session.train_batches(progress.epoch, skip=progress.batch):
            loss = train_step(model, optimizer, batch.to(session.device), embed_l2=tc.embed_l2, clip=tc.clip)
            progress.elapsed_s = resumed_elapsed + time.perf_counter() - started
            progress.batch += 1
            progress.step += 1
            loss_sum, loss_n = loss_sum + loss, loss_n + 1
            bar.update(len(batch) * session.world_size)
            bar.set_postfix(loss=f"{loss_sum / loss_n:.3f}", refresh=False)
            if progress.step >= max_steps:
                progress.stop_reason = "max-epochs"
            elif tc.max_minutes > 0 and progress.step % TIME_CHECK_EVERY == 0:
                over = progress.elapsed_s > tc.max_minutes * 60
                if session.all_reduce_sum([float(over)])[0] > 0:
                    progress.stop_reason = "max-time"
            if progress.stop_reason or due(progress):
                stop = check()
                if stop:
                    break
        else:
            progress.epoch += 1
            progress.batch = 0
    bar.close()
    return {**last, "best_valid_acc": progress.best_valid_acc, "best_step": progress.best_step,
            "steps": progress.step, "stop_reason": progress.stop_reason, "train_seconds": progress.elapsed_s}


def run(
    cfg: JobConfig,
    data_dir: Path,
    run_dir: Path,
    *,
    resume: bool = False,
    on_metrics: MetricsCallback | None = None,
    show_progress: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Train in this process; returns the metrics with the best checkpoint's path."""
    from iaa.jobs.session import LocalSession

    session = LocalSession(data_dir, run_dir, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                           resume=resume, on_metrics=on_metrics, device=device)
    result = fit(cfg, session, show_progress=show_progress, vocab_hash=session.data.manifest.get("vocab_hash", ""))
    return {**result, "checkpoint": str(session.best_checkpoint), "run_dir": str(run_dir)}
