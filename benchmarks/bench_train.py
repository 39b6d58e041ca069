"""Straightforward baseline vs ``iaa`` training (and inference), interleaved in one run.

    python benchmarks/bench_train.py [--rounds 3] [--steps 3] [--set fused_gru=false ...]

Each round times ``--steps`` baseline training batches (random batches padded to their longest
document), then ``--steps`` batches of ours (length-bucketed, ``iaa.jobs.step.train_step``), on
the synthetic CBT-NE workload of ``iaa.jobs.bench`` at the paper config. Over all rounds both
sides train on every example of the pool once, so the rates are totals: examples / seconds. Then
``--rounds`` inference passes over all batches. Rounds alternate between the two sides, so both
meet the same disturbances from other processes; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
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
    pool = bench.synthetic_examples(args.rounds * args.steps * args.batch_size, seed=0)
    warm = bench.collate(bench.synthetic_examples(args.batch_size, seed=1))
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

    step_base(warm)  # warm-up, on other examples
    step_ours(warm)
    totals = {k: [0.0, 0] for k in ("baseline_train", "ours_train", "baseline_infer", "ours_infer")}

    def add(key: str, seconds: float, count: int) -> float:
        totals[key][0] += seconds
        totals[key][1] += count
        return count / seconds

    # Training: round r times batches r*steps .. of each side. Both sides see every example of
    # the pool once over all rounds (in different batches), so the totals compare equal work.
    for r in range(args.rounds):
        chunk = slice(r * args.steps, (r + 1) * args.steps)
        row = {"baseline_train": add("baseline_train", *bench.time_steps(step_base, base_batches[chunk], "cpu", clock)),
               "ours_train": add("ours_train", *bench.time_steps(step_ours, bucketed[chunk], "cpu", clock))}
        print(f"train round {r}: " + ", ".join(f"{k} {v:.1f} ex/s" for k, v in row.items()), flush=True)
    # Inference: the trained models, every batch, after a warm-up batch (ours builds its table).
    if not args.no_infer:
        base.eval(), ours.eval()
        with torch.inference_mode():
            base(warm), ours(warm)
            for r in range(args.rounds):
                row = {"baseline_infer": add("baseline_infer", *bench.time_steps(base, base_batches, "cpu", clock)),
                       "ours_infer": add("ours_infer", *bench.time_steps(ours, bucketed, "cpu", clock))}
                print(f"infer round {r}: " + ", ".join(f"{k} {v:.1f} ex/s" for k, v in row.items()), flush=True)
    result = {k: round(n / t, 2) for k, (t, n) in totals.items() if n}
    result["train_ratio"] = round(result["ours_train"] / result["baseline_train"], 2)
    if not args.no_infer:
        result["infer_ratio"] = round(result["ours_infer"] / result["baseline_infer"], 2)
    result.update(threads=torch.get_num_threads(), clock=args.clock, overrides=overrides,
                  baseline_overrides=args.baseline_set)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
