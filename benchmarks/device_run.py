"""The GPU measurements of benchmarks/README.md: one command, most valuable first, within one call.

    python3 benchmarks/device_run.py --out DIR [--device cuda|cpu] [--tiny] [--budget-s S] [--data DIR]
    python3 benchmarks/device_run.py --plan        # the steps and their time limits, as one JSON object

The plan (``PLAN``), most valuable first: ``env`` (card, driver, toolchain); ``gate`` (the
document BiGRU's µs per time step at B = 8, 16, 32, padded and packed, eager and captured, and
the overlap of 1, 2 and 4 streams: whether our own Triton GRU is worth writing); ``pytest_gpu``
(the gpu tests); ``bench`` (batch 32, fp32 and bf16, eager and captured, with kernel launches
per step); ``prepare_cn`` and ``compare`` (cbt-recon CN from ``--data``, default
``device-data/``, prepared, then iaa, iaa-fixed-query and as-reader at batch 32 side by side on
the card to their early stop or the time left); ``ensemble`` (5 IAA seeds side by side, then
the ensemble against the mean member on valid); then, with the time that remains, ``ray_card``
(the project's Ray Tune sweep with four trials sharing the card, then a Ray Train run with NCCL;
it needs Ray, which the GPU machine lacks, so it is skipped there, saying why in ``"not_run"``,
unless the slimmed bundle of ``benchmarks/ray_bundle.py`` came along), ``shared_card`` (1, 2, 4 and 8 trials as
processes and as trainers in one process), ``batch_sweep``, ``sync_check``, ``prefetch`` and
``bench_compiled`` (bf16). The steps are in ``device_steps.py``, ``device_gpu.py``,
``device_cards.py`` and ``device_ray.py``.

Time: the planned limits add up to the budget (default 540 s). A step may use its own limit plus
whatever the steps before it left unused, so ``compare`` gets the time the tests and benchmarks
did not need, and the steps planned at 0 s run only on time that ``compare`` left (an early stop).
Each step runs in its own process group (session); at its limit the whole group is terminated,
then killed, so no process of a step outlives it. A failed step is recorded and the next runs.

Output: exactly three files in DIR: ``summary.json`` (every figure, ``"failed"`` and
``"skipped"``: the steps that failed, or had no time or nothing to run on; ``"targets"``: each goal with what was
measured and whether it is met; ``"commit"``, ``"source"`` (a digest of the code, as
``device_cards.source_digest``) and ``"card"``), ``results.tar.gz`` (each step's JSON and
log) and ``log.txt`` (what each step said as it happened). The summary is rewritten whenever a
step reports figures, the archive after every step, so a call cut short still returns what was
measured. ``--device cpu --tiny`` runs every step in seconds at the tiny model size (the test
suite does, in tests/test_device_run.py). Needs torch, numpy, pyarrow, click, pyyaml and tqdm;
pytest for the tests; no Ray, MLflow or Optuna (``ray_card`` brings its own Ray and Optuna). The
interpreter of the steps is ``$PYTHON``, else ``python3``. ``--part 1`` (no data: tests and
benchmarks), ``--part 2`` (prepare and compare) and ``--part 3`` (``env`` and ``ray_card``, with
``device-ray/`` beside the checkout instead of ``device-data/``: the two do not fit one call) run
subsets, writing ``summary-N.json``, ``results-N.tar.gz`` and ``log-N.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import device_cards  # noqa: E402
import device_gpu  # noqa: E402
import device_ray  # noqa: E402
import device_steps  # noqa: E402

ROOT = device_steps.ROOT
BUDGET_S = 540               # of a call of at most 10 minutes: start-up and the copy back need the rest
# (step, planned seconds at the default budget); they add up to BUDGET_S. 0: only time left unused.
PLAN = (("env", 15), ("gate", 60), ("pytest_gpu", 90), ("bench", 60), ("prepare_cn", 25), ("compare", 170),
        ("ensemble", 90), ("ray_card", 0), ("shared_card", 30), ("batch_sweep", 0), ("sync_check", 0), ("prefetch", 0),
        ("bench_compiled", 0))
PARTS = {1: ("env", "gate", "pytest_gpu", "bench", "shared_card", "batch_sweep", "sync_check", "prefetch",
             "bench_compiled"),
         2: ("prepare_cn", "compare", "ensemble"),
         3: ("env", "ray_card")}
STEP_FUNCTIONS = {**device_steps.STEP_FUNCTIONS, **device_gpu.STEP_FUNCTIONS, **device_cards.STEP_FUNCTIONS,
                  **device_ray.STEP_FUNCTIONS}
MIN_STEP_S = 10              # a step with less time than this is skipped
KILL_GRACE_S = 3             # between SIGTERM and SIGKILL of a step's process group
TINY_TIME_SCALE = 3          # --tiny on a small shared CPU: imports and start-up dominate


def plan(budget_s: float, part: int | None = None) -> list[tuple[str, float]]:
    """The steps to run and their planned limits, scaled to ``budget_s`` (a part keeps its subset)."""
    scale = budget_s / BUDGET_S
    names = PARTS[part] if part else [name for name, _ in PLAN]
    return [(name, int(limit * scale)) for name, limit in PLAN if name in names]    # rounded down: they fit


# --- one step in its own process group ------------------------------------------------------------


@dataclass
class StepResult:
    code: int | str              # the exit status, or "timeout"
    last_json: dict | None       # the last JSON object the step printed on stdout
    stderr_tail: str


def run_step(cmd: list[str], limit_s: float, *, env: dict[str, str] | None = None, log_path: Path | None = None,
             on_json=None, on_say=None) -> StepResult:
    """Run ``cmd`` in a new session for at most ``limit_s`` seconds; then no process of it is left.

    Its stdout lines that parse as JSON objects go to ``on_json`` as they come, its stderr to
    ``log_path``; stderr lines starting with ``"| "`` (``device_steps.say``) also go to ``on_say``.
    """
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    state: dict = {"json": None, "tail": []}

    def read_stdout() -> None:
        for line in proc.stdout:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                state["json"] = value
                if on_json:
                    on_json(value)

    def read_stderr() -> None:
        with open(log_path or os.devnull, "a") as log:
            for line in proc.stderr:
                log.write(line)
                log.flush()
                state["tail"] = (state["tail"] + [line])[-40:]
                if line.startswith("| ") and on_say:
                    on_say(line[2:].rstrip("\n"))

    readers = [threading.Thread(target=fn, daemon=True) for fn in (read_stdout, read_stderr)]
    for reader in readers:
        reader.start()
    try:
        code: int | str = proc.wait(timeout=max(limit_s, 0.1))
    except subprocess.TimeoutExpired:
        code = "timeout"
    finally:
        end_group(proc)
    for reader in readers:
        reader.join(timeout=5)
    return StepResult(code, state["json"], "".join(state["tail"]))


def end_group(proc: subprocess.Popen) -> None:
    """Terminate, then kill, every process in ``proc``'s group, and wait until none is left."""
    pgid = proc.pid                                            # the leader of its own session
    if proc.poll() is None:
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(pgid, signal.SIGKILL)                        # stragglers, even after a clean exit
    proc.wait()
    give_up = time.monotonic() + 10
    while group_members(pgid) and time.monotonic() < give_up:
        time.sleep(0.05)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in group ``pgid`` (Linux ``/proc``; empty elsewhere)."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:        # state, ppid, pgrp
            members.append(int(entry.name))
    return members


# --- the driver -------------------------------------------------------------------------------------


class Outputs:
    """The three files of a run and the folder of per-step results that the archive holds."""

    def __init__(self, out: Path, results: Path, part: int | None) -> None:
        suffix = f"-{part}" if part else ""
        self.summary, self.archive, self.log_path = (out / f"summary{suffix}.json", out / f"results{suffix}.tar.gz",
                                                     out / f"log{suffix}.txt")
        self.results = results
        self.lock = threading.Lock()
        self.log = self.log_path.open("w")

    def say(self, text: str) -> None:
        with self.lock:
            self.log.write(text + "\n")
            self.log.flush()
        print(text, flush=True)

    def write_summary(self, summary: dict) -> None:
        """``summary`` with its targets, the commit and the card, written whole (a rename)."""
        summary["targets"] = device_cards.targets(summary)
        summary["card"] = (summary.get("env") or {}).get("card")
        with self.lock:
            tmp = self.summary.with_suffix(".tmp")
            tmp.write_text(json.dumps(summary, indent=1))
            os.replace(tmp, self.summary)

    def write_archive(self) -> None:
        tmp = self.archive.with_name(self.archive.name + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.results, arcname=self.results.name)
        os.replace(tmp, self.archive)


class Terminated(Exception):
    """The driver itself was asked to stop (SIGTERM)."""


def _terminate(signum, frame) -> None:
    raise Terminated


def run_plan(args) -> dict:
    """Run the plan's steps in order, each in its own process group within its time."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget = args.budget_s or BUDGET_S * (TINY_TIME_SCALE if args.tiny else 1)
    steps = plan(budget, args.part)
    deadline = time.monotonic() + budget
    summary: dict = {"device": args.device, "tiny": args.tiny, "budget_s": budget, "part": args.part,
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "plan": steps, "failed": [], "skipped": [],
                     "seconds": {}, "commit": device_cards.commit(), "source": device_cards.source_digest()}
    previous = signal.signal(signal.SIGTERM, _terminate)
    with tempfile.TemporaryDirectory(prefix="iaa-device-") as scratch:
        results = Path(scratch) / "results"
        results.mkdir()
        args.work = str(Path(scratch) / "work")
        Path(args.work).mkdir()
        files = Outputs(out, results, args.part)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "PYTHONUNBUFFERED": "1"}
        if args.device == "cuda":
            env["IAA_NO_COMPILED_KERNELS"] = "1"   # a CPU kernel: building it would cost a CUDA run 15-40 s
        try:
            for i, (name, _) in enumerate(steps):
                reserved = sum(limit for _, limit in steps[i + 1:])
                limit = deadline - time.monotonic() - reserved
                _run_one(args, name, limit, env, summary, files)
        except Terminated:
            summary["terminated"] = True
            files.say("== stopped by SIGTERM")
        finally:
            files.write_summary(summary)
            files.write_archive()
            files.log.close()
            signal.signal(signal.SIGTERM, previous)
    return summary


def _run_one(args, name: str, limit: float, env: dict, summary: dict, files: Outputs) -> None:
    started = time.monotonic()
    if limit < MIN_STEP_S:
        summary["skipped"].append(name)
        summary[name] = {"skipped": f"{max(limit, 0):.0f} s left for it"}
        files.say(f"== {name}: skipped ({max(limit, 0):.0f} s left)")
    else:
        cmd = _step_command(args, name, limit)
        files.say(f"== {name} (limit {limit:.0f} s)")

        def on_json(value: dict) -> None:
            summary[name] = value
            files.write_summary(summary)

        result = run_step(cmd, limit, env=env, log_path=files.results / f"{name}.log", on_json=on_json,
                          on_say=lambda text: files.say(f"  [{name}] {text}"))
        summary[name] = result.last_json or {}
        if result.code == 0 and "not_run" in summary[name]:     # the step found nothing to run on
            summary["skipped"].append(name)
        if result.code != 0:
            summary["failed"].append(name)
            error = "timed out" if result.code == "timeout" else f"exit {result.code}"
            last = result.stderr_tail.strip().splitlines()[-1:] or [""]
            summary[name]["error"] = f"{error}: {last[0][:500]}"
            files.say(f"-- {name} FAILED ({summary[name]['error']}); stderr tail:\n{result.stderr_tail[-3000:]}")
        (files.results / f"{name}.json").write_text(json.dumps(summary[name], indent=1))
    summary["seconds"][name] = round(time.monotonic() - started, 1)
    status = "FAILED" if name in summary["failed"] else "skipped" if name in summary["skipped"] else "ok"
    files.say(f"-- {name}: {status} in {summary['seconds'][name]} s")
    files.write_summary(summary)
    files.write_archive()


def _step_command(args, name: str, limit: float) -> list[str]:
    cmd = [os.environ.get("PYTHON", "python3"), str(Path(__file__).resolve()), "--step", name, "--device",
           args.device, "--work", args.work, "--seconds", f"{limit:.0f}", "--data", str(Path(args.data).resolve())]
    return cmd + (["--tiny"] if args.tiny else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the folder for summary.json, results.tar.gz and log.txt")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="the tiny model and data: every step in seconds")
    parser.add_argument("--budget-s", type=float, default=0.0, help=f"seconds for the whole plan (default {BUDGET_S})")
    parser.add_argument("--data", default=str(ROOT / "device-data"), help="the raw cbt-recon CN folder")
    parser.add_argument("--plan", action="store_true", help="print the plan as JSON and exit")
    parser.add_argument("--part", type=int, choices=sorted(PARTS), help="only part 1 (no data), 2 (compare) or 3 (Ray)")
    parser.add_argument("--step", choices=sorted(STEP_FUNCTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--save-valid", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(STEP_FUNCTIONS[args.step](args)), flush=True)
        return 0
    if args.plan:
        budget = args.budget_s or BUDGET_S
        print(json.dumps({"budget_s": int(budget) if budget == int(budget) else budget, "steps": [{"name": n, "limit_s": s} for n, s in plan(budget, args.part)],
                          "rule": "a step may also use the time the steps before it left unused; 0: only that time"}))
        return 0
    if not args.out:
        parser.error("--out is required")
    summary = run_plan(args)
    print(json.dumps({"failed": summary["failed"], "skipped": summary["skipped"], "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
