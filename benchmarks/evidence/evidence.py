"""Reproduce the evidence studies with one command each, through the project's own CLI.

    python benchmarks/evidence/evidence.py curves   [--workdir W] [--minutes 20] [--dry-run]
    python benchmarks/evidence/evidence.py ensemble [--workdir W] [--minutes 15] [--seeds 5] [--dry-run]
    python benchmarks/evidence/evidence.py search   [--workdir W] [--tune-samples 12] [--dry-run]
    python benchmarks/evidence/evidence.py converge [--workdir W] [--minutes 0] [--resume] [--dry-run]

- ``curves``: prepares cbt-recon CN, trains the three ``--model`` kinds side by side at the same
  config and wall-clock budget (one thread each), and draws validation accuracy against
  examples seen with ``iaa-cli report`` and the most-frequent-candidate line.
- ``ensemble``: trains N seeds of the IAA reader at the paper config on cbt-recon CN, two at a
  time, then ``iaa-cli ensemble --members ... --select all`` and ``--select greedy``.
- ``search``: trains every configuration of the demo search space for the same epochs (the
  grid), then ``iaa-cli tune`` with a fraction of the trials for each sweep seed, and draws the
  best validation accuracy found against the trial-seconds spent (anytime curves).

- ``converge``: trains the IAA reader and the AS Reader side by side at the ``cbt-cn`` preset (the
  paper's config and schedule: a check every 2,000 batches, lr x 0.8 after a check without gain,
  early stop after 6), one thread each, until their early stop or ``--minutes`` of training in
  all; ``--resume`` continues both from their last checkpoints (a stop with Ctrl-C keeps them),
  with a larger ``--minutes`` where that budget ended them. Then draws both curves with
  ``iaa-cli report``.

``--dry-run`` prints the commands and runs nothing. Each study uses its own workdir, so its
MLflow experiments hold only its runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SMALL = {"model.embed_dim": 96, "model.hidden_dim": 64, "model.state_dim": 128, "model.steps": 4, "model.gate_dim": 96}
MODELS = ("iaa", "iaa-fixed-query", "as-reader")
CLI = ["nice", "-n", "5", "iaa-cli"]

Step = list[list[str]]   # commands run at the same time; steps run one after another


def sets(values: dict[str, object]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def curves_plan(a: argparse.Namespace) -> list[Step]:
    data = f"{a.workdir}/data/cbt-cn"
    common = ["--workdir", a.workdir, *sets({**SMALL, "train.threads": 1, "train.max_minutes": a.minutes,
                                              "train.patience": 1000, "train.check_every": a.check_every})]
    return [
        [[*CLI, "prepare", "--dataset", "cbt-cn", "--source", str(a.source), "--out", data, "--workdir", a.workdir]],
        [[*CLI, "train", "--data", data, "--model", m, *common] for m in MODELS],
        [[*CLI, "report", "--experiment", "train-cbt-cn", "--workdir", a.workdir, "--baseline-data", data,
          "--out", a.out, "--json"]],
    ]


def ensemble_plan(a: argparse.Namespace) -> list[Step]:
    data = f"{a.workdir}/data/cbt-cn"
    runs = [f"{a.workdir}/runs/ensemble-seed{s}" for s in range(a.seeds)]
    train = [[*CLI, "train", "--data", data, "--model", "iaa", "--run-dir", run, "--workdir", a.workdir,
              *sets({"train.seed": s, "train.threads": 1, "train.max_minutes": a.minutes, "train.patience": 1000,
                     "train.check_every": a.check_every})]
             for s, run in enumerate(runs)]
    members = [f"{run}/checkpoints/best.pt" for run in runs]
    return [
        [[*CLI, "prepare", "--dataset", "cbt-cn", "--source", str(a.source), "--out", data, "--workdir", a.workdir]],
        *[train[i : i + a.parallel] for i in range(0, len(train), a.parallel)],
        *[[[*CLI, "ensemble", "--data", data, "--members", *members, "--select", select, "--name", f"cn-{select}",
            "--workdir", a.workdir, "--json"]] for select in ("all", "greedy")],
    ]


def converge_plan(a: argparse.Namespace) -> list[Step]:
    data = f"{a.workdir}/data/cbt-cn"
    budget = {"train.max_minutes": a.minutes} if a.minutes else {}
    train = [[*CLI, "train", "--data", data, "--model", m, "--workdir", a.workdir,
              *sets({"train.seed": 0, "train.threads": 1, **budget}), *(["--resume"] if a.resume else [])]
             for m in ("iaa", "as-reader")]
    prepare = [] if a.resume else [[[*CLI, "prepare", "--dataset", "cbt-cn", "--source", str(a.source), "--out", data,
                                     "--workdir", a.workdir]]]
    return [*prepare, train,
            [[*CLI, "report", "--experiment", "train-cbt-cn", "--workdir", a.workdir, "--baseline-data", data,
              "--out", a.out, "--json"]]]


def grid(space: dict[str, Sequence[object]]) -> list[dict[str, object]]:
    """Every configuration of a search space of choices."""
    keys = list(space)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


def search_grid(space_file: Path | None) -> list[dict[str, object]]:
    """The grid of the demo preset's space, or of a YAML space file (its fixed keys in every config)."""
    from iaa.jobs.config.presets import for_dataset
    from iaa.jobs.config import search_space

    if space_file is None:
        return grid(search_space.DEMO_GRID)
    space = search_space.load(space_file, for_dataset("demo"))
    if any(p.choices is None for p in space.params.values()):
        sys.exit(f"{space_file}: a grid needs choices for every key, not ranges")
    return [{**space.fixed, **cfg} for cfg in grid({k: p.choices for k, p in space.params.items()})]


def search_plan(a: argparse.Namespace) -> list[Step]:
    epochs = {"train.max_epochs": a.epochs, "train.patience": 1000}
    grid_runs = [[*CLI, "train", "--dataset", "demo", "--workdir", a.workdir, "--run-dir",
                  f"{a.workdir}/runs/grid-{i}", *sets({**cfg, **epochs})] for i, cfg in enumerate(search_grid(a.space))]
    space = ["--search-space", str(a.space)] if a.space else []
    asha = [*(["--grace-period", str(a.grace_period)] if a.grace_period else []),
            *(["--reduction-factor", str(a.reduction_factor)] if a.reduction_factor else [])]
    tunes = [[*CLI, "tune", "--dataset", "demo", "--workdir", a.workdir, "--num-samples", str(a.tune_samples),
              "--max-epochs", str(a.epochs), *space, *asha, "--seed", str(seed), "--name", f"{sweep_prefix(a.label)}{seed}",
              "--json"]
             for seed in a.sweep_seeds]
    if a.tune_only:
        return [[t] for t in tunes]
    prepare = [*CLI, "prepare", "--dataset", "demo", "--workdir", a.workdir]   # once, before runs share it
    return [[prepare], *[grid_runs[i : i + a.parallel] for i in range(0, len(grid_runs), a.parallel)],
            *[[t] for t in tunes]]


@dataclass(frozen=True)
class Trace:
    """One run's validation checks: its start and the (time, accuracy) of each check, in seconds."""

    start: float
    checks: tuple[tuple[float, float], ...]

    @property
    def end(self) -> float:
        return self.checks[-1][0]


def best_against_compute(traces: Sequence[Trace]) -> tuple[list[float], list[float]]:
    """Best accuracy found against trial-seconds spent, for runs that may overlap in time.

    At each check time t, the compute spent is the sum over the runs started before t of
    ``min(t, end) - start`` (a run computes from its start to its last check), and the best is the
    highest check at or before t. Runs two at a time on two cores thus count two seconds per second.
    """
    xs, ys = [], []
    for t in sorted(t for trace in traces for t, _ in trace.checks):
        xs.append(sum(min(t, trace.end) - trace.start for trace in traces if trace.start < t))
        ys.append(max(acc for trace in traces for at, acc in trace.checks if at <= t))
    return xs, ys


def sweep_prefix(label: str) -> str:
    """The start of the names of the sweeps run with ``--label``."""
    return f"demo-tune-{label}-seed" if label else "demo-tune-seed"


def anytime(workdir: str, out: str, label: str = "", title: str = "demo: grid vs tune") -> dict[str, object]:
    """Best valid accuracy found against trial-seconds, for the grid and each sweep of ``label``, and
    the compute each needs to come within 1 point of the grid's best."""
    from iaa.jobs.reports import report
    from iaa.jobs.ports import RunRecord
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking.tracker import MlflowTracker

    tracker = MlflowTracker(Workdir(workdir).tracking_uri())

    def traces(records: list[RunRecord]) -> list[Trace]:
        found = [(r, report.curve(tracker, r, "valid_acc", "seconds")) for r in records]
        return [Trace(r.start_ms / 1000.0, tuple((r.start_ms / 1000.0 + s, acc) for s, acc in zip(c.x, c.y)))
                for r, c in found if c is not None]

    def as_curve(name: str, label: str, runs: list[Trace]) -> report.Curve:
        x, y = best_against_compute(runs)
        return report.Curve(name, label, "", tuple(range(len(x))), tuple(x), tuple(y))

    grid_runs = traces(tracker.experiment_records("train-demo") or [])
    curves = [as_curve("grid", f"grid ({len(grid_runs)} configs)", grid_runs)]
    tune_runs = tracker.experiment_records("tune-demo") or []
    parents = [r for r in tune_runs if r.parent_run_id is None and r.name.startswith(sweep_prefix(label))]
    for parent in parents:
        trials = traces([r for r in tune_runs if r.parent_run_id == parent.run_id])
        curves.append(as_curve(parent.run_id, f"tune {parent.name} ({len(trials)} trials)", trials))
    grid_best = max(curves[0].y, default=0.0)
    report.draw(curves, Path(out), metric="best valid_acc found", x="seconds", title=title,
                xlabel="trial-seconds spent (cumulative)", steps=True,
                marks=[(grid_best - 0.01, f"1 point below the grid's best ({grid_best - 0.01:.3f})")])
    grid_total = max(curves[0].x, default=0.0)
    rows = {}
    for c in curves:
        reached = next((x for x, y in zip(c.x, c.y) if y >= grid_best - 0.01), None)
        rows[c.run_id] = {"label": c.name, "best": max(c.y, default=None), "trial_seconds": max(c.x, default=0.0),
                        "seconds_to_within_1_point": reached,
                        "fraction_of_grid": None if reached is None or not grid_total else reached / grid_total}
    return {"out": out, "grid_best": grid_best, "grid_trial_seconds": grid_total, "curves": rows}


def run_plan(plan: list[Step], dry_run: bool) -> None:
    for step in plan:
        for cmd in step:
            print(("  " if len(step) > 1 else "") + shlex.join(cmd), flush=True)
        if dry_run:
            continue
        procs = [subprocess.Popen(cmd) for cmd in step]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a command failed with exit codes {codes}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="study", required=True)
    for name in ("curves", "ensemble", "search", "converge"):
        s = sub.add_parser(name)
        s.add_argument("--workdir", default=f"iaa-work-{name}")
        s.add_argument("--dry-run", action="store_true", help="Print the commands; run nothing.")
        if name != "search":
            s.add_argument("--source", type=Path, default=SHARED / "cbt-recon" / "CBTest")
    curves = sub.choices["curves"]
    curves.add_argument("--minutes", type=float, default=20.0, help="Wall-clock budget of each model.")
    curves.add_argument("--check-every", type=int, default=200, help="Batches between validation checks.")
    curves.add_argument("--out", default="docs/curves-cbt-cn.png")
    ens = sub.choices["ensemble"]
    ens.add_argument("--minutes", type=float, default=15.0, help="Wall-clock budget of each member.")
    ens.add_argument("--seeds", type=int, default=5)
    ens.add_argument("--parallel", type=int, default=2, help="Members trained at once.")
    ens.add_argument("--check-every", type=int, default=300,
                     help="Batches between checks (the preset's 2,000 is more than 15 minutes on one CPU thread).")
    converge = sub.choices["converge"]
    converge.add_argument("--minutes", type=float, default=0.0,
                          help="Training time of each model, summed over resumptions; 0 runs to the early stop.")
    converge.add_argument("--resume", action="store_true", help="Continue both runs from their last checkpoints.")
    converge.add_argument("--out", default="docs/curves-cbt-cn-converge.png")
    search = sub.choices["search"]
    search.add_argument("--epochs", type=float, default=2.0, help="Epochs of every grid run and trial.")
    search.add_argument("--space", type=Path, help="YAML search space of choices [default: the demo preset's].")
    search.add_argument("--parallel", type=int, default=2, help="Grid runs trained at once.")
    search.add_argument("--grace-period", type=int, help="ASHA grace period of the sweeps [default: the preset's].")
    search.add_argument("--reduction-factor", type=float, help="ASHA reduction factor [default: the preset's].")
    search.add_argument("--label", default="", help="Put in the sweeps' names, to tell settings apart.")
    search.add_argument("--tune-only", action="store_true", help="Run only the sweeps (the grid is already in the workdir).")
    search.add_argument("--plot-only", action="store_true", help="Run nothing; draw the grid and the sweeps of --label.")
    search.add_argument("--tune-samples", type=int, default=12, help="Trials of each tune sweep.")
    search.add_argument("--sweep-seeds", type=int, nargs="+", default=[0, 1, 2])
    search.add_argument("--out", default="docs/search-demo.png")
    return p


PLANS = {"curves": curves_plan, "ensemble": ensemble_plan, "search": search_plan, "converge": converge_plan}


def main(argv: Sequence[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if not getattr(a, "plot_only", False):
        run_plan(PLANS[a.study](a), a.dry_run)
    if a.study == "search" and not a.dry_run:
        space = a.space.stem if a.space else "demo"
        result = anytime(a.workdir, a.out, a.label, f"{space} space: grid vs tune {a.label or '(preset ASHA)'}")
        Path(a.out).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
