"""The GPU runner (benchmarks/device_run.py) on the CPU at the tiny size: the README's one command
runs every step, so a broken step fails this suite and not the few minutes of a GPU call; the plan
fits its budget; a step that runs out of time leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import device_cards  # noqa: E402
import device_run  # noqa: E402
import device_steps  # noqa: E402

TARGET_KEYS = {"train_ex_s_b32", "infer_ex_s_b32", "card_train_ex_s", "cn_epoch_s", "compare_early_stop", "ensemble_gain",
               "ray_tune_trials_per_card", "ray_train_cuda"}

pytestmark = pytest.mark.timeout(900)


def _readme_command() -> list[str]:
    """The one runner command that benchmarks/README.md documents, as words."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    commands = {line.split("#")[0].strip() for block in blocks for line in block.splitlines()
                if "device_run.py" in line}
    assert len(commands) == 1, commands
    return commands.pop().split()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_captured_pass_lives_as_long_as_its_replay(monkeypatch) -> None:
    """A graph reads and writes what it captured at fixed addresses: the gate's replay keeps the
    captured pass, and the tensors it closes over, alive (CUDA's pieces faked on the CPU)."""
    import contextlib
    import gc
    import weakref

    import torch

    import device_gpu

    class Stream:
        def wait_stream(self, other) -> None:
            pass

    class Graph:
        replays = 0

        def replay(self) -> None:
            Graph.replays += 1

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())

    def a_pass():
        x = torch.zeros(3)
        return (lambda: x.add_(1)), weakref.ref(x)

    run, tensor = a_pass()
    replay = device_gpu._graphed(run)
    del run
    gc.collect()
    assert tensor() is not None and tensor().tolist() == [3.0] * 3          # two warm-ups and the capture
    replay()
    assert Graph.replays == 1
    del replay
    gc.collect()
    assert tensor() is None


def test_the_gate_keeps_what_the_overlap_measured_and_why_it_failed(monkeypatch) -> None:
    """The overlap runs in a child process: a CUDA fault there (a sticky error, then an abort)
    comes back as the gate's ``overlap_error``, with what was measured before it."""
    import device_gpu

    script = ("import json, sys; print(json.dumps({'streams_2': 1.7}), flush=True); "
              "sys.stderr.write('Traceback\\ntorch.AcceleratorError: CUDA error: an illegal memory access "
              "was encountered\\nframe #1: ...\\n'); sys.exit(134)")
    monkeypatch.setattr(device_steps, "_self", lambda args, step, *extra: [sys.executable, "-c", script])
    measured, failed = device_gpu._overlap_in_child(SimpleNamespace(), 60)
    assert measured == {"streams_2": 1.7}
    assert failed.startswith("exit 134") and "illegal memory access" in failed
    monkeypatch.setattr(device_steps, "_self", lambda args, step, *extra: [
        sys.executable, "-c", "import json; print(json.dumps({'streams_2': 1.7, 'streams_4': 3.1}))"])
    assert device_gpu._overlap_in_child(SimpleNamespace(), 60) == ({"streams_2": 1.7, "streams_4": 3.1}, None)


def test_the_gate_times_the_triton_gru_beside_cudnn_and_a_failure_of_it_leaves_the_rest(monkeypatch) -> None:
    """With Triton (on the CPU through its interpreter, tiny sizes): each batch's row gains the
    Triton GRU's figures and the gate ``triton_speedup_b16``; a Triton GRU that fails is the
    gate's ``triton_error``, and cuDNN's figures and the verdict stand."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install -e '.[triton]'")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton does not interpret here (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)")
    import device_gpu

    from iaa.model.kernels.triton_gru import TritonGRU

    args = SimpleNamespace(tiny=True, device="cpu", seconds=60)
    monkeypatch.setattr(device_gpu, "_triton_encoder", lambda device: (TritonGRU(), None))
    out = device_gpu.step_gate(args)
    assert out["triton_encoder"] == "TritonGRU" and "triton_error" not in out
    assert all(row["triton_eager"] > 0 and row["triton_captured"] is None for row in out["us_per_time_step"].values())
    assert out["triton_speedup_b16"] > 0 and isinstance(out["gate_passed"], bool)

    class Broken:
        def encode(self, x, lengths, gru):
            raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(device_gpu, "_triton_encoder", lambda device: (Broken(), None))
    out = device_gpu.step_gate(args)
    assert out["triton_error"].startswith("RuntimeError: no kernel image") and "triton_speedup_b16" not in out
    assert all(row["packed_eager"] > 0 and "triton_eager" not in row for row in out["us_per_time_step"].values())
    assert isinstance(out["gate_passed"], bool)


@pytest.mark.slow
def test_the_readme_command_runs_every_step_and_writes_exactly_three_files(tmp_path: Path) -> None:
    words = _readme_command()
    assert words == ["python3", "benchmarks/device_run.py", "--out", "DIR"]
    cmd = [sys.executable, *words[1:3], str(tmp_path), "--device", "cpu", "--tiny"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=850,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt", "results.tar.gz", "summary.json"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == [] and summary["skipped"] == [], {k: summary[k] for k in summary["failed"]}
    steps = [name for name, _ in device_run.PLAN]
    assert all(name in summary for name in steps)
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {f"{s}.json" for s in steps} <= names and {f"{s}.log" for s in steps} <= names
    assert {"fp32_eager", "bf16_eager"} <= set(summary["bench"])
    assert set(summary["bench"]["steps"]) == {"fp32_eager", "fp32_captured", "bf16_eager", "bf16_captured"}
    assert summary["bench"]["steps"]["fp32_captured"]["refused"] == "CUDA graphs need a CUDA device"
    assert summary["bench"]["steps"]["bf16_eager"]["train_examples_per_s"] > 0
    gate = summary["gate"]
    assert set(gate["us_per_time_step"]) == {"b8", "b16", "b32"} and isinstance(gate["gate_passed"], bool)
    assert all(row["packed_eager"] > 0 and row["padded_eager"] > 0 for row in gate["us_per_time_step"].values())
    ensemble = summary["ensemble"]
    assert len(ensemble["member_valid_acc"]) == 2 and 0 <= ensemble["ensemble_valid_acc"] <= 1
    assert set(summary["targets"]) == TARGET_KEYS and "commit" in summary and "card" in summary
    assert summary["targets"]["ensemble_gain"]["measured"] == ensemble["gain_points"]
    assert summary["targets"]["train_ex_s_b32"]["measured"] is None         # the tiny bench runs batch 4
    assert summary["shared_card"]["in_process_2"]["aggregate_train_examples_per_s"] > 0
    assert summary["bench_compiled"]["bf16_compiled"]["compile"] is True
    assert summary["env"]["python_h"] in (True, False) and "gcc" in summary["env"] and "triton" in summary["env"]
    shared = summary["shared_card"]["trials_2"]
    assert shared["aggregate_train_examples_per_s"] > 0 and shared["common_window_s"] > 0
    runs = summary["compare"]["runs"]
    assert set(runs) == set(device_steps.COMPARE_RUNS)
    for run in runs.values():
        assert run["status"] == "max-epochs" and 0 <= run["best_valid_acc"] <= 1 and len(run["checks"]) == 3
        assert run["checks_to_early_stop_at_least"] >= 1
    assert summary["compare"]["at_equal_steps"]["step"] == 12
    ray_card = summary["ray_card"]                       # Ray is installed here: the project's jobs on it
    assert ray_card["ray_from"] == "installed" and "prepare_cn" in ray_card["data"]
    assert ray_card["tune"]["worked"] and ray_card["tune"]["trials"] == 4 and ray_card["tune"]["tracked_runs"] == 4
    assert ray_card["tune"]["trials_at_once"] >= 1 and ray_card["tune"]["examples"] > 0
    assert ray_card["train"]["worked"] and ray_card["train"]["backend"] == "gloo" and ray_card["train"]["checks_logged"] >= 1
    assert summary["targets"]["ray_tune_trials_per_card"]["measured"] is None      # no fraction of a card here
    assert summary["targets"]["ray_train_cuda"]["met"] is False
    log = (tmp_path / "log.txt").read_text()
    assert "[compare] iaa check 1:" in log and "[compare] as-reader: max-epochs" in log


def test_the_plan_fits_its_budget_most_valuable_first() -> None:
    for extra in ([], ["--budget-s", "300"], ["--part", "1"], ["--part", "2"], ["--part", "3"]):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_run.py"), "--plan", *extra],
                              capture_output=True, text=True, check=True)
        plan = json.loads(proc.stdout)
        assert plan["budget_s"] == (300 if extra[:1] == ["--budget-s"] else 540)
        assert sum(step["limit_s"] for step in plan["steps"]) <= plan["budget_s"]
        names = [step["name"] for step in plan["steps"]]
        if not extra or extra[0] == "--budget-s":
            assert names[:4] == ["env", "gate", "pytest_gpu", "bench"] and "compare" in names[:6]
            assert names.index("ensemble") < names.index("ray_card") < names.index("shared_card")
            assert names[-1] == "bench_compiled" and len(names) == len(device_run.PLAN)
            limits = {step["name"]: step["limit_s"] for step in plan["steps"]}
            assert limits["shared_card"] > 0       # time of its own: the steps before it may use up their slack
        else:
            assert names == list(device_run.PARTS[int(extra[1])])


def test_the_gpu_tests_collect_without_mlflow_ray_optuna_or_pydantic() -> None:
    """As on the GPU machines, which lack them: every module that needs one skips, naming it, and
    both GPU test files collect (the runner's ``pytest_gpu`` step runs them)."""
    blocked = "import sys; [sys.modules.__setitem__(m, None) for m in ('mlflow', 'ray', 'optuna', 'pydantic')]"
    script = f"{blocked}; import pytest; sys.exit(pytest.main(['-m', 'gpu', '--collect-only', '-q', '-p', 'no:cacheprovider']))"
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "error" not in proc.stdout.splitlines()[-1]
    assert "tests/test_gpu.py::test_cudnn_gru_equals_the_cpu_fused_gru" in proc.stdout
    assert "tests/test_platform_gpu.py::test_a_worker_given_a_gpu_trains_on_its_first_visible_device" in proc.stdout
    assert "needs mlflow, which is not installed" in proc.stdout


def test_a_timed_out_step_leaves_no_process_behind() -> None:
    """The step starts a child that ignores SIGTERM, which starts a grandchild: at the step's
    limit the whole group goes, the two processes that would outlive a plain kill included."""
    script = (
        "import json, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "p = subprocess.Popen([\"sleep\", \"600\"]); print(p.pid, flush=True); time.sleep(600)'], "
        "stdout=subprocess.PIPE, text=True)\n"
        "grandchild = int(child.stdout.readline())\n"
        "print(json.dumps({'pids': [child.pid, grandchild]}), flush=True)\n"
        "time.sleep(600)\n")
    result = device_run.run_step([sys.executable, "-c", script], 6.0)       # two Python starts fit well within
    assert result.code == "timeout"
    assert result.last_json is not None, result.stderr_tail
    pids = result.last_json["pids"]
    assert len(pids) == 2
    assert [pid for pid in pids if _alive(pid)] == []


def test_a_step_that_fails_is_named_and_the_plan_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHON", sys.executable)
    monkeypatch.setattr(device_run, "PLAN", (("no_such_step", 30), ("env", 60)))
    device_run.main(["--out", str(tmp_path), "--device", "cpu", "--tiny"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == ["no_such_step"] and "error" in summary["no_such_step"]
    assert summary["env"]["cpus"] >= 1
    assert set(summary["targets"]) == TARGET_KEYS and "commit" in summary and summary["card"] is None
    assert all(t == {"measured": None, "goal": t["goal"], "met": False} for t in summary["targets"].values())


def test_targets_take_the_best_figure_of_each_goal_and_say_whether_it_is_met() -> None:
    run = lambda status, acc: {"status": status, "best_valid_acc": acc, "checks": []}   # noqa: E731
    summary = {
        "bench": {"fp32_eager": {"batch_size": 32, "train_examples_per_s": 400.0, "infer_examples_per_s": 21000.0},
                  "steps": {"bf16_captured": {"batch_size": 32, "train_examples_per_s": 3100.0},
                            "fp32_captured": {"refused": "no"}, "bf16_eager": {"batch_size": 4, "train_examples_per_s": 9e9}}},
        "shared_card": {"trials_8": {"aggregate_train_examples_per_s": 9000.0},
                        "in_process_8": {"aggregate_train_examples_per_s": 16000.0}},
        "compare": {"card_train_examples_per_s": 5000.0, "ranking": ["iaa", "as-reader", "iaa-fixed-query"],
                    "runs": {"iaa": {**run("early-stopped", 0.7), "seconds_per_epoch_training_only": 41.0},
                             "as-reader": run("early-stopped", 0.6), "iaa-fixed-query": run("max-time", 0.65)}},
        "ensemble": {"gain_points": 2.5},
        "ray_card": {"tune": {"worked": True, "gpus_per_trial": 0.25, "trials_at_once": 4},
                     "train": {"worked": True, "backend": "nccl", "state": "FINISHED", "checks_logged": 3}},
    }
    targets = device_cards.targets(summary)
    assert {k: (t["measured"], t["met"]) for k, t in targets.items() if k != "compare_early_stop"} == {
        "train_ex_s_b32": (3100.0, True), "infer_ex_s_b32": (21000.0, True), "card_train_ex_s": (16000.0, True),
        "cn_epoch_s": (41.0, False), "ensemble_gain": (2.5, True), "ray_tune_trials_per_card": (4, True),
        "ray_train_cuda": ({"worked": True, "backend": "nccl", "state": "FINISHED", "checks_logged": 3,
                            "card_processes_seen": None}, True)}
    assert targets["compare_early_stop"]["met"] is False                   # one run stopped on time
    summary["compare"]["runs"]["iaa-fixed-query"]["status"] = "early-stopped"
    assert device_cards.targets(summary)["compare_early_stop"]["met"] is True
    summary["compare"]["ranking"] = ["as-reader", "iaa", "iaa-fixed-query"]
    assert device_cards.targets(summary)["compare_early_stop"]["met"] is False
    summary["ray_card"]["tune"]["trials_at_once"] = 3                     # fewer than four trials shared the card
    summary["ray_card"]["train"]["backend"] = "gloo"                      # a Train run that missed NCCL
    assert [device_cards.targets(summary)[k]["met"] for k in ("ray_tune_trials_per_card", "ray_train_cuda")] == [False, False]


def test_a_failing_run_of_compare_leaves_the_others_figures(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHON", sys.executable)
    monkeypatch.setattr(device_steps, "PYTHON", sys.executable)
    monkeypatch.setattr(device_steps, "COMPARE_RUNS", ("as-reader", "no-such-model"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    args = SimpleNamespace(device="cpu", tiny=True, work=str(tmp_path), data=str(tmp_path), seconds=120.0)
    device_steps.step_prepare_cn(args)
    with pytest.raises(RuntimeError, match="runs failed: no-such-model"):
        device_steps.step_compare(args)
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["runs"]["no-such-model"]["status"] == "failed" and last["runs"]["no-such-model"]["error"]
    assert last["runs"]["as-reader"]["status"] == "max-epochs" and len(last["runs"]["as-reader"]["checks"]) == 3
    assert not (tmp_path / "run-as-reader" / "checkpoints").exists()         # benchmark runs write none


def test_device_data_reads_the_shared_data_of_iaa_shared_data_from_a_clone(tmp_path: Path) -> None:
    clone = tmp_path / "elsewhere" / "clone"
    (clone / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "device_data.sh", clone / "benchmarks")
    data = tmp_path / "my-shared" / "cbt-recon" / "CBTest" / "data"
    data.mkdir(parents=True)
    for name in ("cbtest_CN_train.txt.gz", "cbtest_CN_valid_2000ex.txt"):
        (data / name).write_text(name)
    script = str(clone / "benchmarks" / "device_data.sh")
    missing = subprocess.run(["bash", script], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "IAA_SHARED_DATA": ""})
    assert missing.returncode == 1 and "set IAA_SHARED_DATA" in missing.stderr
    done = subprocess.run(["bash", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "IAA_SHARED_DATA": "my-shared"})        # relative to the caller
    assert done.returncode == 0, done.stderr
    assert (clone / "device-data" / "cbtest_CN_train.txt.gz").read_text() == "cbtest_CN_train.txt.gz"
    assert device_steps.cn_source(clone / "device-data") == clone / "device-data"


def test_ray_card_says_why_it_skips_where_there_is_no_ray_and_no_bundle(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    import device_ray

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    monkeypatch.setattr(device_ray, "bundle_path", lambda: ROOT / "device-ray" / "site-cp00.tar.xz")
    out = device_ray.step_ray_card(SimpleNamespace(work=str(tmp_path), device="cuda", tiny=False, data=str(tmp_path)))
    assert "ray_bundle.py" in out["not_run"] and "--part 3" in out["not_run"]
    assert device_cards.targets({"ray_card": out})["ray_train_cuda"] == {"measured": None, "goal": device_cards.TARGETS[
        "ray_train_cuda"], "met": False}


def test_ray_card_runs_the_train_run_before_the_sweep_and_the_sweep_after_a_failed_one(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    import device_ray

    ran: list[str] = []

    def job(name: str, worked: bool):
        def run(args, prepared, work, tracker) -> dict:
            ran.append(name)
            if not worked:
                raise RuntimeError(f"{name} broke")
            return {"worked": True}
        return run

    monkeypatch.setattr(device_ray, "ensure_ray", lambda work: "installed")
    monkeypatch.setattr(device_ray, "_prepared", lambda args, work: (tmp_path, "demo"))
    monkeypatch.setattr(device_ray, "_train", job("train", worked=False))
    monkeypatch.setattr(device_ray, "_tune", job("tune", worked=True))
    with pytest.raises(SystemExit, match="ray_card: train did not work"):
        device_ray.step_ray_card(SimpleNamespace(work=str(tmp_path), device="cpu", tiny=True, data=str(tmp_path)))
    assert ran == ["train", "tune"]


def test_a_bundle_is_unpacked_first_on_the_path_of_this_process_and_of_those_it_starts(tmp_path: Path, monkeypatch) -> None:
    import importlib.util
    import lzma

    import device_ray

    bundle = tmp_path / "site.tar.xz"
    (tmp_path / "src" / "probe_pkg").mkdir(parents=True)
    (tmp_path / "src" / "probe_pkg" / "__init__.py").write_text("WHERE = 'bundle'\n")
    with lzma.open(bundle, "wb") as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        tar.add(tmp_path / "src" / "probe_pkg", arcname="probe_pkg")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    monkeypatch.setattr(device_ray, "bundle_path", lambda: bundle)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))
    work = tmp_path / "work"
    assert device_ray.ensure_ray(work) == "bundle"
    assert os.environ["PYTHONPATH"] == f"{work / 'ray-site'}{os.pathsep}/elsewhere"
    probe = subprocess.run([sys.executable, "-c", "import probe_pkg; print(probe_pkg.WHERE)"], capture_output=True,
                           text=True, check=True)
    assert probe.stdout.strip() == "bundle"


def test_the_ray_bundle_takes_the_projects_pins_and_drops_what_tune_and_train_never_load(tmp_path: Path) -> None:
    import importlib.metadata

    import ray_bundle

    assert ray_bundle.pins() == {"ray": importlib.metadata.version("ray"), "optuna": importlib.metadata.version("optuna")}
    site = tmp_path / "site"
    for rel in ("ray/jars/a.jar", "ray/dashboard/client/build/static/x.js", "ray/dashboard/client/build/index.html",
                "ray/tune/x.py", "ray/tune/x.js.map", "bin/tune"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x" * 10)
    freed = ray_bundle.slim(site)
    left = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert left == ["ray/dashboard/client/build/index.html", "ray/tune/x.py"]
    assert freed["ray/jars"] == 10 and freed["ray/**/*.map"] == 10
    assert (site / "ray/dashboard/client/build/static").is_dir()          # the dashboard serves it: it must exist


def test_a_step_with_nothing_to_run_on_is_listed_as_skipped_with_its_reason(tmp_path: Path, monkeypatch) -> None:
    said = json.dumps({"not_run": "no Ray here"})
    monkeypatch.setattr(device_run, "_step_command", lambda args, name, limit: [sys.executable, "-c", f"print({said!r})"])
    monkeypatch.setattr(device_run, "PLAN", (("ray_card", 30), ("env", 30)))
    device_run.main(["--out", str(tmp_path), "--device", "cpu", "--tiny"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["skipped"] == ["ray_card", "env"] and summary["failed"] == []
    assert summary["ray_card"] == {"not_run": "no Ray here"}


def test_the_requirements_an_unpacked_bundle_finds_unmet_are_named(tmp_path: Path) -> None:
    import device_ray

    info = tmp_path / "carried-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: carried\nVersion: 1.0\n"
                                   "Requires-Dist: numpy>=999\nRequires-Dist: no-such-package-here\n"
                                   "Requires-Dist: numpy>=1\nRequires-Dist: other; extra == \"docs\"\n")
    unmet = device_ray.unmet_requirements(tmp_path)
    assert len(unmet) == 2 and unmet[0].startswith("carried: no-such-package-here (found none)")
    assert unmet[1].startswith("carried: numpy>=999 (found ")
