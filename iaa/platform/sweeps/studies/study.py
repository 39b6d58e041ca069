"""A sweep's Optuna study read back: parameter importances, parallel coordinates, and each
trial's checks with ASHA's stops marked (Optuna's matplotlib figures and ``optuna.importance``).

Two importances are given. The report's own is fANOVA (seeded) over every scored trial.
optuna-dashboard shows PED-ANOVA instead (its ``_importance`` module:
``PedAnovaImportanceEvaluator()`` with its defaults, over COMPLETE trials, the objective negated
for a maximised study); :func:`dashboard_importances` computes exactly that, so the report can
show the dashboard's numbers beside its own. PED-ANOVA compares the best 10% of the trials
with all of them: on a sweep of a few trials that is one trial, and its ranking is mostly ties.

ASHA stops most trials of a sweep, and Optuna's importances and parallel coordinates look at
COMPLETE trials only. So both are drawn from a copy of the study in which an ASHA-stopped
(PRUNED) trial counts with the best check it reached, the value TPE would have learnt had it
finished then; the intermediate values come from the study as it is.

A sweep that began with an earlier sweep's trials (a warm start) holds them in its study too:
the importances and parallel coordinates count them (the sampler learnt from them), the checks
and the history show the sweep's own trials, the history with the best value carried.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

from iaa.errors import IaaError
from iaa.jobs.config.exploration import RANKED_FROM, separable
from iaa.jobs.ports import TIME_BUDGET, BestTrial, HistoryPoint, StudyAnalysis, StudyTrial, trial_name
from iaa.platform.sweeps.studies.given import TRIED_FIRST, is_given
from iaa.platform.sweeps.studies.carried_trials import CARRIED_FROM, scored_value

FIGURES = ("importances", "parallel_coordinates", "intermediate_values", "history")
RANKING_FIGURES = ("importances", "parallel_coordinates")   # drawn from RANKED_FROM scored trials on
OBJECTIVE = "best valid_acc"       # what each trial is valued by (its best check)
_SPAN_SLACK_S = 1.0                # a run's span is rounded: a trial's end this close to it is inside


def named(trial: Any) -> str:
    """The trial's one name, as the console, its MLflow run and ``sweep.json`` call it: the
    ``trial_name`` it was asked with (a trial a resume continues keeps the name of the one it
    continues, under a new number in the study), else the name of its number."""
    return str(trial.user_attrs.get("trial_name") or trial_name(trial.number))


def _scored_copy(study: Any) -> Any:
    """An in-memory study of the finished and ASHA-stopped trials, each valued by its best check."""
    import optuna
    from optuna.trial import TrialState, create_trial

    copy = optuna.create_study(direction=study.direction)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        value = t.value if t.state == TrialState.COMPLETE else max(t.intermediate_values.values(), default=None)
        if value is not None:
            copy.add_trial(create_trial(params=t.params, distributions=t.distributions, value=value,
                                        intermediate_values=t.intermediate_values, user_attrs=t.user_attrs))
    return copy


def analyze(storage_url: str, study_name: str, out_dir: Path,
            spans: Sequence[tuple[float, float]] = ()) -> StudyAnalysis:
    """Draw the figures of study ``study_name`` into ``out_dir``; return their paths and numbers.
    ``spans``: the sweep's runs (start in Unix seconds, seconds), for the history's running time.

    Importances and parallel coordinates compare trials: with fewer than
    :data:`~iaa.jobs.config.exploration.RANKED_FROM` scored trials there are none (``importances``
    is empty and those two figures are not drawn), and the checks per trial and the history are
    drawn all the same. Importances need one scored trial more than the parameters that varied
    (:func:`~iaa.jobs.config.exploration.separable`); with fewer, the parallel coordinates show
    the trials and no importances are given."""
    study = _load(storage_url, study_name)
    scored = _scored_copy(study)
    evaluator = _fanova() if _apart(scored) else None      # None: no importances
    importances = _importances(scored, evaluator) if evaluator is not None else {}
    history = best_so_far(study, spans)
    figures = _draw(study, scored, history, out_dir, evaluator=evaluator)
    return _analysis(study, scored, storage_url, importances, history, figures)


def _load(storage_url: str, study_name: str) -> Any:
    """The study ``study_name`` of the storage ``storage_url``; IaaError where it holds none."""
    import optuna

    from iaa.platform.sweeps.studies.study_store import study_storage

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        return optuna.load_study(study_name=study_name, storage=study_storage(storage_url))
    except KeyError as err:
        raise IaaError(f"no Optuna study {study_name!r} in {storage_url}: the sweep ran before studies were kept, "
                       "or `optuna_storage` pointed elsewhere") from err


def _fanova() -> Any:
    """fANOVA, seeded: Optuna 5's default (PED-ANOVA) needs many more trials than a sweep has."""
    import optuna

    return optuna.importance.FanovaImportanceEvaluator(seed=0)


def _apart(scored: Any) -> bool:
    """Whether the ``scored`` study's trials can tell the effects of the parameters that varied apart."""
    params = [t.params for t in scored.trials]
    return separable(params, sorted({name for p in params for name in p}))


def _importances(scored: Any, evaluator: Any) -> dict[str, float]:
    """Each parameter's importance over the ``scored`` study, highest first."""
    import optuna

    return {k: float(v) for k, v in optuna.importance.get_param_importances(scored, evaluator=evaluator).items()}


def _draw(study: Any, scored: Any, history: tuple[HistoryPoint, ...], out_dir: Path, *,
          evaluator: Any) -> dict[str, Path]:
    """Draw the figures of ``study`` into ``out_dir``: the importances by ``evaluator`` (None:
    none, the trials cannot tell the parameters apart) and the parallel coordinates from
    :data:`~iaa.jobs.config.exploration.RANKED_FROM` trials of ``scored`` (its copy of scored
    trials), the checks per trial and the ``history``. Returns their paths, by name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    ranked = len(scored.trials) >= RANKED_FROM       # importances and parallel coordinates compare trials
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = [name for name in FIGURES
             if (evaluator is not None if name == "importances" else ranked or name not in RANKING_FIGURES)]
    paths = {name: out_dir / f"{name}.png" for name in drawn}
    with warnings.catch_warnings():                # the matplotlib figures are "experimental"
        warnings.simplefilter("ignore")
        if evaluator is not None:
            vis.plot_param_importances(scored, evaluator=evaluator, target_name=OBJECTIVE)
            _save(plt, paths["importances"])
        if ranked:
            _readable_lines(vis.plot_parallel_coordinate(scored, target_name=OBJECTIVE))
            _save(plt, paths["parallel_coordinates"])
        _plot_checks(study)
        _save(plt, paths["intermediate_values"])
        _plot_history(plt, history, [t for t in scored.trials if _carried(t)])
        _save(plt, paths["history"])
    return paths


def _trial(trial: Any) -> StudyTrial:
    """A trial of the study as the report reads it."""
    from optuna.trial import TrialState

    return StudyTrial(number=trial.number, name=named(trial), state=trial.state.name, params=trial.params,
                      value=trial.value,
                      intermediate_values={int(k): v for k, v in sorted(trial.intermediate_values.items())},
                      stopped_by_asha=trial.state == TrialState.PRUNED and not _cut(trial),
                      stopped_by_time_budget=_cut(trial),
                      carried_from=trial.user_attrs[CARRIED_FROM] if _carried(trial) else None,
                      tried_first=trial.user_attrs[TRIED_FIRST] if is_given(trial) else None)


def _analysis(study: Any, scored: Any, storage_url: str, importances: dict[str, float],
              history: tuple[HistoryPoint, ...], figures: dict[str, Path]) -> StudyAnalysis:
    """The record of ``study``, ``scored`` its copy of scored trials (:func:`_scored_copy`)."""
    from optuna.trial import TrialState

    carried = [t for t in scored.trials if _carried(t)]
    return StudyAnalysis(
        study=study.study_name, storage=storage_url, importances=importances, importance_evaluator="fANOVA",
        dashboard_importances=dashboard_importances(study), scored_trials=len(scored.trials),
        complete_trials=len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
        best=BestTrial(scored.best_trial.params, scored.best_value) if scored.trials else None,
        history=history, carried_trials=len(carried), carried_best=max(map(scored_value, carried), default=None),
        trials=tuple(_trial(t) for t in study.get_trials(deepcopy=False)), figures=figures)


def _carried(trial: Any) -> bool:
    """The trial ran in an earlier sweep and began this one's study (a warm start)."""
    return CARRIED_FROM in trial.user_attrs


def _cut(trial: Any) -> bool:
    """The trial was stopped where it stood by the sweep's time budget (not by ASHA)."""
    return trial.user_attrs.get("stopped_by") == TIME_BUDGET


def _last_check(trial: Any) -> tuple[int, float]:
    step = max(trial.intermediate_values)
    return step, trial.intermediate_values[step]


def _plot_checks(study: Any) -> None:
    """Each trial's validation checks (Optuna's intermediate values), labelled by trial, with the
    last check of each ASHA-stopped (PRUNED) trial marked by a cross, and of each trial the time
    budget stopped by a square."""
    from matplotlib.ticker import MaxNLocator
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as vis

    ax = vis.plot_intermediate_values(study)
    carried = {f"Trial{t.number}" for t in study.get_trials(deepcopy=False) if _carried(t)}
    for line in [line for line in ax.get_lines() if line.get_label() in carried]:
        line.remove()
    _trial_labels(ax, study)
    pruned = [t for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
              if t.intermediate_values and not _carried(t)]
    asha = [_last_check(t) for t in pruned if not _cut(t)]
    cut = [_last_check(t) for t in pruned if _cut(t)]
    if asha:
        ax.scatter(*zip(*asha), marker="x", s=80, color="crimson", zorder=5, label="stopped by ASHA")
    if cut:
        ax.scatter(*zip(*cut), marker="s", s=90, facecolors="none", edgecolors="black", linewidths=1.5, zorder=5,
                   label="stopped by the time budget")
    if pruned:
        ax.legend(loc="lower right", fontsize="small")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("validation check")
    ax.set_ylabel("valid_acc")


def best_so_far(study: Any, spans: Sequence[tuple[float, float]] = ()) -> tuple[HistoryPoint, ...]:
    """The sweep's best valid_acc as its own trials ended (not those carried from an earlier
    sweep): each finished or stopped trial (by its end, hours after the first trial started: by
    the wall clock, and by the time the sweep ran, its ``spans``, where they hold that end) with
    its value (its best check), the best of all the trials ended by then, and whether the time
    budget stopped it (``cut``)."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False) if not _carried(t)]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    if not starts:
        return ()
    first, points, best = min(starts), [], None
    origin = _ran_s(spans, first.timestamp())
    ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.datetime_complete]
    for t in sorted(ended, key=lambda t: t.datetime_complete):
        value = t.value if t.state == TrialState.COMPLETE else max(t.intermediate_values.values(), default=None)
        if value is None:
            continue
        best = value if best is None else max(best, value)
        ran = _ran_s(spans, t.datetime_complete.timestamp())
        points.append(HistoryPoint(number=t.number, name=named(t), value=value, best=best, cut=_cut(t),
                                   hours=(t.datetime_complete - first).total_seconds() / 3600,
                                   running_hours=None if ran is None or origin is None else (ran - origin) / 3600))
    return tuple(points)


def _ran_s(spans: Sequence[tuple[float, float]], at: float) -> float | None:
    """Seconds that the sweep's runs (``spans``: start, seconds) had run by ``at`` (Unix seconds);
    None where ``at`` falls in no run (a run that did not record itself, or a record without runs)."""
    if not any(start - _SPAN_SLACK_S <= at <= start + seconds + _SPAN_SLACK_S for start, seconds in spans):
        return None
    return sum(min(max(at - start, 0.0), seconds) for start, seconds in spans)


def _plot_history(plt: Any, history: tuple[HistoryPoint, ...], carried: list[Any]) -> None:
    """The best valid_acc so far against the hours the sweep ran (the wall clock where its runs
    are not all recorded), each trial's end a dot (a square where the time budget stopped it):
    how long the search took to find its best, and whether more time would likely pay; the best
    of the trials a warm start ``carried`` is a dashed line."""
    _, ax = plt.subplots()
    if carried:
        origins = ", ".join(sorted({t.user_attrs[CARRIED_FROM] for t in carried}))
        ax.axhline(max(map(scored_value, carried)), color="steelblue", linestyle="--", linewidth=1.5,
                   label=f"best of the {len(carried)} trials carried from sweep {origins}")
    running = bool(history) and all(p.running_hours is not None for p in history)
    hours = [p.running_hours if running else p.hours for p in history]
    unit, per_hour = ("hours", 1) if hours and hours[-1] >= 2 else ("minutes", 60)
    if history:
        at = [h * per_hour for h in hours]
        ax.step(at, [p.best for p in history], where="post", color="crimson", linewidth=2, label="best so far")
        ended = [(x, p.value) for x, p in zip(at, history) if not p.cut]
        cut = [(x, p.value) for x, p in zip(at, history) if p.cut]
        if ended:
            ax.scatter(*zip(*ended), s=25, color="dimgray", zorder=3, label="a trial's best check, at its end")
        if cut:
            ax.scatter(*zip(*cut), marker="s", s=60, facecolors="none", edgecolors="black", linewidths=1.5, zorder=4,
                       label="... of a trial the time budget stopped")
    if history or carried:
        ax.legend(loc="best", fontsize="small")
    ax.set_xlim(left=0)
    ax.set_xlabel(f"{unit} since the first trial started"
                  + (" (the sweep's running time: its stops left out)" if running else " (wall clock)"))
    ax.set_ylabel("valid_acc")
    ax.set_title("Best valid_acc found over time")


def _lower_is_better(study: Any) -> Any:
    """PED-ANOVA ranks what reaches low targets: a maximised objective is negated (as the dashboard does)."""
    from optuna.study import StudyDirection

    sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
    return lambda t: sign * t.value


def dashboard_importances(study: Any) -> dict[str, float]:
    """The parameter importances optuna-dashboard shows for ``study``: PED-ANOVA with its defaults
    over the COMPLETE trials, highest first, ties by name (the evaluator orders them by chance); {}
    with fewer than 2 (the dashboard shows none)."""
    import optuna
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(trials) <= 1:
        return {}
    with warnings.catch_warnings():                # "importances will be equal" on tiny studies
        warnings.simplefilter("ignore")
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), target=_lower_is_better(study))
    if not found:                                  # the dashboard's equal shares
        names = sorted({name for t in trials for name in t.distributions})
        found = {name: 1 / len(names) for name in names}
    return {k: float(v) for k, v in sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))}


def _readable_lines(ax: Any) -> None:
    """Parallel coordinates that show every trial, the best above all: Optuna colours the trials
    with "Blues", whose worst are near-white on a white background (viridis keeps each visible,
    worst dark), and puts every axis's ends on the frame, where the best trial, often at the end
    of each axis, ran along the top edge unseen. Each axis gets a margin and no grid, the best
    trial's line is drawn thicker, and the axes' tick labels sit on white over the lines."""
    from matplotlib.collections import LineCollection

    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            collection.set_cmap("viridis")
            values = collection.get_array()
            widths = [2.0] * len(collection.get_segments())
            if values is not None and len(values) == len(widths):
                widths[int(values.argmax())] = 4.0
            collection.set_linewidths(widths)
    for axis in [ax, *(other for other in ax.figure.axes if other is not ax and ax.get_shared_x_axes().joined(ax, other))]:
        low, high = axis.get_ylim()
        if axis.get_yscale() == "log":
            ratio = (high / low) ** 0.05
            axis.set_ylim(low / ratio, high * ratio)
        else:
            margin = 0.05 * (high - low)
            axis.set_ylim(low - margin, high + margin)
        axis.grid(False)                  # a twin axis's white grid would run through the trials' lines
        for label in axis.get_yticklabels():
            label.set_bbox({"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85})


def _trial_labels(ax: Any, study: Any) -> None:
    """Each trial's curve labelled by its one name and searched values (``trial-0003 lr=4e-3 T=2
    h=64``, as the console and its MLflow run name it), not "Trial3";
    one that ran a configuration given to try first says so."""
    from iaa.jobs.config.job_config import config_label

    names = {f"Trial{t.number}": " ".join(filter(None, (named(t), config_label(t.params),
                                                          "(given)" if is_given(t) else "")))
             for t in study.get_trials(deepcopy=False)}
    import matplotlib

    palette = matplotlib.colormaps["tab10"]          # Optuna's tab20 gives every other trial a pale shade
    for i, line in enumerate(line for line in ax.get_lines() if line.get_label() in names):
        line.set_label(names[line.get_label()])
        line.set_color(palette(i % 10))
    if ax.get_lines():
        ax.legend(loc="lower right", fontsize="small")


def _save(plt: Any, path: Path) -> None:
    fig = plt.gcf()
    for ax in fig.axes:
        ax.set_facecolor("white")
    fig.set_size_inches(9, 5.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
