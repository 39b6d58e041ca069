"""A local cluster started by iaa listens on loopback only: no port of Ray's (Prometheus
exporters, dashboard, agents, gRPC servers) is reachable from another machine. ``iaa-cli serve``'s
ports, Serve's replicas' among them, are checked where it serves (``tests/test_serve_docs.py``)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests._processes import exposed_ports, listening, process_tree

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
