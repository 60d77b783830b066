"""The NATS server: a thin Twisted adapter over the sans-IO codec and the subscription trie.

Hot path (see ../shared/reference/performance.md): the codec yields every event of one read;
a PUB looks up its *route* by the raw control line (cached until any subscription changes,
the "epoch"); a route holds, per receiving subscription, the prebuilt ``MSG subj sid n``
line and the receiver's output list, so delivering is two list appends (prefix, then
payload and CRLF as one slice); a run of identical frames is one block per receiver (see
``PubRouter.route_pubs`` (router.py)). Every connection touched during a read gets one write at the end
of that read, straight to its socket while Twisted holds none of its output (see
:mod:`mqhub.protocols.nats.connection`, which holds the per-connection protocol).

Subscriptions live in the NATS trie and, when the hub has a core broker, are also bound in
the core's address space through :mod:`mqhub.protocols.nats.bridge`, so other protocols reach
NATS subscribers and NATS publishes reach other protocols' bindings.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

from twisted.internet.protocol import Factory

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.auth import Authenticator, shared_secret_checks
from mqhub.protocols.nats.connection import NatsConnection, Subscription
from mqhub.protocols.nats.rights import NatsGuard
from mqhub.protocols.nats.router import fold_counts
from mqhub.protocols.nats.settings import (  # noqa: F401  (SERVER_VERSION re-exported)
    BROADCAST_PREFIX,
    CRLF,
    MQ9_PREFIX,
    NO_RESPONDERS_BLOCK,
    SERVER_VERSION,
    NatsSettings,
)
from mqhub.protocols.nats.sublist import Sublist, subject_matches

#: the "special" part of a route whose request reaches nobody (no-responders check)
NO_ONE: tuple = ((), (), False, False)
ROUTE_CACHE_LIMIT = 65536
#: a connection's output of this many pieces or fewer goes out with one gathering send; more
#: (many small MSG pieces) are joined first: the kernel's gather of hundreds of small
#: buffers costs more than the join (benchmarks/results/nats.md)
GATHER_MAX = 16


class NatsServer(Factory):
    """Server-wide state: the trie, the route cache, the connections, and the mq9 hook.

    :param hub: the :class:`mqhub.hub.Hub` (its clock is used for every timer).
    :param settings: :class:`NatsSettings`.
    """

    protocol = None  # buildProtocol is overridden

    def __init__(self, hub: Any, settings: NatsSettings | None = None,
                 auth: Authenticator | None = None) -> None:
        """Build empty state; nothing listens until a port uses this factory.

        :param auth: the credential checks (default: the settings' token or user/password).
        """
        self.hub = hub
        self.clock = hub.clock
        self.settings = settings or NatsSettings()
        self.auth = auth or Authenticator(
            shared_secret_checks(self.settings.token, self.settings.user, self.settings.password))
        #: CONNECT's credentials onto the hub's users, then the plugin's own checks
        self.guard = NatsGuard(getattr(hub, "identity", None), self.auth,
                               self.settings.no_auth_user)
        #: lame-duck mode: new INFOs say ``ldm`` (:mod:`mqhub.lameduck`)
        self.lame_duck = False
        #: when the server was built (POSIX seconds; /varz ``start``)
        self.started = self.clock.seconds()
        self.sublist = Sublist()
        self.routes: dict[bytes, tuple] = {}
        self.sroutes: dict[tuple[str, str | None], tuple] = {}
        self.head_routes: dict[bytes, tuple] = {}
        #: per receiving connection: head -> MSG head of every cached head whose only target
        #: is that connection (the frame scanner's one lookup per frame, see scan.py)
        self.one_heads: dict[NatsConnection, dict[bytes, bytes]] = {}
        self.epoch = 0
        self.dirty: list[NatsConnection] = []
        self.connections: dict[int, NatsConnection] = {}
        self.server_id = "N" + secrets.token_hex(14).upper()
        self._next_cid = 0
        self.mq9: Any = None
        self.bridge: Any = None
        self.core_epoch = -1
        #: seconds to stop reading the publisher of this read (a subscriber it fed is near its
        #: budget: the fast-producer stall, see connection.py); 0 for none
        self.stall_for = 0.0
        #: bridge_refused: NATS messages a foreign binding matched that the core did not keep
        #: in_bytes/out_bytes: message payload bytes in and out, as nats-server counts them
        #: (out_bytes is exact after :meth:`fold_counts`); sub_inserts/sub_removes: trie
        #: changes (/subsz)
        self.stats = {"in_msgs": 0, "out_msgs": 0, "slow_consumers": 0, "connections": 0,
                      "bridge_refused": 0, "in_bytes": 0, "out_bytes": 0, "sub_inserts": 0,
                      "sub_removes": 0}
        #: the flow journal's recorder: NATS core PUBs are counted per read (docs/analytics.md)
        self.journal = getattr(hub.broker, "journal", None)

    # factory -----------------------------------------------------------------------------

    def buildProtocol(self, addr: Any) -> NatsConnection:
        """Make a connection protocol for ``addr``."""
        self._next_cid += 1
        conn = NatsConnection(self, self._next_cid)
        return conn

    def info(self, conn: NatsConnection) -> dict[str, Any]:
        """The INFO object for ``conn``."""
        s = self.settings
        info: dict[str, Any] = {
            "server_id": self.server_id, "server_name": s.server_name,
            "version": SERVER_VERSION, "proto": 1, "go": "mqhub", "host": s.host,
            "port": s.port, "headers": True, "max_payload": s.max_payload,
            "client_id": conn.cid, "client_ip": conn.peer_host,
        }
        if self.guard.required:
            info["auth_required"] = True
        if conn.nonce is not None:
            info["nonce"] = conn.nonce
        if s.tls_context is not None and not conn.websocket:
            info["tls_required"] = True
            if s.tls_verify:
                info["tls_verify"] = True
        if self.lame_duck:
            info["ldm"] = True
        peers = self.hub.broker.peers("nats") if self.hub.broker is not None else []
        if peers:   # the hub's other nodes (cluster mode): clients fail over to them
            info["connect_urls"] = [f"{p.host}:{p.ports['tcp']}" for p in peers
                                    if "tcp" in p.ports]
        return info

    def enter_lame_duck(self) -> None:
        """Lame-duck mode: INFO says ``ldm`` from now on; every client gets one INFO now (nats.py
        and nats.go then call their lame-duck callback and look for another server)."""
        self.lame_duck = True
        for conn in list(self.connections.values()):
            if conn.connected and not conn.closing:
                conn.out_ctl(codec.encode_info(self.info(conn)))
        self.flush()

    # subscriptions ------------------------------------------------------------------------

    def changed(self) -> None:
        """Bump the epoch: every cached route is stale."""
        self.epoch += 1
        self.fold_counts()
        self.routes.clear()
        self.sroutes.clear()
        self.head_routes.clear()
        self.one_heads.clear()

    def add_sub(self, sub: Subscription) -> None:
        """Register ``sub`` in the trie (or with mq9) and in the core address space."""
        if self.mq9 is not None and self.mq9.claims_subscription(sub):
            sub.mq9 = True
            self.mq9.subscribe(sub)
            return
        self.sublist.insert(sub)
        self.stats["sub_inserts"] += 1
        self.changed()
        if self.bridge is not None:
            self.bridge.bind(sub)
        if self.mq9 is not None and sub.subject.startswith(BROADCAST_PREFIX):
            self.mq9.broadcast_subscribed(sub)

    def remove_sub(self, sub: Subscription) -> None:
        """Forget ``sub`` everywhere."""
        if sub.mq9:
            self.mq9.unsubscribe(sub)
            return
        if self.sublist.remove(sub):
            self.stats["sub_removes"] += 1
            self.changed()
        if self.bridge is not None:
            self.bridge.unbind(sub)

    # routing -----------------------------------------------------------------------------

    def resolve(self, hit: tuple) -> tuple:
        """Build (and cache) the route of a PUB control line ``hit = (line, subj, reply, size)``.

        A route is ``(targets, special, size, hits)``: ``targets`` is a list of ``(conn, out,
        prefix)`` for plain subscriptions without a message limit; ``special`` is None or a
        tuple ``(limited_subs, groups, mq9, foreign)`` handled on the slower path; ``hits``
        counts the messages delivered to ``targets`` until :meth:`fold_counts`. Routing itself is
        cached per (subject, reply), so a new size on a known subject only formats prefixes.
        """
        line, subject, reply, size = hit
        base = self.sroutes.get((subject, reply))
        if base is None:
            base = self._resolve_subject(subject, reply)
        heads, special = base
        sp = line.rfind(b" ")
        if line[:4] == b"PUB " and line.endswith(b"\r") and sp > 0 \
                and line[sp + 1:-1] == b"%d" % size and special is None and (heads or not reply):
            # the head of a canonical line routes later sizes on this subject in the codec
            hroutes = self.head_routes
            if len(hroutes) >= ROUTE_CACHE_LIMIT:
                fold_counts(hroutes.values(), self.stats)
                hroutes.clear()
                self.one_heads.clear()
            key = line[:sp]
            if len(heads) == 1:
                one = heads[0]
                table = self.one_heads.setdefault(one[0], {})
                table[key] = one[2]
                hroutes[key] = (heads, None, one, table, [0, 0])
            else:
                hroutes[key] = (heads, None, None, None, [0, 0])
        tail = b"%d\r\n" % size
        if special is None and not heads and reply:
            special = NO_ONE      # a request nobody receives: the slow path sends the 503
        route = ([(conn, out, head + tail) for conn, out, head in heads], special, size, [0])
        routes = self.routes
        if len(routes) >= ROUTE_CACHE_LIMIT:
            fold_counts(routes.values(), self.stats)
            routes.clear()
        routes[line] = route
        return route

    def fold_counts(self) -> None:
        """Add what the cached routes delivered since the last fold to each receiving
        connection's ``out_msgs``/``out_bytes`` and to the server's ``out_bytes`` (the fast
        path counts per route, not per message; see ``PubRouter``)."""
        stats = self.stats
        fold_counts(self.routes.values(), stats)
        fold_counts(self.head_routes.values(), stats)
        for conn in self.connections.values():
            if conn.pub_tables is not None:     # a restricted publisher's own copies
                conn.pub_tables.fold(stats)

    def _resolve_subject(self, subject: str, reply: str | None) -> tuple:
        """Route a (subject, reply): MSG line heads of plain subs, and the special part."""
        if self.mq9 is not None and subject.startswith(MQ9_PREFIX) and self.mq9.claims(subject):
            base: tuple = ((), (None, None, True, False))
        else:
            plain, groups = self.sublist.match(subject)
            heads = []
            limited = []
            mid = f" {reply} " if reply else " "
            for sub in plain:
                if sub.max is not None:
                    limited.append(sub)
                else:
                    conn = sub.conn
                    head = f"MSG {subject} {sub.sid}{mid}".encode("utf-8", "surrogateescape")
                    heads.append((conn, conn.out, head))
            foreign = self.bridge is not None and self.bridge.has_foreign(subject)
            special = None
            if limited or groups or foreign:
                special = (limited, list(groups.values()), False, foreign)
            base = (heads, special)
        sroutes = self.sroutes
        if len(sroutes) >= ROUTE_CACHE_LIMIT:
            sroutes.clear()
        sroutes[(subject, reply)] = base
        return base

    def deliver_special(self, pub: NatsConnection | None, subject: str, reply: str | None,
                        hdr: bytes | None, payload: bytes, special: tuple) -> int:
        """Deliver one message to limited subs, queue groups, mq9 and foreign bindings."""
        limited, groups, is_mq9, foreign = special
        if is_mq9:
            return self.mq9.publish(pub, subject, reply, hdr, payload)
        n = 0
        echo_off = pub is not None and not pub.echo
        if limited:
            for sub in list(limited):
                if echo_off and sub.conn is pub:
                    continue
                self.deliver(sub, subject, reply, hdr, payload)
                n += 1
        for members in groups:
            n += self._deliver_to_group(members, pub if echo_off else None, subject, reply, hdr,
                                        payload)
        if foreign:
            n += self.bridge.publish(subject, reply, hdr, payload)
        return n

    def deliver(self, sub: Subscription, subject: str, reply: str | None,
                hdr: bytes | None, payload: bytes) -> None:
        """Render one message for ``sub`` into its connection's output (cold path)."""
        conn = sub.conn
        if not conn.connected or (sub.max is not None and sub.delivered >= sub.max):
            return
        out = conn.out
        if not out:
            self.dirty.append(conn)
        if hdr is not None and conn.headers:
            out.append(codec.hmsg_prefix(subject, sub.sid, reply, len(hdr), len(hdr) + len(payload)))
            out.append(hdr)
            size = len(hdr) + len(payload)
        else:
            out.append(codec.msg_prefix(subject, sub.sid, reply, len(payload)))
            size = len(payload)
        out.append(payload)
        out.append(CRLF)
        conn.out_msgs += 1
        conn.out_bytes += size
        stats = self.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += size
        if sub.max is not None:
            sub.delivered += 1
            if sub.delivered >= sub.max:
                conn.subs.pop(sub.sid, None)
                self.remove_sub(sub)

    def _deliver_to_group(self, members: list[Subscription], skip: NatsConnection | None,
                          subject: str, reply: str | None, hdr: bytes | None,
                          payload: bytes) -> int:
        """Deliver to one random connected member of a queue group (not on ``skip``); 1 or 0."""
        live = [m for m in members if m.conn.connected and m.conn is not skip]
        if not live:
            return 0
        self.deliver(random.choice(live), subject, reply, hdr, payload)
        return 1

    def publish(self, pub: NatsConnection | None, subject: str, reply: str | None,
                hdr: bytes | None, payload: bytes, *, foreign: bool = True) -> int:
        """Deliver one message to every NATS subscriber of ``subject`` (cold path).

        Used for HPUB, for mq9 replies and pushes, and for messages other protocols publish.
        Returns how many subscriptions (and foreign bindings) received it.
        """
        plain, groups = self.sublist.match(subject)
        echo_off = pub is not None and not pub.echo
        n = 0
        for sub in plain:
            if echo_off and sub.conn is pub:
                continue
            self.deliver(sub, subject, reply, hdr, payload)
            n += 1
        for members in groups.values():
            n += self._deliver_to_group(members, pub if echo_off else None, subject, reply, hdr,
                                        payload)
        if foreign and self.bridge is not None and self.bridge.has_foreign(subject):
            n += self.bridge.publish(subject, reply, hdr, payload)
        return n

    def no_responders(self, pub: NatsConnection, subject: str, reply: str) -> None:
        """Send the publisher a 503 HMSG on its subscription matching ``reply``."""
        for sub in pub.subs.values():
            if not sub.mq9 and subject_matches(sub.subject, reply):
                out = pub.out
                if not out:
                    self.dirty.append(pub)
                n = len(NO_RESPONDERS_BLOCK)
                out.append(codec.hmsg_prefix(reply, sub.sid, None, n, n))
                out.append(NO_RESPONDERS_BLOCK)
                out.append(CRLF)
                return

    def flush(self) -> None:
        """Write every touched connection's output with one write each.

        The dirty list is emptied in place: hot loops hold a reference to it.
        """
        dirty = self.dirty
        while dirty:
            conns = dirty[:]
            dirty.clear()
            for conn in conns:
                out = conn.out
                if not out:
                    continue
                if 1 < len(out) <= GATHER_MAX:
                    # a few blocks (the scanner's stretches, a frame completed across reads):
                    # one gathering send, not a copy of a whole read's output
                    chunks = out[:]
                    out.clear()
                    conn.write_chunks(chunks, sum(map(len, chunks)))
                    continue
                data = b"".join(out)
                out.clear()
                conn.write_out(data)

    def end_turn(self) -> None:
        """Finish one read: let mq9 commit its group, then write all output."""
        if self.mq9 is not None:
            self.mq9.end_turn()
        if self.bridge is not None:
            self.bridge.flush()
        self.flush()


__all__ = ["NatsServer", "NatsConnection", "NatsSettings", "Subscription", "SERVER_VERSION"]
