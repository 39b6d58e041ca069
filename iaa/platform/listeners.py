"""Who listens on a TCP port of this machine, a check that a port is free for one server, and
the processes below one (what a command started).

Ray Serve's HTTP proxy binds its port with ``SO_REUSEPORT``, so a second proxy on a port that
one already holds starts without a word and the kernel splits the connections between them.
:func:`check_free` binds the port without ``SO_REUSEPORT`` first: on Linux that fails on a port
that any socket listens on, a ``SO_REUSEPORT`` one included. :func:`holders` names the processes
behind a port from the system's TCP sockets (``psutil.net_connections``); a process of another
user cannot be looked into, and is left out (psutil gives its socket no pid).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import psutil

from iaa.errors import IaaError


def _name(pid: int) -> str:
    """A process's command (``ray::ProxyActor``, ``python3``), from its command line, else its name."""
    try:
        process = psutil.Process(pid)
        argv = process.cmdline()
        command = argv[0].strip() if argv else ""
        if command:          # a path (absolute, or relative as ".venv/bin/python") or a title with words
            return os.path.basename(command if command.startswith("/") else command.split()[0])
        return process.name()
    except psutil.Error:
        return "?"


def holders(port: int) -> list[tuple[int, str]]:
    """(pid, name) of each process that this user can see listening on TCP ``port``, by pid."""
    try:
        sockets = psutil.net_connections(kind="tcp")            # IPv4 and IPv6, any address
    except psutil.Error:                                        # macOS, without root
        return []
    pids = {s.pid for s in sockets if s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port
            and s.pid is not None}                              # None: another user's
    return sorted((pid, _name(pid)) for pid in pids)


def url(host: str, port: int) -> str:
    """The base URL at which this machine reaches a server listening on ``host``: a wildcard
    address on its loopback, an IPv6 address in brackets (``http://[::1]:8000``)."""
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{reach}]:{port}" if ":" in reach else f"http://{reach}:{port}"


def _bind(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past TIME_WAIT, never past a listener
        probe.bind((host, port))


def _parent(pid: int) -> int:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return 0


def _command(pid: int, words: int = 4) -> str:
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "?"
    return " ".join(os.path.basename(word) if word.startswith("/") else word for word in argv[:words]).strip()


def describe(pid: int, name: str) -> str:
    """``pid 12 (name)``; for a process of Ray (Serve's proxy), also the command that started its Ray."""
    text = f"pid {pid} ({name})"
    if not name.startswith("ray::"):
        return text
    owner = _parent(pid)
    while owner > 1 and (_name(owner).startswith("ray::") or _name(owner) in ("raylet", "gcs_server")):
        owner = _parent(owner)
    return f"{text} of pid {owner} ({_command(owner)})" if owner > 1 else text


def check_free(host: str, port: int, flag: str = "`port`") -> None:
    """Raise :class:`IaaError` naming ``port`` (and the process holding it, where this user can
    see it) when a server could not listen on ``host:port`` alone."""
    try:
        _bind(host, port)
    except OSError as err:
        who = ", ".join(describe(pid, name) for pid, name in holders(port))
        reason = f"is taken by {who}" if who else f"cannot be listened on ({err.strerror or err})"
        raise IaaError(f"port {port} on {host} {reason}; stop it or give another {flag}") from None


def descendants(root: int) -> list[int]:
    """Every process below ``root``, each before its own children (none once ``root`` is gone)."""
    try:
        return [child.pid for child in psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return []


def end(pids: Sequence[int], wait_s: float) -> None:
    """SIGKILL ``pids`` and wait, at most ``wait_s``, until they have exited: a port one of them
    listened on is free once this returns, so a server started right after finds it so."""
    killed = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            process.kill()
        except psutil.Error:                    # gone already, or not this user's
            continue
        killed.append(process)
    psutil.wait_procs(killed, timeout=wait_s)


def adopt_orphans() -> None:
    """Make this process the parent of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``),
    so :func:`descendants` still finds them after their own parent died; elsewhere, nothing."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
