"""One code version's training and inference rates, for comparing versions in separate processes.

    python benchmarks/bench_versions.py CODE_DIR fp32|bf16 [BATCHES] [THREADS] [WARMUP]

Imports ``iaa`` from ``CODE_DIR`` (a checkout, e.g. a ``git worktree`` of an older commit), then
times ``BATCHES`` training steps and as many inference batches of the paper-config reader on
the synthetic CBT-NE workload of ``iaa.jobs.training.bench``, on THREADS torch threads (default 1: then
process CPU time, else wall-clock time), after WARMUP other batches (default 1), and prints one
JSON line. Each batch has its own shapes: under bf16, oneDNN builds a kernel the first time it
sees a shape, so with few warm-up batches a run counts those builds, which a long training run
pays once per shape. Two versions cannot share a
process, so alternate them, e.g. three rounds of

    for v in "../old fp32" ". fp32" ". bf16"; do python benchmarks/bench_versions.py $v 6; done
"""

import json
import sys
import time
from dataclasses import replace

code, precision = sys.argv[1], sys.argv[2]
batches = int(sys.argv[3]) if len(sys.argv) > 3 else 6
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
warmup = int(sys.argv[5]) if len(sys.argv) > 5 else 1
sys.path.insert(0, code)

import torch  # noqa: E402

from iaa.jobs.training import bench  # noqa: E402
from iaa.jobs.training.step import autocast, build_optimizer, retain_freed_memory, train_step  # noqa: E402
from iaa.model import PRESETS, build_reader  # noqa: E402

torch.set_num_threads(threads)
clock = time.process_time if threads == 1 else time.perf_counter
retain_freed_memory()
dtype = torch.bfloat16 if precision == "bf16" else None
torch.manual_seed(0)
reader = build_reader(replace(PRESETS["paper"], vocab_size=bench.VOCAB_SIZE))
optimizer = build_optimizer(reader, 1e-3, 1e-4)
timed = [bench.collate(b) for b in bench.bucketed_batches(bench.synthetic_examples(batches * 32, seed=0), 32)]
warm = bench.collate(bench.synthetic_examples(32, seed=1))
for batch in bench.bucketed_batches(bench.synthetic_examples(warmup * 32, seed=1), 32):
    train_step(reader, optimizer, bench.collate(batch), amp_dtype=dtype)
start = clock()
for batch in timed:
    train_step(reader, optimizer, batch, amp_dtype=dtype)
train = len(timed) * 32 / (clock() - start)
reader.eval()
with torch.inference_mode(), autocast("cpu", dtype):
    reader(warm)                                            # builds the inference table
    start = clock()
    for batch in timed:
        reader(batch)
infer = len(timed) * 32 / (clock() - start)
print(json.dumps({"code": code, "precision": precision, "threads": threads, "warmup": warmup, "train": round(train, 2), "infer": round(infer, 2)}))
