"""``mqhub.listener.listen``: plain TCP endpoint strings bound without Twisted's endpoint
parser (a start does not import it), everything else through it, with the same result."""

from __future__ import annotations

from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactor

from mqhub.listener import PLAIN_TCP, listen

PLAIN = ["tcp:4222", "tcp:port=4223", "tcp:0:interface=127.0.0.1",
         "tcp:8222:backlog=7:interface=10.1.2.3", "tcp:9:interface=localhost:backlog=100"]
OTHER = ["tcp:4222:interface=\\:\\:1", "tcp:4222:interface=::1", "unix:/tmp/x.sock",
         "tcp:port=4222:foo=1", "tcp:4222:backlog=x"]


def _bound(endpoint: str, ours: bool) -> list[tuple]:
    """What a MemoryReactor was asked to bind for ``endpoint`` (port, backlog, interface)."""
    reactor = MemoryReactor()
    factory = Factory()
    if ours:
        d = listen(reactor, endpoint, factory)
    else:
        d = serverFromString(reactor, endpoint).listen(factory)
    failures: list[object] = []
    d.addErrback(failures.append)
    assert not failures, failures
    servers = [(p, f is factory, b, i) for p, f, b, i in reactor.tcpServers]
    return servers + [(path, f is factory) for path, f, *_ in reactor.unixServers]


def test_plain_tcp_strings_bind_as_twisted_binds_them() -> None:
    """Port, backlog and interface as Twisted's TCP endpoint passes them; strings the regular
    expression does not take (escapes, IPv6 literals, other keywords or types) go to Twisted's
    parser and bind as before."""
    for endpoint in PLAIN:
        assert PLAIN_TCP.fullmatch(endpoint), endpoint
        assert _bound(endpoint, True) == _bound(endpoint, False), endpoint
    for endpoint in OTHER:
        assert not PLAIN_TCP.fullmatch(endpoint), endpoint
        if endpoint.endswith(("backlog=x", "=::1")) or "foo" in endpoint:
            continue                        # Twisted's own error, raised by either way
        assert _bound(endpoint, True) == _bound(endpoint, False), endpoint
