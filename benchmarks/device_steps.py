"""The steps of ``device_run.py``: each runs in its own process, prints its figures as it goes
(``say``: one human line on stderr; ``partial``: the JSON so far on stdout) and returns one dict,
which ``device_run.py --step NAME`` prints last.

Steps that start processes of their own (``compare``, ``shared_card``) leave them in the step's
process group, so the driver's kill on timeout reaches them too.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from typing import Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("PYTHON", "python3")
TINY_MODEL = {"embed_dim": 16, "hidden_dim": 8, "state_dim": 12, "steps": 2, "gate_dim": 10}
TINY_VOCAB = 500
# Dense bf16 tensor-core peaks from NVIDIA's datasheets (TFLOP/s), by the name torch reports.
BF16_PEAKS = (("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0))
COMPARE_RUNS = ("iaa", "iaa-fixed-query", "as-reader")
COMPARE_BATCH = 32
RUN_START_S = 25            # a training process's start (imports, data, model, CUDA) and last check
SHARED_WINDOW_S = 10.0      # shared_card: every trial counts its examples over this common window
SHARED_SETTLE_S = 1.0       # ... opened this long after the last trial is ready


def say(text: str) -> None:
    """One line for the run's log, as it happens (the driver copies it into log.txt)."""
    print(f"| {text}", file=sys.stderr, flush=True)


def partial(out: dict) -> dict:
    """Print what a step has measured so far: if its time runs out, the driver keeps the last line."""
    print(json.dumps(out), flush=True)
    return out


def _self(args, step: str, *extra: str) -> list[str]:
    cmd = [PYTHON, str(ROOT / "benchmarks" / "device_run.py"), "--step", step, "--device", args.device,
           "--work", args.work, *extra]
    return cmd + (["--tiny"] if args.tiny else [])


def _threads(args, processes: int) -> int:
    """Torch threads for each of ``processes`` sharing the machine (one for the tiny model, whose
    small parallel regions only wait for descheduled threads on a busy CPU)."""
    return 1 if args.tiny else max(1, (os.cpu_count() or 1) // processes)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# --- env --------------------------------------------------------------------------------------


def output_of(cmd: list[str]) -> str | None:
    """The command's output (stripped), or None where it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return str(getattr(__import__(module), "__version__", "installed"))
    except Exception as error:  # noqa: BLE001 - a broken install is worth recording, not fatal
        return f"import failed: {error}"


def step_env(args) -> dict:
    """The card, the driver and the toolchain that Triton's launcher stub and C++ extensions need."""
    import torch

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else None
    smi = output_of(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,"
                    "compute_mode", "--format=csv,noheader"])
    driver = smi.splitlines()[0].split(", ")[1] if smi and ", " in smi else None
    gcc = output_of(["gcc", "--version"])
    out = {
        "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": cuda, "cudnn": torch.backends.cudnn.version() if cuda else None, "card": name,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
        "memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "datasheet_bf16_tflops": next((v for k, v in BF16_PEAKS if name and k in name), None),
        "driver": driver, "nvidia_smi": smi,
        "gpu_processes": output_of(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]),
        "gcc": gcc.splitlines()[0] if gcc else None,
        "ninja": shutil.which("ninja") is not None or importlib.util.find_spec("ninja") is not None,
        "python_h": (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file(),
        "triton": _version("triton"),
        "gru_cpp": "off (IAA_NO_COMPILED_KERNELS=1)" if os.environ.get("IAA_NO_COMPILED_KERNELS") == "1" else "on first CPU use",
        "ray": _version("ray"), "mlflow": _version("mlflow"), "optuna": _version("optuna"),
        "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    say(f"{name or 'no CUDA device'}; torch {out['torch']}, CUDA {out['cuda']}, cuDNN {out['cudnn']}, "
        f"driver {driver}; gcc {'yes' if gcc else 'missing'}, Python.h {out['python_h']}, triton {out['triton']}")
    return out


# --- the gpu tests ----------------------------------------------------------------------------


def step_pytest_gpu(args) -> dict:
    """``pytest -m gpu`` on the GPU test files; each file skips, saying why, where it cannot run."""
    files = ["tests/test_gpu.py", "tests/test_captured_step.py", "tests/test_platform_gpu.py", "tests/test_triton_gru.py"]
    proc = subprocess.Popen([PYTHON, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider", *files],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:                                    # streamed: a timeout keeps what ran
        print(line, end="", file=sys.stderr, flush=True)
        lines.append(line.rstrip())
        if line.startswith(("FAILED", "ERROR", "SKIPPED")):
            say(line.rstrip()[:200])
    code = proc.wait()
    last = next((line for line in reversed(lines) if line.strip()), "")
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", last)}
    say(f"pytest -m gpu: {last}")
    if code not in (0, 5):                                      # 5: nothing collected
        raise RuntimeError(f"pytest -m gpu exited {code}: {last}")
    return {"files": files, "result": last, **counts}


# --- synthetic benchmarks ---------------------------------------------------------------------


def _bench(args, **kwargs) -> dict:
    from iaa.jobs.train import bench

    if args.tiny:
        size = dict(overrides=TINY_MODEL, batch_size=4, steps=1, warmup=1, matmul_size=128, threads=1)
    else:
        size = dict(batch_size=32, steps=30, warmup=3)        # the roofline's matmul: bench.MATMUL_SIZES
    if args.tiny and kwargs.get("compile"):
        kwargs["compile_backend"] = "eager"    # graph capture only: inductor takes minutes on a small CPU
    result = bench.run(device=args.device, **{**size, **kwargs}).fields()
    result.pop("config")
    say(f"{result['precision']} batch {result['batch_size']}{' compiled' if result['compile'] else ''}: "
        f"train {result['train_examples_per_s']:,.0f} ex/s, infer {result['infer_examples_per_s']:,.0f} ex/s, "
        f"peak {result['peak_memory_bytes'] / 2**30:.2f} GiB, {result['roofline_fraction']:.3f} of the roofline")
    return result


def step_bench(args) -> dict:
    out: dict = {}
    for precision in ("fp32", "bf16"):
        out[f"{precision}_eager"] = _bench(args, precision=precision)
        partial(out)
    return out


def step_bench_compiled(args) -> dict:
    return {"bf16_compiled": _bench(args, precision="bf16", compile=True)}


def step_batch_sweep(args) -> dict:
    """bf16 at larger batches: the ex/s one trial gets from a bigger batch (the accuracy at that
    batch is not measured here). The sizes most likely to reach the card's target come first."""
    out: dict = {}
    for n in (8,) if args.tiny else (128, 512, 256, 64):
        out[f"bs{n}"] = _bench(args, precision="bf16", batch_size=n, steps=1 if args.tiny else 10)
        partial(out)
    return out


def _reader(args, precision: str = "fp32", **switches: bool):
    """The paper's reader (the tiny one with ``--tiny``, on one thread) on the device at ``precision``
    (fp32 | bf16), with the config's implementation ``switches`` (``triton_gru=True``), and its
    optimiser."""
    import torch

    from iaa.jobs.train import bench
    from iaa.jobs.training.step import build_optimizer
    from iaa.model.config import PRESETS
    from iaa.model.reader import build_reader

    if args.tiny:
        torch.set_num_threads(1)
    cfg = replace(PRESETS["tiny" if args.tiny else "paper"], vocab_size=TINY_VOCAB if args.tiny else bench.VOCAB_SIZE,
                  **switches)
    model = build_reader(cfg, args.device, precision).to(args.device)
    return cfg, model, build_optimizer(model, bench.LR, bench.EMBED_L2)


def step_shared_card(args) -> dict:
    """n processes training at once on the card (as n one-worker trials with --gpus-per-worker 1/n).

    Each counts the examples it trains over one common window that opens after every process has
    started (``bench_window``), so a process that started early does not inflate the sum. The
    largest n comes first: ``bench`` already measured one trial alone.
    """
    out: dict = {}
    for n in (2,) if args.tiny else (8, 4, 2, 1):
        barrier = Path(args.work) / f"barrier-{n}"
        barrier.mkdir()
        threads = _threads(args, n)
        procs = [subprocess.Popen(_self(args, "bench_window", "--barrier", str(barrier), "--trials", str(n),
                                        "--threads", str(threads), "--seconds", f"{args.seconds:.0f}"),
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(n)]
        results = []
        for proc in procs:
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"a trial of {n} exited {proc.returncode}: {stderr.strip().splitlines()[-1:]}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
        rates = [r["train_examples_per_s"] for r in results]
        common = min(r["window_end"] for r in results) - max(r["window_start"] for r in results)
        out[f"trials_{n}"] = {"aggregate_train_examples_per_s": round(sum(rates), 1), "per_trial": rates,
                              "common_window_s": round(common, 3)}
        say(f"{n} trials sharing the card: {sum(rates):,.0f} ex/s in all over a common {common:.1f} s window")
        partial(out)
    return out


def step_bench_window(args) -> dict:
    """One trial of ``shared_card``: warm up, wait at the barrier for the others, then count the
    examples trained between ``SHARED_SETTLE_S`` after the last trial was ready and
    ``SHARED_WINDOW_S`` later (wall clock, common to all)."""
    import torch

    from iaa.jobs.train import bench
    from iaa.jobs.training.step import train_step

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, model, optimizer = _reader(args, "bf16")
    size = 4 if args.tiny else COMPARE_BATCH
    pool = bench.synthetic_examples(16 * size, seed=os.getpid(), vocab_size=cfg.vocab_size)
    batches = itertools.cycle([bench.collate(b, args.device) for b in bench.bucketed_batches(pool, size)])
    def step() -> None:
        train_step(model, optimizer, next(batches))

    for _ in range(3):                                          # warm-up: allocations, cuDNN plans
        step()
    _sync(args.device)
    barrier = Path(args.barrier)
    mine = barrier / f"{os.getpid()}.ready"
    mine.with_suffix(".tmp").write_text(repr(time.time()))
    os.replace(mine.with_suffix(".tmp"), mine)
    give_up = time.time() + args.seconds
    while len(ready := list(barrier.glob("*.ready"))) < args.trials:
        if time.time() > give_up:
            raise RuntimeError(f"only {len(ready)} of {args.trials} trials started")
        time.sleep(0.01)
    opens = max(float(p.read_text()) for p in ready) + SHARED_SETTLE_S
    window = 1.0 if args.tiny else SHARED_WINDOW_S
    while time.time() < opens:                                  # everyone trains before the window
        step()
    _sync(args.device)
    start, examples = time.time(), 0
    while not examples or time.time() < opens + window:        # at least one step, however slow
        step()
        examples += size
    _sync(args.device)
    end = time.time()
    return {"train_examples_per_s": round(examples / (end - start), 1), "examples": examples,
            "window_start": start, "window_end": end}


def step_sync_check(args) -> dict:
    """Training steps under ``torch.cuda.set_sync_debug_mode("warn")``: each host sync warns."""
    import warnings

    import torch

    from iaa.jobs.train import bench
    from iaa.jobs.training.step import train_step

    cfg, model, optimizer = _reader(args)
    size = 2 if args.tiny else COMPARE_BATCH
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
    say(f"host syncs in {len(batches) - 1} training steps: {len(syncs) if cuda else 'n/a (needs CUDA)'}")
    return {"steps": len(batches) - 1, "sync_warnings": len(syncs) if cuda else None, "first": syncs[:5],
            "loss": float(loss), "note": None if cuda else "sync debug mode needs CUDA"}


def step_prefetch(args) -> dict:
    """Training steps fed by the host's padding, in the training thread or prefetched."""
    from iaa.data.loading.prefetch import prefetch
    from iaa.jobs.train import bench
    from iaa.jobs.training.step import train_step

    cfg, model, optimizer = _reader(args)
    size, count = (2, 3) if args.tiny else (COMPARE_BATCH, 40)
    groups = bench.bucketed_batches(bench.synthetic_examples(size * count, vocab_size=cfg.vocab_size), size)
    out: dict = {}
    for depth in (0, 3, 0, 3):                                 # twice each, alternating
        start = time.perf_counter()
        for batch in prefetch((bench.collate(g) for g in groups), args.device, depth=depth):
            train_step(model, optimizer, batch)
        _sync(args.device)
        out.setdefault(f"depth_{depth}_s", []).append(round(time.perf_counter() - start, 3))
    host = time.perf_counter()
    for g in groups:
        bench.collate(g)
    out["host_padding_s"] = round(time.perf_counter() - host, 3)
    out["speedup"] = round(min(out["depth_0_s"]) / min(out["depth_3_s"]), 3)
    say(f"prefetch depth 3 against 0: {out['speedup']}x")
    return out


# --- the comparison on cbt-recon CN -----------------------------------------------------------


def cn_source(data: Path) -> Path | None:
    """The folder under ``data`` that holds ``cbtest_CN_train.txt.gz`` (``data`` itself, or the
    CBTest layout below it), or None."""
    for folder in (data, data / "data", data / "CBTest" / "data", data / "cbt-recon" / "CBTest" / "data"):
        if (folder / "cbtest_CN_train.txt.gz").is_file():
            return folder
    return None


def step_prepare_cn(args) -> dict:
    from iaa.jobs.datasets import prepare

    source = demo_cn(Path(args.work)) if args.tiny else cn_source(Path(args.data))
    if source is None:
        raise FileNotFoundError(f"no cbtest_CN_train.txt.gz in {args.data}: run `bash benchmarks/device_data.sh` "
                                "on the machine with the shared data and bring device-data/ with the checkout")
    result = prepare.run("cbt-cn", source, Path(args.work) / "cbt-cn", on_error="skip", progress=False)
    say(f"cbt-recon CN prepared: {result.counts} examples, vocabulary {result.vocab_size:,}")
    return {"counts": result.counts, **{k: v for k, v in result.fields().items() if isinstance(v, (int, float, str, bool))}}


def demo_cn(work: Path, sizes: dict[str, int] | None = None) -> Path:
    """Demo-grammar examples (``sizes``: the tiny run's by default) in cbt-recon CN's file layout."""
    from iaa.data.formats import demo

    data = work / "demo-CBTest" / "data"
    paths = demo.write_files(data, sizes=sizes or {"train": 192, "valid": 64, "test": 64})
    names = {"train": "cbtest_CN_train.txt", "valid": "cbtest_CN_valid_2000ex.txt", "test": "cbtest_CN_test_2500ex.txt"}
    for split, path in paths.items():
        path.rename(data / names[split])
    train = data / names["train"]
    (data / "cbtest_CN_train.txt.gz").write_bytes(gzip.compress(train.read_bytes()))
    train.unlink()
    return data


def step_compare(args) -> dict:
    """iaa, iaa-fixed-query and as-reader at batch 32 side by side on the card, with the paper's
    schedule (the cbt-cn preset: a check every 2,000 batches, lr x 0.8 after a check that did not
    improve, early stop after 6 such checks in a row), each to its early stop or the time left.

    Each run's figures are printed at every check; a run that fails is recorded and the others go
    on. The runs write no checkpoints.
    """
    minutes = max(0.2, (args.seconds - RUN_START_S) / 60)
    threads = _threads(args, len(COMPARE_RUNS))
    commands = {kind: _self(args, "train_one", "--model", kind, "--batch-size", str(COMPARE_BATCH),
                            "--minutes", f"{minutes:.2f}", "--threads", str(threads)) for kind in COMPARE_RUNS}
    out: dict = {"minutes_each": round(minutes, 2), "batch_size": COMPARE_BATCH,
                 "runs": {kind: {"status": "running", "checks": []} for kind in COMPARE_RUNS}}

    def card_rate(out: dict) -> None:
        out["card_train_examples_per_s"] = round(sum(r.get("train_examples_per_s", 0) for r in out["runs"].values()), 1)

    failed = runs_side_by_side(commands, out, after_event=card_rate)
    out["ranking"] = sorted((k for k in COMPARE_RUNS if out["runs"][k].get("best_valid_acc") is not None),
                            key=lambda k: -out["runs"][k]["best_valid_acc"])
    say("ranking by best valid accuracy: " + ", ".join(f"{k} {out['runs'][k]['best_valid_acc']:.4f}" for k in out["ranking"]))
    out["at_equal_steps"] = _at_equal_steps(out["runs"])
    if out["at_equal_steps"]:
        step, accs = out["at_equal_steps"]["step"], out["at_equal_steps"]["valid_acc"]
        say(f"at step {step}, reached by every run: " + ", ".join(f"{k} {a:.4f}" for k, a in accs.items()))
    partial(out)
    if failed:
        raise RuntimeError(f"runs failed: {', '.join(failed)} (the others' figures are in the summary)")
    return out


def runs_side_by_side(commands: dict[str, list[str]], out: dict,
                      after_event: Callable[[dict], None] | None = None) -> list[str]:
    """Run ``commands`` (``train_one`` runs) at once, folding each one's events into
    ``out["runs"][name]`` (``_record``) and rewriting the summary after each (``after_event``
    first); a run that fails is marked failed with the tail of its stderr. Returns the names of
    those that failed."""
    lines: queue.Queue = queue.Queue()
    procs = {name: subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, cmd in commands.items()}
    for name, proc in procs.items():
        for stream in ("stdout", "stderr"):
            threading.Thread(target=_pump, args=(name, stream, getattr(proc, stream), lines), daemon=True).start()
    errors: dict[str, list[str]] = {name: [] for name in commands}
    open_streams = 2 * len(commands)
    while open_streams:
        name, stream, line = lines.get()
        if line is None:
            open_streams -= 1
        elif stream == "stderr":
            print(f"[{name}] {line}", end="", file=sys.stderr, flush=True)
            errors[name] = (errors[name] + [line.strip()])[-20:]
        else:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            _record(out["runs"][name], name, event)
            if after_event is not None:
                after_event(out)
            partial(out)
    failed = []
    for name, proc in procs.items():
        if proc.wait() != 0:
            run = out["runs"][name]
            run.update(status="failed", error=f"exit {proc.returncode}: {' | '.join(errors[name][-3:])}")
            failed.append(name)
            say(f"{name}: FAILED ({run['error'][:300]})")
    return failed


def _pump(kind: str, stream: str, pipe, lines: queue.Queue) -> None:
    for line in pipe:
        lines.put((kind, stream, line))
    lines.put((kind, stream, None))


def _record(run: dict, kind: str, event: dict) -> None:
    """Fold one event of ``train_one`` (a check, or the end) into the run's figures, saying it."""
    if event.get("event") == "check":
        run["checks"].append([event["step"], round(event["epoch"], 3), round(event["valid_acc"], 4)])
        run.update({k: event[k] for k in ("step", "epoch", "best_valid_acc", "bad_checks", "patience", "lr",
                                          "examples_per_epoch", "check_every")})
        run.setdefault("rates", []).append(round(event["train_examples_per_s"], 1))
        rates = sorted(run["rates"][1:] or run["rates"])              # the first window warms up
        run["train_examples_per_s"] = rates[len(rates) // 2]
        run["valid_seconds_last"] = round(event["valid_seconds"], 2)
        run["seconds_per_epoch_training_only"] = round(event["examples_per_epoch"] / run["train_examples_per_s"], 1)
        _how_far(run)
        say(f"{kind} check {len(run['checks'])}: step {event['step']} epoch {event['epoch']:.2f} valid "
            f"{event['valid_acc']:.4f} (best {event['best_valid_acc']:.4f}, {event['bad_checks']}/{event['patience']} "
            f"without improvement) lr {event['lr']:.2e} {event['train_examples_per_s']:,.0f} ex/s "
            f"valid {event['valid_seconds']:.1f} s")
    elif event.get("event") == "end":
        run["status"] = event["stop_reason"] or "ended"
        run["train_seconds"] = round(event["train_seconds"], 1)
        say(f"{kind}: {run['status']} after {len(run['checks'])} checks, {run.get('epoch', 0):.2f} epochs, "
            f"best valid {run.get('best_valid_acc', float('nan')):.4f}")


def _at_equal_steps(runs: dict) -> dict | None:
    """The valid accuracies at the last check step that every run reached: the runs train at
    different speeds, so their best accuracies cover different numbers of examples."""
    checked = {kind: run["checks"] for kind, run in runs.items() if run["checks"]}
    common = set.intersection(*({s for s, _, _ in checks} for checks in checked.values())) if checked else set()
    if len(checked) < 2 or not common:
        return None
    step = max(common)
    accs = {kind: next(a for s, _, a in checks if s == step) for kind, checks in checked.items()}
    return {"step": step, "valid_acc": dict(sorted(accs.items(), key=lambda item: -item[1]))}


def _how_far(run: dict) -> None:
    """Checks still needed before the early stop (at the least: the best may yet improve) and the
    training seconds they take at the run's rate."""
    left = run["patience"] - run["bad_checks"]
    run["checks_to_early_stop_at_least"] = left
    run["seconds_to_early_stop_at_least"] = round(left * run["check_every"] * COMPARE_BATCH / run["train_examples_per_s"], 1)


def step_train_one(args) -> dict:
    """One run of ``compare``: the training loop with a session that reports each check on stdout
    and writes no checkpoint (``metrics.jsonl`` only)."""
    from iaa.jobs.datasets import resolve
    from iaa.jobs.train import train
    from iaa.jobs.training.session import LocalSession

    prepared = Path(args.work) / "cbt-cn"
    sets = [f"model.kind={args.model}", f"train.batch_size={args.batch_size}", f"train.threads={args.threads}"]
    sets += [f"train.seed={args.seed}"] if getattr(args, "seed", None) is not None else []
    if args.tiny:
        sets += [*(f"model.{k}={v}" for k, v in TINY_MODEL.items()), "train.precision=fp32", "train.max_epochs=2",
                 "train.check_every=4"]
    else:
        sets += ["train.precision=bf16", f"train.max_minutes={args.minutes}", "train.max_epochs=50"]
    cfg = resolve.job_config("cbt-cn", prepared, sets=tuple(sets))

    class ChecksOnly(LocalSession):
        best: dict | None = None

        def report(self, metrics, state, is_best):  # type: ignore[override]
            if is_best:
                self.best = state["model"]
            row = self.report_metrics(metrics, state, is_best)
            self.folder.append_metrics(row)
            batches = self.num_train_batches()
            print(json.dumps({"event": "check", **row, "bad_checks": state["progress"]["bad_checks"],
                              "patience": cfg.train.patience, "check_every": cfg.train.check_every or batches // 2,
                              "examples_per_epoch": batches * cfg.train.batch_size}), flush=True)

    seed = getattr(args, "seed", None)
    run_dir = Path(args.work) / (f"run-{args.model}" + (f"-seed{seed}" if seed is not None else ""))
    session = ChecksOnly(prepared, run_dir, batch_size=cfg.train.batch_size,
                         seed=cfg.train.seed, device=args.device)
    result = train.fit(cfg, session, show_progress=False, vocab_hash=session.data.manifest.vocab_hash)
    if getattr(args, "save_valid", None) and session.best is not None:
        _save_valid_log_p(cfg, session, session.best, Path(args.save_valid), args.device)
    return {"event": "end", **{k: result[k] for k in ("best_valid_acc", "best_step", "steps", "stop_reason",
                                                      "train_seconds", "precision", "cuda_graphs", "cuda_graphs_refused")}}


def _save_valid_log_p(cfg, session, weights: dict, path: Path, device: str) -> None:
    """log P(a) (N, C) of the validation split under ``weights``, with the answers, to ``path``."""
    import torch

    from iaa.model.reader import build_reader

    model = build_reader(cfg.model, device).to(device)
    model.load_state_dict(weights)
    model.eval()
    log_p, answers = [], []
    with torch.no_grad():
        for batch in session.valid_batches():
            batch = batch.to(device)
            log_p.append(model(batch).log_probs.float().cpu())
            answers.append(batch.answer.cpu())
    width = max(t.shape[1] for t in log_p)
    log_p = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=float("-inf")) for t in log_p]
    torch.save({"log_p": torch.cat(log_p), "answer": torch.cat(answers)}, path)


STEP_FUNCTIONS = {name[len("step_"):]: fn for name, fn in globals().items() if name.startswith("step_")}
