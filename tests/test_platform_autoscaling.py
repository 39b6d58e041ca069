"""A GPU sweep submitted to an autoscaling cluster that has no GPU node yet waits for one and finishes.

The cluster is Ray's fake multi-node autoscaler (what ``ray.cluster_utils.AutoscalingCluster``
starts), launched here by hand with its own temp dir and GCS port, because
``AutoscalingCluster.start``/``shutdown`` run ``ray stop --force``, which would kill every other
Ray on the machine. The head has 1 CPU and no GPU; a ``gpu`` node type has 1 CPU and 1 fake GPU
with ``min_workers: 0``, beside a CPU node type. The GPUs are fake, so training is forced onto
the CPU with ``IAA_TRAIN_DEVICE=cpu`` (the documented switch).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests._platform import ray_command, read_sweep, run_sweep, write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


GPU_NODES = {"gpu": {"resources": {"CPU": 1, "GPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2},
             "cpu": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 1}}
# One GPU with the CPUs of four trials, and room for a second such node: packing must not need it.
SHARED_GPU_NODES = {"gpu4": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}, "min_workers": 0,
                             "max_workers": 2}}


def _config(gcs_address: str, worker_types: dict) -> dict:
    node_types = {
        "ray.head.default": {"resources": {"CPU": 1, "trial_driver": 10}, "node_config": {}, "max_workers": 0},
        **worker_types,
    }
    return {"cluster_name": "iaa-fake", "max_workers": 4, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": gcs_address},
            "available_node_types": node_types, "head_node_type": "ray.head.default", "auth": {}, "docker": {},
            "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": []}


@pytest.fixture
def autoscaling_cluster():
    yield from _cluster(GPU_NODES)


@pytest.fixture
def shared_gpu_cluster():
    yield from _cluster(SHARED_GPU_NODES)


def _cluster(worker_types: dict):
    import ray

    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    address = f"{ray.util.get_node_ip_address()}:{port}"
    temp = tempfile.mkdtemp(prefix="iaa-as-", dir="/tmp")    # short: Ray's socket paths live under it
    config = Path(temp) / "autoscaler.json"
    config.write_text(json.dumps(_config(address, worker_types)), encoding="utf-8")
    # Token authentication as this process already has it: a local Ray started earlier in the process
    # turned it on (with the token in ~/.ray/auth_token), and Ray reads the mode once per process.
    env = {**os.environ, "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1",
           "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    head = subprocess.Popen([ray_command(), "start", "--head", f"--port={port}", "--num-cpus=1",
                             "--resources", json.dumps({"trial_driver": 10}), f"--autoscaling-config={config}",
                             f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats", "--block"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except OSError:
            assert time.time() < deadline and head.poll() is None, "the fake cluster's head did not start"
            time.sleep(1)
    yield address
    ray.shutdown()
    os.killpg(head.pid, signal.SIGTERM)      # the process group: ray start, its head and the fake nodes
    try:
        head.wait(timeout=3)                 # `ray start --block` outlasts it as a rule: then SIGKILL
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)


def _gpu_sweep(address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, trials: int,
               gpus_per_worker: float) -> tuple[dict, list]:
    """A tiny sweep of one-worker trials on the fake autoscaling cluster: (sweep.json, the GPU nodes after it)."""
    import ray

    monkeypatch.setenv("IAA_TRAIN_DEVICE", "cpu")
    monkeypatch.setenv("IAA_AUTOSCALE_WAIT_S", "180")
    tiny = make_tiny_prepared(tmp_path / "data")
    run_sweep(dataset="cbt-ne", data=tiny, num_samples=trials, search_space=write_space(tmp_path),
              sets=TINY_SETS, workdir=tmp_path / "work", name="gpu", gpus_per_worker=gpus_per_worker,
              address=address, storage_path=str(tmp_path / "shared"), show_progress=False)
    return read_sweep(tmp_path / "work", "gpu"), [n for n in ray.nodes() if n["Resources"].get("GPU")]


def test_gpu_sweep_waits_for_the_autoscaler_and_finishes(autoscaling_cluster: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    sweep, gpu_nodes = _gpu_sweep(autoscaling_cluster, tmp_path, monkeypatch, trials=2, gpus_per_worker=1)
    assert [t["status"] for t in sweep["trials"]] == ["TERMINATED", "TERMINATED"]
    assert sweep["max_concurrent"] == 2          # not frozen at the one GPU node there was at the start
    assert len(gpu_nodes) == 2, gpu_nodes        # the second trial's demand brought a second GPU node


def test_quarter_gpus_pack_four_trials_on_one_gpu(shared_gpu_cluster: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gpus-per-worker 0.25``: four one-worker trials run at once on the one GPU node the
    autoscaler starts for them (a second would be allowed, and is not needed)."""
    sweep, gpu_nodes = _gpu_sweep(shared_gpu_cluster, tmp_path, monkeypatch, trials=4, gpus_per_worker=0.25)
    assert [t["status"] for t in sweep["trials"]] == ["TERMINATED"] * 4
    assert sweep["max_concurrent"] == 4
    assert len(gpu_nodes) == 1, gpu_nodes        # all four trials on one GPU
