"""eMQP pub/sub: PUBLISH on the pub-in ROUTER goes out on PUB and into the hub, and (with
``pub_bridge``) what other protocols publish on chosen addresses goes out on PUB too."""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError
from mqhub.interfaces import IDeliveryTarget
from mqhub.protocols.emqp import frames as F
from mqhub.protocols.emqp.droplog import DropLog
from mqhub.protocols.emqp.jobs import Frames, Send
from mqhub.protocols.emqp.peers import PeerTable
from mqhub.records import BODY, ORIGIN

log = Logger(namespace="mqhub.emqp")


@implementer(IDeliveryTarget)
class PubBridge:
    """Live hub subscription that copies other protocols' messages to the PUB socket.

    A message published on address ``a.b`` by NATS, NSQ, ... goes out as ``[b"a.b", body]``;
    messages that came from eMQP PUBLISH are skipped (they were sent on PUB already).
    """

    protocol_name = "emqp"

    def __init__(self, send_pub: Send, guard: Any = None) -> None:
        """:param send_pub: sends ``[topic, message]`` on the PUB socket.
        :param guard: the :class:`~.access.EmqpGuard` when a users file is in force: an address
            goes out only if everyone who can connect to PUB may read it."""
        self.send_pub = send_pub
        self.guard = guard

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Forward every foreign message of the batch as one PUB message each."""
        if self.guard is not None and not self.guard.audience_may(address):
            return
        topic = address.encode()
        send = self.send_pub
        for entry in messages:
            if entry[ORIGIN] != "emqp":
                send([topic, entry[BODY]])


class PubRelay:
    """The pub-in ROUTER's PUBLISH handling and the PUB bridge's hub subscriptions."""

    def __init__(self, broker: Any, send_pub: Send | None, drops: DropLog, max_body: int,
                 stats: dict[str, int], patterns: tuple[str, ...], publishers: PeerTable,
                 clock: Any, guard: Any = None) -> None:
        """:param send_pub: sends ``[topic, message]`` on PUB (None: hub only, no PUB socket).
        :param stats: the router's counters (``published`` is counted here).
        :param patterns: hub address patterns bridged to PUB while started.
        :param publishers: where the identities that PUBLISH are noted.
        :param clock: IReactorTime giving when they were seen.
        :param guard: the :class:`~.access.EmqpGuard` (None: every peer may do everything)."""
        self.broker = broker
        self.publishers = publishers
        self.clock = clock
        self.send_pub = send_pub
        self.drops = drops
        self.max_body = max_body
        self.stats = stats
        self.patterns = tuple(patterns)
        self.bindings: list[Any] = []
        self.guard = guard

    def start(self) -> None:
        """Subscribe the bridge to every pattern (when there is a PUB socket)."""
        if self.send_pub is not None:
            bridge = PubBridge(self.send_pub, self.guard)
            for pattern in self.patterns:
                self.bindings.append(self.broker.subscribe(pattern, bridge))

    def stop(self) -> None:
        """Drop the bridge's subscriptions."""
        for binding in self.bindings:
            self.broker.unbind(binding)
        self.bindings.clear()

    def received(self, messages: list[Frames]) -> None:
        """PUBLISH on the pub/sub ROUTER: out on PUB as ``[topic, message]`` and into the hub."""
        topics: dict[bytes, list[bytes]] = {}
        seen: list[bytes] = []  # marked in the peer table once, after the read
        mark = seen.append
        for frames in messages:
            try:
                cmd = F.parse_routed(frames, self.max_body)
                if cmd.name != b"PUBLISH":
                    raise F.ProtocolError(F.E_COMMAND, f"{cmd.name.decode()} on pub-in")
                topic, message = cmd.body
                if not topic:
                    raise F.ProtocolError(F.E_BAD_VALUE, "empty topic")
                guard = self.guard
                if guard is not None and not guard.may_publish(
                        "pub-in", cmd.peer, topic.decode("utf-8", "replace")):
                    raise F.ProtocolError(F.E_UNAUTHORIZED, "not allowed to publish to "
                                          + topic.decode("utf-8", "replace"))
            except F.ProtocolError as exc:
                self.drops.drop("pub-in", frames[0] if frames else b"", str(exc))
                continue
            mark(cmd.peer)
            if self.send_pub is not None and (self.guard is None or self.guard.audience_may(
                    topic.decode("utf-8", "replace"))):
                self.send_pub([topic, message])
            topics.setdefault(topic, []).append(message)
            self.stats["published"] += 1
        self.publishers.seen_all(seen, self.clock.seconds())
        for topic, bodies in topics.items():
            try:
                d = self.broker.publish_batch(topic.decode(), bodies, origin="emqp")
            except InvalidName:
                continue  # not a hub address: PUB subscribers only
            except MqhubError as exc:
                log.warn("eMQP: publish to {t} refused by the hub: {e}", t=topic, e=exc)
                continue
            d.addErrback(lambda f: log.failure("eMQP: publish failed", f))
