"""Before/after ratio of each speed change, every pair measured in the same run.

    python benchmarks/bench_changes.py [--rounds 3] [--batches 4] [--only NAME ...]

The machine is shared with other processes, so the pairs are timed by process CPU time at one
intra-op thread (what another process on the other core barely disturbs), interleaved, and the
best round of each side is compared. Parts:

- ``gru/*``: the document BiGRU alone, forward + backward, at the paper shape (B 32, d 384,
  h 128, a length-bucketed batch of the workload): padded ``nn.GRU`` (the straightforward way),
  packed ``nn.GRU`` (the reference path), the fused packed recurrence in Python, in C++.
- ``train/<change>``: a whole training step with every change on, against the same step with
  that one change off (leave-one-out), on length-bucketed batches unless the change is bucketing.
- ``infer/inference_table``: inference with and without the per-word projection table.
- ``adam/fused``: one Adam step over the paper model's parameters, default vs fused kernel.
- ``march/gru`` and ``march/train``: the C++ recurrence built with ``-march=native`` against the
  shipped build for the generic x86-64 / arm64 target: the document BiGRU alone, and a whole
  training step.

The last line is JSON: {name: {"before": rate, "after": rate, "ratio": after / before}}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline_reader import random_batches  # noqa: E402
from iaa.jobs.train import bench  # noqa: E402
from iaa.jobs.training.step import build_optimizer, retain_freed_memory, train_step  # noqa: E402
from iaa.model import PRESETS, build_reader  # noqa: E402
from iaa.model.encoder import BiGRUEncoder  # noqa: E402
from iaa.model.kernels import gru_kernels  # noqa: E402
from iaa.model.kernels.fused_gru import FusedEncoder  # noqa: E402

LEAVE_ONE_OUT = {  # change -> the config (or, for the C++ recurrence, the kernel's argument) that turns it off
    "bucketing": {},
    "cpp_recurrence": {"cpp": None},
    "fast_dropout": {"fast_dropout": False},
    "sparse_embedding_grad": {"sparse_embedding_grad": False},
    "batched_read_grad": {"batched_read_grad": False},
}


def best_rate(fns: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Examples per CPU second of each fn (returns examples), best of ``rounds`` interleaved."""
    best = {name: 0.0 for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.process_time()
            count = fn()
            best[name] = max(best[name], count / (time.process_time() - start))
    return best


def gru_part(batch: bench.Batch, rounds: int) -> dict[str, dict]:
    torch.manual_seed(0)
    enc = BiGRUEncoder(384, 128)
    x = torch.randn(*batch.doc.shape, 384, requires_grad=True)
    mask, lengths = batch.doc_mask, batch.doc_mask.sum(1)

    def padded() -> int:
        enc.gru(x)[0].sum().backward()
        return len(lengths)

    def packed() -> int:
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        pad_packed_sequence(enc.gru(packed)[0], batch_first=True)[0].sum().backward()
        return len(lengths)

    def fused(cpp: bool) -> Callable[[], int]:
        kernel = FusedEncoder("fp32", gru_kernels.load() if cpp else None)

        def run() -> int:
            enc(x, mask, encode=kernel.encode)[0].sum().backward()
            return len(lengths)
        return run

    rates = best_rate({"padded": padded, "packed": packed, "python": fused(False), "cpp": fused(True)},
                      max(1, rounds - 1))
    pairs = [("gru/fused_python_vs_padded_nn_gru", "padded", "python"),
             ("gru/fused_python_vs_packed_nn_gru", "packed", "python"),
             ("gru/cpp_vs_python_recurrence", "python", "cpp"),
             ("gru/cpp_vs_padded_nn_gru", "padded", "cpp")]
    return {name: _pair(rates[a], rates[b]) for name, a, b in pairs}


def _pair(before: float, after: float) -> dict:
    return {"before": round(before, 2), "after": round(after, 2), "ratio": round(after / before, 3)}


def _trainer(overrides: dict, batches: list) -> Callable[[], int]:
    """Training steps of the paper reader with ``overrides`` of its config; ``cpp`` there: the
    C++ kernels its encoders run (None: the Python loops)."""
    overrides = dict(overrides)
    cpp = overrides.pop("cpp", gru_kernels.load())
    torch.manual_seed(0)
    model = build_reader(replace(PRESETS["paper"], vocab_size=bench.VOCAB_SIZE, **overrides))
    model.kernels.encoder.cpp = cpp
    optimizer = build_optimizer(model, bench.LR, bench.EMBED_L2)

    def run() -> int:
        for batch in batches:
            train_step(model, optimizer, batch)
        return sum(len(b) for b in batches)

    run()                                                           # warm-up
    return run


def march_part(batch: bench.Batch, batches: list, rounds: int) -> dict[str, dict]:
    """-march=native against the generic target, for the BiGRU alone and a training step."""
    native = gru_kernels.build((*gru_kernels.CFLAGS, "-march=native"))
    generic = gru_kernels.build()
    torch.manual_seed(0)
    enc = BiGRUEncoder(384, 128)
    x = torch.randn(*batch.doc.shape, 384, requires_grad=True)

    def gru(cpp) -> Callable[[], int]:
        kernel = FusedEncoder("fp32", cpp)

        def run() -> int:
            enc(x, batch.doc_mask, encode=kernel.encode)[0].sum().backward()
            return len(batch)
        return run

    results = {}
    for name, make in (("march/gru", gru), ("march/train", lambda cpp: _trainer({"cpp": cpp}, batches))):
        rates = best_rate({"before": make(generic), "after": make(native)}, rounds)
        results[name] = _pair(rates["before"], rates["after"])
        print(name, results[name], flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--only", nargs="*", default=None, help="name prefixes to run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    retain_freed_memory()
    pool = bench.synthetic_examples(args.batches * 32, seed=0)
    bucketed = [bench.collate(b) for b in bench.bucketed_batches(pool, 32)]
    padded = [bench.collate(b) for b in random_batches(pool, 32)]

    def wanted(name: str) -> bool:
        return args.only is None or any(name.startswith(p) for p in args.only)

    results: dict[str, dict] = {}
    if wanted("gru/"):
        results.update(gru_part(bucketed[0], args.rounds))
        print(json.dumps(results), flush=True)
    for change, off in LEAVE_ONE_OUT.items():
        name = f"train/{change}"
        if not wanted(name):
            continue
        after = _trainer({}, bucketed)
        before = _trainer(off, padded if change == "bucketing" else bucketed)
        rates = best_rate({"before": before, "after": after}, args.rounds)
        results[name] = _pair(rates["before"], rates["after"])
        print(name, results[name], flush=True)
    if wanted("infer/"):
        models = {}
        for flag in (False, True):
            torch.manual_seed(0)
            models[flag] = build_reader(replace(PRESETS["paper"], vocab_size=bench.VOCAB_SIZE,
                                                inference_table=flag)).eval()

        def infer(model) -> Callable[[], int]:
            def run() -> int:
                with torch.inference_mode():
                    for batch in bucketed:
                        model(batch)
                return sum(len(b) for b in bucketed)
            run()
            return run

        rates = best_rate({"before": infer(models[False]), "after": infer(models[True])}, args.rounds)
        results["infer/inference_table"] = _pair(rates["before"], rates["after"])
        print("infer/inference_table", results["infer/inference_table"], flush=True)
    if wanted("adam/"):
        model = build_reader(replace(PRESETS["paper"], vocab_size=bench.VOCAB_SIZE))
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        plain = torch.optim.Adam(model.parameters(), lr=1e-3)
        fused = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        rates = best_rate({"before": lambda: (plain.step(), 1)[1], "after": lambda: (fused.step(), 1)[1]},
                          args.rounds * 3)
        results["adam/fused"] = _pair(rates["before"], rates["after"])
        print("adam/fused", results["adam/fused"], flush=True)
    if wanted("march/"):
        results.update(march_part(bucketed[0], bucketed, args.rounds))
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
