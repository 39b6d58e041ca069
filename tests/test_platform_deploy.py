"""The deploy manifests parse and agree with each other (no cluster is started: see deploy/validate.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
pytestmark = pytest.mark.timeout(60)


def _validate(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(folder / "validate.py")], capture_output=True, text=True)


def test_manifests_parse_and_agree() -> None:
    out = _validate(DEPLOY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mlflow.yaml:", "ok", "(http://mlflow.mlflow.svc.cluster.local:5000)",
                                  "rayjob.yaml:", "ok", "cluster.yaml:", "ok", "serve.yaml:", "ok", "Dockerfile:", "ok"]


def test_a_broken_manifest_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    rayjob = copy / "rayjob.yaml"
    rayjob.write_text(rayjob.read_text().replace("--tracking-uri http://mlflow.mlflow", "--tracking-uri http://x"))
    out = _validate(copy)
    assert out.returncode != 0 and "the sweep logs to http://mlflow.mlflow.svc.cluster.local:5000" in out.stderr
