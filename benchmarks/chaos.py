"""Worker nodes killed hard under a sweep, a data-parallel run and a served model: one table.

The three scenarios of ``tests/test_chaos.py`` at a larger size, on the same kind of cluster
(``tests/_chaos.py``: a head with no CPUs and N one-CPU worker nodes on this machine, each a
``ray start`` in its own process group; a kill is SIGKILL to that group, and a fresh node
replaces it):

- **sweep**: a grid of 8 configurations, 8 epochs of the tiny demo data each (24 checks), run once without
  faults and once with a worker node killed every ``--every`` seconds up to ``--kills`` times;
  a trial is *inconsistent* when its run is not FINISHED, a metric step appears twice, its
  per-check ``valid_acc`` differs from the fault-free run's, or its Optuna trial is missing or
  not COMPLETE;
- **train**: ``train --workers 2`` with one node killed after its 2nd check; inconsistent when its
  final weights differ from an uninterrupted run's;
- **serve**: ``serve --replicas 2`` under ``--clients`` closed-loop loopback clients for
  ``--serve-s`` seconds, with ``--serve-kills`` nodes killed one after another (each replaced).

Run from the repository root (the ``ray`` CLI on PATH; about 10 minutes on 2 cores)::

    python benchmarks/chaos.py
    python benchmarks/chaos.py --kills 6 --every 10 --serve-s 300 --json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests._chaos import ChaosCluster, chaos_launcher, hold_at, kill_when_held, wait_for
from tests._tiny import TINY_SETS, make_tiny_prepared

EPOCHS = 8          # per sweep trial: 3 checks each (a check every 4 of 12 batches)
SPACE = "model.hidden_dim: [8, 12]\nmodel.steps: [1, 2]\ntrain.lr: [2.0e-3, 4.0e-3]\n"


class _Tee(io.TextIOBase):
    def __init__(self, stream: Any) -> None:
        self.stream, self.buffer_ = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def sweep(chaos: ChaosCluster, tiny: Path, root: Path, name: str, every: float, kills: int) -> dict[str, Any]:
    from iaa.jobs.tune import tune
    from iaa.platform.tracking.tracker import MlflowTracker

    root.mkdir(parents=True, exist_ok=True)
    (root / "space.yaml").write_text(SPACE, encoding="utf-8")
    sets = tuple(s for s in TINY_SETS if not s.startswith("train.max_epochs")) + (f"train.max_epochs={EPOCHS}",)
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=8, search_space=root / "space.yaml", sets=sets,
                           workdir=root / "work", name=name, storage_path=str(root / "shared"), grace_period=3 * EPOCHS)
    before, done = len(chaos.kills), threading.Event()
    killer = chaos.kill_every(every, kills, stop=done) if kills else None
    tee = _Tee(sys.stderr)
    started = time.monotonic()
    try:
        with contextlib.redirect_stderr(tee):
            tune.run(req, MlflowTracker, chaos_launcher(chaos.address, str(root / "shared"), root / "marks"))
    finally:
        done.set()                    # no kill after the sweep: only the sweep's faults count
    wall = time.monotonic() - started
    if killer is not None:
        killer.join(timeout=120)
    chaos.restore_workers()
    from tests.test_chaos import sweep_history, study_trials
    from tests._platform import read_sweep

    record = read_sweep(root / "work", name)
    redone = re.search(r"work redone: at most (\S+)", tee.buffer_.getvalue())
    return {"history": sweep_history(record, ("model.hidden_dim", "model.steps", "train.lr")), "study": study_trials(root, name), "wall_s": wall, "faults": len(chaos.kills) - before,
            "redone": redone.group(1) if redone else "0m00s", "statuses": [t["status"] for t in record["trials"]]}


def sweep_row(clean: dict[str, Any], chaos_run: dict[str, Any]) -> dict[str, Any]:
    bad = 0
    for key, run in chaos_run["history"].items():
        expected = clean["history"].get(key)
        bad += (expected is None or run["run"].info.status != "FINISHED" or len(run["steps"]) != len(set(run["steps"]))
                or run["valid_acc"] != expected["valid_acc"])
    bad += abs(len(chaos_run["history"]) - len(clean["history"]))
    trials = chaos_run["study"]
    bad_study = abs(len(trials) - len(chaos_run["history"])) + sum(t.state.name != "COMPLETE" for t in trials)
    # each Optuna trial's intermediate values: one per check, equal to its run's valid_acc
    for t in trials:
        run = chaos_run["history"].get(tuple(str(t.params[k]) for k in ("model.hidden_dim", "model.steps", "train.lr")))
        if run is None or list(t.intermediate_values.values()) != [run["valid_acc"][s] for s in sorted(run["valid_acc"])]:
            bad_study += 1
    restored = sum(int(r["run"].data.tags.get("restores", 0)) > 0 for r in chaos_run["history"].values())
    return {"scenario": f"sweep ({len(chaos_run['history'])} trials)", "faults": chaos_run["faults"],
            "restored": restored, "redone": chaos_run["redone"], "inconsistent": bad + bad_study,
            "answered": "", "p99_ms": "", "wall_s": round(chaos_run["wall_s"])}


def train_row(chaos: ChaosCluster, tiny: Path, root: Path) -> dict[str, Any]:
    from iaa.jobs.modeling import checkpoint
    from tests.test_chaos import train_on_chaos

    clean = train_on_chaos(chaos, tiny, root / "clean", root / "clean-marks")
    markers = root / "marks"
    markers.mkdir(parents=True)
    hold_at(markers, 2, "after")

    killer, _ = kill_when_held(chaos, markers, 2, "train")
    started = time.monotonic()
    result = train_on_chaos(chaos, tiny, root / "chaos", markers)
    wall = time.monotonic() - started
    killer.join(timeout=60)
    a = checkpoint.load(Path(clean["run_dir"]) / "checkpoints" / "last.pt")["model"]
    b = checkpoint.load(Path(result["run_dir"]) / "checkpoints" / "last.pt")["model"]
    import torch

    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return {"scenario": "train --workers 2", "faults": 1, "restored": 1, "redone": "since check 1",
            "inconsistent": int(not same), "answered": "", "p99_ms": "", "wall_s": round(wall)}


def serve_row(chaos: ChaosCluster, root: Path, seconds: float, clients: int, kills: int) -> dict[str, Any]:
    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve as platform_serve
    from tests._explain import tiny_setup
    from tests.test_chaos import closed_loop
    from tests.test_serve import QUESTION, free_port, wait_ready

    prepared, ckpts = tiny_setup(root)
    cfg = job.config(model_uri=None, checkpoint=ckpts["iaa"], ensemble_dir=None, data_dir=prepared, workdir=root,
                     tracking_uri=None, replicas=2, max_batch=4, port=free_port(), address=chaos.address)
    url = platform_serve.start(cfg, job.CODE)
    backs = []
    try:
        wait_ready(url, 300)
        stats: dict[str, Any] = {"sent": 0, "status": [], "latency": [], "tracebacks": 0}
        load = threading.Thread(target=closed_loop, args=(url, json.dumps(QUESTION).encode(), clients, 10 ** 9,
                                                             seconds, stats))
        started = time.monotonic()
        load.start()
        for i in range(kills):
            time.sleep(max(0.0, seconds / (kills + 1) * (i + 1) - (time.monotonic() - started)))
            kill = chaos.kill(replace=False, reason="serve")
            chaos.restore_workers()
            wait_for(lambda: platform_serve.replicas(cfg.app_name) == {"RUNNING": 2}, 300, poll_s=0.5)
            backs.append(time.monotonic() - kill.at)
        load.join()
    finally:
        platform_serve.stop(cfg.app_name)
    latency = sorted(stats["latency"])
    answered = sum(s == 200 for s in stats["status"]) / max(len(stats["status"]), 1)
    errors = Counter(s for s in stats["status"] if s != 200)
    return {"scenario": f"serve --replicas 2 ({len(latency)} requests)", "faults": kills, "restored": len(backs),
            "redone": "", "inconsistent": stats["tracebacks"], "answered": f"{answered:.2%} {dict(errors) or ''}".strip(),
            "p99_ms": round(latency[int(len(latency) * 0.99) - 1] * 1000) if latency else "",
            "wall_s": round(seconds), "back_s": [round(b, 1) for b in backs],
            "p50_ms": round(latency[len(latency) // 2] * 1000) if latency else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="one-CPU worker nodes")
    parser.add_argument("--kills", type=int, default=4, help="nodes killed during the sweep")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between the sweep's kills")
    parser.add_argument("--serve-s", type=float, default=120.0, help="seconds of serve load")
    parser.add_argument("--serve-kills", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--only", choices=("sweep", "train", "serve"), action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = set(args.only or ("sweep", "train", "serve"))
    root = Path(tempfile.mkdtemp(prefix="iaa-chaos-bench-"))
    tiny = make_tiny_prepared(root / "data")
    chaos = ChaosCluster(workers=args.workers, logs=root / "nodes")
    rows = []
    try:
        if "sweep" in only:
            clean = sweep(chaos, tiny, root / "clean", "clean", args.every, 0)
            rows.append(sweep_row(clean, sweep(chaos, tiny, root / "chaos", "chaos", args.every, args.kills)))
        if "train" in only:
            rows.append(train_row(chaos, tiny, root / "train"))
        if "serve" in only:
            rows.append(serve_row(chaos, root / "serve", args.serve_s, args.clients, args.serve_kills))
    finally:
        chaos.shutdown()
        _table(rows, args.json)


def _table(rows: list[dict[str, Any]], as_json: bool) -> None:
    head = ["scenario", "faults", "restored", "redone", "inconsistent", "answered", "p50_ms", "p99_ms", "back_s",
            "wall_s"]
    table = [head] + [[str(r.get(h, "")) for h in head] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if as_json:
        print(json.dumps(rows, default=str))


if __name__ == "__main__":
    main()
