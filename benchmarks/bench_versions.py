"""One code version's training and inference rates, for comparing versions in separate processes.

    python benchmarks/bench_versions.py CODE_DIR fp32|bf16|auto [BATCHES] [THREADS] [WARMUP]

Imports ``iaa`` from ``CODE_DIR`` (a checkout, e.g. a ``git worktree`` of an older commit), then
times ``BATCHES`` training steps and as many inference batches of the paper-config reader on
the synthetic CBT-NE workload of ``iaa.jobs.train.bench``, on THREADS torch threads (default 1: then
process CPU time, else wall-clock time), after WARMUP other batches (default 1), and prints one
JSON line. ``auto`` is ``train.precision``'s rule on this machine (the probe, cached). Each
batch has its own shapes: under bf16, oneDNN builds a kernel the first time it sees a shape, so
with few warm-up batches a run counts those builds, which a long training run pays once per
shape. Versions whose reader takes its precision as an argument (``build_reader(cfg, device,
precision)``) get it there; older ones run under bf16 autocast. Two versions cannot share a
process, so alternate them, e.g. three rounds of

    for v in "../old fp32" ". fp32" "../old auto" ". auto"; do python benchmarks/bench_versions.py $v 6; done
"""

import importlib
import inspect
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import replace

code, precision = sys.argv[1], sys.argv[2]
batches = int(sys.argv[3]) if len(sys.argv) > 3 else 6
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
warmup = int(sys.argv[5]) if len(sys.argv) > 5 else 1
sys.path.insert(0, code)

import torch  # noqa: E402

from iaa.model import PRESETS, build_reader  # noqa: E402


def first_module(*names: str):
    """The first of ``names`` that this version has (modules moved between versions)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            pass
    raise ModuleNotFoundError(names[0])


bench = first_module("iaa.jobs.train.bench", "iaa.jobs.training.bench", "iaa.jobs.bench")
step = first_module("iaa.jobs.training.step", "iaa.jobs.step")
policy = first_module("iaa.jobs.modeling.precision_policy", "iaa.jobs.training.precision_policy",
                      "iaa.jobs.precision")
build_optimizer, retain_freed_memory, train_step = step.build_optimizer, step.retain_freed_memory, step.train_step

torch.set_num_threads(threads)
clock = time.process_time if threads == 1 else time.perf_counter
retain_freed_memory()
used = policy.resolve(precision, "cpu")                     # fp32 | bf16
cfg = replace(PRESETS["paper"], vocab_size=bench.VOCAB_SIZE)
torch.manual_seed(0)
if "precision" in inspect.signature(build_reader).parameters:  # the reader takes its precision
    reader, step_args, arithmetic = build_reader(cfg, "cpu", used), {}, nullcontext
else:                                                       # older versions: autocast around the reader
    dtype = torch.bfloat16 if used == "bf16" else None
    reader, step_args = build_reader(cfg), {"amp_dtype": dtype}
    arithmetic = lambda: step.autocast("cpu", dtype)  # noqa: E731
optimizer = build_optimizer(reader, 1e-3, 1e-4)
timed = [bench.collate(b) for b in bench.bucketed_batches(bench.synthetic_examples(batches * 32, seed=0), 32)]
warm = bench.collate(bench.synthetic_examples(32, seed=1))
for batch in bench.bucketed_batches(bench.synthetic_examples(warmup * 32, seed=1), 32):
    train_step(reader, optimizer, bench.collate(batch), **step_args)
start = clock()
for batch in timed:
    train_step(reader, optimizer, batch, **step_args)
train = len(timed) * 32 / (clock() - start)
reader.eval()
with torch.inference_mode(), arithmetic():
    reader(warm)                                            # builds the inference table
    start = clock()
    for batch in timed:
        reader(batch)
infer = len(timed) * 32 / (clock() - start)
print(json.dumps({"code": code, "precision": precision, "used": used, "threads": threads, "warmup": warmup, "train": round(train, 2), "infer": round(infer, 2)}))
