"""``iaa-cli serve`` from start to stop: one server per port, and a clean stop on a signal.

- Before a local Ray starts, the port must be free for this server alone
  (:func:`iaa.platform.listeners.check_free`): Serve's proxy would share it with any other.
  Once serving, no process but this command's may listen on it either.
- SIGINT and SIGTERM (Ctrl-C, ``docker stop``, ``systemctl stop``) raise ``KeyboardInterrupt`` in
  the main thread, also after Ray set its own handlers. The stop then deletes the application
  (Serve lets its replicas finish the requests they hold) and shuts down the Ray this command
  started; the command exits 0. A signal while Ray starts (when Ray's own SIGTERM handler, which
  raises ``SystemExit``, may be the one set) ends what the half-started Ray had started.
- A stop has :data:`STOP_S` seconds. A service manager may signal every process of the service
  at once, Ray's included: then Ray is gone, and a driver that still talks to it blocks until
  Ray's client gives up and aborts the process. So when this command's local Ray is no longer
  reachable, or the stop runs out of time, or a second signal comes, what is left of the local
  Ray is killed and the process exits at once, without Ray's exit hooks.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from iaa.errors import IaaError
from iaa.jobs.ports import ServeConfig
from iaa.platform import listeners

_log = logging.getLogger(__name__)

STOP_S = 20.0                      # the most a stop takes before the process ends anyway
KILLED_WAIT_S = 3.0                # the most it then waits for the processes it killed to exit
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _arm(handler: Any) -> None:
    for s in _SIGNALS:
        signal.signal(s, handler)


def _local(cfg: ServeConfig) -> bool:
    """Whether serving ``cfg`` starts a local Ray here (none joined, none already up in this process)."""
    ray = sys.modules.get("ray")
    return not (cfg.address or os.environ.get("RAY_ADDRESS") or (ray is not None and ray.is_initialized()))


def check_port(cfg: ServeConfig) -> None:
    """Raise :class:`IaaError` when a local Ray's proxy would share ``cfg.port`` with another
    listener (see the module); quick, and without Ray."""
    if _local(cfg):
        listeners.check_free(cfg.host, cfg.port)


def _check_alone(cfg: ServeConfig) -> None:
    """After the start: only this command's processes listen on the port (another server may have
    taken it in the seconds Ray took to start)."""
    ours = set(listeners.descendants(os.getpid()))
    others = [(pid, name) for pid, name in listeners.holders(cfg.port) if pid not in ours]
    if others:
        who = ", ".join(listeners.describe(pid, name) for pid, name in others)
        raise IaaError(f"port {cfg.port} on {cfg.host} was taken by {who} while Ray started; "
                       "stop it or give another `port`")


def run_forever(cfg: ServeConfig, connect: Callable[[], bool], start: Callable[[], str],
                stop: Callable[[bool], None]) -> None:
    """Serve ``cfg`` until SIGINT or SIGTERM, then stop (see the module): ``connect()`` joins or
    starts Ray (True: a local one, this command's), ``start()`` deploys and returns the URL,
    ``stop(local)`` deletes the application and shuts down what this command started."""
    check_port(cfg)
    own = _local(cfg)                               # a local Ray, started (or half started) by this command
    if own:
        listeners.adopt_orphans()                   # what Ray leaves when its raylet dies stays ours to end
    _arm(_interrupt)                                # also when started with SIGINT ignored (`cmd &`)
    local, error = False, None
    try:
        local = connect()
        _arm(_interrupt)                            # Ray's start may have taken them
        url = start()
        if local:
            _check_alone(cfg)
        _log.info(f"serving on {url}: POST {url}/predict, GET {url}/ready; API docs at {url}/docs (Ctrl-C stops)")
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):        # SystemExit: Ray's own SIGTERM handler, set while it starts
        _log.info(f"stopping: the replicas finish the requests they hold (at most {STOP_S:.0f} s; a second "
                  "Ctrl-C ends it at once)")
    except BaseException as err:
        error = err                                 # on its way to the command's error line
        raise
    finally:
        _stop(stop, local, own, error)


def _stop(stop: Callable[[bool], None], local: bool, own: bool, pending: BaseException | None) -> None:
    """``stop(local)`` within :data:`STOP_S` (see the module); ``own``: this command started a
    local Ray, maybe only half (stopped while Ray started); ``pending``: the error the command is
    failing with, said before an early exit."""
    ray = sys.modules.get("ray")
    _arm(lambda signum, frame: _end_now(own, 128 + signum))
    if ray is None or not ray.is_initialized():
        if own:
            _kill_ours()                            # what a half-started Ray had started
        return
    done = threading.Event()
    code = 1 if pending is not None else 0
    threading.Thread(target=_watch, args=(local, code, pending, done), daemon=True).start()
    try:
        stop(local)
    except Exception:  # noqa: BLE001 - a stop that fails still ends what this command started
        _end_now(local, 1, pending)
    finally:
        done.set()


def _watch(local: bool, code: int, pending: BaseException | None, done: threading.Event) -> None:
    """End the process (:func:`_end_now`) when the stop outlasts :data:`STOP_S`, or at once when
    this command's local Ray stops answering (signalled with it) before the stop is done."""
    address, deadline = _gcs_address() if local else "", time.monotonic() + STOP_S
    while not done.wait(0.5):
        if time.monotonic() > deadline or (address and not _reachable(address) and not done.is_set()):
            _end_now(local, code, pending)


def _gcs_address() -> str:
    import ray

    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - no context: nothing to reach
        return ""


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return False
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError:
        return False
    return True


def _end_now(local: bool, code: int, pending: BaseException | None = None) -> None:
    """Kill what is left of this command's local Ray, print ``pending``'s line, and exit ``code``."""
    if local:
        _kill_ours()
    if pending is not None:
        _log.error(str(pending) if isinstance(pending, IaaError) else f"{type(pending).__name__}: {pending}")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)


def _kill_ours() -> None:
    """SIGKILL every process below this one (all of them this command's local Ray's), and wait for
    them to exit: the port their proxy held is free when the command ends."""
    listeners.end(listeners.descendants(os.getpid()), KILLED_WAIT_S)
