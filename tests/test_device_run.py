"""Every step of the GPU runner (benchmarks/device_run.py) runs here, on the CPU at the tiny size,
so that a broken step fails this suite and not the few minutes of a GPU call."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(1500)


@pytest.mark.parametrize("part", [1, 2])
def test_each_part_runs_every_step_and_writes_exactly_three_files(part: int, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import device_run

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_run.py"), "--part", str(part),
                           "--out", str(tmp_path), "--device", "cpu", "--tiny"],
                          cwd=ROOT, capture_output=True, text=True, env={**__import__("os").environ,
                                                                         "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"log-{part}.txt", f"results-{part}.tar.gz",
                                                         f"summary-{part}.json"]
    summary = json.loads((tmp_path / f"summary-{part}.json").read_text())
    assert summary["failed"] == [], {k: summary[k] for k in summary["failed"]}
    steps = [name for name, _ in device_run.PART_STEPS[part]]
    assert all(name in summary for name in steps)
    with tarfile.open(tmp_path / f"results-{part}.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {f"{s}.json" for s in steps} <= names and {f"{s}.log" for s in steps} <= names
    if part == 1:
        assert set(summary["bench"]) == {"fp32_eager", "bf16_eager"}
        assert set(summary["bench_compiled"]) == {"fp32_compiled", "bf16_compiled"}
        assert summary["bench_compiled"]["bf16_compiled"]["compile"] is True
        assert summary["shared_card"]["trials_2"]["aggregate_train_examples_per_s"] > 0
    else:
        runs = [k for k in summary["compare"] if k.endswith(tuple(f"_bs{n}" for n in (16, 32)))]
        assert {"iaa_bs32", "iaa-fixed-query_bs32", "as-reader_bs32"} <= set(runs)
        assert all(0 <= summary["compare"][k]["best_valid_acc"] <= 1 for k in runs)


def test_a_step_that_fails_is_named_and_the_part_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import device_run

    monkeypatch.setenv("PYTHON", sys.executable)
    monkeypatch.setattr(device_run, "PYTHON", sys.executable)
    monkeypatch.setitem(device_run.PART_STEPS, 1, [("no_such_step", 30), ("env", 60)])
    device_run.main(["--part", "1", "--out", str(tmp_path), "--device", "cpu", "--tiny"])
    summary = json.loads((tmp_path / "summary-1.json").read_text())
    assert summary["failed"] == ["no_such_step"] and "error" in summary["no_such_step"]
    assert summary["env"]["cpus"] >= 1
