"""The ensemble's tracked run, as one reads it in the runs view: opened when the job starts (so
its duration is the job's and the members it trains nest under it), its figures without float
noise, one ``members.json`` naming the members, and the sweep's parent counting its ensembles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.files import atomic_write_text
from iaa.jobs.ensemble.members import Member
from iaa.jobs.evaluation import model_card, uncertainty
from iaa.jobs.evaluation.ensembling.averaging import Averaged
from iaa.jobs.evaluation.predictor import MODEL_CODE, SUMMARY
from iaa.jobs.ports import ModelCard, ModelFiles, TrackedRun, Tracker
from iaa.jobs.sweeps.record import SweepRecord

MEMBERS_FILE = "members.json"   # one row per candidate member, logged as an artifact
METRIC_DIGITS = 10              # accuracies are counts over counts: 10 decimals keep them whole
SHOWN_DIGITS = 4                # figures in params and tags, as the console prints them
FIGURES = ("valid_acc", "test_acc", "mean_member_valid_acc", "mean_member_test_acc", "mean_selected_valid_acc",
           "mean_selected_test_acc")


def run_tags(dataset: str, select: str, out_dir: Path, sweep: SweepRecord | None) -> dict[str, str]:
    """The ensemble run's tags: its kind and, for a sweep's ensemble, the sweep's name and parent run."""
    tags = {"kind": "ensemble", "dataset": dataset, "select": select, "ensemble_dir": str(out_dir)}
    if sweep is not None:
        tags.update({"sweep": sweep.name, "sweep_parent_run_id": sweep.parent_run_id or ""})
    return tags


def stopped_run(tracker: Tracker, experiment: str, tags: Mapping[str, str]) -> str | None:
    """The run of this ensemble (its ``tags``, which name its folder) that a stop left KILLED
    before it logged its settings; None where there is none. Running the command again continues
    it, so the members it trained before the stop stay nested under the ensemble's one run."""
    for record in tracker.find_runs(experiment, tags, status="KILLED"):
        if not record.params:
            return record.run_id
    return None


def accuracy_sizes(result: Averaged) -> dict[str, float | int | None]:
    """``valid_acc_n`` and ``valid_acc_stderr`` (the valid split's size and the standard error of
    the ensemble's accuracy there), and the test's where it has one, as its result names them."""
    sizes = uncertainty.fields("valid_acc", result.valid_acc, result.examples.get("valid", 0))
    if result.test_acc is not None:
        sizes.update(uncertainty.fields("test_acc", result.test_acc, result.examples.get("test", 0)))
    return sizes


def metrics(result: Averaged) -> dict[str, float]:
    """The ensemble's figures as metrics: rounded to :data:`METRIC_DIGITS` (a mean of accuracies
    logs 0.9623, not 0.9622999999999999), ``best_valid_acc`` (the ensemble's valid accuracy, the
    column a sweep's runs are sorted by), the standard errors of its accuracies
    (``valid_acc_stderr``, ``test_acc_stderr``), Boo(n) once, under ``boo_n_*``, the log-loss and
    calibration error of the ensemble, of its members on average and of the ensemble at its
    ``temperature`` (``valid_log_loss``, ``calibrated_test_log_loss``, ...)."""
    figures = {k: getattr(result, k) for k in FIGURES if getattr(result, k) is not None}
    figures.update({k: v for k, v in accuracy_sizes(result).items() if k.endswith("_stderr") and v is not None})
    figures["best_valid_acc"] = result.valid_acc
    figures.update({"boo_n": result.boo_n, "boo_n_valid": result.boo_valid, "temperature": result.temperature})
    figures.update({k: v for k, v in result.calibration.items() if not k.endswith("mean_confidence")})
    if result.boo_test is not None:
        figures["boo_n_test"] = result.boo_test
    return {k: round(float(v), METRIC_DIGITS) for k, v in figures.items()}


def params(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every float rounded to :data:`SHOWN_DIGITS`."""
    return {k: round(v, SHOWN_DIGITS) if isinstance(v, float) else v for k, v in settings.items()}


def member_rows(members: Sequence[Member], result: Averaged) -> list[dict[str, Any]]:
    """One row per candidate member: its label, seed, run, checkpoint, source, accuracies and
    whether the selection kept it."""
    chosen = set(result.selected)
    tests = result.member_test_acc or [None] * len(members)
    return [{"member": i, "label": m.label, "seed": m.config.train.seed, "run_id": m.mlflow_run_id,
             "checkpoint": str(m.checkpoint), "source": m.source, "selected": i in chosen,
             "valid_acc": round(float(valid), METRIC_DIGITS),
             "test_acc": None if test is None else round(float(test), METRIC_DIGITS)}
            for i, (m, valid, test) in enumerate(zip(members, result.member_valid_acc, tests))]


def card(summary: Mapping[str, Any], members: Sequence[Member], result: Averaged, experiment: str) -> ModelCard:
    """What the ensemble's registered model says of itself: an ensemble of its selected members'
    model kind on its dataset, its valid accuracy with its interval, its members, and its run (in
    ``experiment``) and folder. ``summary`` is its record (``name``, ``dataset``, ``ensemble_dir``,
    ``mlflow_run_id``, and ``baseline_valid_acc`` shown beside its accuracy)."""
    kinds = sorted({members[i].config.model.kind for i in result.selected}) or ["?"]
    calibrated = f", scaled by temperature {result.temperature:.4g}" if result.temperature != 1.0 else ""
    return model_card.card(kind="ensemble", model=",".join(kinds), dataset=summary["dataset"],
                           valid_acc=result.valid_acc, n=result.examples.get("valid", 0),
                           baseline=summary.get("baseline_valid_acc"),
                           origin=f"The ensemble {summary['name']}: {len(result.selected)} of {len(members)} members "
                                  f"(selection {result.select}) averaged{calibrated}; run {summary['mlflow_run_id']} "
                                  f"of experiment {experiment}; its folder is `{Path(summary['ensemble_dir']).resolve()}`.")


def record(run: TrackedRun, tracker: Tracker, settings: Mapping[str, Any], members: Sequence[Member],
           result: Averaged, out_dir: Path, prepared: Path, register: str | None,
           about: ModelCard | None = None, *, baselines: Mapping[str, float] | None = None) -> str | None:
    """Log the finished ensemble on its run: params (with the splits' sizes, ``valid_acc_n`` and
    ``test_acc_n``), metrics (with the most-frequent-candidate ``baselines``: ``baseline_valid_acc``,
    ``baseline_test_acc``), ``members.json``, the per-member accuracies (one step per member), its
    files, its data and its model (the selected members, averaged; ``about`` describes its
    registered version). Returns the model's URI."""
    run.log_params({**params(settings), **{k: v for k, v in accuracy_sizes(result).items() if k.endswith("_n")}})
    run.log_metrics({**metrics(result), **{k: round(float(v), METRIC_DIGITS) for k, v in (baselines or {}).items()}})
    for i, acc in enumerate(result.member_valid_acc):
        test = result.member_test_acc[i] if result.member_test_acc is not None else None
        run.log_metrics({"member_valid_acc": round(float(acc), METRIC_DIGITS),
                         **({} if test is None else {"member_test_acc": round(float(test), METRIC_DIGITS)})}, step=i)
    table = Path(out_dir) / MEMBERS_FILE
    atomic_write_text(table, json.dumps(member_rows(members, result), indent=1))
    for path in (Path(result.predictions), Path(result.table_path), table, Path(out_dir) / SUMMARY):
        run.log_artifact(path)
    run.log_dataset(prepared, context="eval")
    files = ModelFiles(tuple(Path(m) for m in result.members), prepared, result.temperature)
    return tracker.log_model(run, files, register, code=MODEL_CODE, card=about)


def count_on_sweep(tracker: Tracker, experiment: str, sweep: SweepRecord) -> None:
    """Tag the sweep's parent run with how many finished ensembles nest under it (``ensembles``),
    beside its ``trials``; a courtesy, so a failing store only leaves the count behind."""
    parent = sweep.parent_run_id
    if not parent:
        return
    try:
        done = [r for r in tracker.find_runs(experiment, {"kind": "ensemble"}, status="FINISHED")
                if r.parent_run_id == parent]
        tracker.attach(parent).set_tags({"ensembles": str(len(done))})
    except tracker.transient_errors:
        pass
