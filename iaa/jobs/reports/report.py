"""``iaa-cli report``: learning curves of tracked runs, read back from the MLflow store.

Every point of the figure is a value of the runs' metric history (``valid_acc`` by default,
logged at every validation check with the optimizer step as its MLflow step), never a number
copied by hand. The x axis is one of:

- ``examples``: training examples seen, ``step x train.batch_size x workers``. Runs log the step,
  not the examples, so the count is derived from the run's ``train.batch_size`` parameter and its
  ``workers`` tag (a run trained in one process, tag 0 or absent, counts as one worker).
- ``steps``: the optimizer step the value was logged at.
- ``seconds``: the value's MLflow timestamp minus the run's start time (wall clock; a resumed
  run's pause counts too).

A sweep is drawn by its experiment (every trial's child run has the history; the parent, which
has none, is left out) or by ``--runs PARENT_ID``, which stands for the parent's children.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from iaa.errors import IaaError
from iaa.files import atomic_path
from iaa.jobs.evaluation.result import Result
from iaa.jobs.ports import MetricPoint, RunRecord, Tracker
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir

X_AXES = ("examples", "steps", "seconds")
X_LABELS = {"examples": "training examples seen", "steps": "optimizer steps", "seconds": "wall-clock seconds since run start"}


@dataclass(frozen=True)
class Curve:
    """One run's metric against the chosen x; ``steps`` are the MLflow steps of the points;
    ``sweep``: the sweep whose trial the run is ("" for a run of its own)."""

    run_id: str
    name: str
    model: str
    steps: tuple[int, ...]
    x: tuple[float, ...]
    y: tuple[float, ...]
    sweep: str = ""


def select_runs(tracker: Tracker, experiment: str, run_ids: Sequence[str] = ()) -> list[RunRecord]:
    """The runs of ``experiment`` to draw: all, or those of ``run_ids`` (a parent stands for its children)."""
    uri = tracker.uri
    records = tracker.experiment_records(experiment)
    if records is None:
        names = ", ".join(tracker.experiment_names()) or "none"
        raise IaaError(f"the MLflow store {uri} has no experiment {experiment!r} (it has: {names}); "
                       "train runs go to train-DATASET, sweeps to tune-DATASET, distilled students to distill-ENSEMBLE")
    if not run_ids:
        return records
    by_id = {r.run_id: r for r in records}
    chosen: dict[str, RunRecord] = {}
    for run_id in run_ids:
        if run_id not in by_id:
            raise IaaError(f"run {run_id} is not in experiment {experiment!r} of {uri}; "
                           "list its runs with `mlflow ui` or drop `run_ids` to draw them all")
        children = [r for r in records if r.parent_run_id == run_id]
        for record in children or [by_id[run_id]]:
            chosen[record.run_id] = record
    return list(chosen.values())


def x_values(record: RunRecord, points: Sequence[MetricPoint], x: str) -> list[float]:
    """The x coordinate of each point (see the module docstring for each axis)."""
    if x == "steps":
        return [float(p.step) for p in points]
    if x == "seconds":
        return [(p.timestamp_ms - record.start_ms) / 1000.0 for p in points]
    try:
        batch = int(record.params["train.batch_size"])
    except (KeyError, ValueError) as err:
        raise IaaError(f"run {record.run_id} ({record.name}) has no train.batch_size parameter, so its examples "
                       "seen are unknown; use `x_axis` steps") from err
    workers = max(1, int(record.tags.get("workers", "0") or 0))
    return [float(p.step * batch * workers) for p in points]


def curve(tracker: Tracker, record: RunRecord, metric: str, x: str) -> Curve | None:
    """The run's curve, one point per step (a resumed run that logged a step twice keeps the later value)."""
    by_step: dict[int, MetricPoint] = {}
    for point in tracker.metric_history(record.run_id, metric):
        kept = by_step.get(point.step)
        if kept is None or point.timestamp_ms >= kept.timestamp_ms:
            by_step[point.step] = point
    if not by_step:
        return None
    points = [by_step[s] for s in sorted(by_step)]
    return Curve(record.run_id, record.name, record.tags.get("model", ""), tuple(p.step for p in points),
                 tuple(x_values(record, points, x)), tuple(p.value for p in points),
                 record.tags.get("sweep", "") if record.parent_run_id else "")


def labels(curves: Sequence[Curve]) -> list[str]:
    """Each curve's legend entry: its run's name (and model, where the name does not say it), after
    its sweep's name where the curves come from more than one sweep (each numbers its trials from
    ``trial-0000``), with the run's id where two curves would still read the same (a folder trained
    twice, or runs of two work folders that share a store)."""
    named = [c.name if not c.model or c.model in c.name else f"{c.name} ({c.model})" for c in curves]
    if len({c.sweep for c in curves if c.sweep}) > 1:
        named = [f"{c.sweep} {label}" if c.sweep else label for c, label in zip(curves, named)]
    return [f"{label} [{c.run_id[:8]}]" if named.count(label) > 1 else label for c, label in zip(curves, named)]


def draw(curves: Sequence[Curve], out: Path, *, metric: str, x: str, title: str,
         baseline: float | None = None, xlabel: str | None = None, steps: bool = False,
         marks: Sequence[tuple[float, str]] = ()) -> Path:
    """A PNG of the curves (and the baseline as a dashed line), written atomically.

    ``steps`` draws each curve as a staircase (a best-so-far value holds until the next point);
    ``marks`` are more horizontal lines, as (y, label).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for c, label in zip(curves, labels(curves)):
        ax.plot(c.x, c.y, marker="o", markersize=3, linewidth=1.5, label=label,
                drawstyle="steps-post" if steps else "default")
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label=f"most frequent candidate ({baseline:.3f})")
    for y, text in marks:
        ax.axhline(y, color="black", linestyle=":", linewidth=1, label=text)
    ax.set_xlabel(xlabel or X_LABELS[x])
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(out)


@dataclass(frozen=True, kw_only=True)
class ReportResult(Result):
    """``iaa-cli report``: the figure drawn and its data, run by run (``skipped``: the runs that
    logged no value of the metric, and against examples those that trained nothing of their own,
    as an ensemble's run)."""

    experiment: str
    tracking_uri: str
    metric: str
    x: str                              # the x axis: one of X_AXES
    out: str                            # the PNG
    baseline: float | None
    runs: tuple[Curve, ...]
    skipped: tuple[str, ...]


def run(experiment: str, out: Path, open_tracker: Callable[[str], Tracker], *, run_ids: Sequence[str] = (),
        metric: str = "valid_acc", x: str = "examples", baseline: float | None = None,
        baseline_data: Path | None = None, workdir: Path = Path(DEFAULT_WORKDIR),
        tracking_uri: str | None = None) -> ReportResult:
    """Draw ``metric`` against ``x`` for the selected runs of the store ``open_tracker(uri)``;
    returns the plotted data, run by run.

    ``baseline_data``: a prepared folder whose valid split's most-frequent-candidate accuracy is
    drawn as the baseline. ``out`` must be a ``.png`` that replaces neither the tracking database
    nor a file of ``baseline_data``.
    """
    from iaa.jobs.workdir import outputs

    if x not in X_AXES:
        raise IaaError(f"`x_axis` must be one of {', '.join(X_AXES)}, got {x!r}")
    outputs.check_file_output(out, suffixes=(".png",), what="a PNG image", inputs={
        "a file of the prepared data": outputs.data_files(baseline_data),
        "the tracking database": Workdir(workdir).tracking_db(tracking_uri)})
    if baseline_data is not None:
        from iaa.jobs.evaluation import frequency

        baseline = frequency.run(baseline_data, "valid").accuracy
    tracker = open_tracker(Workdir(workdir).tracking_uri(tracking_uri))
    uri = tracker.uri
    curves, skipped = [], []
    for record in select_runs(tracker, experiment, tuple(dict.fromkeys(run_ids))):
        if x == "examples" and record.run_id not in run_ids and "train.batch_size" not in record.params:
            skipped.append(record.run_id)           # no batches of its own: an ensemble's, a sweep's parent
            continue
        c = curve(tracker, record, metric, x)
        if c is None:
            skipped.append(record.run_id)
        else:
            curves.append(c)
    if not curves:
        raise IaaError(f"no run of experiment {experiment!r} in {uri} logged the metric {metric!r}; "
                       "train runs log valid_acc at every check")
    draw(curves, out, metric=metric, x=x, title=experiment, baseline=baseline)
    return ReportResult(experiment=experiment, tracking_uri=uri, metric=metric, x=x, out=str(Path(out).resolve()), baseline=baseline,
                        runs=tuple(curves), skipped=tuple(skipped))


# Logged metrics where less is better (train_loss, valid_loss, calibration_error, train_seconds, resident_mb ...)
LOWER_IS_BETTER = ("loss", "error", "seconds", "_mb")


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in LOWER_IS_BETTER)


def describe(result: ReportResult) -> str:
    """What ``iaa-cli report`` prints: each run's points, last and best values (the lowest of a
    loss, an error or a cost), then the figure."""
    metric, x = result.metric, result.x
    pick = min if lower_is_better(metric) else max
    lines = []
    for c, label in zip(result.runs, labels(result.runs)):
        best = pick(range(len(c.y)), key=lambda i: c.y[i])
        lines.append(f"{label}: {len(c.y)} points; last {metric} {c.y[-1]:.4f} at {x} {_at(c.x[-1])}; "
                     f"best {c.y[best]:.4f} at {x} {_at(c.x[best])}")
    return "\n".join([*lines, f"figure: {result.out}"])


def _at(value: float) -> str:
    """An x value as the console writes numbers: ``29,984`` examples, ``12.5`` seconds."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.4g}"
