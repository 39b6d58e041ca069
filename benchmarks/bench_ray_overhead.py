"""Per-trial overhead of a Ray Tune sweep: from a trial's start to its first training step.

A trial "starts" when a slot for it is free: when the sweep's Tune loop begins, for the first
``max_concurrent`` trials, and when an earlier trial finishes, for the others (so waiting for a
free slot is not counted). Its first step is when its session hands out the first training
batch (``first_step_at``, reported with every check). The difference is what Ray adds: placing
the trial, starting (or reusing) its actor, importing torch and the model, fetching the data
from the object store, building the model.

The trials train a tiny model on a tiny demo-grammar dataset for one check, so the sweep is
dominated by overhead. Run from the repository root::

    python benchmarks/bench_ray_overhead.py                      # 6 trials, 1 worker each
    python benchmarks/bench_ray_overhead.py --workers-per-trial 2 --trials 3   # TorchTrainer trials
    python benchmarks/bench_ray_overhead.py --json               # one JSON line at the end
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray.tune

from iaa.data.formats import demo
from iaa.jobs.datasets import prepare
from iaa.jobs.tune import tune
from iaa.platform.sweeps.launch import RayLauncher
from iaa.platform.tracking.tracker import MlflowTracker

TINY_SETS = ("model.embed_dim=16", "model.hidden_dim=8", "model.state_dim=12", "model.steps=2", "model.gate_dim=10",
             "train.batch_size=16", "train.max_epochs=1", "train.check_every=1000", "train.seed=0")
SPACE = "train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}\n"


class Clock(ray.tune.Callback):
    """Records when the Tune loop starts, and when each trial reports first and completes."""

    def __init__(self) -> None:
        self.loop_start = 0.0
        self.first_step: dict[str, float] = {}
        self.completed: dict[str, float] = {}

    def setup(self, **info: Any) -> None:
        self.loop_start = time.time()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.first_step.setdefault(trial.trial_id, float(result["first_step_at"]))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.completed[trial.trial_id] = time.time()


def overheads(clock: Clock, concurrency: int) -> list[float]:
    """Seconds from a free slot to the first step, per trial, in order of first step."""
    starts = sorted(clock.first_step.items(), key=lambda kv: kv[1])
    freed = sorted(clock.completed.values())
    out = []
    for i, (_, first) in enumerate(starts):
        slot_free = clock.loop_start if i < concurrency else freed[i - concurrency]
        out.append(first - slot_free)
    return out


def tiny_data(root: Path, train: int) -> Path:
    data = root / "CBTest" / "data"
    paths = demo.write_files(data, sizes={"train": train, "valid": 32, "test": 32})
    names = {"train": "cbtest_NE_train.txt", "valid": "cbtest_NE_valid_2000ex.txt", "test": "cbtest_NE_test_2500ex.txt"}
    for split, path in paths.items():
        path.rename(data / names[split])
    prepare.run("cbt-ne", root / "CBTest", root / "prepared", progress=False)
    return root / "prepared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--workers-per-trial", type=int, default=1)
    parser.add_argument("--train-examples", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="iaa-bench-ray-") as tmp:
        root = Path(tmp)
        prepared = tiny_data(root, args.train_examples)
        (root / "space.yaml").write_text(SPACE, encoding="utf-8")
        clock = Clock()
        started = time.time()
        tune.run(tune.TuneRequest(dataset="cbt-ne", data=prepared, num_samples=args.trials,
                                  search_space=root / "space.yaml", sets=TINY_SETS, workdir=root / "work",
                                  workers_per_trial=args.workers_per_trial, name="bench", show_progress=False),
                 MlflowTracker, RayLauncher(callbacks=[clock]))
        wall = time.time() - started
        sweep = json.loads((root / "work" / "sweeps" / "bench" / "sweep.json").read_text(encoding="utf-8"))
    concurrency = int(sweep["max_concurrent"])
    per_trial = overheads(clock, concurrency)
    summary = {
        "trials": len(per_trial), "workers_per_trial": args.workers_per_trial, "concurrency": concurrency,
        "overhead_s_mean": round(statistics.mean(per_trial), 2), "overhead_s_median": round(statistics.median(per_trial), 2),
        "overhead_s_max": round(max(per_trial), 2), "overhead_s_first_wave": [round(x, 2) for x in per_trial[:concurrency]],
        "overhead_s_later": [round(x, 2) for x in per_trial[concurrency:]],
        "sweep_wall_s": round(wall, 1), "tune_loop_s": sweep.get("wall_s"),
    }
    if not args.json:
        for key, value in summary.items():
            print(f"{key}: {value}", file=sys.stderr)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
