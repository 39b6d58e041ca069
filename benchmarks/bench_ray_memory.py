"""Peak memory of the driver and of each Train worker when data-parallel workers get their data.

Two ways for ``--workers N`` Ray Train workers to get the training split:

- ``driver`` (the earlier code): the driver reads the whole split into an Arrow table, hands it to
  ``ray.data.from_arrow`` (a copy in the object store for every Train run) and each worker pulls
  its Ray Data shard into a local table;
- ``rank`` (the current code): each worker reads its own contiguous rows of the Parquet shards
  (``PreparedData.rank_rows``); the driver reads nothing but the manifest.

In both, each worker then cuts its rows into one epoch of padded length-bucketed batches. The data
set is synthetic and CNN-sized by default (380k documents of ~760 tokens, 10 candidates), written
as Parquet shards of 20k rows in a temporary folder. Peaks are ``ru_maxrss`` of each process (the
driver, and every worker process); each mode runs in a fresh driver process. Run from the
repository root::

    python benchmarks/bench_ray_memory.py --docs 95000            # a quarter of CNN's train split
    python benchmarks/bench_ray_memory.py --docs 380000 --json    # CNN-sized (needs ~20 GB free)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iaa.data.prepared import manifest as M
from iaa.data.prepared.shards import SCHEMA, file_sha256

ROWS_PER_SHARD = 20_000
VOCAB_SIZE = 50_000
CANDIDATES = 10


def _lists(lengths: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, kind))


def _shard(rng: np.random.Generator, start: int, n: int, mean_len: int) -> pa.Table:
    doc_len = np.clip(rng.normal(mean_len, mean_len / 3, n), 50, 2000).astype(np.int32)       # (n,)
    query_len = rng.integers(10, 40, n).astype(np.int32)
    doc = rng.integers(3, VOCAB_SIZE, int(doc_len.sum()), dtype=np.int32)
    doc_cand = np.where(rng.random(len(doc)) < 0.05, rng.integers(0, CANDIDATES, len(doc)), -1).astype(np.int16)
    query = rng.integers(3, VOCAB_SIZE, int(query_len.sum()), dtype=np.int32)
    cands = rng.integers(3, VOCAB_SIZE, n * CANDIDATES, dtype=np.int32)
    return pa.Table.from_arrays([
        pa.array([f"synthetic-{i}" for i in range(start, start + n)]),
        _lists(doc_len, doc, pa.int32()), _lists(query_len, query, pa.int32()),
        _lists(np.full(n, CANDIDATES), cands, pa.int32()),
        _lists(np.full(n, CANDIDATES), np.array([f"@entity{c % 1000}" for c in cands], dtype=object), pa.string()),
        pa.array(rng.integers(0, CANDIDATES, n).astype(np.int32)),
        _lists(doc_len, doc_cand, pa.int16()), pa.array(doc_len), pa.array(query_len),
    ], schema=SCHEMA)


def make_dataset(root: Path, docs: int, mean_len: int, valid: int = 4000) -> Path:
    """A prepared folder (manifest, vocabulary, shards) that ``PreparedData.open`` reads."""
    rng = np.random.default_rng(0)
    splits: dict[str, M.Split] = {}
    for split, total in (("train", docs), ("valid", valid)):
        shards = []
        for i, start in enumerate(range(0, total, ROWS_PER_SHARD)):
            name = f"{split}/part-{i:05d}.parquet"
            (root / split).mkdir(parents=True, exist_ok=True)
            pq.write_table(_shard(rng, start, min(ROWS_PER_SHARD, total - start), mean_len), root / name,
                           compression="zstd")
            shards.append(M.Shard(file=name, rows=min(ROWS_PER_SHARD, total - start),
                                  bytes=(root / name).stat().st_size, sha256=file_sha256(root / name)))
        splits[split] = M.Split(count=total, shards=tuple(shards))
    tokens = ["<pad>", "<unk>", "@placeholder", *(f"w{i}" for i in range(VOCAB_SIZE - 3))]
    (root / M.VOCAB).write_text(json.dumps(tokens), encoding="utf-8")
    M.write(root, M.Manifest.of({"dataset": "synthetic"}, vocab_size=len(tokens),
                                vocab_hash=file_sha256(root / M.VOCAB), splits=splits))
    return root


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(config: dict[str, Any]) -> None:
    import ray.train

    from iaa.data.loading.loader import PreparedData, iter_batches

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    started = time.time()
    if config["mode"] == "rank":
        train = PreparedData.open(Path(config["data"])).rank_rows("train", rank, world)
    else:
        shard = ray.train.get_dataset_shard("train")
        train = pa.concat_tables([b for b in shard.iter_batches(batch_size=None, batch_format="pyarrow")
                                  if b.num_rows]).combine_chunks()
    loaded = time.time() - started
    batches = sum(1 for _ in iter_batches(train, 32, seed=0, epoch=0))
    Path(config["out"], f"worker-{rank}.json").write_text(json.dumps(
        {"rank": rank, "rows": train.num_rows, "batches": batches, "load_s": round(loaded, 1),
         "peak_mib": round(_peak_mib())}), encoding="utf-8")


def run_mode(mode: str, data: Path, workers: int, out: Path) -> dict[str, Any]:
    """One Train run in this (fresh) process; returns the driver's and the workers' peaks."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from iaa.data.loading.loader import PreparedData

    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    started = time.time()
    kwargs: dict[str, Any] = {}
    put_mib = 0.0
    if mode == "driver":
        table = PreparedData.open(data).table("train")
        put_mib = table.nbytes / 2**20
        step = -(-table.num_rows // (4 * workers))
        kwargs = {"datasets": {"train": ray.data.from_arrow([table.slice(i, step)
                                                             for i in range(0, table.num_rows, step)])},
                  "dataset_config": ray.train.DataConfig(datasets_to_split=["train"])}
        del table
    trainer = TorchTrainer(_worker, train_loop_config={"mode": mode, "data": str(data), "out": str(out)},
                           scaling_config=ray.train.ScalingConfig(num_workers=workers),
                           torch_config=TorchConfig(backend="gloo"),
                           run_config=ray.train.RunConfig(name=f"mem-{mode}", storage_path=str(out / "ray")), **kwargs)
    trainer.fit()
    wall = time.time() - started
    ray.shutdown()
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    return {"mode": mode, "driver_peak_mib": round(_peak_mib()), "object_store_put_mib": round(put_mib),
            "workers": ranks, "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=380_000)
    parser.add_argument("--mean-len", type=int, default=760)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", type=Path, help="reuse a folder written by an earlier run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mode", choices=("driver", "rank"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:                                   # the child: one mode, one fresh process
        print(json.dumps(run_mode(args.mode, args.data, args.workers, args.out)))
        return
    with tempfile.TemporaryDirectory(prefix="iaa-mem-") as tmp:
        data = args.data
        if data is None:
            started = time.time()
            data = make_dataset(Path(tmp) / "data", args.docs, args.mean_len)
            size = sum(f.stat().st_size for f in data.rglob("*.parquet")) / 2**20
            print(f"wrote {args.docs} documents ({size:.0f} MiB of Parquet) in {time.time() - started:.0f} s",
                  file=sys.stderr)
        results = []
        for mode in ("driver", "rank"):
            out = Path(tmp) / mode
            out.mkdir()
            child = subprocess.run([sys.executable, __file__, "--mode", mode, "--data", str(data), "--workers",
                                    str(args.workers), "--out", str(out)], capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": os.getcwd()})
            if child.returncode:
                sys.exit(f"{mode} failed:\n{child.stderr[-3000:]}")
            results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    for r in results:
        peaks = ", ".join(f"rank {w['rank']} {w['peak_mib']} MiB ({w['rows']} rows, load {w['load_s']} s)"
                          for w in r["workers"])
        print(f"{r['mode']:>6}: driver {r['driver_peak_mib']} MiB, {r['object_store_put_mib']} MiB put into the "
              f"object store; workers: {peaks}; wall {r['wall_s']} s",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"docs": args.docs, "mean_len": args.mean_len, "workers": args.workers, "runs": results}))


if __name__ == "__main__":
    main()
