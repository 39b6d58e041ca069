"""The key figures of a curve table: its spread, how the ranking moves between checks, its cost.

    python benchmarks/search/figures.py [benchmarks/search/curves.parquet]

prints one JSON object: configurations and checks, the best, median and worst configuration by
its best validation accuracy (the gap best - median says how much a search can gain), each
knob's main effect (the mean best accuracy of the configurations at each of its values), the
rank correlations (Spearman, Kendall tau-b) between each check's valid accuracy and the last
check's (how far an early check predicts the end), and the seconds per configuration on the CPU
named in the table's metadata.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import table  # noqa: E402


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tied = x == v
        r[tied] = r[tied].mean()
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: the correlation of the ranks (nan when either side is all ties)."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom else float("nan")


def kendall_tau_b(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b: concordant minus discordant pairs, corrected for ties in either ranking."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    i, j = np.triu_indices(len(x), k=1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    denom = np.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy))
    return float((dx * dy).sum() / denom) if denom else float("nan")


def key_figures(t: table.CurveTable) -> dict[str, Any]:
    """The table's figures (accuracies as fractions, seconds on the table's CPU)."""
    curves = list(t.curves.values())
    n_checks = min(len(c) for c in curves)
    best = sorted(c[-1].best_valid_acc for c in curves)
    last = [c[n_checks - 1].valid_acc for c in curves]
    meta = t.metadata
    started, finished = meta.get("build_started"), meta.get("build_finished")
    build_s = ((datetime.datetime.fromisoformat(finished) - datetime.datetime.fromisoformat(started)).total_seconds()
               if started and finished else None)
    return {
        "configs": len(curves),
        "checks_per_config": sorted({len(c) for c in curves}),
        "best_valid_acc": {"best": round(best[-1], 4), "median": round(statistics.median(best), 4),
                           "worst": round(best[0], 4),
                           "best_minus_median": round(best[-1] - statistics.median(best), 4)},
        "main_effects": {name: {f"{value:g}": _mean([c[-1].best_valid_acc for key, c in t.curves.items()
                                                     if key[i] == table.normalise(value)])
                                for value in values} for i, (name, values) in enumerate(t.grid.items())},
        "rank_vs_last_check": {
            f"check_{k + 1}": {"spearman": round(spearman([c[k].valid_acc for c in curves], last), 3),
                               "kendall_tau_b": round(kendall_tau_b([c[k].valid_acc for c in curves], last), 3)}
            for k in range(n_checks - 1)},
        "seconds_per_config": {
            "train_mean": round(statistics.fmean(c[-1].seconds for c in curves), 1),
            "wall_mean": round(statistics.fmean(c[-1].wall_seconds for c in curves), 1),
            "wall_min": round(min(c[-1].wall_seconds for c in curves), 1),
            "wall_max": round(max(c[-1].wall_seconds for c in curves), 1)},
        "build_seconds": build_s,
        "cpu": meta.get("cpu", ""),
        "workers": meta.get("workers", ""),
    }


def _mean(values: Sequence[float]) -> float | None:
    """The mean, rounded to 4 places; None for no values (a table built with ``--limit``)."""
    return round(statistics.fmean(values), 4) if values else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else table.DEFAULT
    print(json.dumps(key_figures(table.load(path)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
