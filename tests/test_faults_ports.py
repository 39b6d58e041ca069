"""A local cluster started by iaa listens on loopback only: no port of Ray's (Prometheus
exporters, dashboard, agents, gRPC servers, Serve's replicas) is reachable from another machine."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests._processes import exposed_ports, listening, process_tree
from tests.test_serve import QUESTION, _free_port, _post, setup, wait_ready  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_port_of_a_local_cluster_is_on_loopback(monkeypatch):
    if shutil.which("ss") is None or not os.path.isdir("/proc"):
        pytest.skip("needs ss (iproute2) and /proc to list listening sockets")
    ray = pytest.importorskip("ray")
    from iaa.platform.cluster import connect as cluster

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("IAA_DASHBOARD_HOST", raising=False)
    cluster.connect(num_cpus=1)
    try:
        assert ray.get(ray.remote(num_cpus=0)(lambda: 1).remote()) == 1   # a worker, with its own server
        ports = listening(process_tree(os.getpid()))
    finally:
        ray.shutdown()
    assert len(ports) >= 5, ports              # GCS, raylet, agents, dashboard, exporters, workers
    assert not exposed_ports(ports)


def test_every_port_of_a_local_serve_is_on_loopback(monkeypatch, setup):
    """Ray Serve asks for each replica's gRPC server (calls between deployments) on every
    interface; on a local cluster it listens on loopback like the rest."""
    if shutil.which("ss") is None or not os.path.isdir("/proc"):
        pytest.skip("needs ss (iproute2) and /proc to list listening sockets")
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve", reason="needs ray[serve]")
    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    root, prepared, ckpt = setup
    cfg = job.config(model_uri=None, checkpoint=ckpt, ensemble_dir=None, data_dir=prepared, workdir=root,
                     tracking_uri=None, port=_free_port())
    try:
        url = ray_serve.start(cfg, job.CODE)
        wait_ready(url)
        assert _post(url, json.dumps(QUESTION).encode())[0] == 200
        ports = listening(process_tree(os.getpid()))
    finally:
        ray_serve.stop(cfg.app_name)
        ray.shutdown()
    replicas = [row for row in ports if row[2].startswith("ray::ServeRepl")]
    assert len(replicas) >= 2, ports            # the ingress's and the reader's servers at least
    assert not exposed_ports(ports)
