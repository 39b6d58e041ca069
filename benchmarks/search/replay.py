"""A sweep of ``iaa-cli tune`` replayed against the table of learning curves, in simulated time.

The replay drives the project's own search stack as Ray Tune drives it, without Ray and without
training: the searcher ``tune`` builds (:func:`iaa.platform.sweeps.search.search_algorithm.searcher`, a
Ray Tune ``Searcher`` over an Optuna study, here in memory) proposes each trial; the preset's
ASHA (:func:`iaa.platform.sweeps.search.search_algorithm.scheduler`, Ray's own ``ASHAScheduler``) sees
every check and stops trials; a trial's checks are read from the table (:mod:`table`) instead of
trained. A trial reports exactly what the training loop reports: ``valid_acc`` (ASHA's metric),
``best_valid_acc`` (the searcher's), ``checks`` (ASHA's clock) and, on its last check,
``stop_reason``.

Time is simulated from the table's recorded cost in training examples, not seconds (seconds are
noisy): ``concurrency`` trials run at once, each check takes as long as the examples it trained,
and events are handled in time order (ties by trial number). Compute is the examples trained,
in epochs of the table's training split; wall time is the schedule's makespan in the same unit.
Given each configuration's ``price`` (its cost per example relative to the grid's mean, as
``price.py`` measures it), an example of a configuration costs its price instead: compute is
then in epochs of the grid's average configuration, and the whole grid costs what it did.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import table as curves_table

TRIAL_ID = "t{:05d}"


@dataclass(frozen=True)
class Strategy:
    """How a sweep searches: a sampler for the study (None: the exhaustive grid, every
    configuration in a seeded order) and whether ASHA stops trials."""

    name: str
    sampler: Callable[[Any, int], Any] | None
    asha: bool = True
    grace_period: int | None = None           # None: the preset's
    reduction_factor: float | None = None
    max_trials: int | None = None             # a cap on the long sweep (a sampler whose cost grows fast)


@dataclass
class Trace:
    """What one replayed sweep did."""

    proposals: list[dict[str, Any]] = field(default_factory=list)     # each trial's configuration
    stops: list[tuple[str, int]] = field(default_factory=list)         # (trial, check) that ASHA stopped
    points: list[tuple[float, float, float]] = field(default_factory=list)   # (compute, wall, best so far)
    seconds: float = 0.0                                               # the table's training seconds spent
    study: Any = None                                                  # the searcher's Optuna study (in memory)

    def best(self) -> float:
        return self.points[-1][2] if self.points else float("nan")


class _Trial:
    """What Ray's ASHA reads of a trial."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def every(table: curves_table.CurveTable, k: int) -> curves_table.CurveTable:
    """``table`` as if validation ran ``k`` times less often: each curve keeps every ``k``-th
    check (its last included where ``k`` divides the checks), numbered anew, its best so far
    over the checks kept."""
    from dataclasses import replace

    def thinned(curve: list[curves_table.Check]) -> list[curves_table.Check]:
        kept = [c for c in curve if c.check % k == 0]
        best = np.maximum.accumulate([c.valid_acc for c in kept])
        return [replace(c, check=i, best_valid_acc=float(b)) for i, (c, b) in enumerate(zip(kept, best), 1)]

    return replace(table, curves={key: thinned(curve) for key, curve in table.curves.items()})


def shown(path: Path) -> str:
    """``path`` as the figures name it: relative to the repository where it lies inside it."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def load(path: Any) -> tuple[curves_table.CurveTable, Any]:
    """The table at ``path`` and its grid as the search space ``tune`` searches, Optuna quiet."""
    import warnings

    import optuna

    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.config.search_space import parse

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    table = curves_table.load(path)
    return table, parse(table.grid, JobConfig())


def _grid_order(table: curves_table.CurveTable, seed: int) -> list[dict[str, Any]]:
    keys = sorted(table.curves)
    order = np.random.default_rng(seed).permutation(len(keys))
    return [dict(zip(table.grid, keys[i])) for i in order]


def replay(table: curves_table.CurveTable, space: Any, strategy: Strategy, seed: int, preset: Any,
           num_trials: int, concurrency: int, warm_start: Any = None, given: Sequence[Mapping[str, Any]] = (),
           price: Mapping[curves_table.Key, float] | None = None) -> Trace:
    """One sweep of ``num_trials`` trials (``preset``: a ``TunePreset`` for ASHA's schedule);
    ``warm_start``: an earlier replay's study, whose trials begin this one's as ``tune
    --warm-start`` carries them; ``given``: configurations its first trials run, as ``tune
    --try-first`` gives them; ``price``: each configuration's cost per example (None: 1 each)."""
    from dataclasses import replace

    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.search.distinct_search import StudySearch

    checks = len(next(iter(table.curves.values())))
    epoch_examples = next(iter(table.curves.values()))[-1].examples / next(iter(table.curves.values()))[-1].epoch
    max_t = checks + 1                                   # as tune's max_checks: the loop ends first
    asha = None
    if strategy.asha:
        tuned = replace(preset, grace_period=strategy.grace_period or preset.grace_period,
                        reduction_factor=strategy.reduction_factor or preset.reduction_factor)
        np.random.seed(seed)                             # ASHA draws a bracket per trial (one bracket here)
        asha = search.scheduler(tuned, max_t)
    if strategy.sampler is None:
        queue = _grid_order(table, seed)[:num_trials]
        searcher = None
    else:
        searcher = StudySearch(search.to_optuna(space), strategy.sampler(space, seed), None, given=given)
        if warm_start is not None:
            from iaa.jobs.ports import WarmStart
            from iaa.platform.sweeps.studies.carried_trials import carry

            carry(warm_start, searcher.study, search.to_optuna(space),
                  WarmStart(sweep="earlier", study_storage="", study_name="", filled={}, fixed={}))

    trace = Trace(study=searcher.study if searcher is not None else None)
    events: list[tuple[float, int, int]] = []            # (time, trial number, check)
    configs: dict[int, dict[str, Any]] = {}
    compute = best = 0.0
    started = 0

    def cost(config: Mapping[str, Any], examples: int) -> float:
        """Epochs (of the grid's average configuration, given prices) that ``examples`` of ``config`` cost."""
        return examples / epoch_examples * (price[table.key(config)] if price is not None else 1.0)

    def start(now: float) -> None:
        nonlocal started
        number = started
        config = queue[number] if searcher is None else searcher.suggest(TRIAL_ID.format(number))
        config = {name: config[name] for name in table.grid}
        started += 1
        configs[number] = config
        trace.proposals.append(config)
        if asha is not None:
            asha.on_trial_add(None, _Trial(TRIAL_ID.format(number)))
        first = table.curve(config)[0]
        heapq.heappush(events, (now + cost(config, first.examples), number, 1))

    while started < min(concurrency, num_trials):
        start(0.0)
    while events:
        now, number, k = heapq.heappop(events)
        trial_id = TRIAL_ID.format(number)
        curve = table.curve(configs[number])
        check = curve[k - 1]
        done = cost(configs[number], check.examples - (curve[k - 2].examples if k > 1 else 0))
        compute += done
        trace.seconds += check.seconds - (curve[k - 2].seconds if k > 1 else 0.0)
        best = max(best, check.valid_acc)
        trace.points.append((compute, now, best))
        last = k == len(curve)
        result = {"valid_acc": check.valid_acc, "best_valid_acc": check.best_valid_acc, "checks": k,
                  "training_iteration": k, "stop_reason": "max-epochs" if last else ""}
        stopped = False
        # as the sweep's scheduler does (iaa.platform.sweeps.search.asha): a given configuration's trial
        # runs to its end, its checks left out of ASHA
        scheduled = asha is not None and (searcher is None or trial_id not in searcher.given_ids)
        if scheduled:
            stopped = asha.on_trial_result(None, _Trial(trial_id), result) == "STOP" and not last
        if searcher is not None:
            searcher.on_trial_result(trial_id, result)
        if stopped or last:
            if stopped:
                trace.stops.append((trial_id, k))
            if scheduled and last:
                asha.on_trial_complete(None, _Trial(trial_id), result)
            if searcher is not None:
                searcher.on_trial_complete(trial_id, result)
            if started < num_trials:
                start(now)
        else:
            nxt = curve[k]
            heapq.heappush(events, (now + cost(configs[number], nxt.examples - check.examples), number, k + 1))
    return trace


def summary(regret: Sequence[float], epochs: Sequence[float]) -> dict[str, float]:
    """The figures of replayed sweeps: ``regret`` (points below the table's best) and ``epochs``, one per seed."""
    points = np.asarray(regret, dtype=float)
    return {"regret_median": float(np.median(points)), "regret_q75": float(np.percentile(points, 75)),
            "seeds_within_0.5": float(np.mean(points <= 0.5 + 1e-9)),
            "seeds_within_1.0": float(np.mean(points <= 1.0 + 1e-9)), "epochs_median": float(np.median(epochs))}


def cells(by: Mapping[int, Mapping[str, float]], sizes: Sequence[int]) -> str:
    """A Markdown row's cells of :func:`summary` figures, each as ``a / b / c`` over ``sizes``."""
    def cell(key: str, fmt: str) -> str:
        return " / ".join(format(by[n][key] * (100 if key.startswith("seeds") else 1), fmt) for n in sizes)
    return (f"{cell('regret_median', '.2f')} | {cell('regret_q75', '.2f')} | {cell('seeds_within_0.5', '.0f')}% | "
            f"{cell('seeds_within_1.0', '.0f')}% | {cell('epochs_median', '.1f')}")


def report(out: Mapping[str, Any], path: Path, title: str, columns: Sequence[str],
           rows: Sequence[Sequence[str]]) -> None:
    """Write ``out`` as JSON to ``path``, then print ``title`` and a Markdown table of ``columns``
    (its header) and ``rows`` (each a row's cells; :func:`cells` gives several at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1), encoding="utf-8")
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row) + " |")
