"""Fault suite, ``iaa-cli serve`` from start to stop, in its own process: a taken port is one
line naming the port and its holder, before Ray starts (another serve's included: Serve's proxy
would share the port); replicas the cluster cannot place are one line naming the CPUs; SIGTERM
to every process of a running serve (a service manager's stop) ends it cleanly and leaves none.
The port and CPU checks themselves are also tested without Ray, at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _faults import assert_says
from tests._explain import tiny_setup
from tests.test_serve import free_port

REPO = Path(__file__).resolve().parents[1]
START_WAIT_S = 600                 # a busy 2-core machine takes minutes to start Ray Serve


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(work folder, prepared data, a tiny checkpoint)."""
    root = tmp_path_factory.mktemp("serve-life")
    prepared, ckpts = tiny_setup(root)
    return root, prepared, ckpts["iaa"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "IAA_WORKDIR")}
    return {**env, "PYTHONPATH": str(REPO)}


def _serve(tiny, port: int, log: Path, *extra: str) -> subprocess.Popen:
    """``iaa-cli serve`` of the tiny checkpoint on ``port``, in a session of its own."""
    root, prepared, ckpt = tiny
    argv = [sys.executable, "-m", "iaa.cli", "serve", "--checkpoint", str(ckpt), "--data", str(prepared),
            "--workdir", str(root), "--port", str(port), "--cpus-per-replica", "0.2", *extra]
    with log.open("w") as out:
        return subprocess.Popen(argv, cwd=root, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _finish(proc: subprocess.Popen, log: Path, timeout_s: float) -> tuple[int | None, float, str]:
    """(exit status, or None when still running after ``timeout_s``; seconds; output)."""
    started = time.monotonic()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - started
    if code is None:
        _kill_session(proc.pid)
    return code, took, log.read_text()


def _live(session: int) -> list[str]:
    """The processes of ``session`` still running (zombies are already dead)."""
    rows = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[3]) == session and stat[0] != "Z":
            rows.append(f"{entry} {Path(f'/proc/{entry}/comm').read_text().strip()}")
    return rows


def _kill_session(session: int) -> None:
    for row in _live(session):
        try:
            os.kill(int(row.split()[0]), signal.SIGKILL)
        except OSError:
            pass


def _one_error_line(out: str, *names: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), out[-3000:]
    assert all(name in lines[0] for name in names), lines[0]
    return lines[0]


class _Asking(threading.Thread):
    """Asks ``GET url`` every 20 ms until told to stop, keeping each answer: (status, content
    type, body); a connection refused is not kept."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.answers, self.done = url, [], threading.Event()

    def run(self) -> None:
        import urllib.error
        import urllib.request

        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as reply:
                    self.answers.append((reply.status, reply.headers.get("content-type"), reply.read()))
            except urllib.error.HTTPError as err:
                self.answers.append((err.code, err.headers.get("content-type"), err.read()))
            except OSError:
                pass
            time.sleep(0.02)


@pytest.fixture(scope="module")
def running(tiny, tmp_path_factory):
    """A serve of one replica, running, and what ``/ready`` answered as it started; stopped (and
    its session killed) at the end at the latest."""
    port, log = free_port(), tmp_path_factory.mktemp("running") / "serve.log"
    proc, asking = _serve(tiny, port, log), _Asking(f"http://127.0.0.1:{port}/ready")
    asking.start()
    deadline = time.monotonic() + START_WAIT_S
    try:
        while "serving on" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill_session(proc.pid)
                pytest.fail(f"serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
    finally:
        asking.done.set()
        asking.join()
    yield proc, port, log, asking.answers
    if proc.poll() is None:
        _kill_session(proc.pid)
        proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_starting_serve_answers_json_503s_until_ready_and_never_the_proxys_404(running):
    """Before the application's route exists, Serve's proxy answers every path itself: its plain
    404 is a JSON 503 to retry, as is the ingress's while no reader has loaded the model."""
    answers = running[3]
    assert answers, "the starting serve answered nothing"
    assert {(status, kind) for status, kind, _ in answers} <= {(503, "application/json"), (200, "application/json")}
    assert all(json.loads(body)["status"] == 503 for status, _, body in answers if status == 503)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_second_serve_on_a_running_ones_port_fails_in_one_line(tiny, running, tmp_path):
    first, port, _, _ = running
    log = tmp_path / "second.log"
    code, took, out = _finish(_serve(tiny, port, log), log, 60)
    assert code not in (None, 0), out[-3000:]
    _one_error_line(out, f"port {port} ", f"(ray::ProxyActor) of pid {first.pid} (", " -m iaa.cli serve)")
    assert took < 10, took
    assert first.poll() is None                  # the running one is untouched


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_to_every_process_of_a_serve_ends_it_cleanly(running):
    """What ``systemctl stop`` does (and ``docker stop`` to a container's processes): Ray's
    processes get the signal too, so the command must not wait for them to answer."""
    from iaa.platform import listeners

    proc, port, log, _ = running
    os.killpg(proc.pid, signal.SIGTERM)
    code, took, out = _finish(proc, log, 60)
    listeners.check_free("127.0.0.1", port)     # free as the command ends: a restart right after can listen
    assert code in (0, 143) and took < 30, (code, took, out[-3000:])
    assert "Traceback" not in out and "Aborted" not in out and "terminate" not in out, out[-3000:]
    assert_says(out, "stopping: the replicas finish the requests they hold")
    time.sleep(1)
    assert _live(proc.pid) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_port_held_by_any_program_is_one_line_naming_it(tiny, tmp_path):
    log = tmp_path / "serve.log"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, took, out = _finish(_serve(tiny, port, log), log, 60)
    assert code not in (None, 0), out[-3000:]
    _one_error_line(out, f"port {port} on 127.0.0.1 is taken by pid {os.getpid()} (", "--port")
    assert took < 10, took


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_replicas_the_cluster_cannot_place_are_one_line_naming_the_cpus(tiny, tmp_path):
    cpus = os.cpu_count() or 1
    log = tmp_path / "serve.log"
    proc = _serve(tiny, free_port(), log, "--replicas", str(cpus + 1), "--cpus-per-replica", "1")
    code, took, out = _finish(proc, log, 120)
    assert code not in (None, 0) and took < 60, (code, took, out[-3000:])
    _one_error_line(out, f"{cpus + 1} replicas x 1 CPU need {cpus + 1} CPUs", f"the cluster has {cpus}")
    time.sleep(1)
    assert _live(proc.pid) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_replicas_left_unplaced_fail_in_one_line_instead_of_waiting(tiny):
    """The CPUs exist but something else holds them: refused before Serve is asked to wait."""
    pytest.importorskip("ray.serve", reason="needs ray[serve]")
    import ray

    from iaa.errors import IaaError
    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve
    from tests._platform import start_local_ray

    root, prepared, ckpt = tiny
    cfg = job.config(model_uri=None, checkpoint=ckpt, ensemble_dir=None, data_dir=prepared, workdir=root,
                     tracking_uri=None, cpus_per_replica=0.5, port=free_port())
    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(num_cpus=2)
    try:
        holder = ray.remote(num_cpus=1.8)(type("Holder", (), {"ping": lambda self: 1})).remote()
        ray.get(holder.ping.remote())
        started = time.monotonic()
        with pytest.raises(IaaError) as caught:
            ray_serve.start(cfg, job.CODE)
        assert time.monotonic() - started < 30
        assert_says(caught.value, "1 replica x 0.5 CPU", "need 0.5 CPUs", "+0.1 for the ingress",
                    "the cluster has 2 (0.2 free)", "free the cluster")
    finally:
        ray_serve.stop(cfg.app_name)
        ray.shutdown()


# --- without Ray ----------------------------------------------------------------------------------


def test_a_port_that_reuseport_listeners_would_share_is_not_free():
    from iaa.errors import IaaError
    from iaa.platform import listeners

    with socket.socket() as proxy, socket.socket() as second:
        for sock in (proxy, second):                # how Serve's proxy binds
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        port = proxy.getsockname()[1]
        second.bind(("127.0.0.1", port))             # a second proxy would share it, silently
        for host in ("127.0.0.1", "0.0.0.0"):
            with pytest.raises(IaaError) as caught:
                listeners.check_free(host, port)
            assert f"port {port} on {host} is taken by pid {os.getpid()} (" in str(caught.value)


def test_the_url_said_for_a_host_is_one_a_client_here_can_open():
    """A wildcard host is reached on loopback, an IPv6 address in brackets (``http://::1:8000``
    is no URL: its port would read as part of the address)."""
    import urllib.parse

    from iaa.platform import listeners

    said = {host: listeners.url(host, 8000) for host in ("127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "reader.local")}
    assert said == {"127.0.0.1": "http://127.0.0.1:8000", "0.0.0.0": "http://127.0.0.1:8000", "::": "http://[::1]:8000",
                    "::1": "http://[::1]:8000", "fe80::1": "http://[fe80::1]:8000", "reader.local": "http://reader.local:8000"}
    assert all(urllib.parse.urlsplit(url).port == 8000 for url in said.values())


def test_the_first_replicas_and_the_ingress_must_fit_the_cpus(tmp_path):
    from iaa.errors import IaaError
    from iaa.jobs.inference import serve as job
    from iaa.platform.serve_capacity import check_fits

    def cfg(**deploy):
        return job.config(model_uri=None, checkpoint=tmp_path / "m.pt", ensemble_dir=None, data_dir=None,
                          workdir=tmp_path, tracking_uri=None, **deploy)

    with pytest.raises(IaaError, match=r"^8 replicas x 1 CPU need 8 CPUs \(\+0.2 for the ingress\); the cluster has 2 "):
        check_fits(cfg(replicas=8, cpus_per_replica=1), {"CPU": 2.0})
    with pytest.raises(IaaError, match="3 replicas x 1 CPU need 3 CPUs"):
        check_fits(cfg(autoscale=(3, 6), cpus_per_replica=1), {"CPU": 2.0})
    check_fits(cfg(replicas=3, cpus_per_replica=0.6), {"CPU": 2.0})     # 1.8 + 0.1
    check_fits(cfg(autoscale=(0, 8), cpus_per_replica=1.5), {"CPU": 2.0})   # starts with one
    with pytest.raises(IaaError, match=r"the cluster has 2 \(0.5 free\) and could not place them"):
        check_fits(cfg(replicas=1, cpus_per_replica=1), {"CPU": 2.0}, {"CPU": 0.5})    # the rest held by others
    check_fits(cfg(replicas=1, cpus_per_replica=1), {"CPU": 2.0}, {"CPU": 1.1})


def test_the_serving_line_points_to_the_api_docs(tmp_path, monkeypatch, caplog):
    """The one line a started serve prints names the browser's page, ``/docs``, beside the routes."""
    from iaa.jobs.inference import serve as job
    from iaa.platform import serve_life

    cfg = job.config(model_uri=None, checkpoint=tmp_path / "m.pt", ensemble_dir=None, data_dir=None,
                     workdir=tmp_path, tracking_uri=None, address="ray://cluster:10001")   # joins: no local Ray here
    url = "http://127.0.0.1:8011"

    def stopped(seconds: float) -> None:
        raise KeyboardInterrupt                          # Ctrl-C as soon as it serves

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(serve_life.time, "sleep", stopped)
    caplog.set_level("INFO", logger="iaa.platform.serve_life")
    try:
        serve_life.run_forever(cfg, lambda: False, lambda: url, lambda local: None)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving on")]
    assert_says(line, f"POST {url}/predict", f"API docs at {url}/docs")
