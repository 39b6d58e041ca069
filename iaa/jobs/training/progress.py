"""Where a training run is, and what its validation checks decided.

:class:`Progress` is the loop's whole state apart from the model, the optimiser and the RNG. It
owns the three decisions the paper's "Training Details" make at each check: keep the best score,
decay the learning rate when validation accuracy did not improve, and stop after ``patience``
such checks in a row. It is a plain dataclass of numbers, saved in every checkpoint
(``asdict``), so each decision is unit-tested without a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping


@dataclass
class Progress:
    """Loop state saved in every checkpoint.

    Attributes:
        epoch: the current epoch (0-based). batch: batches done in it. step: batches done in all.
        checks: validation checks done. best_valid_acc: the best check's accuracy (-1 before any).
        best_step: the step of that check. bad_checks: consecutive checks without improvement.
        lr_scale: the learning rate's multiplier, ``lr_decay ** (checks that did not improve)``.
        elapsed_s: training wall time, summed across resumptions.
        stop_reason: "" while running, else max-epochs | max-time | early-stopped.
    """

    epoch: int = 0
    batch: int = 0
    step: int = 0
    checks: int = 0
    best_valid_acc: float = -1.0
    best_step: int = 0
    bad_checks: int = 0
    lr_scale: float = 1.0
    elapsed_s: float = 0.0
    stop_reason: str = ""

    def finish_batch(self, elapsed_s: float) -> None:
        """One more training batch done; ``elapsed_s`` is the run's training time so far."""
        self.batch += 1
        self.step += 1
        self.elapsed_s = elapsed_s

    def finish_epoch(self) -> None:
        self.epoch += 1
        self.batch = 0

    def stop(self, reason: str) -> None:
        """Stop training for ``reason``; the first reason given is kept."""
        self.stop_reason = self.stop_reason or reason

    def resume(self, *, max_steps: int, max_seconds: float) -> None:
        """Continue a resumed run whose budget was extended: forget a budget stop that the new
        budget (``max_seconds`` 0: none) no longer imposes. Early stopping stays final."""
        if self.stop_reason == "max-epochs" and self.step < max_steps:
            self.stop_reason = ""
        elif self.stop_reason == "max-time" and (max_seconds <= 0 or self.elapsed_s < max_seconds):
            self.stop_reason = ""

    def record_check(self, valid_acc: float, *, lr_decay: float, patience: int, decides: bool = True) -> bool:
        """Count a validation check; returns whether it improved on the best score.

        A check that does not improve multiplies ``lr_scale`` by ``lr_decay`` and, the
        ``patience``-th time in a row, stops the run ("early-stopped"). A tie is no improvement:
        the best checkpoint stays the first one that reached the score. A check that only closes a
        budget between two scheduled checks (``decides`` False) keeps a better score but decides
        nothing: no step follows it, and a resume that extends the budget goes on as a run given
        the longer budget from the start would.
        """
        self.checks += 1
        improved = valid_acc > self.best_valid_acc
        if improved:
            self.best_valid_acc, self.best_step, self.bad_checks = valid_acc, self.step, 0
        elif not decides:
            return False
        else:
            self.bad_checks += 1
            self.lr_scale *= lr_decay
        if self.bad_checks >= patience:
            self.stop("early-stopped")
        return improved

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any], *, lr_scale: float = 1.0) -> "Progress":
        """The progress of a checkpoint. ``lr_scale`` is used when the checkpoint predates that
        field (its optimiser's learning rate over the configured one)."""
        known = {f.name for f in fields(cls)}
        return cls(**{"lr_scale": lr_scale, **{k: v for k, v in saved.items() if k in known}})
