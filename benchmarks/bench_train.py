"""Straightforward baseline vs ``iaa`` training (and inference), interleaved in one run.

    python benchmarks/bench_train.py [--rounds 3] [--steps 3] [--set fused_gru=false ...]

Each round times ``--steps`` baseline training batches (random batches padded to their longest
document), then ``--steps`` batches of ours (length-bucketed, ``iaa.jobs.step.train_step``), on
the synthetic CBT-NE workload of ``iaa.jobs.bench`` at the paper config, and likewise for
inference. The machine is shared, so only ratios from the same round are meaningful; the median
round ratio is printed, and the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline_reader import BaselineReader, baseline_optimizer, baseline_train_step  # noqa: E402
from iaa.jobs import bench  # noqa: E402
from iaa.jobs.step import build_optimizer, retain_freed_memory, train_step  # noqa: E402
from iaa.model import PRESETS, build_reader  # noqa: E402


def _value(text: str) -> object:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="iaa")
    parser.add_argument("--set", action="append", default=[], help="ReaderConfig field=value for ours")
    parser.add_argument("--baseline-set", action="append", default=[],
                        help="field=value for a second 'ours' run standing in as the baseline "
                             "(A/B of one change) instead of BaselineReader")
    parser.add_argument("--no-infer", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time, which other processes on a shared machine "
                             "barely disturb; meaningful as a rate only with --threads 1")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    retain_freed_memory()                       # both sides get the allocator setting
    overrides = dict(kv.split("=", 1) for kv in args.set)
    cfg = replace(PRESETS["paper"], kind=args.model, vocab_size=bench.VOCAB_SIZE,
                  **{k: _value(v) for k, v in overrides.items()})
    base_cfg = replace(cfg, **{k: _value(v) for k, v in (kv.split("=", 1) for kv in args.baseline_set)})
    n = args.rounds * args.steps * args.batch_size + args.batch_size
    pool = bench.synthetic_examples(n, seed=0)
    bucketed = [bench.collate(b) for b in bench.bucketed_batches(pool, args.batch_size)]
    padded = [bench.collate(b) for b in bench.random_batches(pool, args.batch_size)]

    torch.manual_seed(0)
    ours = build_reader(cfg)
    ours_opt = build_optimizer(ours, bench.LR, bench.EMBED_L2)
    if args.baseline_set:
        base = build_reader(base_cfg)
        base_opt = build_optimizer(base, bench.LR, bench.EMBED_L2)
        base_step, base_batches = train_step, bucketed
    else:
        base = BaselineReader(cfg)
        base_opt = baseline_optimizer(base, bench.LR)
        base_step, base_batches = baseline_train_step, padded

    def step_ours(batch):
        return train_step(ours, ours_opt, batch, embed_l2=bench.EMBED_L2)

    def step_base(batch):
        return base_step(base, base_opt, batch, embed_l2=bench.EMBED_L2)

    step_base(base_batches[-1])  # warm-up
    step_ours(bucketed[-1])
    rows = []
    for r in range(args.rounds):
        chunk = slice(r * args.steps, (r + 1) * args.steps)
        b_s, b_n = bench.time_steps(step_base, base_batches[chunk], "cpu", clock)
        o_s, o_n = bench.time_steps(step_ours, bucketed[chunk], "cpu", clock)
        row = {"baseline_train": b_n / b_s, "ours_train": o_n / o_s}
        if not args.no_infer:
            base.eval(), ours.eval()
            with torch.inference_mode():
                bi_s, bi_n = bench.time_steps(base, base_batches[chunk], "cpu", clock)
                oi_s, oi_n = bench.time_steps(ours, bucketed[chunk], "cpu", clock)
            row.update(baseline_infer=bi_n / bi_s, ours_infer=oi_n / oi_s)
        rows.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v:.1f} ex/s" for k, v in row.items())
              + f"; train ratio {row['ours_train'] / row['baseline_train']:.2f}", flush=True)
    result = {k: round(statistics.median(row[k] for row in rows), 2) for k in rows[0]}
    result["train_ratio"] = round(statistics.median(r["ours_train"] / r["baseline_train"] for r in rows), 2)
    best = {k: max(row[k] for row in rows) for k in rows[0]}    # least disturbed by other processes
    result["train_ratio_best"] = round(best["ours_train"] / best["baseline_train"], 2)
    if not args.no_infer:
        result["infer_ratio"] = round(statistics.median(r["ours_infer"] / r["baseline_infer"] for r in rows), 2)
        result["infer_ratio_best"] = round(best["ours_infer"] / best["baseline_infer"], 2)
    result.update(threads=torch.get_num_threads(), clock=args.clock, overrides=overrides,
                  baseline_overrides=args.baseline_set)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
