#!/usr/bin/env bash
# One prepared GPU measurement (issue 6, item 5), to run on a machine with one CUDA GPU:
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # default: $OUT if set, else ./gpu-results
#
# 1. the CBT-NE-shaped benchmark on CUDA: fp32 and bf16 autocast (cuDNN packed GRU on CUDA);
# 2. a batch-size sweep of training throughput (bf16);
# 3. short real training runs on the demo data at batch 32 and at larger batches, so that the
#    largest batch that keeps accuracy can be read off valid_acc;
# 4. the CPU benchmark of the same machine, for reference.
# Every step writes one JSON file; a failing step is recorded and the script goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu-results}}"
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CLI="python -m iaa.cli"

step() {  # step NAME COMMAND...: run, keep the last line (the JSON) and the log
  local name=$1; shift
  echo "== $name: $*"
  if "$@" >"$OUT_DIR/$name.log" 2>&1; then
    tail -n 1 "$OUT_DIR/$name.log" >"$OUT_DIR/$name.json"
  else
    echo "{\"step\": \"$name\", \"failed\": true}" >"$OUT_DIR/$name.json"
  fi
  cat "$OUT_DIR/$name.json"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT_DIR/gpu.txt" 2>&1 || true
python -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.backends.cudnn.version())" \
  >>"$OUT_DIR/gpu.txt" 2>&1 || true

# 1. The benchmark command (bf16 autocast is the default on CUDA), and the fp32 path.
step bench_cuda_bf16 $CLI bench --device cuda --json
step bench_cuda_fp32 python -c "import json; from iaa.jobs.bench import run; \
print(json.dumps(run(device='cuda', precision='fp32', steps=20, warmup=3)))"

# 2. Batch-size sweep (training and inference ex/s at each batch size).
for bs in 32 64 128 256 512; do
  step "sweep_bs$bs" python -c "import json; from iaa.jobs.bench import run; \
r = run(device='cuda', batch_size=$bs, steps=10, warmup=3); r.pop('config'); print(json.dumps(r))"
done

# 3. Short real training runs on the demo data (valid_acc per batch size; lr scaled with the batch).
for bs in 32 128 512; do
  step "train_demo_bs$bs" $CLI train --dataset demo --gpus-per-worker 1 \
    --set train.batch_size=$bs --set train.max_epochs=3 --json
done

# 4. The same benchmark on this machine's CPUs, for scale.
step bench_cpu $CLI bench --device cpu --json
step bench_cpu_bf16 $CLI bench --device cpu --set bench.precision=bf16 --json
echo "results in $OUT_DIR"
