"""The GPU measurements of benchmarks/README.md, in two parts that each fit one 9-minute call.

    python3 benchmarks/device_run.py --part 1 --out DIR [--device cuda|cpu] [--tiny]
    python3 benchmarks/device_run.py --part 2 --out DIR [--device cuda|cpu] [--tiny]

Part 1 (no data): the ``gpu`` tests, then the synthetic CBT-shaped benchmark at the paper config:
batch 32 in fp32 and bf16, eager and compiled; bf16 at larger batches; 1, 2, 4 and 8 trials
sharing the card (separate processes); host syncs seen by CUDA's sync debug mode; the input
pipeline with and without prefetching; the card's measured bf16 matmul rate and its datasheet peak.

Part 2: cbt-recon CN (carried in ``device-data/``, copied there by ``benchmarks/device_data.sh``)
prepared, then iaa, iaa-fixed-query and as-reader at batch 32, and iaa at batches 128 and 512,
trained side by side on the one card to their early stop or the time left (the paper's schedule:
lr x 0.8 when valid accuracy did not improve at a half-epoch check), with their valid curves.

Each part writes exactly three files: ``DIR/summary-N.json`` (every figure, and ``"failed"``:
the steps that failed), ``DIR/results-N.tar.gz`` (each step's JSON and log) and ``DIR/log-N.txt``.
The summary and the archive are rewritten after every step, so a call cut short still returns
what was measured. Each step runs in its own process with a time limit; a failed step is
recorded and the next one runs. ``--device cpu --tiny`` runs every step in seconds at the tiny
model size (the test suite does, in tests/test_device_run.py). Needs torch, numpy, pyarrow,
click, pyyaml and tqdm; pytest for the tests; no Ray, MLflow or Optuna. The interpreter is
``$PYTHON``, else ``python3``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("PYTHON", "python3")
PART_BUDGET_S = 530                     # of a 9-minute call: start-up and the copy back need the rest
DATA = ROOT / "device-data" / "cbt-recon" / "CBTest"
TINY_MODEL = {"embed_dim": 16, "hidden_dim": 8, "state_dim": 12, "steps": 2, "gate_dim": 10, "vocab_size": 500}
# Dense bf16 tensor-core peaks from NVIDIA's datasheets (TFLOP/s), by the name torch reports.
BF16_PEAKS = (("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0))
TINY_TIME_SCALE = 4
# Part 1's compiled benchmark comes last and gets the time left: compiling the T=8 reads (forward
# and backward, a static then a dynamic-shape graph) is the one step whose time is not known.
PART_STEPS = {1: [("env", 60), ("pytest_gpu", 150), ("bench", 90), ("batch_sweep", 60), ("shared_card", 120),
                  ("sync_check", 40), ("prefetch", 40), ("bench_compiled", 0)],
              2: [("prepare_cn", 150), ("compare", 0)]}   # 0: the time left


# --- the steps (each runs in its own process and prints one JSON line last) ----------------------


def step_env(args) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else None
    peak = next((v for k, v in BF16_PEAKS if name and k in name), None)
    return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": cuda, "cudnn": torch.backends.cudnn.version() if cuda else None, "card": name,
            "memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
            "datasheet_bf16_tflops": peak, "cpus": os.cpu_count()}


def step_pytest_gpu(args) -> dict:
    files = ["tests/test_gpu.py"]
    try:
        import ray  # noqa: F401
        files.append("tests/test_platform_gpu.py")
    except ImportError:
        pass
    proc = subprocess.run([PYTHON, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-6000:], proc.stderr[-2000:], file=sys.stderr)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0:
        raise RuntimeError(f"pytest -m gpu exited {proc.returncode}: {last}")
    return {"files": files, "result": last}


def _bench(args, **kwargs) -> dict:
    from iaa.jobs.training import bench

    size = dict(overrides={k: v for k, v in TINY_MODEL.items() if k != "vocab_size"}, batch_size=4, steps=1,
                warmup=1, matmul_size=128, threads=1) if args.tiny else dict(batch_size=32, steps=30, warmup=3)
    if args.tiny and kwargs.get("compile"):
        kwargs["compile_backend"] = "eager"    # graph capture only: inductor takes minutes on a small CPU
    result = bench.run(device=args.device, **{**size, **kwargs})
    result.pop("config")
    return result


def _partial(out: dict) -> dict:
    """Print what a step has measured so far: if its time runs out, the driver keeps the last line."""
    print(json.dumps(out), flush=True)
    return out


def step_bench(args) -> dict:
    out: dict = {}
    for precision in ("fp32", "bf16"):
        out[f"{precision}_eager"] = _bench(args, precision=precision)
        _partial(out)
    return out


def step_bench_compiled(args) -> dict:
    out: dict = {}
    for precision in ("bf16", "fp32"):
        out[f"{precision}_compiled"] = _bench(args, precision=precision, compile=True)
        _partial(out)
    return out


def step_batch_sweep(args) -> dict:
    out: dict = {}
    for n in (8,) if args.tiny else (64, 128, 256, 512):
        out[f"bs{n}"] = _bench(args, precision="bf16", batch_size=n, steps=1 if args.tiny else 10)
        _partial(out)
    return out


def step_bench_one(args) -> dict:
    return _bench(args, precision="bf16", steps=1 if args.tiny else 40)


def step_shared_card(args) -> dict:
    """n processes training at once on the card (as n one-worker trials with --gpus-per-worker 1/n)."""
    out = {}
    for n in (1, 2) if args.tiny else (1, 2, 4, 8):
        procs = [subprocess.Popen(_self(args, "bench_one"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True) for _ in range(n)]
        rates = [json.loads(p.communicate()[0].strip().splitlines()[-1])["train_examples_per_s"] for p in procs]
        out[f"trials_{n}"] = {"aggregate_train_examples_per_s": round(sum(rates), 1), "per_trial": rates}
        _partial(out)
    return out


def step_sync_check(args) -> dict:
    """Training steps under ``torch.cuda.set_sync_debug_mode("warn")``: each host sync warns."""
    import warnings

    import torch

    from iaa.jobs.training import bench
    from iaa.jobs.training.step import build_optimizer, train_step
    from iaa.model.config import PRESETS
    from iaa.model.reader import build_reader
    from dataclasses import replace

    cfg = replace(PRESETS["tiny" if args.tiny else "paper"], vocab_size=500 if args.tiny else bench.VOCAB_SIZE)
    model = build_reader(cfg).to(args.device)
    optimizer = build_optimizer(model, 1e-3, 1e-4)
    size = 2 if args.tiny else 32
    pool = bench.synthetic_examples(4 * size, vocab_size=cfg.vocab_size)
    batches = [bench.collate(b, args.device) for b in bench.bucketed_batches(pool, size)]
    train_step(model, optimizer, batches[0])                  # warm-up: allocations, cuDNN plans
    cuda = args.device == "cuda"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        for batch in batches[1:]:
            loss = train_step(model, optimizer, batch)
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
    return {"steps": len(batches) - 1, "sync_warnings": len(syncs) if cuda else None, "first": syncs[:5],
            "loss": float(loss), "note": None if cuda else "sync debug mode needs CUDA"}


def step_prefetch(args) -> dict:
    """Training steps fed by the host's padding, in the training thread or prefetched."""
    import torch

    from iaa.data.prefetch import prefetch
    from iaa.jobs.training import bench
    from iaa.jobs.training.step import build_optimizer, train_step
    from iaa.model.config import PRESETS
    from iaa.model.reader import build_reader
    from dataclasses import replace

    cfg = replace(PRESETS["tiny" if args.tiny else "paper"], vocab_size=500 if args.tiny else bench.VOCAB_SIZE)
    model = build_reader(cfg).to(args.device)
    optimizer = build_optimizer(model, 1e-3, 1e-4)
    size, count = (2, 3) if args.tiny else (32, 40)
    groups = bench.bucketed_batches(bench.synthetic_examples(size * count, vocab_size=cfg.vocab_size), size)
    out = {}
    for depth in (0, 3, 0, 3):                                 # twice each, alternating
        start = time.perf_counter()
        for batch in prefetch((bench.collate(g) for g in groups), args.device, depth=depth):
            train_step(model, optimizer, batch)
        if args.device == "cuda":
            torch.cuda.synchronize()
        out.setdefault(f"depth_{depth}_s", []).append(round(time.perf_counter() - start, 3))
    host = time.perf_counter()
    for g in groups:
        bench.collate(g)
    out["host_padding_s"] = round(time.perf_counter() - host, 3)
    out["speedup"] = round(min(out["depth_0_s"]) / min(out["depth_3_s"]), 3)
    return out


def step_prepare_cn(args) -> dict:
    from iaa.jobs.datasets import prepare

    source = _tiny_cn(Path(args.work)) if args.tiny else DATA
    if not (source / "data" / "cbtest_CN_train.txt.gz").exists() and not args.tiny:
        raise FileNotFoundError(f"{source}/data/cbtest_CN_train.txt.gz not found: run benchmarks/device_data.sh "
                                "and carry device-data")
    result = prepare.run("cbt-cn", source, Path(args.work) / "cbt-cn", on_error="skip", progress=False)
    return {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}


def _tiny_cn(work: Path) -> Path:
    from iaa.data import demo

    data = work / "tiny-CBTest" / "data"
    paths = demo.write_files(data, sizes={"train": 192, "valid": 64, "test": 64})
    names = {"train": "cbtest_CN_train.txt", "valid": "cbtest_CN_valid_2000ex.txt", "test": "cbtest_CN_test_2500ex.txt"}
    for split, path in paths.items():
        path.rename(data / names[split])
    import gzip
    train = data / names["train"]
    (data / "cbtest_CN_train.txt.gz").write_bytes(gzip.compress(train.read_bytes()))
    train.unlink()
    return data.parent


RUNS = (("iaa", 32), ("iaa-fixed-query", 32), ("as-reader", 32), ("iaa", 128), ("iaa", 512))


def step_compare(args) -> dict:
    """The runs of ``RUNS`` side by side on the card, each to its early stop or the time left."""
    minutes = max(0.2, (args.seconds - 45) / 60)
    runs = RUNS[:3] + ((("iaa", 16),) if args.tiny else RUNS[3:])
    procs = {f"{kind}_bs{bs}": subprocess.Popen(_self(args, "train_one", "--model", kind, "--batch-size", str(bs),
                                                      "--minutes", f"{minutes:.2f}"),
                                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for kind, bs in runs}
    out = {"minutes_each": round(minutes, 2)}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate()
        lines = stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{name} exited {proc.returncode}: {stderr.strip().splitlines()[-1:] }")
        out[name] = json.loads(lines[-1])
    return out


def step_train_one(args) -> dict:
    from iaa.jobs.datasets import resolve
    from iaa.jobs.training import train

    prepared = Path(args.work) / "cbt-cn"
    sets = [f"model.kind={args.model}", f"train.batch_size={args.batch_size}", "train.precision=bf16",
            f"train.max_minutes={args.minutes}", "train.max_epochs=50"]
    if args.tiny:
        sets = [*(f"model.{k}={v}" for k, v in TINY_MODEL.items() if k != "vocab_size"),
                f"model.kind={args.model}", f"train.batch_size={args.batch_size}", "train.max_epochs=2",
                "train.check_every=4"]
    cfg = resolve.job_config("cbt-cn", prepared, sets=tuple(sets))
    run_dir = Path(args.work) / f"run-{args.model}-bs{args.batch_size}"
    result = train.run(cfg, prepared, run_dir, device=args.device, show_progress=False)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = sorted(r["train_examples_per_s"] for r in (rows[1:] or rows))       # the first window warms up
    examples = rows[-1]["step"] / rows[-1]["epoch"] * cfg.train.batch_size
    return {"best_valid_acc": result["best_valid_acc"], "stop_reason": result["stop_reason"],
            "steps": result["steps"], "epochs": round(rows[-1]["epoch"], 3), "train_seconds": result["train_seconds"],
            "train_examples_per_s": round(rates[len(rates) // 2], 1),
            "seconds_per_epoch_training_only": round(examples / rates[len(rates) // 2], 1),
            "valid_seconds_per_check": round(sum(r["valid_seconds"] for r in rows) / len(rows), 2),
            "curve": [[r["step"], round(r["epoch"], 3), round(r["valid_acc"], 4)] for r in rows]}


STEP_FUNCTIONS = {name[len("step_"):]: fn for name, fn in globals().items() if name.startswith("step_")}


# --- the driver --------------------------------------------------------------------------------


def _self(args, step: str, *extra: str) -> list[str]:
    cmd = [PYTHON, str(Path(__file__).resolve()), "--step", step, "--device", args.device, "--work", args.work, *extra]
    return cmd + (["--tiny"] if args.tiny else [])


def run_part(args) -> dict:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = args.part
    log_path, summary_path, archive = out / f"log-{n}.txt", out / f"summary-{n}.json", out / f"results-{n}.tar.gz"
    scale = TINY_TIME_SCALE if args.tiny else 1     # a small shared CPU: import and start-up dominate
    deadline = time.monotonic() + (args.budget_s or PART_BUDGET_S * scale)
    summary: dict = {"part": n, "device": args.device, "tiny": args.tiny, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                     "failed": []}
    with tempfile.TemporaryDirectory(prefix=f"iaa-device-{n}-") as scratch, log_path.open("w") as log:
        results = Path(scratch) / f"results-{n}"
        results.mkdir()
        args.work = str(Path(scratch) / "work")
        Path(args.work).mkdir()
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "PYTHONUNBUFFERED": "1"}
        for name, limit in PART_STEPS[n]:
            left = deadline - time.monotonic()
            limit = left if limit == 0 else min(limit * scale, left)
            started = time.monotonic()
            if limit < 5:
                summary["failed"].append(name)
                summary[name] = {"error": "no time left in this part"}
            else:
                cmd = _self(args, name, "--seconds", f"{limit:.0f}")
                log.write(f"== {name} (limit {limit:.0f} s): {' '.join(cmd)}\n")
                log.flush()
                try:
                    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
                    code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
                except subprocess.TimeoutExpired as err:
                    code, stdout, stderr = "timeout", _text(err.stdout), _text(err.stderr)
                (results / f"{name}.log").write_text(stdout + "\n" + stderr)
                log.write(stderr[-3000:] + "\n")
                try:
                    summary[name] = json.loads(stdout.strip().splitlines()[-1])
                except (IndexError, ValueError):
                    summary[name] = {"error": f"exit {code}: {stderr.strip().splitlines()[-1:] or ''}"}
                if code != 0:
                    summary["failed"].append(name)
                    summary[name].setdefault("error", f"exit {code}")
                (results / f"{name}.json").write_text(json.dumps(summary[name], indent=1))
            summary.setdefault("seconds", {})[name] = round(time.monotonic() - started, 1)
            log.write(f"-- {name}: {'FAILED' if name in summary['failed'] else 'ok'} "
                      f"in {summary['seconds'][name]} s\n")
            log.flush()
            _write(summary_path, summary, archive, results)
    return summary


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _write(summary_path: Path, summary: dict, archive: Path, results: Path) -> None:
    tmp = summary_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, summary_path)
    with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
        tar.add(results, arcname=results.name)
    os.replace(archive.with_suffix(".tmp"), archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", type=int, choices=(1, 2))
    parser.add_argument("--out")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="the tiny model and data: every step in seconds")
    parser.add_argument("--budget-s", type=float, default=0.0, help=f"seconds for the part (default {PART_BUDGET_S})")
    parser.add_argument("--step", choices=sorted(STEP_FUNCTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(STEP_FUNCTIONS[args.step](args)))
        return 0
    if args.part is None or not args.out:
        parser.error("--part and --out are required")
    summary = run_part(args)
    print(json.dumps({"part": args.part, "failed": summary["failed"], "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
