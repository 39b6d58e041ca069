"""Does ``report --sweep``'s warning about ASHA's first comparison fire on the sweeps it should?

    python benchmarks/bench_first_comparison.py [--table benchmarks/search/curves-cbt-cn.parquet]
        [--seeds 100] [--trials 16] [--out docs/]

``report --sweep`` (:func:`iaa.jobs.reports.sweep_report.first_comparison`) ranks the trials
that ASHA let go on past its first comparison by their accuracy there and by how they ended, and
warns where the two orders correlate below ``comparison.RANKED_POORLY``: the comparison came too early. This
replays sweeps against a table of the reader's learning curves (:mod:`search.replay`: TPE and
ASHA as ``tune`` runs them, no training), hands each sweep's trials to that same function, and
counts, for each ASHA schedule, how often the warning fired and how the sweeps it fired on ended
against those it did not: the regret of the best check seen (the table's best minus it, in
points) and the share that found a configuration within 0.5 points of the table's best.

Schedules: the CBT and CNN presets' (grace 1, keep a third) on the table's checks, whose first
comparison on ``curves-cbt-cn.parquet`` comes after 8,000 examples (worse than chance there), and
after 16,000 (every second check: ``replay.every``), and grace 2 keeping a half (16,000).
Writes ``first-comparison.json`` to ``--out`` and prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "search"))
import replay  # noqa: E402

if TYPE_CHECKING:
    from iaa.jobs.ports import StudyTrial

TABLE = HERE / "search" / "curves-cbt-cn.parquet"
SCHEDULES = {   # name -> (checks thinned to every k-th, grace period, reduction factor)
    "grace 1, keep a third, first compared at check 1": (1, 1, 3.0),
    "grace 1, keep a third, every second check": (2, 1, 3.0),
    "grace 2, keep a half": (1, 2, 2.0),
}


def trials_of(trace: replay.Trace, table: Any) -> list[StudyTrial]:
    """The replayed sweep's trials as the report's analyzer lists an Optuna study's: each one's
    checks (``intermediate_values``, by check number) up to where ASHA stopped it, and the best of
    them as the value of a trial that ran to its end."""
    from iaa.jobs.ports import StudyTrial, trial_name

    stopped = dict(trace.stops)
    trials = []
    for i, config in enumerate(trace.proposals):
        curve = table.curve(config)
        last = stopped.get(replay.TRIAL_ID.format(i), len(curve))
        checks = {c.check: c.valid_acc for c in curve[:last]}
        cut = last < len(curve)
        trials.append(StudyTrial(number=i, name=trial_name(i), state="PRUNED" if cut else "COMPLETE", params=config,
                                 value=None if cut else max(checks.values(), default=None),
                                 intermediate_values=checks, stopped_by_asha=cut))
    return trials


def _outcome(regrets: list[float]) -> dict[str, Any]:
    if not regrets:
        return {"sweeps": 0}
    return {"sweeps": len(regrets), "regret_median": round(float(np.median(regrets)), 2),
            "within_0.5": round(float(np.mean(np.array(regrets) <= 0.5)), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--trials", type=int, default=16, help="trials of each sweep")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs")
    args = parser.parse_args()

    from dataclasses import replace

    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.jobs.reports import sweep_report
    from iaa.jobs.sweeps import comparison
    from iaa.platform.sweeps.search import search_algorithm as search

    full, space = replay.load(args.table)
    best = max(max(c.valid_acc for c in curve) for curve in full.curves.values())
    strategy = replay.Strategy("tpe", lambda space, seed: search.build_sampler(space, seed, "tpe"))
    out: dict[str, Any] = {"table": replay.shown(args.table), "configurations": len(full.curves), "best": best,
                           "seeds": args.seeds, "trials": args.trials, "concurrency": args.concurrency,
                           "ranked_poorly_below": comparison.RANKED_POORLY, "schedules": {}}
    for name, (k, grace, factor) in SCHEDULES.items():
        started = time.perf_counter()
        t = replay.every(full, k) if k > 1 else full
        preset = replace(TUNE_PRESETS["cnn"], grace_period=grace, reduction_factor=factor)
        first_examples = t.curves[next(iter(t.curves))][grace - 1].examples
        warned, quiet, rhos = [], [], []
        for seed in range(args.seeds):
            trace = replay.replay(t, space, strategy, seed, preset, args.trials, args.concurrency)
            compared = sweep_report.first_comparison(trials_of(trace, t), grace)
            regret = (best - trace.best()) * 100
            if compared["spearman"] is not None:
                rhos.append(compared["spearman"])
            (warned if comparison.ranked_poorly(compared) else quiet).append(regret)
        out["schedules"][name] = {
            "grace_period": grace, "reduction_factor": factor, "first_comparison_examples": first_examples,
            "spearman_median": round(float(np.median(rhos)), 3) if rhos else None,
            "warned_share": round(len(warned) / args.seeds, 3), "warned": _outcome(warned), "quiet": _outcome(quiet),
            "seconds": round(time.perf_counter() - started, 1)}
        print(f"{name}: {out['schedules'][name]['seconds']} s", file=sys.stderr, flush=True)

    def cell(row: dict[str, Any]) -> str:
        return "-" if not row["sweeps"] else (f"{row['sweeps']}: {row['regret_median']:.1f} pts, "
                                              f"{100 * row['within_0.5']:.0f}% within 0.5")
    rows = [[name, f"{r['first_comparison_examples']:,}", f"{r['spearman_median']}", f"{100 * r['warned_share']:.0f}%",
             cell(r["warned"]), cell(r["quiet"])] for name, r in out["schedules"].items()]
    replay.report(out, args.out / "first-comparison.json",
                  f"table best {best:.4f}; {args.seeds} seeds of {args.trials} trials, {args.concurrency} at a time",
                  ["ASHA", "first compared after (examples)", "Spearman, trials that went on (median)",
                   "sweeps warned", "warned: sweeps, regret (median), found the best",
                   "not warned: the same"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
