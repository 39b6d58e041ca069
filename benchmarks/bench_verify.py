"""Cost of verifying a prepared folder, against the time of one training epoch on it.

    python benchmarks/bench_verify.py --data iaa-work/data/cbt-ne [--train-ex-per-s 40] [--repeats 3]

Times ``iaa.data.prepared.verify.verify`` cold (every shard hashed, read and range-checked, as a new
process does) and warm (unchanged files skipped by their stat identity, as a second job in the
same process does). The epoch time is the split's example count over a training throughput:
given with ``--train-ex-per-s`` (for instance ``iaa-cli bench``'s ``train_examples_per_s``), or
measured here by ``iaa.jobs.train.bench.run`` at the paper configuration. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def time_verify(data: Path, repeats: int) -> dict[str, float]:
    from iaa.data.prepared import verify

    cold, warm = [], []
    for _ in range(repeats):
        verify.forget()
        t0 = time.perf_counter()
        verify.verify(data)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        verify.verify(data)
        warm.append(time.perf_counter() - t0)
    return {"verify_cold_s": min(cold), "verify_warm_s": min(warm)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a prepared folder (iaa-cli prepare)")
    parser.add_argument("--train-ex-per-s", type=float, default=None,
                        help="training throughput; default: measure it with iaa.jobs.train.bench.run")
    parser.add_argument("--bench-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from iaa.data.prepared import manifest as M

    manifest = M.read(args.data)
    shard_bytes = sum(s.bytes for e in manifest.splits.values() for s in e.shards)
    result: dict[str, object] = {"data": str(args.data), "shard_mb": round(shard_bytes / 2**20, 1),
                                 **time_verify(args.data, args.repeats)}
    rate = args.train_ex_per_s
    if rate is None:
        from iaa.jobs.train import bench

        rate = bench.run(steps=args.bench_steps, warmup=1).train_examples_per_s
        result["train_ex_per_s_measured"] = round(rate, 2)
    epoch_s = manifest.count("train") / rate
    result.update(train_examples=manifest.count("train"), train_ex_per_s=round(rate, 2),
                  epoch_s=round(epoch_s, 1), verify_fraction_of_epoch=result["verify_cold_s"] / epoch_s)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
