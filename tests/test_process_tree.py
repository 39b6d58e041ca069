"""The processes, ports and start times that iaa reads through psutil, against what /proc says
(``tests/_processes.py`` parses it by hand): the processes below one, who listens on a port, and
the owner token's start time, which keeps the format of tokens written before psutil."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from iaa.jobs import interrupt
from iaa.platform import listeners
from iaa.platform.cluster import owner
from tests._processes import process_tree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compared with Linux's /proc")


def test_descendants_are_every_process_below_one_each_before_its_children() -> None:
    shell = subprocess.Popen(["bash", "-c", "sleep 30 & (sleep 30 & wait) & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(process_tree(shell.pid)) < 4 and time.monotonic() < deadline:     # bash, sleep, subshell, sleep
            time.sleep(0.05)
        below = process_tree(shell.pid) - {shell.pid}
        assert len(below) == 3
        for found in (listeners.descendants(shell.pid), interrupt.descendants(shell.pid)):
            assert set(found) == below and len(found) == 3
        assert set(listeners.descendants(os.getpid())) >= below | {shell.pid}
        order = listeners.descendants(os.getpid())
        assert all(order.index(listeners._parent(pid)) < order.index(pid) for pid in below)
    finally:
        for pid in [*listeners.descendants(shell.pid), shell.pid]:
            os.kill(pid, 9)
        shell.wait()
    assert listeners.descendants(shell.pid) == [] and interrupt.descendants(shell.pid) == []     # gone: none


def test_the_listener_on_a_port_is_named_and_a_free_port_has_none() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with open("/proc/self/cmdline", "rb") as cmdline:
            command = os.path.basename(cmdline.read().split(b"\0")[0].decode())
        assert listeners.holders(port) == [(os.getpid(), command)]
    assert listeners.holders(port) == []


def test_the_owner_token_keeps_the_clock_ticks_since_boot_of_proc_stat() -> None:
    with open(f"/proc/{os.getpid()}/stat") as stat:
        ticks = stat.read().rsplit(")", 1)[1].split()[19]            # field 22, starttime
    token = owner.owner()
    assert token == f"{socket.gethostname()}:{os.getpid()}:{ticks}"
    assert owner.owner_alive(token)
    assert not owner.owner_alive(f"{socket.gethostname()}:{os.getpid()}:{int(ticks) + 1}")   # a reused pid
    assert owner._process_start(2**22 + 1) == ""                        # no such process
