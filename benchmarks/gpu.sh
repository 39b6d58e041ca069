#!/usr/bin/env bash
# One prepared GPU measurement, for a machine with one CUDA GPU. Needs torch (with CUDA), numpy,
# pyarrow, click, pyyaml and tqdm; pytest for step 1. No Ray, MLflow or Optuna: every step calls
# iaa.jobs directly, with PYTHONPATH set to this checkout.
#
#   bash benchmarks/gpu.sh [OUT_DIR]        # default: $OUT if set, else ./gpu-results
#   TRAIN_MINUTES=4.5 SWEEP="64 128 256 512" bash benchmarks/gpu.sh
#
# 0. env.txt: the card, driver, torch, CUDA and cuDNN versions.
# 1. pytest -m gpu: tests/test_gpu.py, and with Ray installed tests/test_platform_gpu*.py.
# 2. bench_{fp32,bf16}.json: the CBT-NE-shaped benchmark at the paper config, batch 32: training
#    and inference ex/s, peak GPU memory, FLOPs and the fraction of the measured matmul rate.
# 3. sweep_bs<N>.json: the same in bf16 at larger batches.
# 4. prepare_cbt_ne.json: cbt-recon NE (../shared/data/cbt-recon, or $IAA_SHARED_DATA) prepared.
# 5. train_cbt_ne.json / .log: the paper config on cbt-recon NE in bf16 for TRAIN_MINUTES,
#    valid accuracy printed at every check (every 1,000 batches); seconds per epoch, with and
#    without the checks (validation and checkpoint writes).
# 6. summary.json: the figures benchmarks/README.md records, with the fraction of the card's
#    bf16 datasheet peak.
# Without CUDA, steps 2, 3 and 5 are skipped with a message; the script always exits 0, and a
# failing step is recorded in its JSON file. About 8 minutes on an H100.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu-results}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT_DIR
TRAIN_MINUTES="${TRAIN_MINUTES:-4.5}"
SWEEP="${SWEEP:-64 128 256 512}"
SHARED="${IAA_SHARED_DATA:-../shared/data}"
SCRATCH="${SCRATCH:-$(mktemp -d -t iaa-gpu-XXXX)}"   # prepared data and checkpoints: not in OUT_DIR
export TRAIN_MINUTES SHARED SCRATCH
start_all=$(date +%s)

step() {  # step NAME TIMEOUT_S COMMAND...: run with a time limit; the last stdout line is the JSON
  local name=$1 limit=$2; shift 2
  echo "== $name ($(($(date +%s) - start_all)) s in): $*"
  if timeout "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1; then
    tail -n 1 "$OUT_DIR/$name.log" >"$OUT_DIR/$name.json"
  else
    echo "{\"step\": \"$name\", \"failed\": true, \"exit\": $?}" >"$OUT_DIR/$name.json"
    tail -n 5 "$OUT_DIR/$name.log"
  fi
  cat "$OUT_DIR/$name.json"
}

# 0. The environment.
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), 'cudnn', torch.backends.cudnn.version(), \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  CUDA=1
else
  CUDA=0
  echo "!! no CUDA device here (torch.cuda.is_available() is False): steps 2, 3 and 5 are skipped"
fi

# 1. The GPU tests (they skip, each with its reason, without CUDA).
if python -c "import pytest" 2>/dev/null; then
  echo "== pytest -m gpu"
  GPU_TESTS="tests/test_gpu.py"
  if python -c "import ray" 2>/dev/null; then   # the Ray GPU tests (one GPU worker, killed, resumed)
    GPU_TESTS="$GPU_TESTS $(ls tests/test_platform_gpu*.py 2>/dev/null | tr '\n' ' ')"
  else
    echo "!! Ray is not installed: the Ray GPU tests (tests/test_platform_gpu*.py) are not run"
  fi
  timeout 240 python -m pytest -q -m gpu -rs -p no:cacheprovider $GPU_TESTS >"$OUT_DIR/pytest_gpu.log" 2>&1
  echo "{\"step\": \"pytest_gpu\", \"exit\": $?}" >"$OUT_DIR/pytest_gpu.json"
  tail -n 12 "$OUT_DIR/pytest_gpu.log"
else
  echo "!! pytest is not installed: step 1 skipped"
fi

bench() {  # bench PRECISION BATCH STEPS: one JSON line
  python - "$@" <<'PY'
import json, sys
from iaa.jobs import bench
precision, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
result = bench.run(device="cuda", precision=precision, batch_size=batch, steps=steps, warmup=3)
result.pop("config")
print(json.dumps(result))
PY
}

if [ "$CUDA" = 1 ]; then
  # 2. Batch 32, fp32 and bf16 autocast.
  step bench_fp32 120 bench fp32 32 30
  step bench_bf16 120 bench bf16 32 30
  # 3. Larger batches in bf16 (the largest that keeps accuracy is read off training runs).
  for bs in $SWEEP; do
    step "sweep_bs$bs" 90 bench bf16 "$bs" 10
  done
fi

# 4. cbt-recon NE, prepared on the CPU.
step prepare_cbt_ne 180 python - <<'PY'
import json, os, sys
from pathlib import Path
from iaa.jobs import prepare
source = Path(os.environ["SHARED"]) / "cbt-recon" / "CBTest"
if not source.is_dir():
    print(f"!! {source} not found (set IAA_SHARED_DATA): the training run is skipped", file=sys.stderr)
    print(json.dumps({"step": "prepare_cbt_ne", "skipped": f"no {source}"}))
    sys.exit(0)
result = prepare.run("cbt-ne", source, Path(os.environ["SCRATCH"]) / "cbt-ne", on_error="skip", progress=False)
print(json.dumps({k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}))
PY

# 5. The paper config on cbt-recon NE, bf16, valid accuracy at every check.
if [ "$CUDA" = 1 ] && [ -f "$SCRATCH/cbt-ne/manifest.json" ]; then
  step train_cbt_ne "$(python -c "print(int(float('$TRAIN_MINUTES') * 60 + 120))")" python - <<'PY'
import json, os, time
from pathlib import Path
from iaa.jobs import resolve, train
prepared = Path(os.environ["SCRATCH"]) / "cbt-ne"
minutes = float(os.environ["TRAIN_MINUTES"])
cfg = resolve.job_config("cbt-ne", prepared, sets=(
    "train.precision=bf16", f"train.max_minutes={minutes}", "train.check_every=1000",
    "train.patience=1000", "train.max_epochs=50"))
start = time.time()

def show(m):
    print(f"step {m['step']:6d}  epoch {m['epoch']:.2f}  {time.time() - start:6.0f} s  "
          f"train_loss {m['train_loss']:.3f}  valid_acc {m['valid_acc']:.4f}  "
          f"train ex/s {m['train_examples_per_s']:.0f}", flush=True)

result = train.run(cfg, prepared, Path(os.environ["SCRATCH"]) / "run", device="cuda", on_metrics=show,
                   show_progress=False)
rows = [json.loads(x) for x in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
epochs = max(r["epoch"] for r in rows)
batches_per_epoch = rows[-1]["step"] / rows[-1]["epoch"]
rates = sorted(r["train_examples_per_s"] for r in rows[1:] or rows)    # the first window warms up
print(json.dumps({"steps": result["steps"], "epochs": epochs, "train_seconds": result["train_seconds"],
                  "seconds_per_epoch": result["train_seconds"] / epochs,
                  "seconds_per_epoch_training_only": batches_per_epoch * cfg.train.batch_size / rates[len(rates) // 2],
                  "best_valid_acc": result["best_valid_acc"], "stop_reason": result["stop_reason"],
                  "curve": [[r["step"], round(r["epoch"], 3), r["valid_acc"]] for r in rows]}))
PY
else
  echo "!! step 5 (training on cbt-recon NE) skipped: it needs CUDA and the prepared data"
fi

# 6. The summary.
python - <<'PY'
import json, os
from pathlib import Path
out = Path(os.environ["OUT_DIR"])
# Dense bf16 tensor-core peaks from NVIDIA's datasheets, by the device name torch reports.
PEAKS = [("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0)]

def read(name):
    try:
        return json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None

env = (out / "env.txt").read_text()
card, peak = next(((k, v) for k, v in PEAKS if k in env), (None, None))
summary = {"env": env.strip().splitlines(), "card": card, "datasheet_bf16_tflops": peak}
for name in ["bench_fp32", "bench_bf16"] + [p.stem for p in sorted(out.glob("sweep_bs*.json"))]:
    r = read(name)
    if r and not r.get("failed"):
        summary[name] = {k: r.get(k) for k in ("batch_size", "precision", "train_examples_per_s",
                         "infer_examples_per_s", "peak_memory_bytes", "achieved_gflops", "matmul_gflops",
                         "roofline_fraction")}
        if peak:
            summary[name]["fraction_of_bf16_datasheet_peak"] = round(r["achieved_gflops"] / (peak * 1e3), 4)
for name in ("pytest_gpu", "prepare_cbt_ne", "train_cbt_ne"):
    summary[name] = read(name)
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
PY
echo "results in $OUT_DIR ($(($(date +%s) - start_all)) s)"
exit 0
