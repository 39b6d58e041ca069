"""What this test process started, seen from /proc and ``ss``: its process tree, the TCP ports
those processes listen on, and the resident memory of the ones Ray names."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess


def process_tree(root: int) -> set[int]:
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


def listening(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket that one of ``pids`` listens on (``ss -ltnp``)."""
    rows = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', line):
            if int(pid) in pids:
                host, port = line.split()[3].rsplit(":", 1)
                rows.append((host.strip("[]"), int(port), name))
    return rows


def loopback(host: str) -> bool:
    return host not in ("*", "0.0.0.0", "::") and ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback


def exposed_ports(rows: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """The rows of :func:`listening` that another machine could reach."""
    return [row for row in rows if not loopback(row[0])]


def resident_mib(pids: set[int], title: str) -> dict[int, int]:
    """The resident memory, in MiB, of each process among ``pids`` whose title (what Ray sets as
    its command line, ``ray::ProxyActor``) starts with ``title``, by pid; at least one."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().split(b"\0")[0].decode(errors="replace")
            with open(f"/proc/{pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
        if command.startswith(title):
            found[pid] = rss // 1024
    assert found, f"no process titled {title}"
    return found
