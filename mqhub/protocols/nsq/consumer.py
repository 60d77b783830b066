"""Consumer-side NSQ commands (SUB, RDY, FIN, REQ, TOUCH, CLS, NOP) as a mixin of the connection.

:class:`~mqhub.protocols.nsq.server.NsqProtocol` inherits :class:`ConsumerCommands`, so these stay
plain methods of the connection (no extra call per message): a run of FINs is one
:meth:`ConsumerCommands.finish` and one ``queue.ack`` call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mqhub.interfaces import ICore
from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq.codec import ProtocolError, encode_error
from mqhub.records import NOT_OWNER

if TYPE_CHECKING:
    from mqhub.protocols.nsq.auth import AuthState
    from mqhub.protocols.nsq.config import NsqConfig
    from mqhub.protocols.nsq.identify import Identity
    from mqhub.protocols.nsq.topics import TopicRegistry

STATE_INIT = "init"
STATE_SUBSCRIBED = "subscribed"
STATE_CLOSING = "closing"

_OK = wire.OK_FRAME
_NOT_IN_FLIGHT = b"ID not in flight"
_NOT_OWNER = b"client does not own message"


class ConsumerCommands:
    """SUB/RDY/FIN/REQ/TOUCH/CLS/NOP handling; the connection class supplies the attributes below."""

    factory: Any  # the NsqFactory (Any: twisted types Protocol.factory as a plain Factory)
    config: NsqConfig
    registry: TopicRegistry
    identity: Identity
    auth: AuthState | None
    state: str
    core: ICore
    consumer: Any
    queue: Any
    topic_name: str
    channel_name: str
    ready_count: int
    finish_count: int
    requeue_count: int

    if TYPE_CHECKING:
        def respond(self, data: bytes, close: bool = False) -> None:
            """Queue a response in command order (provided by the connection)."""

    def on_sub(self, ev: wire.Sub) -> None:
        """SUB topic channel: attach to the channel's queue with RDY 0."""
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if self.identity.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        if self.factory.secrets is not None:
            if self.auth is None:
                raise ProtocolError("E_AUTH_FIRST", "AUTH required before SUB")
            if not self.auth.allows(ev.topic, ev.channel, "subscribe"):
                raise ProtocolError("E_UNAUTHORIZED", f'AUTH failed for SUB on "{ev.topic}" "{ev.channel}"')
        queue = self.registry.ensure_channel(ev.topic, ev.channel)
        limit = self.config.max_channel_consumers
        if limit and len(queue.consumers) >= limit:
            raise ProtocolError(
                "E_SUB_FAILED", f"SUB failed consumers for {ev.topic}:{ev.channel} exceeds limit of {limit}"
            )
        self.topic_name, self.channel_name = ev.topic, ev.channel
        self.queue = queue
        self.state = STATE_SUBSCRIBED
        self.respond(_OK)
        self.consumer = self.core.attach(queue, self, ready=0,
                                         timeout=self.identity.msg_timeout / 1000.0)

    def on_rdy(self, ev: wire.Rdy) -> None:
        """RDY n: how many messages may be in flight to this client."""
        if self.state == STATE_CLOSING:
            return
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        if ev.count < 0 or ev.count > self.config.max_rdy_count:
            raise ProtocolError(
                "E_INVALID", f"RDY count {ev.count} out of range 0-{self.config.max_rdy_count}"
            )
        self.ready_count = ev.count
        self.consumer.set_ready(ev.count)

    def _require_consumer(self, verb: str) -> None:
        """FIN/REQ/TOUCH need a subscribed (or closing) connection."""
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ProtocolError("E_INVALID", f"cannot {verb} in current state")

    def finish(self, ids: list[int], bad: Sequence[bytes] = ()) -> None:
        """FIN a run of parsed ids with one core call; E_FIN_FAILED (non-fatal) for unknown ones.

        :param bad: raw ids that are not 16 hex digits (they fail after ``ids``).
        """
        self._require_consumer("FIN")
        failed = self.queue.ack(self.consumer, ids) if ids else []
        self.finish_count += len(ids) - len(failed)
        if failed or bad:
            errs = [(wire.render_id(i), why) for i, why in self._why(failed)]
            errs += [(raw, _NOT_IN_FLIGHT) for raw in bad]
            self.respond(b"".join(
                encode_error(b"E_FIN_FAILED FIN %s failed %s" % err) for err in errs))

    def _why(self, failed: list[int]) -> list[tuple[int, bytes]]:
        """nsqd's reason text for each id an ack/requeue/touch refused (asked right after it)."""
        if not failed:
            return []
        return [(mid, _NOT_OWNER if reason == NOT_OWNER else _NOT_IN_FLIGHT)
                for mid, reason in self.queue.failure_reasons(self.consumer, failed)]

    def _one_id(self, verb: str, raw_id: bytes, op: Callable[[list[int]], list[int]]) -> None:
        """REQ or TOUCH of one raw id through ``op(ids)`` (a queue call returning refused ids).

        :raises ProtocolError: nsqd's non-fatal ``E_<VERB>_FAILED`` with its reason text.
        """
        self._require_consumer(verb)
        ids, _ = wire.parse_ids([raw_id])
        failed = op(ids) if ids else []
        if failed or not ids:
            why = self._why(failed)[0][1] if failed else _NOT_IN_FLIGHT
            raise ProtocolError(f"E_{verb}_FAILED",
                                f"{verb} {raw_id.decode('latin-1')} failed {why.decode()}", fatal=False)

    def on_req(self, ev: wire.Req) -> None:
        """REQ id timeout_ms: back to the channel now (0) or after the delay (durable)."""
        delay = ev.timeout_ms / 1000.0
        self._one_id("REQ", ev.msg_id, lambda ids: self.queue.requeue(self.consumer, ids, delay=delay))
        self.requeue_count += 1

    def on_touch(self, ev: wire.Touch) -> None:
        """TOUCH id: reset the in-flight deadline."""
        self._one_id("TOUCH", ev.msg_id, lambda ids: self.queue.touch(self.consumer, ids))

    def on_cls(self, ev: wire.Cls) -> None:
        """CLS: stop sending messages; the client closes once it has FINed what it holds."""
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.state = STATE_CLOSING
        self.ready_count = 0
        self.consumer.set_ready(0)
        self.respond(wire.CLOSE_WAIT_FRAME)

    def on_nop(self, ev: wire.Nop) -> None:
        """NOP: no response."""
