"""The quick start speaks at once: ``iaa-cli tune --dataset demo`` prints its first line before
PyTorch, MLflow and Optuna load and Ray starts."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The aim is 2 s; a loaded CI machine (several test processes on 2 cores) gets a generous bound.
FIRST_LINE_S = 5.0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tune_prints_a_first_line_within_seconds(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "iaa.cli", "tune", "--dataset", "demo", "--workdir", str(tmp_path / "w")]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": ""})
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=30)
            line = proc.stdout.readline() if ready else ""
        elapsed = time.monotonic() - started
    finally:
        os.killpg(proc.pid, signal.SIGKILL)       # the command's whole session: Ray, if it got that far
        proc.wait(timeout=30)
    assert line.startswith("tune: starting a sweep of iaa on demo"), line
    assert elapsed < FIRST_LINE_S, f"first line after {elapsed:.1f} s: {line!r}"
