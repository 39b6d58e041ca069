"""Which search finds the best reader for the least compute: sweeps replayed against the table of
the reader's own learning curves (``benchmarks/search/curves.parquet``), no training.

    python benchmarks/bench_search.py [--table FILE] [--seeds 50] [--trials 96] [--concurrency 2] [--out DIR]
                                      [--name STEM] [--every K] [--cost examples|cpu]

Each strategy runs ``--seeds`` sweeps (:mod:`search.replay`): the sampler ``iaa-cli tune``
builds and the variants it is measured against, with the demo preset's ASHA schedule (grace 2,
keep a half) unless named otherwise, ``--concurrency`` trials at a time. Optuna's ``GPSampler`` refits its
Gaussian process at every proposal, so its long sweep stops at the largest preset budget (24). For each it reports regret (the
table's best accuracy minus the best check the sweep has seen, in points) against compute (epochs
of training) and simulated wall time, as the median and interquartile band over the seeds; the
compute each needs to come within 0.5 and 1 point of the table's best; and the regret of a whole
sweep of 4, 16 and 24 trials (the presets' budgets). Writes ``STEM.json`` (every figure) and
``STEM.png`` (the curves) to ``--out`` (default ``docs/``; ``--name`` STEM, default
``search-replay``) and prints the tables as Markdown (``docs/search.md`` holds them). A sweep
longer than the table's grid is cut to the grid's size.

Compute counts a trial's training examples (``--cost examples``: every configuration's example
costs the same) or, with ``--cost cpu``, each example at its configuration's price in CPU time
relative to the grid's mean (``search/price.py`` measures it into ``STEM.price.json`` beside the
table; ``--price`` another file): a sweep drawn to large configurations then pays for them, and
the whole grid costs the same in both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "search"))
import price as prices  # noqa: E402
import replay  # noqa: E402
import table as curves_table  # noqa: E402

DEFAULT = "tpe + asha (grace 1, reduction 3: the cbt and cnn presets)"   # drawn bold
DRAWN = (DEFAULT, "tpe + asha (grace 2, reduction 2: the demo preset)",
         "tpe, independent draws + asha", "plain optuna tpe (multivariate) + asha",
         "random + asha (tune --sampler random)", "gp + asha (tune --sampler gp)", "exhaustive grid")
BANDS = (DEFAULT, "exhaustive grid")           # the others' bands overlap them; search-replay.json has all
BUDGETS = (4, 16, 24)             # the presets' trial counts: demo, cnn, cbt
WITHIN = (0.5, 1.0)               # points from the table's best


def _samplers() -> dict[str, replay.Strategy]:
    from optuna.samplers import RandomSampler, TPESampler

    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.search.distinct_search import DistinctSampler

    class IndependentDistinct(DistinctSampler):
        """The wrapper as it was: each parameter drawn on its own, TPE's joint model never asked."""

        def _propose(self, study, trial, search_space, joint):
            return {n: self.inner.sample_independent(study, trial, n, d) for n, d in search_space.items()}

    def plain(make):
        return lambda space, seed: make(seed)

    def tune_builds(name: str):
        return lambda space, seed: search.build_sampler(space, seed, name)

    return {s.name: s for s in (
        replay.Strategy("tpe + asha (grace 2, reduction 2: the demo preset)", tune_builds("tpe")),
        replay.Strategy("tpe, independent draws + asha",
                        lambda space, seed: IndependentDistinct(TPESampler(seed=seed), search.to_optuna(space),
                                                                space.size, seed=seed)),
        replay.Strategy("plain optuna tpe (multivariate) + asha", plain(lambda seed: TPESampler(seed=seed))),
        replay.Strategy("tpe from the 5th trial + asha",
                        lambda space, seed: DistinctSampler(TPESampler(seed=seed, n_startup_trials=5),
                                                            search.to_optuna(space), space.size, seed=seed)),
        replay.Strategy(DEFAULT, tune_builds("tpe"), grace_period=1, reduction_factor=3.0),
        replay.Strategy("tpe + asha (grace 1, reduction 2)", tune_builds("tpe"), grace_period=1, reduction_factor=2.0),
        replay.Strategy("tpe from the 5th trial + asha (grace 1, reduction 3)",
                        lambda space, seed: DistinctSampler(TPESampler(seed=seed, n_startup_trials=5),
                                                            search.to_optuna(space), space.size, seed=seed),
                        grace_period=1, reduction_factor=3.0),
        replay.Strategy("tpe, no asha", tune_builds("tpe"), asha=False),
        replay.Strategy("gp + asha (tune --sampler gp)", tune_builds("gp"), max_trials=max(BUDGETS)),
        replay.Strategy("random + asha (tune --sampler random)", tune_builds("random")),
        replay.Strategy("plain optuna random + asha", plain(lambda seed: RandomSampler(seed=seed))),
        replay.Strategy("plain optuna random", plain(lambda seed: RandomSampler(seed=seed)), asha=False),
        replay.Strategy("exhaustive grid", None, asha=False),
    )}


def _at(points: list[tuple[float, float, float]], axis: int, xs: np.ndarray, best: float) -> np.ndarray:
    """Regret (points) at each x of ``xs`` along ``axis`` (0 compute, 1 wall) of a trace: before
    the first check, the regret of knowing nothing (the table's best); past its end, the regret it
    ended with (the sweep has stopped and its best stands). Every seed counts at every x, so the
    median never rises: a median of only the sweeps still running would, as the lucky ones end
    first."""
    order = sorted(points, key=lambda p: p[axis])
    at = np.array([p[axis] for p in order])
    seen = np.maximum.accumulate(np.array([p[2] for p in order]))
    idx = np.searchsorted(at, xs, side="right") - 1
    return np.where(idx >= 0, (best - seen[np.clip(idx, 0, None)]) * 100, best * 100)


def _to_within(points: list[tuple[float, float, float]], best: float, within: float) -> float:
    """The compute (epochs) at which the sweep first came within ``within`` points; inf if never."""
    for compute, _, seen in points:
        if (best - seen) * 100 <= within + 1e-9:
            return compute
    return float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=curves_table.DEFAULT)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--trials", type=int, default=96, help="trials of the long sweep each curve is drawn from")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="strategies whose name starts with one of these")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs")
    parser.add_argument("--name", default="search-replay", help="the stem of the JSON and PNG written to --out")
    parser.add_argument("--every", type=int, default=1,
                        help="keep every K-th check of the table: validation K times less often [1]")
    parser.add_argument("--cost", choices=("examples", "cpu"), default="examples",
                        help="what an example costs: the same for every configuration, or its price in CPU time "
                             "(search/price.py) [examples]")
    parser.add_argument("--price", type=Path, default=None, help="the price file [STEM.price.json beside --table]")
    args = parser.parse_args()

    from iaa.jobs.config.presets import TUNE_PRESETS

    table, space = replay.load(args.table)
    if args.every > 1:
        table = replay.every(table, args.every)
    preset = TUNE_PRESETS["demo"]
    finals = {key: max(c.valid_acc for c in curve) for key, curve in table.curves.items()}
    best = max(finals.values())
    price = prices.load(args.price or prices.path_for(args.table), table) if args.cost == "cpu" else None
    grid_compute = sum(curve[-1].epoch * (price[key] if price else 1.0) for key, curve in table.curves.items())
    strategies = _samplers()
    if args.only:
        strategies = {k: v for k, v in strategies.items() if any(k.startswith(p) for p in args.only)}
    xs = np.geomspace(grid_compute / 400, grid_compute, 60)
    out: dict[str, Any] = {"table": replay.shown(args.table), "dataset": table.metadata.get("dataset", ""), "every": args.every,
                           "cost": args.cost,
                           "price_file": replay.shown(args.price or prices.path_for(args.table)) if price else None,
                           "configurations": len(table.curves), "best": best,
                           "median_config": float(np.median(list(finals.values()))), "grid_epochs": grid_compute,
                           "seeds": args.seeds, "trials": args.trials, "concurrency": args.concurrency,
                           "preset": {"grace_period": preset.grace_period, "reduction_factor": preset.reduction_factor},
                           "x_epochs": xs.tolist(), "strategies": {}}
    for name, strategy in strategies.items():
        started = time.perf_counter()
        trials = len(table.curves) if strategy.sampler is None else min(
            args.trials, strategy.max_trials or args.trials, len(table.curves))
        curves, wall_curves, walls, finals_seen, within = [], [], [], [], {w: [] for w in WITHIN}
        budgets: dict[int, list[float]] = {b: [] for b in BUDGETS}
        budget_compute: dict[int, list[float]] = {b: [] for b in BUDGETS}
        for seed in range(args.seeds):
            trace = replay.replay(table, space, strategy, seed, preset, trials, args.concurrency, price=price)
            curves.append(_at(trace.points, 0, xs, best))
            wall_curves.append(_at(trace.points, 1, xs / args.concurrency, best))
            walls.append(trace.points[-1][1])
            finals_seen.append(trace.best())
            for w in WITHIN:
                within[w].append(_to_within(trace.points, best, w))
            for b in BUDGETS:
                short = replay.replay(table, space, strategy, seed, preset, min(b, trials), args.concurrency,
                                      price=price)
                budgets[b].append((best - short.best()) * 100)
                budget_compute[b].append(short.points[-1][0])
        band = np.percentile(np.array(curves), [25, 50, 75], axis=0)
        wall_band = np.percentile(np.array(wall_curves), [25, 50, 75], axis=0)
        row = {"regret_q25": band[0].tolist(), "regret_median": band[1].tolist(), "regret_q75": band[2].tolist(),
               "wall_regret_q25": wall_band[0].tolist(), "wall_regret_median": wall_band[1].tolist(),
               "wall_regret_q75": wall_band[2].tolist(),
               "final_regret_median": float(np.median([(best - t) * 100 for t in finals_seen])),
               "wall_epochs_median": float(np.median(walls)),
               **{f"epochs_to_{w}": float(np.median(within[w])) for w in WITHIN},
               **{f"share_of_grid_to_{w}": float(np.median(within[w])) / grid_compute for w in WITHIN},
               **{f"seeds_within_{w}_by_quarter_grid": float(np.mean(np.array(within[w]) <= grid_compute / 4))
                  for w in WITHIN},
               **{f"regret_{b}_trials": float(np.median(budgets[b])) for b in BUDGETS},
               **{f"regret_{b}_trials_q75": float(np.percentile(budgets[b], 75)) for b in BUDGETS},
               **{f"epochs_{b}_trials": float(np.median(budget_compute[b])) for b in BUDGETS},
               "trials": trials, "seconds": round(time.perf_counter() - started, 1)}
        out["strategies"][name] = row
        print(f"{name}: {row['seconds']} s", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=1), encoding="utf-8")
    _figure(out, args.out / f"{args.name}.png")
    _print_tables(out)
    return 0


def _priced(out: dict[str, Any]) -> bool:
    """Whether ``out`` counts compute in CPU time (``--cost cpu``) rather than examples."""
    return out.get("cost", "examples") == "cpu"


def _figure(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    xs = np.array(out["x_epochs"])
    unit = "epochs of the grid's average configuration, priced by CPU time" if _priced(out) else "epochs of training"
    panels = ((axes[0], xs, "", f"compute ({unit}; dotted: the whole grid)"),
              (axes[1], xs / out["concurrency"], "wall_",
               f"simulated wall time (epochs of one trial slot, {out['concurrency']} slots)"))
    for ax, x, prefix, label in panels:
        for i, name in enumerate(n for n in DRAWN if n in out["strategies"]):
            row = out["strategies"][name]
            # dashes of their own, so that a strategy whose median runs on another's still shows
            line, = ax.plot(x, row[f"{prefix}regret_median"], label=name, lw=2.6 if name == DEFAULT else 1.4,
                            ls="-" if name == DEFAULT else ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))[i % 4])
            if name in BANDS:
                ax.fill_between(x, row[f"{prefix}regret_q25"], row[f"{prefix}regret_q75"], color=line.get_color(),
                                alpha=0.15)
        ax.axvline(out["grid_epochs"] / (out["concurrency"] if prefix else 1), color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("regret: points below the table's best (median; IQR band for two)")
    axes[0].legend(fontsize=7.5, loc="lower left")
    priced = "; compute priced by CPU time per example" if _priced(out) else ""
    fig.suptitle(f"{out.get('dataset') or 'the table'}: {out['configurations']} configurations, {out['seeds']} seeds, "
                 f"{out['concurrency']} trials at a time{priced}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _print_tables(out: dict[str, Any]) -> None:
    print(f"\ntable: {out['configurations']} configurations, best {out['best']:.4f}, median configuration "
          f"{out['median_config']:.4f}; the exhaustive grid trains {out['grid_epochs']:.0f} epochs"
          + (" (compute priced by CPU time per example: epochs of the grid's average configuration)"
             if _priced(out) else "") + "\n")
    print("| strategy | epochs to within 0.5 pt (share of grid) | to within 1 pt | seeds within 0.5 / 1 pt by a "
          "quarter of the grid | regret after 4 / 16 / 24 trials (median, pts) | epochs of 4 / 16 / 24 trials |")
    print("|---|---|---|---|---|---|")
    for name, r in out["strategies"].items():
        def share(w: float) -> str:
            e = r[f"epochs_to_{w}"]
            return "never" if not np.isfinite(e) else f"{e:.0f} ({100 * r[f'share_of_grid_to_{w}']:.0f}%)"
        print(f"| {name} | {share(0.5)} | {share(1.0)} | {100 * r['seeds_within_0.5_by_quarter_grid']:.0f}% / "
              f"{100 * r['seeds_within_1.0_by_quarter_grid']:.0f}% | "
              f"{r['regret_4_trials']:.1f} / {r['regret_16_trials']:.1f} / {r['regret_24_trials']:.1f} | "
              f"{r['epochs_4_trials']:.1f} / {r['epochs_16_trials']:.1f} / {r['epochs_24_trials']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
