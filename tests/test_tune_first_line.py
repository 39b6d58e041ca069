"""The quick start speaks at once: ``iaa-cli tune --dataset demo`` prints its first line before
PyTorch, MLflow and Optuna load and Ray starts."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "ray", "mlflow", "optuna")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tune_prints_its_first_line_before_any_heavy_import(tmp_path: Path) -> None:
    """Each heavy package is replaced by one that fails on import: the first line must come all the
    same, so it is printed before any of them loads (an order, not a time a loaded machine bends)."""
    blocked = tmp_path / "blocked"
    for name in HEAVY:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "iaa.cli", "tune", "--dataset", "demo", "--workdir", str(tmp_path / "w")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "",
                                 "PYTHONPATH": os.pathsep.join([str(blocked), str(repo)])})
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=30)
            line = proc.stdout.readline() if ready else ""
    finally:
        os.killpg(proc.pid, signal.SIGKILL)       # the command's whole session: Ray, if it got that far
        proc.wait(timeout=30)
    assert line.startswith("tune: starting sweep demo-iaa-") and " of iaa on demo:" in line, line
