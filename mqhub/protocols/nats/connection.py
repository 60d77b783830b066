"""One NATS client connection and its subscriptions: parse each read, route PUBs, write output.

The Twisted side of :class:`mqhub.protocols.nats.server.NatsServer`: CONNECT and auth, the
per-connection rules (verbose, pedantic, echo, headers, no_responders), the fast loop that takes
turns between the router (:mod:`mqhub.protocols.nats.router`) and the parser's events, and the
output path: each read's output is written straight to the
socket while Twisted holds none of it (:mod:`mqhub.protocols.nats.output`), with the
slow-consumer rule of nats-server: output that waits for a subscriber is bounded by
``max_pending`` bytes and by ``write_deadline`` seconds of being backed up; past either the
subscriber is cut at once. A publisher whose read left a subscriber above 3/4 of its budget
is not read for a few milliseconds (nats-server's fast-producer stall, 2–5 ms): a reader
that is only briefly behind catches up instead of being cut, while one that stopped reading
reaches its budget within a fraction of a second; nobody else waits.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from mqhub.identity import Session
from mqhub.listener import set_no_delay, set_read_size
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.auth import (
    ANONYMOUS,
    AUTH_EXPIRED,
    AUTH_VIOLATION,
    Principal,
    new_nonce,
)
from mqhub.protocols.nats.codec import (
    OP_CONNECT,
    OP_ERR,
    OP_ERROR,
    OP_HPUB,
    OP_OK,
    OP_PING,
    OP_PONG,
    OP_PUB,
    OP_SUB,
    OP_UNSUB,
    NatsParser,
    ProtocolError,
)
from mqhub.protocols.nats.host import NatsHost
from mqhub.protocols.nats.mq9_common import sub_pattern
from mqhub.protocols.nats.output import direct_socket, remainder, send_chunks
from mqhub.protocols.nats.rights import PublishTables, publish_violation, subscribe_violation
from mqhub.protocols.nats.router import PubRouter
from mqhub.protocols.nats.settings import (
    CRLF,
    MQ9_PREFIX,
    READ_SIZE,
    STALL_MAX,
    STALL_MIN,
    WIRE_ERRORS,
)

__all__ = ["NatsConnection", "Subscription"]

log = Logger()


def stall_duration(pending: int, budget: int) -> float:
    """How long a publisher is not read after feeding a subscriber with ``pending`` of its
    ``budget`` bytes waiting: :data:`STALL_MIN`, growing past half the budget, at most
    :data:`STALL_MAX` (nats-server's fast-producer stall)."""
    half = budget // 2
    if pending <= half:
        return STALL_MIN
    return min(STALL_MAX, STALL_MIN + (STALL_MAX - STALL_MIN) * (pending - half) / max(half, 1))


class Subscription:
    """One SUB of one connection."""

    __slots__ = ("conn", "subject", "queue", "sid", "max", "delivered", "wire_subject",
                 "core_handle", "mq9")

    def __init__(self, conn: NatsConnection, subject: str, queue: str | None, sid: str,
                 wire_subject: str) -> None:
        """:param subject: the pattern matched on (``#`` already mapped); ``wire_subject`` as sent."""
        self.conn = conn
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.max: int | None = None
        self.delivered = 0
        self.wire_subject = wire_subject
        self.core_handle: Any = None
        self.mq9 = False

    def __repr__(self) -> str:
        """Show pattern, queue and sid."""
        return f"<Subscription {self.subject!r} q={self.queue!r} sid={self.sid!r}>"


@implementer(IPushProducer)
class NatsConnection(Protocol):
    """One client connection."""

    transport: Any

    def __init__(self, server: NatsHost[NatsConnection, Subscription], cid: int) -> None:
        """Connection state before INFO is sent; ``server`` is the ``NatsServer`` (see host.py)."""
        self.server = server
        self.cid = cid
        s = server.settings
        self.parser = NatsParser(server=True, max_payload=s.max_payload,
                                 max_control_line=s.max_control_line)
        self.router = PubRouter(self.parser)
        self.out: list[bytes] = []
        self.subs: dict[str, Subscription] = {}
        self.connected = False       # transport open
        self.authed = not server.guard.required
        #: who authenticated (name, account, expiry; :mod:`mqhub.protocols.nats.auth`)
        self.principal: Principal = ANONYMOUS
        #: what it may do: its rights' session (None: no per-subject rights are checked)
        self.session: Session | None = None
        #: a restricted publisher's own route tables (None: the server's are used)
        self.pub_tables: PublishTables | None = None
        #: events waiting behind a CONNECT whose turn has not come (failed-login slowdown)
        self.waiting: list[tuple] | None = None
        self._turn = False
        self._connect_wait = 0.0
        #: the INFO nonce an nkey/JWT client signs (None when no signature check is configured)
        self.nonce: str | None = new_nonce() if server.guard.needs_nonce else None
        self.got_connect = False
        self.verbose = True
        self.pedantic = True
        self.echo = True
        self.headers = False
        self.no_resp = False
        self.fast = False
        self.name = ""
        self.lang = ""
        self.version = ""
        self.peer_host = ""
        self.pings_out = 0
        self.paused = False
        self.paused_bytes = 0
        #: the socket written directly while Twisted holds nothing of ours (None: plain writes)
        self.sock: Any = None
        #: output waiting while Twisted still holds an earlier remainder (direct writes only)
        self.held: list[bytes] = []
        self._pinger: LoopingCall | None = None
        self._auth_timer: Any = None
        self._deadline: Any = None
        self._expiry: Any = None
        self._stall: Any = None          # the timer that reads this publisher again
        self.closing = False
        #: monitoring (/connz): when it connected and last read; messages and their payload
        #: bytes in and out, as nats-server counts them (``out_*`` of the fast path are added
        #: per route when the server folds its route counts: ``NatsServer.fold_counts``)
        self.start = server.clock.seconds()
        self.last_activity = self.start
        self.in_msgs = 0
        self.in_bytes = 0
        self.out_msgs = 0
        self.out_bytes = 0
        #: set by the WebSocket listener for its connections (/connz ``type``)
        self.websocket = False

    # lifecycle ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        """Send INFO, start the pinger and (with auth) the auth timeout."""
        self.connected = True
        srv = self.server
        srv.connections[self.cid] = self
        srv.stats["connections"] += 1
        peer = self.transport.getPeer()
        self.peer_host = getattr(peer, "host", "") or ""
        # bigger reads = bigger groups per store commit for mq9, fewer turns for core
        set_read_size(self.transport, READ_SIZE)
        set_no_delay(self.transport)    # a reply then a PONG must not wait for Nagle
        try:
            self.transport.registerProducer(self, True)
        except Exception:  # pragma: no cover - transports without producer support
            pass
        s = srv.settings
        tls = None if self.websocket else s.tls_context   # WebSocket has its own TLS
        if tls is None:
            self.sock = direct_socket(self.transport)
        elif s.tls_handshake_first:       # TLS before INFO: INFO is the first encrypted bytes
            self.transport.startTLS(tls)
        self.write_out(codec.encode_info(srv.info(self)))
        if tls is not None and not s.tls_handshake_first:
            self.transport.startTLS(tls)
        if s.ping_interval > 0:
            self._pinger = LoopingCall(self._ping)
            self._pinger.clock = srv.clock
            self._pinger.start(s.ping_interval, now=False)
        if not self.authed and s.auth_timeout > 0:
            self._auth_timer = srv.clock.callLater(s.auth_timeout, self._auth_expired)

    def connectionLost(self, reason: Any = None) -> None:
        """Drop every subscription and timer."""
        if not self.connected:
            return
        self.connected = False
        srv = self.server
        srv.connections.pop(self.cid, None)
        if self._pinger is not None and self._pinger.running:
            self._pinger.stop()
        if self._auth_timer is not None and self._auth_timer.active():
            self._auth_timer.cancel()
        if self._expiry is not None and self._expiry.active():
            self._expiry.cancel()
        subs, self.subs = self.subs, {}
        for sub in subs.values():
            srv.remove_sub(sub)
        self.out.clear()
        self.held.clear()
        self._cancel_deadline()
        if self._stall is not None and self._stall.active():
            self._stall.cancel()

    def close(self, text: str | None) -> None:
        """Send ``-ERR 'text'`` (unless None) with pending output, then close."""
        if self.closing or not self.connected:
            return
        self.closing = True
        self.fast = False
        if text is not None:
            self.out.append(codec.encode_err(text))
        data = b"".join(self.held + self.out)
        self.out.clear()
        self.held.clear()
        if data:
            self.transport.write(data)
        # a registered producer would keep a draining transport open (Twisted's rule)
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    def lame_duck_close(self) -> None:
        """Closed by the hub's lame-duck mode: pending output first, no -ERR (as nats-server)."""
        self.close(None)

    # producer (the slow-consumer rule) ---------------------------------------------------------

    def pauseProducing(self) -> None:
        """The transport's buffer is full: count what piles up, start the write deadline."""
        if not self.paused:
            self.paused = True
            self._arm_deadline()

    def resumeProducing(self) -> None:
        """The transport drained: send what was held."""
        self.paused = False
        self.paused_bytes = 0
        self._cancel_deadline()
        if self.held and not self.closing:
            held, self.held = self.held, []
            # what the socket refuses of it is backed up again and counts toward max_pending
            self.paused_bytes = self._send_direct(held)

    def _arm_deadline(self) -> None:
        """Backed up from now: a slow consumer unless it drains within the write deadline."""
        if self._deadline is None and self.server.settings.write_deadline > 0:
            self._deadline = self.server.clock.callLater(
                self.server.settings.write_deadline, self._deadline_passed)

    def _cancel_deadline(self) -> None:
        """Forget a pending write-deadline check."""
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def stopProducing(self) -> None:
        """The transport is going away."""
        self.paused = False

    def write_out(self, data: bytes) -> None:
        """Write delivery output, closing the connection when it is a slow consumer."""
        self.write_chunks([data], len(data))

    def write_chunks(self, chunks: list[bytes], size: int) -> None:
        """Write ``chunks`` (``size`` bytes in all) in order, closing the connection when it is
        a slow consumer: one gathering send on a socket, one joined write otherwise."""
        if self.closing:
            return
        if self.paused:
            self.paused_bytes += size
            budget = self.server.settings.max_pending
            if self.paused_bytes > budget:
                self.slow_consumer(f"MaxPending of {budget} exceeded")
                return
            if self.paused_bytes * 4 > budget * 3:
                self.server.stall_for = max(self.server.stall_for,
                                            stall_duration(self.paused_bytes, budget))
            if self.sock is not None:
                self.held += chunks
                return
        if self.sock is not None:
            self._send_direct(chunks)
        else:
            self.transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def _send_direct(self, chunks: list[bytes]) -> int:
        """Send ``chunks`` on the socket now; hand what it does not take to Twisted, paused.

        Only called while Twisted holds none of this connection's output, so order is kept.
        Whatever the socket refuses goes to ``transport.write`` and the connection counts as
        paused (``transport.producerPaused``, a public attribute of Twisted's consumer, makes
        the transport call :meth:`resumeProducing` once it has written everything); output
        arriving meanwhile is held here and sent, without joining, by resumeProducing.
        Returns the bytes handed to Twisted (0 when the socket took everything).
        """
        sent = send_chunks(self.sock, chunks)
        if sent is None:      # a socket error: Twisted's write path reports it
            data = b"".join(chunks)
        else:
            data = remainder(chunks, sent)
        if data:
            self.transport.write(data)
            self.transport.producerPaused = True
            if not self.paused:
                self.paused = True
                self._arm_deadline()
        return len(data)

    def _deadline_passed(self) -> None:
        """Backed up for a whole write deadline: a slow consumer (nats-server's WriteDeadline)."""
        self._deadline = None
        if self.connected and self.paused:
            self.slow_consumer(f"WriteDeadline of {self.server.settings.write_deadline:g}s "
                               f"exceeded with {self.paused_bytes} bytes pending")

    def slow_consumer(self, why: str) -> None:
        """Cut this subscriber at once, without -ERR, as nats-server does (logged once: the
        connection is closing and is never cut twice); its pending output is dropped."""
        self.server.stats["slow_consumers"] += 1
        log.warn("nats: Slow Consumer Detected: {why}; closing cid={cid} {peer} name={name!r}",
                 cid=self.cid, why=why, peer=self.peer_host, name=self.name)
        self.closing = True
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()
        else:
            self.transport.loseConnection()
        self.connectionLost(None)

    # timers ------------------------------------------------------------------------------

    def _ping(self) -> None:
        """Send a keepalive PING, or close a connection that stopped answering."""
        if self.pings_out >= self.server.settings.ping_max:
            self.close("Stale Connection")
            return
        self.pings_out += 1
        self.write_out(codec.PING)

    def _auth_expired(self) -> None:
        """No CONNECT within the auth timeout."""
        if not self.authed:
            self.close("Authentication Timeout")

    def _credentials_expired(self) -> None:
        """The principal's credentials (a user JWT's ``exp``) ran out while connected."""
        self._expiry = None
        self.close(AUTH_EXPIRED)

    def tls_subject(self) -> str | None:
        """The RFC 4514 subject of a verified client certificate, or None."""
        get = getattr(self.transport, "getPeerCertificate", None)
        cert = get() if get is not None else None
        if cert is None:
            return None
        return str(cert.to_cryptography().subject.rfc4514_string())

    # input -------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Parse everything of this read, route it, then write every touched connection once."""
        if self.closing:
            return
        srv = self.server
        if self.waiting is not None:
            self.parser.receive_data(data)
            return
        bridge = srv.bridge
        if bridge is not None and bridge.epoch != srv.core_epoch:
            srv.core_epoch = bridge.epoch
            srv.changed()
        parser = self.parser
        parser.receive_data(data)
        before = srv.stats["in_msgs"]
        self.last_activity = srv.clock.seconds()
        srv.stall_for = 0.0
        try:
            if self.fast:
                self._fast_loop(self.router)
            else:
                self._general(parser.events(), 0)
        finally:
            srv.end_turn()
            self.in_msgs += srv.stats["in_msgs"] - before
            if srv.journal is not None and srv.stats["in_msgs"] != before:
                srv.journal.traffic("*", "nats-core", srv.stats["in_msgs"] - before, len(data))
        if srv.stall_for and self._stall is None and self.connected and not self.closing:
            # this read left a subscriber near its budget: let it catch up (fast-producer stall)
            self.transport.pauseProducing()
            self._stall = srv.clock.callLater(srv.stall_for, self._unstall)

    def _unstall(self) -> None:
        """The fast-producer stall is over: read this publisher again."""
        self._stall = None
        if self.connected and not self.closing:
            self.transport.resumeProducing()

    def _fast_loop(self, router: PubRouter) -> None:
        """Alternate the router's PUB fast path with one-event steps for everything else."""
        srv = self.server
        tables = self.pub_tables
        if tables is None:
            routes, head_routes = srv.routes, srv.head_routes
        else:   # only subjects this publisher may publish to are in its own tables
            routes, head_routes = tables.tables(srv.epoch)
        dirty = srv.dirty
        stats = srv.stats
        while self.fast:
            stats["in_msgs"] += router.route_pubs(routes, dirty, head_routes)
            stats["out_msgs"] += router.last_sent
            nbytes = router.last_bytes
            self.in_bytes += nbytes
            stats["in_bytes"] += nbytes
            events = router.slow_run(routes, head_routes)
            if not events:
                return
            for i, ev in enumerate(events):
                if not self.fast:
                    self._general(events, i)
                    break
                if ev[0] == OP_PUB:
                    self._fast_pub(ev[1], ev[2])
                else:
                    self._general([ev], 0)
        if not self.closing:
            self._general(router.parser.events(), 0)

    def _fast_pub(self, hit: tuple, payload: bytes) -> None:
        """Route one PUB by its cached route (fast-loop misses: queue groups, mq9, foreign...;
        and the general path when echo is on): plain targets, the special part, no-responders."""
        srv = self.server
        tables = self.pub_tables
        if tables is not None and not self._may_publish(hit[1]):
            return
        route = srv.routes.get(hit[0])
        if route is None:
            route = srv.resolve(hit)
        if tables is not None and route[1] is None:
            tables.keep(hit, route, srv.head_routes)
        dirty = srv.dirty
        for conn, out, prefix in route[0]:
            if not out:
                dirty.append(conn)
            out.append(prefix)
            out.append(payload)
            out.append(CRLF)
        route[3][0] += 1
        special = route[1]
        if special is not None:
            got = srv.deliver_special(self, hit[1], hit[2], None, payload, special)
            if not got and not route[0] and hit[2] and self.no_resp:
                srv.no_responders(self, hit[1], hit[2])
        stats = srv.stats
        stats["in_msgs"] += 1
        stats["out_msgs"] += len(route[0])
        self.in_bytes += len(payload)
        stats["in_bytes"] += len(payload)

    def _general(self, events: list[tuple], start: int) -> None:
        """Process events one by one with every per-connection rule applied."""
        for i in range(start, len(events)):
            if self.closing:
                return
            ev = events[i]
            op = ev[0]
            if op == OP_ERROR:
                err: ProtocolError = ev[1]
                if err.fatal:
                    self.close(WIRE_ERRORS.get(err.code, "Unknown Protocol Operation"))
                    return
                self.out_ctl(codec.encode_err(WIRE_ERRORS.get(err.code) or err.message))
                continue
            if not self.authed and op != OP_CONNECT and op != OP_PING:
                self.close("Authorization Violation")
                return
            if op == OP_PUB:
                hit = ev[1]
                if not self._publish(hit[1], hit[2], None, ev[2], hit):
                    continue
            elif op == OP_HPUB:
                if not self.headers:
                    self.close("Unknown Protocol Operation")
                    return
                hit = ev[1]
                if not self._publish(hit[1], hit[2], ev[2], ev[3], None):
                    continue
            elif op == OP_SUB:
                if not self._sub(ev[1], ev[2], ev[3]):
                    continue
            elif op == OP_UNSUB:
                self._unsub(ev[1], ev[2])
            elif op == OP_PING:
                mq9 = self.server.mq9
                if mq9 is None or not mq9.barrier(self):
                    self.out_ctl(codec.PONG)
                continue
            elif op == OP_PONG:
                self.pings_out = 0
                continue
            elif op == OP_CONNECT:
                if not self._connect(ev[1]):
                    if self.waiting is None and not self.closing:
                        # its turn comes later: keep this CONNECT and what follows it (the
                        # client did send CONNECT in time: no auth timeout while it waits)
                        self.waiting = events[i:]
                        if self._auth_timer is not None and self._auth_timer.active():
                            self._auth_timer.cancel()
                        self.transport.pauseProducing()
                        self.server.clock.callLater(self._connect_wait, self._connect_turn)
                    return
            elif op == OP_OK or op == OP_ERR:
                continue
            if self.verbose and not self.closing:
                self.out_ctl(codec.OK)

    def out_ctl(self, data: bytes) -> None:
        """Queue a control line for this connection (written at the end of the read)."""
        out = self.out
        if not out:
            self.server.dirty.append(self)
        out.append(data)

    def _update_fast(self) -> None:
        """Choose the fast loop when no per-connection rule applies to publishes."""
        self.fast = (self.authed and self.got_connect and not self.verbose and not self.pedantic
                     and self.echo and not self.closing)

    def _connect_turn(self) -> None:
        """A held CONNECT's turn has come: handle it and what followed, then read again."""
        waiting, self.waiting = self.waiting, None
        if waiting is None or self.closing or not self.connected:
            return
        self._turn = True
        try:
            self._general(waiting, 0)
        finally:
            self._turn = False
            self.server.end_turn()
        if self.waiting is None and not self.closing:
            self.transport.resumeProducing()
            self.dataReceived(b"")

    def _rights_changed(self, session: Session) -> None:
        """The users file was reloaded: drop the subscriptions this client may no longer hold
        (``-ERR 'Permissions Violation for Subscription to ...'`` each, as nats-server does on
        a reload) and start its publish tables over."""
        self._use_rights(session)
        for sid, sub in list(self.subs.items()):
            if session.may_subscribe(sub.subject, sub.queue):
                continue
            session.refuse("subscribe", sub.subject)
            del self.subs[sid]
            self.server.remove_sub(sub)
            self.out_ctl(codec.encode_err(subscribe_violation(sub.wire_subject, sub.queue)))
        self.server.flush()

    def _use_rights(self, session: Session | None) -> None:
        """Act as ``session``: a restricted publisher gets its own publish tables; a reload of
        the users file re-checks its subscriptions."""
        self.session = session
        if session is None or session.publish_all:
            self.pub_tables = None
        else:
            self.pub_tables = PublishTables(session, self.server.stats)
        if session is not None:
            session.on_revoke = self._rights_changed

    def _may_publish(self, subject: str) -> bool:
        """The publish check: ``-ERR 'Permissions Violation for Publish to "x"'`` when refused."""
        session = self.session
        if session is None or session.publish_all or session.check_publish(subject):
            return True
        self.out_ctl(codec.encode_err(publish_violation(subject)))
        return False

    def _connect(self, opts: dict[str, Any]) -> bool:
        """Apply CONNECT options and check credentials; return False when closed, or when
        the check waits for its turn (``_connect_wait`` seconds, failed-login slowdown)."""
        proto = opts.get("protocol", 0)
        if not isinstance(proto, int) or proto < 0 or proto > 1:
            self.close("invalid client protocol")
            return False
        self.verbose = bool(opts.get("verbose", True))
        self.pedantic = bool(opts.get("pedantic", True))
        self.echo = bool(opts.get("echo", True))
        self.headers = bool(opts.get("headers", False))
        self.no_resp = bool(opts.get("no_responders", False))
        if self.no_resp and not self.headers:
            self.close("no responders requires headers support")
            return False
        self.name = str(opts.get("name", ""))
        self.lang = str(opts.get("lang", ""))
        self.version = str(opts.get("version", ""))
        if not self.authed:
            if not self._turn:
                self._connect_wait = self.server.guard.wait(self.peer_host)
                if self._connect_wait > 0:
                    return False
            if not self._authenticate(opts):
                return False
        self.got_connect = True
        self._update_fast()
        return True

    def _authenticate(self, opts: dict[str, Any]) -> bool:
        """Turn CONNECT's credentials into this connection's principal and rights (the users
        file, or the plugin's own checks: :class:`~mqhub.protocols.nats.rights.NatsGuard`);
        False when closed."""
        srv = self.server
        admitted = srv.guard.connect(opts, self.peer_host, self.nonce, self.tls_subject(),
                                     srv.clock.seconds())
        if admitted is None:
            self.close(AUTH_VIOLATION)
            return False
        principal = self.principal = admitted.principal
        self._use_rights(admitted.session)
        self.authed = True
        if self._auth_timer is not None and self._auth_timer.active():
            self._auth_timer.cancel()
        if principal.expires is not None:
            self._expiry = srv.clock.callLater(
                max(0.0, principal.expires - srv.clock.seconds()), self._credentials_expired)
        return True

    def _publish(self, subject: str, reply: str | None, hdr: bytes | None, payload: bytes,
                 hit: tuple | None) -> bool:
        """Route one PUB/HPUB with per-connection rules; False when refused with an -ERR."""
        srv = self.server
        if self.pedantic and not codec.valid_publish_subject(subject):
            self.out_ctl(codec.encode_err("Invalid Publish Subject"))
            return False
        if self.session is not None and not self._may_publish(subject):
            return False
        if hit is not None and self.echo:
            self._fast_pub(hit, payload)
            return True
        size = len(payload) if hdr is None else len(hdr) + len(payload)
        self.in_bytes += size
        srv.stats["in_bytes"] += size
        srv.stats["in_msgs"] += 1
        if srv.mq9 is not None and subject.startswith(MQ9_PREFIX) and (
                srv.mq9.claims(subject) or (hdr is not None and srv.mq9.persist_requested(hdr))):
            got = srv.mq9.publish(self, subject, reply, hdr, payload)
        else:
            got = srv.publish(self, subject, reply, hdr, payload)
        if not got and reply and self.no_resp:
            srv.no_responders(self, subject, reply)
        return True

    def _sub(self, subject: str, queue: str | None, sid: str) -> bool:
        """Register a subscription (replacing nothing: a reused sid is ignored like nats-server).

        False when the user's rights do not cover ``subject`` (answered with -ERR).
        """
        if sid in self.subs:
            return True
        pattern = sub_pattern(subject)
        session = self.session
        if session is not None and not session.subscribe_all and \
                not session.check_subscribe(pattern, queue):
            self.out_ctl(codec.encode_err(subscribe_violation(subject, queue)))
            return False
        sub = Subscription(self, pattern, queue, sid, subject)
        self.subs[sid] = sub
        self.server.add_sub(sub)
        return True

    def _unsub(self, sid: str, max_msgs: int | None) -> None:
        """Remove a subscription now, or after ``max_msgs`` total deliveries."""
        sub = self.subs.get(sid)
        if sub is None:
            return
        if max_msgs is not None and sub.delivered < max_msgs:
            sub.max = max_msgs
            self.server.changed()
            return
        del self.subs[sid]
        self.server.remove_sub(sub)
