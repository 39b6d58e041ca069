"""Shared bits of the platform tests: a tiny search space, MLflow read-back helpers and the
``ray`` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

# Two knobs of the tiny model: 4 points, so 2-3 trials stay cheap.
TINY_SPACE = "model.hidden_dim: [8, 12]\nmodel.steps: [1, 2]\n"


def ray_command() -> str:
    """The ``ray`` command of the environment whose Python runs the tests, activated or not."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def write_space(folder: Path) -> Path:
    path = folder / "space.yaml"
    path.write_text(TINY_SPACE, encoding="utf-8")
    return path


def read_sweep(workdir: Path, name: str) -> dict[str, Any]:
    """The sweep's ``sweep.json``, its paths (stored relative to the work folder) found where they are."""
    from iaa.jobs.sweeps import record

    return record.read_rows(workdir / "sweeps" / name / "sweep.json")


def children(sweep: dict[str, Any]) -> list[Any]:
    """The sweep's nested MLflow runs (tag ``mlflow.parentRunId`` = the parent run)."""
    client = MlflowClient(sweep["tracking_uri"])
    experiment = client.get_experiment_by_name(sweep["experiment"])
    runs = client.search_runs([experiment.experiment_id])
    return [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep["parent_run_id"]]


def run_sweep(address: str | None = None, callbacks: tuple = (), **request: Any) -> dict[str, Any]:
    """``iaa-cli tune`` as the CLI composes it: a TuneRequest, the MLflow tracker, the Ray launcher."""
    from iaa.cli.adapters import open_tracker
    from iaa.jobs.tune import tune
    from iaa.platform.sweeps.launch import RayLauncher

    req = tune.TuneRequest(**request)
    return tune.run(req, open_tracker, RayLauncher(address, req.storage_path, callbacks))


def start_local_ray(num_cpus: int = 2) -> None:
    """A local Ray for a test module, as the CLI's (Ray Serve's patience with a slow proxy included);
    a start that fails fails the test with one line naming Ray, not a fixture traceback."""
    import pytest
    import ray

    from iaa.platform.cluster import resources

    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
                 runtime_env={"env_vars": resources.job_env()})
    except Exception as err:  # noqa: BLE001 - any failure to start is the same failure here
        ray.shutdown()
        lines = str(err).strip().splitlines() or [""]
        pytest.fail(f"the local Ray did not start ({type(err).__name__}: {lines[-1][:300]})")
