"""Build ``curves.parquet``: the reader's learning curves over a fixed grid, for replaying searches.

Every configuration of ``GRID`` (the paper's knobs, embedding L2, T, d, h and s, plus the learning
rate and dropout) is trained once on the CPU, in this process or in ``--workers`` processes of one
torch thread each, with the same seed, for ``MAX_EPOCHS`` on the first ``TRAIN_ROWS`` examples of
the demo's training split, validated on the whole validation split every ``CHECK_EVERY`` batches,
without early stopping. Each check becomes a row of the table (columns in ``table.py``). A
search (Optuna's TPE with ASHA, as ``iaa-cli tune`` builds them) can then be replayed against the
table with simulated time and no training.

The full table (22 to 36 minutes with two workers on a 2-core machine; kept in git)::

    nice -n 15 .venv/bin/python benchmarks/search/build_table.py --workers 2

The build is resumable: each finished configuration is appended as one JSON line to
``--parts`` (default ``/tmp/iaa-table/parts``), and a rerun trains only the configurations not
there yet; the table is written once every configuration is done. Each line carries its plan's
fingerprint, and a line of another plan is never read. A stopped build stops its workers (a
worker whose build is gone ends after the configuration it trains). ``--limit K`` builds the first
K configurations of a fixed shuffled order (a random slice of the grid), for a quick check.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import multiprocessing
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402  (this folder's key figures of a table)
import table  # noqa: E402  (this folder's schema, writer and reader)

ROOT = Path(__file__).resolve().parents[2]
SCRATCH = Path("/tmp/iaa-table")

DATASET = "demo"
TRAIN_ROWS = 9600            # the first rows of the demo's 20,000: few enough that search matters
SEED = 0                     # every configuration shares it, as a sweep's trials do
GRID: dict[str, list[Any]] = {
    "train.lr": [2e-3, 4e-3, 8e-3],
    "train.embed_l2": [1e-4, 1e-3],
    "model.steps": [1, 3],
    "model.embed_dim": [32, 64],
    "model.hidden_dim": [32, 64],
    "model.state_dim": [64, 128],
    "model.dropout": [0.0, 0.2],
}
FIXED: dict[str, Any] = {
    "train.batch_size": 32,
    "train.max_epochs": 1.5,
    "train.check_every": 90,     # 450 batches in 1.5 epochs of 9,600 rows: 5 checks
    "train.patience": 1000,      # no early stopping: every configuration gets all its checks
    "train.seed": SEED,
    "train.threads": 1,
    "train.precision": "fp32",   # the same arithmetic on every CPU (auto would pick by machine)
}
ORDER_SEED = 0               # the shuffled order that --limit slices and workers share out


@dataclass(frozen=True)
class Plan:
    """What a build trains: its data, grid and fixed settings, and where it keeps its parts."""

    dataset: str
    data: str                    # prepared folder
    train_rows: int
    grid: dict[str, list[Any]]
    fixed: dict[str, Any]
    parts: str                   # folder of the finished configurations (JSON lines)
    runs: str                    # scratch run folders, removed after each configuration

    def fingerprint(self) -> str:
        """What the parts depend on: a resumed build must train exactly as the one it continues."""
        same = {k: v for k, v in asdict(self).items() if k not in ("parts", "runs")}
        return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]


def configurations(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every configuration of ``grid``, in product order: a configuration's id is its index."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def build_order(n: int, limit: int | None = None) -> list[int]:
    """Config ids in a fixed shuffled order, so that a ``limit`` slice and each worker's share mix all knobs."""
    order = list(range(n))
    random.Random(ORDER_SEED).shuffle(order)
    return order[:limit] if limit else order


# --- parts: the finished configurations ---------------------------------------------------------


def read_parts(parts: Path, fingerprint: str) -> dict[int, dict[str, Any]]:
    """Finished configurations of the plan ``fingerprint`` by id; a line cut short by a killed
    worker, or written for another plan, is ignored."""
    done: dict[int, dict[str, Any]] = {}
    for path in sorted(parts.glob("worker-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("plan", fingerprint) == fingerprint:
                done[int(record["config_id"])] = record
    return done


def claim_parts(plan: Plan) -> None:
    """Create ``plan.parts`` for this plan, or check that the parts there were built by the same plan."""
    parts = Path(plan.parts)
    parts.mkdir(parents=True, exist_ok=True)
    stamp = parts / "plan.json"
    if stamp.exists():
        old = json.loads(stamp.read_text())
        if old["fingerprint"] != plan.fingerprint():
            raise SystemExit(f"{parts} holds configurations of another plan (see {stamp}); "
                             f"give another --parts, or delete it to start over")
    else:
        stamp.write_text(json.dumps({"fingerprint": plan.fingerprint(), **asdict(plan)}, indent=1))


def append_part(path: Path, record: Mapping[str, Any]) -> None:
    """One finished configuration, one line, on disk before the next configuration starts (after a
    newline when a killed worker left the file's last line cut short)."""
    with open(path, "ab+") as f:
        torn = f.seek(0, os.SEEK_END) > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        f.write((("\n" if torn else "") + json.dumps(record) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


# --- training -----------------------------------------------------------------------------------


def train_configuration(config_id: int, params: Mapping[str, Any], plan: Plan, train_rows: Any) -> dict[str, Any]:
    """Train one configuration; returns its record: the params and one row per check."""
    from iaa.data.loading.loader import num_batches
    from iaa.jobs.config.job_config import apply
    from iaa.jobs.datasets.resolve import job_config
    from iaa.jobs.train import train

    cfg = apply(job_config(plan.dataset, Path(plan.data)), {**plan.fixed, **params})
    batch_size, n = cfg.train.batch_size, train_rows.num_rows
    per_epoch = num_batches(n, batch_size)
    rows: list[dict[str, Any]] = []
    last_steps, train_seconds = 0, 0.0

    def on_check(m: Mapping[str, Any]) -> None:
        nonlocal last_steps, train_seconds
        steps = int(m["steps"])
        # the loop reports the window's speed: its batches over its training time (validation excluded)
        train_seconds += (steps - last_steps) * batch_size / m["train_examples_per_s"]
        last_steps = steps
        epochs, batch = divmod(steps, per_epoch)
        rows.append({**params, "config_id": config_id, "check": len(rows) + 1,
                     "valid_acc": float(m["valid_acc"]), "best_valid_acc": float(m["best_valid_acc"]),
                     "examples": epochs * n + round(batch * n / per_epoch),   # exact when batch_size divides n
                     "seconds": train_seconds, "wall_seconds": time.perf_counter() - start,
                     "epoch": float(m["epoch"])})

    run_dir = Path(plan.runs) / f"config-{config_id}-{os.getpid()}"
    started_at = time.time()
    start = time.perf_counter()
    try:
        train.run(cfg, Path(plan.data), run_dir, device="cpu", show_progress=False, train_rows=train_rows,
                  on_metrics=on_check)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"config_id": config_id, "params": dict(params), "rows": rows, "started_at": started_at,
            "finished_at": time.time(), "pid": os.getpid()}


def work(worker: int, config_ids: Sequence[int], plan: Plan) -> None:
    """One worker: train ``config_ids`` in turn with one torch thread, appending each to its part file."""
    import torch

    from iaa.data.loading.loader import PreparedData

    torch.set_num_threads(1)
    build = os.getppid()
    rows = PreparedData.open(Path(plan.data)).rows("train", 0, plan.train_rows)
    grid = configurations(plan.grid)
    out = Path(plan.parts) / f"worker-{worker}.jsonl"
    for i, config_id in enumerate(config_ids, 1):
        record = train_configuration(config_id, grid[config_id], plan, rows)
        append_part(out, {**record, "plan": plan.fingerprint()})
        best = max(r["valid_acc"] for r in record["rows"])
        took = record["finished_at"] - record["started_at"]
        print(f"worker {worker}: {i}/{len(config_ids)} config {config_id} best {best:.3f} in {took:.0f} s",
              flush=True)
        if os.getppid() != build:           # the build was killed: what is kept serves its rerun
            return


def run_workers(todo: list[int], plan: Plan, workers: int) -> None:
    """Share ``todo`` out round-robin over ``workers`` processes (in this process for one)."""
    if workers <= 1:
        work(0, todo, plan)
        return
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=work, args=(w, todo[w::workers], plan)) for w in range(workers)]
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))   # the workers end too
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in procs:
            if p.is_alive():
                p.terminate()
    failed = [w for w, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        raise SystemExit(f"workers {failed} failed; rerun the same command to train what is left")


# --- the table ----------------------------------------------------------------------------------


def cpu_model() -> str:
    """``lscpu``'s Model name (the platform's processor string where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else platform.machine()


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def table_metadata(plan: Plan, records: Iterable[Mapping[str, Any]], command: str, workers: int) -> dict[str, str]:
    """How the table was built: command, data and its size, settings, machine, software, dates."""
    import torch

    from iaa.data.loading.loader import PreparedData

    records = list(records)
    prepared = PreparedData.open(Path(plan.data))
    splits = {name: sum(s.rows for s in split.shards) for name, split in prepared.manifest.splits.items()}
    return {
        "command": command,
        "dataset": plan.dataset,
        "dataset_size": json.dumps({"train": plan.train_rows, "train_prepared": splits.get("train", 0),
                                    "valid": splits.get("valid", 0)}),
        "vocab_hash": prepared.manifest.vocab_hash,
        "seed": str(plan.fixed.get("train.seed", SEED)),
        "fixed": json.dumps(plan.fixed),
        "cpu": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "workers": str(workers),
        "torch_threads_per_worker": "1",
        "nice": str(os.nice(0)),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "iaa_commit": git_commit(),
        "build_started": _iso(min(r["started_at"] for r in records)),
        "build_finished": _iso(max(r["finished_at"] for r in records)),
        "date": datetime.date.today().isoformat(),
    }


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


# --- command line -------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1, help="processes, one torch thread each [1]")
    ap.add_argument("--limit", type=int, default=None, help="only the first K configurations of the shuffled order")
    ap.add_argument("--out", type=Path, default=table.DEFAULT, help=f"the table [{table.DEFAULT}]")
    ap.add_argument("--parts", type=Path, default=SCRATCH / "parts", help="finished configurations, for resuming")
    ap.add_argument("--runs", type=Path, default=SCRATCH / "runs", help="scratch run folders")
    ap.add_argument("--workdir", type=Path, default=SCRATCH / "work", help="where the demo is prepared")
    ap.add_argument("--data", type=Path, default=None, help="a prepared folder instead of the demo under --workdir")
    ap.add_argument("--dataset", default=DATASET, help="the preset of --data [demo]")
    ap.add_argument("--train-rows", type=int, default=TRAIN_ROWS, help=f"training examples [{TRAIN_ROWS}]")
    ap.add_argument("--grid", type=json.loads, default=None, help="JSON dotted name -> choices, instead of GRID")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=JSON",
                    help="change a fixed setting, e.g. train.max_epochs=1.0")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    fixed = dict(FIXED)
    for item in args.sets:
        key, _, value = item.partition("=")
        try:
            fixed[key] = json.loads(value)
        except json.JSONDecodeError:
            fixed[key] = value          # a bare word: fp32, auto
    if args.data is None:
        from iaa.jobs.datasets.prepare import ensure_prepared

        args.data = ensure_prepared(DATASET, args.workdir)
    plan = Plan(dataset=args.dataset, data=str(Path(args.data).resolve()), train_rows=args.train_rows,
                grid=args.grid or GRID, fixed=fixed, parts=str(args.parts), runs=str(args.runs))
    claim_parts(plan)
    wanted = build_order(len(configurations(plan.grid)), args.limit)
    done = read_parts(Path(plan.parts), plan.fingerprint())
    todo = [c for c in wanted if c not in done]
    print(f"{len(wanted)} configurations: {len(wanted) - len(todo)} done, {len(todo)} to train "
          f"on {args.workers} worker(s)", flush=True)
    if todo:
        run_workers(todo, plan, args.workers)
        done = read_parts(Path(plan.parts), plan.fingerprint())
    missing = [c for c in wanted if c not in done]
    if missing:
        raise SystemExit(f"configurations {missing} did not finish; rerun the same command to train them")
    records = [done[c] for c in wanted]
    command = "python " + shlex.join([os.path.relpath(__file__, ROOT) if Path(__file__).is_relative_to(ROOT)
                                      else __file__, *argv])
    table.write_table([row for r in records for row in r["rows"]], plan.grid, args.out,
                      table_metadata(plan, records, command, args.workers))
    print(f"wrote {args.out}: {len(records)} configurations, {sum(len(r['rows']) for r in records)} checks",
          flush=True)
    print(json.dumps(figures.key_figures(table.load(args.out)), indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
