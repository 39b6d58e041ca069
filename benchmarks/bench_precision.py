"""fp32 against bf16 on the CPU, interleaved in one run: GEMM choices, training and inference.

    python benchmarks/bench_precision.py [--threads 2] [--rounds 5] [--steps 2] [--clock cpu] [--json OUT]

1. GEMMs: each matmul shape of the paper config in fp32 and with bf16 operands, the two
   alternating, median of ``--rounds`` (GFLOP/s), with the cast of the operands that the
   reader pays counted in the bf16 time where it pays it (``cast``). These decide which GEMMs
   get bf16 operands (``iaa.model.kernels.fused_gru``, ``iaa.model.kernels.precision``).
2. Training and inference of the IAA reader on the synthetic CBT-NE workload of
   ``iaa.jobs.train.bench``, one batch per side in turn, sides: fp32, bf16 (``train.precision=bf16``:
   the T steps' 32-row matmuls, i.e. gates, inference GRU and read projections, take bf16
   operands on AMX where the CPU has it), and bf16 with those matmuls kept fp32
   (the kernels' ``bf16_products=False``). Each side's first batch goes first in turn,
   and in training the sides trade readers (same initial weights, one optimizer each) from
   batch to batch: a reader's own memory placement was measured to bias its side by up to 10%. Rates are
   totals (examples / seconds) per side; the last line is JSON.
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

from iaa.jobs.train import bench  # noqa: E402
from iaa.jobs.training.step import build_optimizer, retain_freed_memory, train_step  # noqa: E402
from iaa.model import PRESETS, build_reader  # noqa: E402
from iaa.model import kernels as fast  # noqa: E402
from iaa.model.kernels import gru_kernels  # noqa: E402

TOKENS = 32 * 430          # packed rows of one encoder at batch 32
# name: (m, k, n, cast): cast = which operands the bf16 path converts on each call
GEMMS = {
    "encoder input projection x W_ih^T": (TOKENS, 384, 384, "a"),
    "encoder input gradient dG W_ih": (TOKENS, 384, 384, "a"),
    "encoder weight gradient dG^T x": (384, TOKENS, 384, "a"),
    "encoder recurrent weight gradient dG^T h": (384, TOKENS, 128, "ab"),
    "recurrent step h W_hh^T (32 rows)": (32, 128, 384, "a"),
    "recurrent step gradient dG W_hh (32 rows)": (32, 384, 128, "a"),
    "inference GRU step (32 rows)": (32, 512, 1536, "a"),
    "search gate hidden layer (32 rows)": (32, 1280, 256, "a"),
    "inference table X W_ih^T (50k words)": (bench.VOCAB_SIZE, 384, 384, "ab"),
}


def gemm_rates(rounds: int, clock=time.perf_counter) -> dict[str, dict[str, float]]:
    """GFLOP/s per GEMM: fp32, bf16 on bf16 operands, and bf16 counting the operand casts."""
    results = {}
    for name, (m, k, n, cast) in GEMMS.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        a16, b16 = a.bfloat16(), b.bfloat16()
        reps = max(1, int(2e9 // (2 * m * k * n)))
        sides = {
            "fp32": lambda: torch.mm(a, b),
            "bf16": lambda: torch.mm(a16, b16),
            "bf16_with_cast": lambda: torch.mm(a.bfloat16() if "a" in cast else a16,
                                               b.bfloat16() if "b" in cast else b16).float(),
        }
        times: dict[str, list[float]] = {side: [] for side in sides}
        for rnd in range(rounds + 1):
            for side, fn in sides.items():
                start = clock()
                for _ in range(reps):
                    fn()
                if rnd:
                    times[side].append((clock() - start) / reps)
        results[name] = {side: round(2 * m * k * n / statistics.median(t) / 1e9, 1) for side, t in times.items()}
        if name.startswith("recurrent step"):
            results[name].update(_amx_rate(a, b, reps, rounds, clock))
        results[name]["bf16_speedup"] = round(results[name]["bf16_with_cast"] / results[name]["fp32"], 2)
        amx = f"  C++ AMX {results[name]['amx']:7.1f}" if "amx" in results[name] else ""
        print(f"{name:45s} fp32 {results[name]['fp32']:7.1f}  bf16 {results[name]['bf16']:7.1f}  "
              f"bf16+cast {results[name]['bf16_with_cast']:7.1f} GFLOP/s  ({results[name]['bf16_speedup']}x){amx}",
              flush=True)
    return results


def _amx_rate(a: torch.Tensor, b: torch.Tensor, reps: int, rounds: int, clock) -> dict[str, float]:
    """The recurrence's own AMX matmul (``gru_kernels``, operands rounded to bf16 in the loop, as
    the recurrence does at every step), where the CPU has AMX: {"amx": GFLOP/s}, else {}."""
    kernels = gru_kernels.load()
    if kernels is None or not kernels.amx_paths(a.shape[1]):
        return {}
    times = []
    for rnd in range(rounds + 1):
        start = clock()
        kernels.amx_matmul(a, b, reps)
        if rnd:
            times.append((clock() - start) / reps)
    return {"amx": round(2 * a.shape[0] * a.shape[1] * b.shape[1] / statistics.median(times) / 1e9, 1)}


SIDES = {                  # name: (precision, bf16 small matmuls)
    "fp32": ("fp32", True),
    "bf16": ("bf16", True),
    "bf16, small matmuls fp32": ("bf16", False),
}


def _as_side(reader, name: str):
    """``reader`` computing as side ``name``: its precision and kernels chosen for it (the
    sides trade readers; each side's first pass builds what its kernels cache)."""
    precision, small_bf16 = SIDES[name]
    if (reader.precision, getattr(reader, "_side", None)) != (precision, name):
        reader.precision, reader._side = precision, name
        reader.kernels = fast.select("cpu", precision, reader.cfg)
        for kernel in (reader.kernels.layers, reader.kernels.steps):
            if kernel is not None:
                kernel.bf16_products = small_bf16
    return reader


def model_rates(rounds: int, steps: int, batch_size: int, clock=time.perf_counter) -> dict[str, dict[str, float]]:
    cfg = replace(PRESETS["paper"], vocab_size=bench.VOCAB_SIZE)
    readers = []
    for _ in SIDES:
        torch.manual_seed(0)
        reader = build_reader(cfg)
        readers.append((reader, build_optimizer(reader, 1e-3, 1e-4)))
    pool = bench.synthetic_examples(rounds * steps * batch_size, seed=0)
    batches = [bench.collate(b) for b in bench.bucketed_batches(pool, batch_size)]
    warm = bench.collate(bench.synthetic_examples(batch_size, seed=1))
    order = list(SIDES)
    for reader, optimizer in readers:
        for name in SIDES:
            train_step(_as_side(reader, name), optimizer, warm)
    seconds = {name: {"train": 0.0, "infer": 0.0} for name in SIDES}

    def sides_of(i: int, trade: bool):
        """Batch i's (side, reader) pairs: who goes first rotates; with ``trade`` the readers
        rotate over the sides too (in inference each side keeps its reader, whose per-word
        table is built for that side's dtype)."""
        for name in order[i % len(order):] + order[: i % len(order)]:
            yield name, readers[(order.index(name) + (i // len(order) if trade else 0)) % len(readers)]

    for i, batch in enumerate(batches):
        for name, (reader, optimizer) in sides_of(i, trade=True):
            _as_side(reader, name)
            start = clock()
            train_step(reader, optimizer, batch)
            seconds[name]["train"] += clock() - start
    for (reader, _), name in zip(readers, SIDES):
        with torch.inference_mode():
            _as_side(reader, name).eval()(warm)                        # builds the inference table
    for i, batch in enumerate(batches):
        for name, (reader, _) in sides_of(i, trade=False):
            start = clock()
            with torch.inference_mode():
                reader(batch)
            seconds[name]["infer"] += clock() - start
    n = len(batches) * batch_size
    rates = {name: {f"{kind}_examples_per_s": round(n / s, 2) for kind, s in t.items()} for name, t in seconds.items()}
    for name, r in rates.items():
        r["train_speedup"] = round(r["train_examples_per_s"] / rates["fp32"]["train_examples_per_s"], 2)
        r["infer_speedup"] = round(r["infer_examples_per_s"] / rates["fp32"]["infer_examples_per_s"], 2)
        print(f"{name:26s} train {r['train_examples_per_s']:7.2f} ex/s ({r['train_speedup']}x)  "
              f"infer {r['infer_examples_per_s']:7.2f} ex/s ({r['infer_speedup']}x)", flush=True)
    return rates


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep)")
    parser.add_argument("--rounds", type=int, default=5, help="GEMM timings per side; training batches = rounds x steps")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-model", action="store_true", help="only the GEMMs")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu = process CPU time, which other processes on a shared machine "
                             "barely disturb; meaningful as a rate only with --threads 1")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    retain_freed_memory()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__, "clock": args.clock,
              "gemms": gemm_rates(args.rounds, clock)}
    if not args.no_model:
        result["model"] = model_rates(args.rounds, args.steps, args.batch_size, clock)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
