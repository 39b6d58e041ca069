"""Connecting to Ray: an unreachable --address fails fast and names the address; the local
cluster's dashboard listens on loopback only, on a port of its own, behind Ray's token auth."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.errors import IaaError
from iaa.platform.cluster import connect as cluster, resources


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])        # nothing listens there once the probe closes


def _own_network_addresses() -> list[str]:
    """This machine's own IPv4 addresses other than loopback, as `ip` lists them."""
    try:
        listing = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [a for a in re.findall(r"inet (\S+)/", listing) if not a.startswith("127.")]


def test_unreachable_address_is_an_error_naming_it() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(IaaError, match=f"Ray cluster at {address} is not reachable within 2 s"):
        cluster.check_reachable(address, timeout_s=2)
    with pytest.raises(IaaError, match="ray://127.0.0.1"):
        cluster.check_reachable(f"ray://{address}", timeout_s=2)


def test_reachable_address_and_local_lookups_pass() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        cluster.check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2)
    cluster.check_reachable("auto")            # Ray's own look-up on this machine: nothing to probe


def test_connect_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cluster.CONNECT_TIMEOUT_ENV, "0.5")
    assert cluster.connect_timeout() == 0.5
    monkeypatch.setenv(cluster.CONNECT_TIMEOUT_ENV, "soon")
    with pytest.raises(IaaError, match="IAA_RAY_CONNECT_TIMEOUT='soon'"):
        cluster.connect_timeout()


def test_cli_train_on_an_unreachable_address_exits_with_the_address(tmp_path) -> None:
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray started by another test in this process would be reused")
    address = f"127.0.0.1:{_closed_port()}"
    out = CliRunner().invoke(cli, ["train", "--dataset", "demo", "--workers", "2", "--address", address,
                                   "--workdir", str(tmp_path), "--set", "train.max_epochs=0.01"],
                             env={cluster.CONNECT_TIMEOUT_ENV: "2"})
    assert out.exit_code != 0 and f"Ray cluster at {address} is not reachable" in out.output
    assert not ray.is_initialized()


def test_dashboard_port_avoids_a_busy_8265(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cluster.DASHBOARD_PORT_ENV, raising=False)
    with socket.socket() as squatter:
        try:
            squatter.bind(("127.0.0.1", cluster.DEFAULT_DASHBOARD_PORT))
        except OSError:
            pass                                   # someone else's dashboard holds it already
        port = cluster.dashboard_port("127.0.0.1")
        assert port != cluster.DEFAULT_DASHBOARD_PORT and cluster._port_free("127.0.0.1", port)
    monkeypatch.setenv(cluster.DASHBOARD_PORT_ENV, "9911")
    assert cluster.dashboard_port() == 9911
    monkeypatch.setenv(cluster.DASHBOARD_PORT_ENV, "x")
    with pytest.raises(IaaError, match="IAA_DASHBOARD_PORT"):
        cluster.dashboard_port()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_cluster_dashboard_is_loopback_only_and_needs_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    import requests

    if ray.is_initialized():
        pytest.skip("needs to start its own local Ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    info = cluster.connect(num_cpus=1)
    try:
        assert info.dashboard is not None
        host, port = info.dashboard.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert ray.util.get_node_ip_address() == "127.0.0.1"   # a local cluster's node is loopback
        for address in _own_network_addresses():                # not reachable from the network
            with pytest.raises(OSError):
                socket.create_connection((address, int(port)), timeout=2).close()
        answer = requests.get(f"http://{info.dashboard}/api/version", timeout=10)
        assert answer.status_code == 401      # Ray's token authentication is on for a local cluster
        assert "dashboard http://127.0.0.1:" in cluster.describe(info, resources.plan(info.nodes, 1))
    finally:
        ray.shutdown()


class _FakeContext:
    dashboard_url = "127.0.0.1:1"


def _ray_init_failing(times: int, message: str, calls: list[int]):
    """A ``ray.init`` that fails ``times`` times as Ray does when the dashboard's port was taken."""

    def init(**kwargs):
        calls.append(kwargs["dashboard_port"])
        if len(calls) <= times:
            raise Exception(f"\n{message}\nThe last 20 lines of dashboard.log:\n  more\n  lines")
        return _FakeContext()

    return init


TAKEN = "Failed to find a valid port for dashboard after 0 retries: [Errno 98] address already in use"


def test_the_cluster_line_counts_in_words() -> None:
    """One thread in the trial actor is "1 thread", with no "per worker" where there is no worker."""
    info = cluster.ClusterInfo((resources.Node("127.0.0.1", 2.0),), "10.0.0.1:6379")
    one = cluster.describe(info, resources.TrialPlan(workers=1, threads=1, gpus_per_worker=0.0, max_concurrent=1))
    assert "in the trial actor with 1 thread;" in one and "(s)" not in one and "per worker" not in one
    assert "1 node," in one and "up to 1 trial at once" in one
    two = cluster.describe(info, resources.TrialPlan(workers=2, threads=1, gpus_per_worker=0.0, max_concurrent=3))
    assert "on 2 Train workers with 1 thread each" in two and "up to 3 trials at once" in two
    growing = cluster.describe(info, resources.TrialPlan(workers=1, threads=1, gpus_per_worker=0.0, max_concurrent=3,
                                                         fits_now=1))
    assert "1 trial at once on today's nodes, up to 3 as nodes join" in growing
    run = cluster.describe(info, resources.TrialPlan(workers=2, threads=1, gpus_per_worker=0.0, max_concurrent=1),
                           one_run=True)                  # train on workers: one run, no trials
    assert run.endswith("; the run trains on 2 Train workers with 1 thread each") and "trial" not in run


def test_a_dashboard_behind_a_token_says_where_the_token_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from _faults import assert_says

    info = cluster.ClusterInfo((resources.Node("127.0.0.1", 2.0),), None, "127.0.0.1:8265")
    plan = resources.TrialPlan(workers=1, threads=1, gpus_per_worker=0.0, max_concurrent=1)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")             # as Ray sets it when it starts with tokens on
    assert_says(cluster.describe(info, plan), "(dashboard http://127.0.0.1:8265; it asks for the token",
                "`ray get-auth-token`")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert "token" not in cluster.describe(info, plan)


def test_a_taken_dashboard_port_starts_ray_again_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    calls: list[int] = []
    monkeypatch.delenv(cluster.DASHBOARD_PORT_ENV, raising=False)
    monkeypatch.setattr(ray, "init", _ray_init_failing(2, TAKEN, calls))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    env: dict[str, str] = {}
    assert cluster._start_local(1, None, env, {}) == "127.0.0.1:1"
    assert len(calls) == 3 and len(set(calls)) == 3           # a new port each time
    assert env["RAY_API_SERVER_ADDRESS"].endswith(f":{calls[-1]}")   # workers are told the port Ray got


def test_a_failed_ray_start_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    calls: list[int] = []
    monkeypatch.setattr(ray, "init", _ray_init_failing(99, TAKEN, calls))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.delenv(cluster.DASHBOARD_PORT_ENV, raising=False)
    with pytest.raises(IaaError) as caught:
        cluster._start_local(1, None, {}, {})
    assert len(calls) == cluster.LOCAL_START_TRIES
    assert "\n" not in str(caught.value) and "address already in use" in str(caught.value)
    monkeypatch.setenv(cluster.DASHBOARD_PORT_ENV, "9911")        # a port the user fixed is not changed
    calls.clear()
    with pytest.raises(IaaError, match="IAA_DASHBOARD_PORT") as caught:
        cluster._start_local(1, None, {}, {})
    assert calls == [9911] and "\n" not in str(caught.value)
    monkeypatch.setattr(ray, "init", _ray_init_failing(99, "raylet died", calls))
    monkeypatch.delenv(cluster.DASHBOARD_PORT_ENV)
    with pytest.raises(IaaError, match="could not start a local Ray.*: lines; see Ray's logs"):
        cluster._start_local(1, None, {}, {})
