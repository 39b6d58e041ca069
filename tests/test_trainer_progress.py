"""The loop's decisions, without a model: best score, learning-rate decay, early stopping."""

from __future__ import annotations

import pytest

from iaa.jobs.training.progress import Progress


def _checks(accuracies, *, lr_decay=0.5, patience=3) -> tuple[Progress, list[bool]]:
    p = Progress()
    improved = []
    for acc in accuracies:
        p.finish_batch(elapsed_s=1.0)
        improved.append(p.record_check(acc, lr_decay=lr_decay, patience=patience))
    return p, improved


def test_the_best_score_is_the_first_check_that_reaches_it() -> None:
    p, improved = _checks([0.3, 0.5, 0.5, 0.4])
    assert improved == [True, True, False, False]                   # a tie is no improvement
    assert (p.best_valid_acc, p.best_step, p.checks) == (0.5, 2, 4)


def test_lr_decays_once_per_check_without_improvement() -> None:
    p, _ = _checks([0.3, 0.2, 0.6, 0.6, 0.1], lr_decay=0.8, patience=10)
    assert p.lr_scale == pytest.approx(0.8 ** 3)
    assert p.bad_checks == 2 and p.stop_reason == ""


def test_early_stopping_after_patience_checks_in_a_row() -> None:
    p, _ = _checks([0.5, 0.4, 0.4, 0.6, 0.1, 0.2], patience=3)
    assert p.stop_reason == ""                                       # the 0.6 reset the count
    p.record_check(0.3, lr_decay=0.5, patience=3)
    assert p.stop_reason == "early-stopped" and p.bad_checks == 3


def test_a_check_that_only_closes_a_budget_keeps_a_better_score_and_decides_nothing() -> None:
    p, _ = _checks([0.5, 0.4], lr_decay=0.5, patience=2)
    assert (p.lr_scale, p.bad_checks) == (0.5, 1)
    assert p.record_check(0.3, lr_decay=0.5, patience=2, decides=False) is False
    assert (p.lr_scale, p.bad_checks, p.stop_reason, p.checks) == (0.5, 1, "", 3)   # counted, nothing decided
    assert p.record_check(0.7, lr_decay=0.5, patience=2, decides=False) is True
    assert (p.best_valid_acc, p.bad_checks) == (0.7, 0)


def test_the_first_stop_reason_is_kept() -> None:
    p = Progress()
    p.stop("max-time")
    p.stop("max-epochs")
    p.record_check(0.0, lr_decay=0.5, patience=1)
    assert p.stop_reason == "max-time"


def test_batches_and_epochs() -> None:
    p = Progress()
    for _ in range(3):
        p.finish_batch(elapsed_s=2.5)
    p.finish_epoch()
    p.finish_batch(elapsed_s=3.0)
    assert (p.epoch, p.batch, p.step, p.elapsed_s) == (1, 1, 4, 3.0)


def test_round_trip_and_checkpoints_without_lr_scale() -> None:
    p, _ = _checks([0.5, 0.1], lr_decay=0.8)
    assert Progress.from_dict(p.to_dict()) == p
    old = {k: v for k, v in p.to_dict().items() if k != "lr_scale"}   # written before lr_scale
    assert Progress.from_dict(old, lr_scale=0.64).lr_scale == 0.64


def test_a_resumed_run_continues_only_when_its_budget_was_extended() -> None:
    p = Progress(step=10, elapsed_s=60.0, stop_reason="max-epochs")
    p.resume(max_steps=10, max_seconds=0)
    assert p.stop_reason == "max-epochs"
    p.resume(max_steps=20, max_seconds=0)
    assert p.stop_reason == ""
    p.stop("max-time")
    p.resume(max_steps=20, max_seconds=30)
    assert p.stop_reason == "max-time"
    p.resume(max_steps=20, max_seconds=120)
    assert p.stop_reason == ""
    p.stop("early-stopped")
    p.resume(max_steps=100, max_seconds=0)
    assert p.stop_reason == "early-stopped"
