"""A local cluster started by iaa listens on loopback only: no port of Ray's (Prometheus
exporters, dashboard, agents, gRPC servers) is reachable from another machine."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _process_tree(root: int) -> set[int]:
    """``root`` and every process below it, from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    tree, todo = {root}, [root]
    while todo:
        here = todo.pop()
        kids = [pid for pid, ppid in parent.items() if ppid == here and pid not in tree]
        tree.update(kids)
        todo.extend(kids)
    return tree


def _listening(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket that one of ``pids`` listens on (``ss -ltnp``)."""
    rows = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', line):
            if int(pid) in pids:
                host, port = line.split()[3].rsplit(":", 1)
                rows.append((host.strip("[]"), int(port), name))
    return rows


def _loopback(host: str) -> bool:
    return host not in ("*", "0.0.0.0", "::") and ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback


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
        listening = _listening(_process_tree(os.getpid()))
    finally:
        ray.shutdown()
    assert len(listening) >= 5, listening      # GCS, raylet, agents, dashboard, exporters, workers
    exposed = [row for row in listening if not _loopback(row[0])]
    assert not exposed, exposed
