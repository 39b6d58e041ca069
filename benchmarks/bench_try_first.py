"""What ``tune --try-first`` buys, and what a wrong guess costs: sweeps whose first trial runs a
given configuration, replayed against the table of the reader's learning curves
(``benchmarks/search/curves.parquet``), no training.

    python benchmarks/bench_try_first.py [--seeds 200] [--trials 4 8 16] [--grace-period G] [--out DIR]

Each sweep of ``N`` trials (each of ``--trials``) runs with the sampler and the ASHA schedule of
the CBT and CNN presets (TPE, grace 1 or ``--grace-period``, keep a third; :mod:`search.replay`), over ``--seeds``
seeds, given nothing, or given one configuration to try first: a strong guess (the table's
configuration at the 98th percentile of best accuracy), a good one (the 90th), a middling one
(the median) or a poor one (the 10th percentile). The guess's trial is one of the ``N`` and ASHA may stop it like any other.
For each it reports the regret of the best check seen (the table's best accuracy minus it, in
points; median and upper quartile over the seeds), the share of seeds within 0.5 and 1 point of
the table's best, and the epochs the sweep trained. Writes ``search-try-first.json`` (with
``--grace-period G``: ``search-try-first-graceG.json``) to ``--out`` (default ``docs/``) and
prints the table as Markdown (``docs/search.md`` holds it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "search"))
import replay  # noqa: E402
import table as curves_table  # noqa: E402

GUESSES = {"nothing given": None, "a strong guess (98th percentile)": 0.98, "a good guess (90th percentile)": 0.9,
           "a middling guess (median)": 0.5, "a poor guess (10th percentile)": 0.1}


def guess(table: Any, space: Any, quantile: float) -> dict[str, Any]:
    """The configuration at ``quantile`` of the table's best accuracies, as the space holds its values."""
    ranked = sorted(table.curves, key=lambda key: max(c.valid_acc for c in table.curves[key]))
    key = ranked[min(int(quantile * len(ranked)), len(ranked) - 1)]
    return {name: space.params[name].value_of(value) for name, value in zip(table.grid, key)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=curves_table.DEFAULT)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--trials", type=int, nargs="+", default=[4, 8, 16], help="trials of each sweep")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--grace-period", type=int, default=None, help="ASHA's grace [default: the preset's, 1]")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs")
    args = parser.parse_args()

    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.platform.sweeps.search import search_algorithm as search

    table, space = replay.load(args.table)
    preset = TUNE_PRESETS["cnn"]          # TPE, grace 1, keep a third (as cbt-*)
    strategy = replay.Strategy("tpe + asha (the cbt and cnn presets)",
                               lambda space, seed: search.build_sampler(space, seed, "tpe"),
                               grace_period=args.grace_period)
    best = max(max(c.valid_acc for c in curve) for curve in table.curves.values())
    out: dict[str, Any] = {"table": replay.shown(args.table), "configurations": len(table.curves), "best": best,
                           "seeds": args.seeds, "concurrency": args.concurrency,
                           "preset": {"grace_period": args.grace_period or preset.grace_period,
                                      "reduction_factor": preset.reduction_factor}, "guesses": {}}
    for name, quantile in GUESSES.items():
        given = (guess(table, space, quantile),) if quantile is not None else ()
        started = time.perf_counter()
        rows = {}
        for n in args.trials:
            traces = [replay.replay(table, space, strategy, seed, preset, n, args.concurrency, given=given)
                      for seed in range(args.seeds)]
            rows[n] = replay.summary((best - np.array([t.best() for t in traces])) * 100,
                                     [t.points[-1][0] for t in traces])
        guessed = max(c.valid_acc for c in table.curve(given[0])) if given else None
        out["guesses"][name] = {"config": given[0] if given else None, "its_best": guessed, "by_trials": rows,
                                "seconds": round(time.perf_counter() - started, 1)}
        print(f"{name}: {out['guesses'][name]['seconds']} s", file=sys.stderr, flush=True)
    suffix = f"-grace{args.grace_period}" if args.grace_period else ""
    each = " / ".join(str(n) for n in args.trials)
    rows = [[name, f"{(best - row['its_best']) * 100:.2f}" if row["its_best"] is not None else "-",
             replay.cells(row["by_trials"], args.trials)] for name, row in out["guesses"].items()]
    replay.report(out, args.out / f"search-try-first{suffix}.json",
                  f"table best {best:.4f}; {args.seeds} seeds, {args.concurrency} trials at a time, ASHA grace "
                  f"{out['preset']['grace_period']}",
                  [f"sweep of {each} trials, given", "its regret (pts)", "regret (median, pts)", "upper quartile", "seeds within 0.5 pt", "seeds within 1 pt", "epochs"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
