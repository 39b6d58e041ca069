"""Who listens on a TCP port of this machine, a check that a port is free for one server, and
the processes below one (what a command started).

Ray Serve's HTTP proxy binds its port with ``SO_REUSEPORT``, so a second proxy on a port that
one already holds starts without a word and the kernel splits the connections between them.
:func:`check_free` binds the port without ``SO_REUSEPORT`` first: on Linux that fails on a port
that any socket listens on, a ``SO_REUSEPORT`` one included. :func:`holders` names the processes
behind a port from ``/proc/net/tcp*`` and each process's open sockets (``/proc/PID/fd``); a
process of another user cannot be looked into, and is left out.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from iaa.errors import IaaError

_LISTEN = "0A"                       # TCP_LISTEN in /proc/net/tcp's "st" column


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes of every TCP listener on ``port`` (IPv4 and IPv6, any address)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _name(pid: int) -> str:
    """A process's command (``ray::ProxyActor``, ``python3``), from its command line, else its comm."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        if command:
            return os.path.basename(command) if command.startswith("/") else command.split()[0]
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def holders(port: int) -> list[tuple[int, str]]:
    """(pid, name) of each process that this user can see listening on TCP ``port``, by pid."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    found = []
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in wanted for fd in fds):
                found.append((int(entry), _name(int(entry))))
        except OSError:                 # gone, or another user's
            continue
    return sorted(found)


def _bind(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past TIME_WAIT, never past a listener
        probe.bind((host, port))


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _command(pid: int, words: int = 4) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
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


def check_free(host: str, port: int, flag: str = "--port") -> None:
    """Raise :class:`IaaError` naming ``port`` (and the process holding it, where this user can
    see it) when a server could not listen on ``host:port`` alone."""
    try:
        _bind(host, port)
    except OSError as err:
        who = ", ".join(describe(pid, name) for pid, name in holders(port))
        reason = f"is taken by {who}" if who else f"cannot be listened on ({err.strerror or err})"
        raise IaaError(f"port {port} on {host} {reason}; stop it or give another {flag}") from None


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first, then theirs), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parents[int(entry)] = _parent(int(entry))
    found, todo = [], [root]
    while todo:
        here = todo.pop(0)
        kids = [pid for pid, ppid in parents.items() if ppid == here and pid not in found]
        found.extend(kids)
        todo.extend(kids)
    return found


def adopt_orphans() -> None:
    """Make this process the parent of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``),
    so :func:`descendants` still finds them after their own parent died; elsewhere, nothing."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
