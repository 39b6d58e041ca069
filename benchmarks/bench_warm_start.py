"""What ``tune --warm-start`` buys: a second sweep after a first one, replayed against the table of
the reader's learning curves (``benchmarks/search/curves.parquet``), no training.

    python benchmarks/bench_warm_start.py [--seeds 50] [--first 16] [--second 4 8 16] [--out DIR]

A user ran a sweep of ``--first`` trials and has the budget for ``N`` more (each of ``--second``).
Each way of spending it is replayed over ``--seeds`` seeds with the sampler and the ASHA schedule
of the CBT and CNN presets (TPE, grace 1, keep a third; :mod:`search.replay`):

- **warm start**: a second sweep of ``N`` trials that begins with the first sweep's study
  (``--warm-start FIRST``), with the same ``--seed`` (the default a user leaves) or another;
- **cold, same seed**: a second sweep of ``N`` trials from scratch with the same ``--seed``: it
  proposes what the first proposed;
- **cold, another seed**: a second sweep of ``N`` trials from scratch with another ``--seed``;
- **one long sweep**: ``--first + N`` trials in one sweep, as if the whole budget had been known.

For each it reports the regret of the best check seen over both sweeps (the table's best accuracy
minus it, in points; median and upper quartile over the seeds), the share of seeds within 0.5 and
1 point of the table's best, and the epochs the ``N`` trials trained. Writes
``search-warm-start.json`` to ``--out`` (default ``docs/``) and prints the table as Markdown
(``docs/search.md`` holds it).
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

WAYS = ("warm start, same seed", "warm start, another seed", "cold, same seed", "cold, another seed",
        "one long sweep")
OTHER_SEED = 1000                     # the second sweep's seed where it is not the first's


def _second(way: str, table: Any, space: Any, strategy: replay.Strategy, seed: int, preset: Any, first: int,
            n: int, concurrency: int) -> tuple[float, float]:
    """The best check seen over both sweeps, and the epochs the ``n`` more trials trained."""
    if way == "one long sweep":
        whole = replay.replay(table, space, strategy, seed, preset, first + n, concurrency)
        earlier = replay.replay(table, space, strategy, seed, preset, first, concurrency)
        return whole.best(), whole.points[-1][0] - earlier.points[-1][0]
    earlier = replay.replay(table, space, strategy, seed, preset, first, concurrency)
    second_seed = seed if way.endswith("same seed") else seed + OTHER_SEED
    warm = earlier.study if way.startswith("warm") else None
    later = replay.replay(table, space, strategy, second_seed, preset, n, concurrency, warm_start=warm)
    return max(earlier.best(), later.best()), later.points[-1][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=curves_table.DEFAULT)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first", type=int, default=16, help="trials of the first sweep")
    parser.add_argument("--second", type=int, nargs="+", default=[4, 8, 16], help="trials of the second")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs")
    args = parser.parse_args()

    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.platform.sweeps.search import search_algorithm as search

    table, space = replay.load(args.table)
    preset = TUNE_PRESETS["cnn"]          # TPE, grace 1, keep a third (as cbt-*)
    strategy = replay.Strategy("tpe + asha (the cbt and cnn presets)",
                               lambda space, seed: search.build_sampler(space, seed, "tpe"))
    best = max(max(c.valid_acc for c in curve) for curve in table.curves.values())
    out: dict[str, Any] = {"table": replay.shown(args.table), "configurations": len(table.curves), "best": best,
                           "seeds": args.seeds, "first": args.first, "concurrency": args.concurrency,
                           "preset": {"grace_period": preset.grace_period,
                                      "reduction_factor": preset.reduction_factor},
                           "first_regret_median": None, "ways": {}}
    firsts = [replay.replay(table, space, strategy, seed, preset, args.first, args.concurrency).best()
              for seed in range(args.seeds)]
    out["first_regret_median"] = float(np.median([(best - b) * 100 for b in firsts]))
    for way in WAYS:
        started = time.perf_counter()
        rows = {}
        for n in args.second:
            seen, epochs = zip(*(_second(way, table, space, strategy, seed, preset, args.first, n, args.concurrency)
                                 for seed in range(args.seeds)))
            rows[n] = replay.summary((best - np.array(seen)) * 100, epochs)
        out["ways"][way] = {"by_second_trials": rows, "seconds": round(time.perf_counter() - started, 1)}
        print(f"{way}: {out['ways'][way]['seconds']} s", file=sys.stderr, flush=True)
    each = " / ".join(str(n) for n in args.second)
    rows = [[way, replay.cells(row["by_second_trials"], args.second)] for way, row in out["ways"].items()]
    replay.report(out, args.out / "search-warm-start.json",
                  f"first sweep: {args.first} trials, median regret {out['first_regret_median']:.1f} points; "
                  f"{args.seeds} seeds, {args.concurrency} trials at a time",
                  [f"then {each} more trials", "regret over both (median, pts)", "upper quartile",
                   "seeds within 0.5 pt", "seeds within 1 pt", "epochs of the more trials"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
