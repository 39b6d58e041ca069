"""Straightforward baseline vs ``iaa`` training (and inference), interleaved in one run.

    python benchmarks/bench_train.py [--rounds 3] [--steps 3] [--set fused_gru=false ...]

Each round times ``--steps`` baseline training batches (random batches padded to their longest
document), then ``--steps`` batches of ours (length-bucketed, ``iaa.jobs.training.step.train_step``), then
of each ``--variant`` (ours with some fields changed, e.g. ``plain:fused_gru=false``), on
the synthetic CBT-NE workload of ``iaa.jobs.train.bench`` at the paper config. Over all rounds every
side trains on every example of the pool once, so the rates are totals: examples / seconds. Then
``--rounds`` inference passes over all batches. Rounds interleave the sides, and the side that
goes first rotates, so all meet the same disturbances from other processes; the last line is JSON.
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

from baseline_reader import BaselineReader, baseline_optimizer, baseline_train_step, random_batches  # noqa: E402
from iaa.jobs.train import bench  # noqa: E402
from iaa.jobs.training.step import build_optimizer, retain_freed_memory, train_step  # noqa: E402
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


def _overrides(pairs: list[str]) -> dict[str, object]:
    return {k: _value(v) for k, v in (kv.split("=", 1) for kv in pairs)}


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
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=VALUE,...",
                        help="another side timed in the same rounds: ours with these fields, "
                             "e.g. plain:fused_gru=false (bf16: benchmarks/bench_precision.py)")
    parser.add_argument("--no-infer", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time, which other processes on a shared machine "
                             "barely disturb; meaningful as a rate only with --threads 1")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    retain_freed_memory()                       # every side gets the allocator setting
    overrides = _overrides(args.set)
    cfg = replace(PRESETS["paper"], kind=args.model, vocab_size=bench.VOCAB_SIZE, **overrides)
    pool = bench.synthetic_examples(args.rounds * args.steps * args.batch_size, seed=0)
    warm = bench.collate(bench.synthetic_examples(args.batch_size, seed=1))
    bucketed = [bench.collate(b) for b in bench.bucketed_batches(pool, args.batch_size)]
    padded = [bench.collate(b) for b in random_batches(pool, args.batch_size)]

    def ours(side_cfg):
        torch.manual_seed(0)
        model = build_reader(side_cfg)
        opt = build_optimizer(model, bench.LR, bench.EMBED_L2)
        return model, lambda batch: train_step(model, opt, batch), bucketed

    # sides: name -> (model, one training step, its batches); the baseline first.
    sides: dict[str, tuple] = {}
    if args.baseline_set:
        sides["baseline"] = ours(replace(cfg, **_overrides(args.baseline_set)))
    else:
        torch.manual_seed(0)
        base = BaselineReader(cfg)
        base_opt = baseline_optimizer(base, bench.LR)
        sides["baseline"] = (base, lambda batch: baseline_train_step(base, base_opt, batch,
                                                                      embed_l2=bench.EMBED_L2), padded)
    sides["ours"] = ours(cfg)
    for spec in args.variant:
        name, _, fields = spec.partition(":")
        sides[name] = ours(replace(cfg, **_overrides([f for f in fields.split(",") if f])))

    for _, step, _ in sides.values():
        step(warm)                                  # warm-up, on other examples
    totals = {f"{name}_{kind}": [0.0, 0] for kind in ("train", "infer") for name in sides}

    def add(key: str, seconds: float, count: int) -> float:
        totals[key][0] += seconds
        totals[key][1] += count
        return count / seconds

    # Training: round r times batches r*steps .. of each side. Every side sees every example of
    # the pool once over all rounds (in different batches), so the totals compare equal work.
    # The side that goes first rotates from round to round.
    names = list(sides)
    for r in range(args.rounds):
        chunk = slice(r * args.steps, (r + 1) * args.steps)
        order = names[r % len(names):] + names[: r % len(names)]
        row = {f"{name}_train": add(f"{name}_train", *bench.time_steps(sides[name][1], sides[name][2][chunk],
                                                                      "cpu", clock))
               for name in order}
        print(f"train round {r}: " + ", ".join(f"{k} {v:.1f} ex/s" for k, v in row.items()), flush=True)
    # Inference: the trained models, every batch, after a warm-up batch (ours builds its table).
    if not args.no_infer:
        with torch.inference_mode():
            for model, _, _ in sides.values():
                model.eval()
                model(warm)
            for r in range(args.rounds):
                order = names[r % len(names):] + names[: r % len(names)]
                row = {f"{name}_infer": add(f"{name}_infer", *bench.time_steps(sides[name][0], sides[name][2],
                                                                              "cpu", clock))
                       for name in order}
                print(f"infer round {r}: " + ", ".join(f"{k} {v:.1f} ex/s" for k, v in row.items()), flush=True)
    result = {k: round(n / t, 2) for k, (t, n) in totals.items() if n}
    for name in list(sides)[1:]:
        prefix = "" if name == "ours" else f"{name}_"
        result[f"{prefix}train_ratio"] = round(result[f"{name}_train"] / result["baseline_train"], 2)
        if not args.no_infer:
            result[f"{prefix}infer_ratio"] = round(result[f"{name}_infer"] / result["baseline_infer"], 2)
    result.update(threads=torch.get_num_threads(), clock=args.clock, overrides=args.set,
                  baseline_overrides=args.baseline_set, variants=args.variant)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
