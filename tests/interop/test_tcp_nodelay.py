"""TCP_NODELAY on every accepted client connection of every TCP protocol (issue 28 item 2).

The broker runs as a subprocess with every protocol (and the example redis plugin); the test
connects to each TCP role, finds the broker's end of that connection among the broker's file
descriptors (Linux ``pidfd_getfd``: a duplicate of the broker's real accepted socket) and reads
its TCP_NODELAY option.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from collections.abc import Callable
from functools import partial

import pytest

from tests.interop.broker import HOST, BrokerProcess, wait_until
from tests.plugins import EXAMPLE_PLUGINS

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"),
                       reason="reads another process's socket through Linux pidfd_getfd"),
]

#: the pidfd_getfd system call number (the same on x86_64 and aarch64)
SYS_PIDFD_GETFD = 438


def broker_socket(pid: int, peer: tuple[str, int]) -> socket.socket | None:
    """A duplicate of the broker's socket whose peer is ``peer`` (our client's address)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                continue
            sock = socket.socket(fileno=fd)
            try:
                if sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM \
                        and sock.getpeername() == peer:
                    return sock
            except OSError:
                pass
            sock.close()
    finally:
        os.close(pidfd)
    return None


def test_every_tcp_listener_sets_tcp_nodelay(make_broker: Callable[..., BrokerProcess]) -> None:
    """Each protocol's accepted socket (NSQ TCP and HTTP, NATS, eMQP, MQKS, VibeMQ, the example
    redis plugin, the admin HTTP listener) has TCP_NODELAY set."""
    broker = make_broker(["nsq", "nats", "emqp", "mqks", "vibemq", "redis"],
                         plugin_paths=[EXAMPLE_PLUGINS], extra_args=["--durability", "none"])
    assert broker.process is not None
    pid = broker.process.pid
    roles = sorted(broker.ports)
    assert len(roles) >= 8
    checked = []
    for protocol, role in roles:
        client = socket.create_connection((HOST, broker.port(protocol, role)), timeout=5)
        try:
            mine = client.getsockname()
            theirs = wait_until(partial(broker_socket, pid, mine),
                                f"the broker's socket of {protocol}.{role}")
            with theirs:
                assert theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0, \
                    f"{protocol}.{role} accepted a connection without TCP_NODELAY"
            checked.append(f"{protocol}.{role}")
        finally:
            client.close()
    assert {"mq9.tcp", "nsq.tcp", "nsq.http", "emqp.frontend", "emqp.backend", "mqks.tcp",
            "vibemq.tcp", "redis.tcp", "admin.http"} <= set(checked)
