"""Does a ranking at ASHA's first comparison still hold at its next? Curves trained past a table's end.

    python benchmarks/search/late.py benchmarks/search/curves-cbt-cn-long.parquet \
        --short benchmarks/search/curves-cbt-cn.parquet --rungs 64000 192000 --keep 3 \
        --name search-late-cbt-cn

``TABLE`` is a curve table (``build_table.py``) whose configurations trained long enough to reach
every rung, the training examples at which ASHA compares trials (the CBT presets, one check
every 2,000 batches of 32 with grace 1 and a third kept: 64,000, then 192,000). At each rung the
script takes each configuration's check at or just after it and reports:

- the configurations' valid accuracy and rank there, and the rank correlations (Spearman,
  Kendall tau-b) of each rung's ranking with the last rung's;
- the best configuration at each rung, and how far below the last rung's best it ends there;
- the ``1/keep`` that ASHA keeps at the first rung (the top ``ceil(n / keep)``) and whether the
  last rung's best is among them: if not, a sweep stops the configuration it was looking for.

``--short`` names a table of the same configurations trained on other data (its first rows, one
epoch): where both reach the first rung, the same configuration's two accuracies say how much a
single run's accuracy moves with the data it saw, against the gaps between configurations.

Writes ``docs/NAME.json`` and ``docs/NAME.png`` (each configuration's curve against examples,
the rungs marked) and prints the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402  (this folder's rank correlations)
import replay  # noqa: E402  (paths as the figures name them)
import table  # noqa: E402  (this folder's schema and reader)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def at_examples(curve: Sequence[table.Check], examples: int) -> table.Check | None:
    """The first check of ``curve`` that has seen ``examples`` or more, within 1% (a table counts a
    check's examples as epochs x rows, so 2,000 batches of 32 may read 63,984), or None: it ends
    before."""
    return next((c for c in curve if c.examples >= 0.99 * examples), None)


def label(t: table.CurveTable, key: table.Key) -> str:
    """The knobs that vary across ``t``'s grid, e.g. ``L2=1e-4 h=64 s=128``."""
    short = {"train.embed_l2": "L2", "model.steps": "T", "model.embed_dim": "d", "model.hidden_dim": "h",
             "model.state_dim": "s", "train.lr": "lr"}
    return " ".join(f"{short.get(name, name)}={value:g}" for (name, choices), value in zip(t.grid.items(), key)
                    if len(choices) > 1)


def params(t: table.CurveTable, key: table.Key) -> dict[str, Any]:
    """The configuration ``key`` with each knob's value as the grid spells it (3, not 3.0)."""
    return {name: next(c for c in choices if table.normalise(c) == value)
            for (name, choices), value in zip(t.grid.items(), key)}


def late_figures(t: table.CurveTable, rungs: Sequence[int], keep: float,
                 short: table.CurveTable | None = None) -> dict[str, Any]:
    """The ranking at each rung against the last (module docstring). SystemExit, one line, where a
    configuration of ``t`` ends before the last rung."""
    keys = sorted(t.curves, key=lambda k: t.config_ids[k])
    checks: dict[int, list[table.Check]] = {}
    for rung in rungs:
        found = [at_examples(t.curves[k], rung) for k in keys]
        if any(c is None for c in found):
            ends = min(t.curves[k][-1].examples for k in keys)
            raise SystemExit(f"the table's shortest curve ends at {ends:,} examples, before the rung at {rung:,}")
        checks[rung] = found
    last = [c.valid_acc for c in checks[rungs[-1]]]
    best_last = max(last)
    kept = math.ceil(len(keys) / keep)
    out: dict[str, Any] = {
        "configurations": len(keys),
        "rungs": list(rungs),
        "keep": keep,
        "per_config": [
            {"config": label(t, k), "params": params(t, k),
             **{f"valid_acc_{r}": round(checks[r][i].valid_acc, 4) for r in rungs},
             **{f"examples_{r}": checks[r][i].examples for r in rungs}}
            for i, k in enumerate(keys)],
        "rungs_vs_last": {},
    }
    for rung in rungs:
        accs = [c.valid_acc for c in checks[rung]]
        order = sorted(range(len(keys)), key=lambda i: -accs[i])
        top = order[0]
        out["rungs_vs_last"][str(rung)] = {
            "spearman": round(figures.spearman(accs, last), 3),
            "kendall_tau_b": round(figures.kendall_tau_b(accs, last), 3),
            "best": label(t, keys[top]),
            "best_valid_acc": round(accs[top], 4),
            "best_regret_at_last_rung_pts": round(100 * (best_last - last[top]), 2),
            "kept": [label(t, keys[i]) for i in order[:kept]],
            "kept_holds_last_best": any(last[i] == best_last for i in order[:kept]),
        }
    if short is not None:
        out["short_table"] = _against_short(t, short, keys, rungs[0])
    return out


def _against_short(t: table.CurveTable, short: table.CurveTable, keys: Sequence[table.Key],
                   rung: int) -> dict[str, Any]:
    """The same configurations' accuracy at ``rung`` in both tables (a run on other data)."""
    pairs = []
    for k in keys:
        try:
            other = at_examples(short.curve(params(t, k)), rung)
        except KeyError:
            continue
        mine = at_examples(t.curves[k], rung)
        if other is not None and mine is not None:
            pairs.append((label(t, k), mine.valid_acc, other.valid_acc))
    if len(pairs) < 2:
        return {"configurations": len(pairs)}
    diffs = [100 * (a - b) for _, a, b in pairs]
    gaps = [100 * abs(a[1] - b[1]) for i, a in enumerate(pairs) for b in pairs[i + 1:]]
    return {
        "configurations": len(pairs),
        "rung": rung,
        "valid_acc": {name: [round(a, 4), round(b, 4)] for name, a, b in pairs},
        "mean_abs_diff_pts": round(statistics.fmean(abs(d) for d in diffs), 2),
        "max_abs_diff_pts": round(max(abs(d) for d in diffs), 2),
        "mean_gap_between_configs_pts": round(statistics.fmean(gaps), 2),
        "spearman_between_tables": round(figures.spearman([a for _, a, _ in pairs], [b for _, _, b in pairs]), 3),
    }


def _figure(t: table.CurveTable, out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    for k in sorted(t.curves, key=lambda k: t.config_ids[k]):
        curve = t.curves[k]
        ax.plot([c.examples for c in curve], [100 * c.valid_acc for c in curve], marker=".", ms=3, lw=1.2,
                label=label(t, k))
    for rung in out["rungs"]:
        ax.axvline(rung, color="grey", ls=":", lw=1)
    ax.set_xlabel("training examples (dotted: where ASHA compares trials)")
    ax.set_ylabel("valid accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fixed = ", ".join(f"{name.split('.')[-1]} {choices[0]:g}" for name, choices in t.grid.items() if len(choices) == 1)
    ax.set_title(f"{t.metadata.get('dataset', '')}: {out['configurations']} configurations ({fixed})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", type=Path, help="a curve table trained past every rung")
    ap.add_argument("--short", type=Path, default=None, help="a table of the same configurations on other data")
    ap.add_argument("--rungs", type=int, nargs="+", default=[64_000, 192_000],
                    help="training examples at which ASHA compares trials [64000 192000]")
    ap.add_argument("--keep", type=float, default=3.0, help="ASHA's reduction factor: it keeps 1/KEEP [3]")
    ap.add_argument("--name", default=None, help="write docs/NAME.json and docs/NAME.png")
    args = ap.parse_args(argv)
    t = table.load(args.table)
    short = table.load(args.short) if args.short else None
    command = ["python", replay.shown(Path(__file__)), *(sys.argv[1:] if argv is None else argv)]
    out = {"table": replay.shown(args.table), "command": " ".join(command), "cpu": t.metadata.get("cpu", ""),
           **late_figures(t, sorted(args.rungs), args.keep, short)}
    text = json.dumps(out, indent=1)
    print(text)
    if args.name:
        (DOCS / f"{args.name}.json").write_text(text + "\n")
        _figure(t, out, DOCS / f"{args.name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
