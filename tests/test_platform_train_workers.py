"""``iaa-cli train --workers N``: what the user sees when the workers fail (a local Ray, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from tests._platform import start_local_ray
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_an_expected_failure_on_every_worker_is_one_line_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One training row for two workers: a rank has no rows, which it reports as an IaaError."""
    import ray

    from iaa.platform import ray_train

    monkeypatch.setattr(ray_train, "MAX_FAILURES", 0)        # the same error on every retry: fail at once
    prepared = make_tiny_prepared(tmp_path / "one-row", {"train": 1, "valid": 16, "test": 16})
    sets = [arg for s in TINY_SETS for arg in ("--set", s)]
    start_local_ray(num_cpus=2)
    try:
        out = CliRunner().invoke(cli, ["train", "--data", str(prepared), *sets, "--workers", "2",
                                       "--workdir", str(tmp_path), "--run-dir", str(tmp_path / "run")])
    finally:
        ray.shutdown()
    assert out.exit_code != 0
    assert "has no training rows: use fewer workers" in out.output, out.output
    assert "failed on rank" in out.output and "Traceback" not in out.output
