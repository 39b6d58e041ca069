"""A local cluster started by iaa listens on loopback only: no port of Ray's (Prometheus
exporters, dashboard, gRPC servers) is reachable from another machine."""

from __future__ import annotations

import ipaddress

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_port_of_a_local_cluster_is_on_loopback(monkeypatch):
    psutil = pytest.importorskip("psutil")
    ray = pytest.importorskip("ray")
    from iaa.platform import cluster

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("IAA_DASHBOARD_HOST", raising=False)
    cluster.connect(num_cpus=1)
    try:
        ray.get(ray.remote(num_cpus=0)(lambda: 1).remote())      # a worker process, with its own server
        tree = {p.pid for p in psutil.Process().children(recursive=True)} | {psutil.Process().pid}
        listening = [(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in psutil.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in tree]
    finally:
        ray.shutdown()
    assert len(listening) >= 5, listening      # GCS, raylet, agents, dashboard, exporters, workers
    exposed = [entry for entry in listening if not ipaddress.ip_address(entry[0].removeprefix("::ffff:")).is_loopback]
    assert not exposed, exposed
