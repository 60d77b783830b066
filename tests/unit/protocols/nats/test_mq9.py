"""mq9 mailbox semantics over StringTransport with a MemoryStore and a Clock."""

from __future__ import annotations

import json

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import OP_HMSG, OP_MSG
from mqhub.protocols.nats.mq9 import mailbox_queue, mailbox_queues
from mqhub.protocols.nats.mq9_common import sub_pattern
from mqhub.protocols.nats.server import NatsServer
from mqhub.testing import result_of
from tests.unit.protocols.nats.helpers import Client, make_hub, make_mq9_server, request


def create(c: Client, **req: object) -> dict:
    """CREATE a mailbox and return the reply."""
    return request(c, "$mq9.AI.MAILBOX.CREATE", json.dumps(req).encode())


def bodies(events: list[tuple]) -> list[bytes]:
    """Payloads of MSG/HMSG events."""
    return [e[4] if e[0] == OP_MSG else e[5] for e in events if e[0] in (OP_MSG, OP_HMSG)]


def stored(srv: NatsServer, mail_id: str) -> int:
    """How many entries the store holds for a mailbox (after the next turn's commit)."""
    srv.hub.clock.advance(0)
    return sum(result_of(srv.hub.store.count_entries(name)) for name in mailbox_queues(mail_id))


def send(c: Client, mail_id: str, prio: str, body: bytes) -> None:
    """Publish one INBOX message."""
    c.send(codec.encode_pub(f"$mq9.AI.INBOX.{mail_id}.{prio}", body))


def test_create_both_types_and_defaults() -> None:
    """CREATE makes standard and latest mailboxes; bad requests get JSON errors."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c)
    assert box["type"] == "standard" and box["ttl"] == 86400
    assert len(box["mail_id"]) >= 20 and box["mail_id"] == box["mail_id"].lower()
    assert box["inbox"] == "$mq9.AI.INBOX." + box["mail_id"] and box["token"]
    latest = create(c, type="latest", ttl=60)
    assert latest["type"] == "latest" and latest["ttl"] == 60
    assert latest["mail_id"] != box["mail_id"]
    assert create(c, type="weird") == {"error": "type must be 'standard' or 'latest'"}
    assert "error" in create(c, ttl=-5)
    assert "error" in request(c, "$mq9.AI.MAILBOX.CREATE", b"{not json")
    assert "error" in request(c, "$mq9.AI.MAILBOX.NOPE", b"{}")
    assert not c.closed            # mq9 errors never -ERR


def test_offline_backlog_delivered_in_priority_order_then_live() -> None:
    """An offline backlog arrives urgent, normal, notify on SUB, then live messages."""
    srv = make_mq9_server()
    sender = Client(srv)
    box = create(sender)
    mid = box["mail_id"]
    send(sender, mid, "notify", b"n1")
    send(sender, mid, "normal", b"a1")
    send(sender, mid, "urgent", b"u1")
    send(sender, mid, "normal", b"a2")
    send(sender, mid, "urgent", b"u2")
    assert stored(srv, mid) == 4                 # notify is memory-tier
    agent = Client(srv)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    evs = agent.events()
    assert bodies(evs) == [b"u1", b"u2", b"a1", b"a2", b"n1"]
    assert evs[0][1] == f"$mq9.AI.INBOX.{mid}.urgent" and evs[0][2] == "1"
    assert stored(srv, mid) == 0                 # delivered = read
    send(sender, mid, "normal", b"live")
    assert bodies(agent.events()) == [b"live"]
    assert stored(srv, mid) == 0
    again = Client(srv)                          # nothing is replayed twice
    again.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    assert again.events() == []


def test_single_priority_subscription() -> None:
    """A SUB on one priority gets only that priority."""
    srv = make_mq9_server()
    c = Client(srv)
    mid = create(c)["mail_id"]
    send(c, mid, "normal", b"a")
    send(c, mid, "urgent", b"u")
    c.send(f"SUB $mq9.AI.INBOX.{mid}.urgent 5\r\n".encode())
    assert bodies(c.events()) == [b"u"]
    send(c, mid, "normal", b"b")
    assert c.events() == []
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": create.__name__}).encode())
    assert q == {"error": "invalid token"}


def test_query_with_right_and_wrong_token() -> None:
    """QUERY returns unread messages with the right token and an error otherwise."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    send(c, mid, "normal", b'{"type":"task"}')
    c.send(codec.encode_hpub(f"$mq9.AI.INBOX.{mid}.urgent", codec.build_headers({"k": "v"}),
                             b"\xff\x00"))
    assert request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", b'{"token":"nope"}') == {
        "error": "invalid token"}
    assert request(c, "$mq9.AI.MAILBOX.QUERY.mnosuch", b'{"token":"x"}') == {
        "error": "mailbox mnosuch does not exist"}
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert q["mail_id"] == mid and q["unread"] == 2
    first, second = q["messages"]
    assert first["priority"] == "urgent" and first["encoding"] == "base64"
    assert first["payload"] == "/wA=" and first["headers"] == {"k": "v"}
    now_ms = round(srv.hub.clock.seconds() * 1000)
    assert first["ts"] == second["ts"] == now_ms     # the id's time, in ms since the epoch
    assert second == {**second, "priority": "normal", "payload": '{"type":"task"}',
                      "encoding": "utf-8", "subject": f"$mq9.AI.INBOX.{mid}.normal"}
    assert stored(srv, mid) == 0
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert q == {"mail_id": mid, "unread": 0, "messages": []}


def test_latest_keeps_only_newest() -> None:
    """A latest mailbox keeps only its newest message, in memory and in the store."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c, type="latest")
    mid = box["mail_id"]
    for i in range(5):
        send(c, mid, "normal", b"status %d" % i)
    send(c, mid, "notify", b"status 5")
    assert stored(srv, mid) == 1
    c.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    assert bodies(c.events()) == [b"status 5"]


def test_message_ttl_and_mailbox_ttl_expiry() -> None:
    """Message TTL removes a message; mailbox TTL removes the mailbox and its messages."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c, ttl=100)
    mid = box["mail_id"]
    c.send(codec.encode_hpub(f"$mq9.AI.INBOX.{mid}.normal", codec.build_headers({"mq9-ttl": "5"}),
                             b"short"))
    send(c, mid, "urgent", b"long")
    srv.hub.clock.advance(6)
    assert stored(srv, mid) == 1
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert [m["payload"] for m in q["messages"]] == ["long"]
    send(c, mid, "urgent", b"doomed")
    srv.hub.clock.advance(100)
    assert mid not in srv.mq9.mailboxes and stored(srv, mid) == 0
    assert result_of(srv.hub.store.get_meta("mq9/mb/" + mid)) is None
    err = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert err == {"error": f"mailbox {mid} does not exist"}
    c.send(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.urgent", b"x", "_INBOX.t.2"))
    replies = [e for e in c.events() if e[0] == OP_MSG]
    assert json.loads(replies[0][4]) == {"error": f"mailbox {mid} does not exist"}


def test_unknown_mailbox_without_reply_is_dropped_quietly() -> None:
    """INBOX publishes to unknown mailboxes without a reply are dropped, no -ERR."""
    srv = make_mq9_server()
    c = Client(srv)
    c.send(b"PUB $mq9.AI.INBOX.mnope.urgent 1\r\nx\r\nPUB $mq9.AI.INBOX.bad 1\r\nx\r\nPING\r\n")
    assert c.events() == [(codec.OP_PONG,)]
    assert not c.closed


def test_queue_group_on_mailbox_and_reply_subject_kept() -> None:
    """Mailbox queue groups split messages; the publish reply subject is kept."""
    srv = make_mq9_server()
    c = Client(srv)
    mid = create(c)["mail_id"]
    w1, w2 = Client(srv), Client(srv)
    w1.send(f"SUB $mq9.AI.INBOX.{mid}.* workers 1\r\n".encode())
    w2.send(f"SUB $mq9.AI.INBOX.{mid}.normal workers 1\r\n".encode())
    for i in range(10):
        c.send(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.normal", b"%d" % i, "answer.here"))
    e1, e2 = w1.events(), w2.events()
    assert len(e1) + len(e2) == 10 and e1 and e2
    assert all(e[3] == "answer.here" for e in e1 + e2)


def test_broadcast_wildcards_hash_and_queue_groups() -> None:
    """Broadcast subscriptions with *, # and queue groups; nothing persisted by default."""
    srv = make_mq9_server()
    pub = Client(srv)
    dom, evt, allb, hashb = Client(srv), Client(srv), Client(srv), Client(srv)
    dom.send(b"SUB $mq9.AI.BROADCAST.system.* 1\r\n")
    evt.send(b"SUB $mq9.AI.BROADCAST.*.anomaly 1\r\n")
    allb.send(b"SUB $mq9.AI.BROADCAST.> 1\r\n")
    hashb.send(b"SUB $mq9.AI.BROADCAST.# 1\r\n")
    w = [Client(srv) for _ in range(3)]
    for c in w:
        c.send(b"SUB $mq9.AI.BROADCAST.task.available task.workers 1\r\n")
    pub.send(codec.encode_pub("$mq9.AI.BROADCAST.system.anomaly", b"a"))
    pub.send(codec.encode_pub("$mq9.AI.BROADCAST.task.available", b"t"))
    assert bodies(dom.events()) == [b"a"]
    assert bodies(evt.events()) == [b"a"]
    assert bodies(allb.events()) == [b"a", b"t"]
    hev = hashb.events()
    assert bodies(hev) == [b"a", b"t"] and hev[0][1] == "$mq9.AI.BROADCAST.system.anomaly"
    assert sum(len(c.events()) for c in w) == 1
    late = Client(srv)
    late.send(b"SUB $mq9.AI.BROADCAST.> 1\r\n")
    assert late.events() == []                 # not persisted: nothing replayed


def test_persisted_broadcast_replayed_once_per_group_and_subject() -> None:
    """mq9-persist broadcasts replay once per queue group or SUB subject until their TTL."""
    srv = make_mq9_server()
    pub = Client(srv)
    online = Client(srv)
    online.send(b"SUB $mq9.AI.BROADCAST.task.* 1\r\n")
    hdr = codec.build_headers({"mq9-persist": "true"})
    pub.send(codec.encode_hpub("$mq9.AI.BROADCAST.task.available", hdr, b"job"))
    assert bodies(online.events()) == [b"job"]
    w1 = Client(srv)
    w1.send(b"SUB $mq9.AI.BROADCAST.task.available workers 1\r\n")
    assert bodies(w1.events()) == [b"job"]
    w2 = Client(srv)
    w2.send(b"SUB $mq9.AI.BROADCAST.task.available workers 1\r\n")
    assert w2.events() == []                   # the group already had it
    same = Client(srv)
    same.send(b"SUB $mq9.AI.BROADCAST.task.* 1\r\n")
    assert same.events() == []                 # this subject already had it
    other = Client(srv, {"headers": False, "no_responders": False})
    other.send(b"SUB $mq9.AI.BROADCAST.# 1\r\n")
    assert other.events() == [(OP_MSG, "$mq9.AI.BROADCAST.task.available", "1", None, b"job")]
    srv.hub.clock.advance(3601)                # default persisted-broadcast TTL
    fresh = Client(srv)
    fresh.send(b"SUB $mq9.AI.BROADCAST.task.> 1\r\n")
    assert fresh.events() == []


def test_mailboxes_and_backlog_survive_restart_on_the_same_store() -> None:
    """Mailboxes and durable unread messages survive a restart; notify does not."""
    hub = make_hub()
    hub.clock.advance(1_800_000_000)
    srv = make_mq9_server(hub)
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    send(c, mid, "normal", b"n")
    send(c, mid, "urgent", b"u")
    send(c, mid, "notify", b"gone")            # memory tier: lost on restart
    srv.mq9.stop()
    srv2 = make_mq9_server(hub)
    agent = Client(srv2)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    assert bodies(agent.events()) == [b"u", b"n"]
    q = request(agent, f"$mq9.AI.MAILBOX.QUERY.{mid}",
                json.dumps({"token": box["token"]}).encode())
    assert q["unread"] == 0


def test_mq9_requests_do_not_trigger_no_responders() -> None:
    """mq9 requests are answered by the broker, never with a 503."""
    srv = make_mq9_server()
    c = Client(srv)
    reply = request(c, "$mq9.AI.MAILBOX.CREATE", b"")
    assert "mail_id" in reply


def test_pong_waits_for_the_commit_of_mq9_writes() -> None:
    """A PING after mq9 writes is answered only once they are committed."""
    from twisted.internet.task import Clock

    from mqhub.hub import Hub
    from mqhub.store.memory import MemoryStore

    clock = Clock()
    clock.advance(1_800_000_000)
    store = MemoryStore(clock=clock)      # commits group on the next turn, like LMDB
    store.open()
    srv = make_mq9_server(Hub(clock=clock, store=store))
    c = Client.__new__(Client)
    Client.__init__(c, srv, handshake=False)
    c.send(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'
           b"SUB _INBOX.t.* 1\r\nPUB $mq9.AI.MAILBOX.CREATE _INBOX.t.1 0\r\n\r\nPING\r\n")
    assert c.events() == []                       # neither reply nor PONG before the commit
    clock.advance(0)
    evs = c.events()
    assert [e[0] for e in evs] == [OP_MSG, codec.OP_PONG]
    mid = json.loads(evs[0][4])["mail_id"]
    c.send(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.urgent", b"x") + b"PING\r\n")
    assert c.events() == []
    assert result_of(store.count_entries(mailbox_queue(mid, "urgent"))) == 0
    clock.advance(0)
    assert c.events() == [(codec.OP_PONG,)]
    assert result_of(store.count_entries(mailbox_queue(mid, "urgent"))) == 1
    c.send(b"PING\r\n")                           # nothing pending: answered at once
    assert c.events() == [(codec.OP_PONG,)]


def test_old_single_queue_layout_is_migrated_to_the_core_queues_on_start() -> None:
    """Entries of the old one-queue-per-mailbox layout move to the core queues on start.

    A latest mailbox keeps only its newest; a message's expiry is derived from its id's time.
    """
    from mqhub.store.batch import WriteBatch

    hub = make_hub()
    hub.clock.advance(1_800_000_000)
    srv = make_mq9_server(hub)
    c = Client(srv)
    latest = create(c, type="latest")
    std = create(c)
    srv.mq9.stop()
    ids = srv.mq9.ids
    batch = WriteBatch()
    first, second = ids.reserve(1), ids.reserve(1)
    lsub = f"$mq9.AI.INBOX.{latest['mail_id']}.normal"
    batch.put_entries("mq9/box/" + latest["mail_id"],
                      [(first, 1, 0, 0.0, 0.0, lsub, None, b"old", "nats"),
                       (second, 2, 0, 0.0, 0.0, lsub.replace("normal", "urgent"), None, b"new",
                        "nats")])
    old = ids.reserve(1)
    batch.put_entries("mq9/box/" + std["mail_id"],
                      [(old, 1, 0, 0.0, 0.0, f"$mq9.AI.INBOX.{std['mail_id']}.normal", None,
                        b"normal ttl", "nats")])
    result_of(hub.store.commit(batch))
    hub.clock.advance(3000)                         # normal TTL is 3600 s from the id's time
    srv2 = make_mq9_server(hub)
    hub.clock.advance(0)
    assert result_of(hub.store.count_entries("mq9/box/" + std["mail_id"])) == 0
    assert stored(srv2, latest["mail_id"]) == 1
    (entry,) = srv2.mq9.mailboxes[std["mail_id"]].queues[1].peek(10)
    assert abs(entry[4] - (hub.clock.seconds() - 3000 + 3600)) < 1.0
    hub.clock.advance(601)
    agent = Client(srv2)
    agent.send(f"SUB $mq9.AI.INBOX.{latest['mail_id']}.* 1\r\n"
               f"SUB $mq9.AI.INBOX.{std['mail_id']}.* 2\r\n".encode())
    assert bodies(agent.events()) == [b"new"]        # the normal message expired meanwhile


def test_backlog_lives_in_core_queues_bound_to_inbox_addresses() -> None:
    """A mailbox is three core queues bound to its INBOX addresses: a core publish reaches it.

    The backlog is the core's (a bounded window, the rest in the store); message TTL is the
    entry's expiry and the mailbox TTL the queues' ``expires_at``; ``latest`` is max_size 1.
    """
    from mqhub.testing import memory_hub

    hub = memory_hub()
    srv = make_mq9_server(hub)
    c = Client(srv)
    box = create(c, ttl=600)
    mid = box["mail_id"]
    queues = [hub.broker.queue(name) for name in mailbox_queues(mid)]
    assert [q.tier for q in queues] == ["durable", "durable", "memory"]
    assert all(q.expires_at == hub.clock.seconds() + 600 for q in queues)
    assert [b.pattern for b in hub.broker.bindings(mailbox_queue(mid, "urgent"))] == [
        f"$mq9.AI.INBOX.{mid}.urgent"]
    send(c, mid, "normal", b"from nats")
    result_of(hub.broker.publish_batch(f"$mq9.AI.INBOX.{mid}.urgent", [b"from the core"],
                                       origin="test"))
    assert queues[0].depth == 1 and queues[1].depth == 1
    assert [q.ttl for q in queues] == [86400.0, 3600.0, 0.0]     # priority TTLs are queue TTLs
    assert queues[1].peek(1)[0][4] == 0.0           # so the entry needs no expiry of its own
    agent = Client(srv)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    assert bodies(agent.events()) == [b"from the core", b"from nats"]
    assert queues[0].depth == 0 and queues[1].depth == 0
    latest = create(c, type="latest")["mail_id"]
    assert {hub.broker.queue(n).max_size for n in mailbox_queues(latest)} == {1}
    assert {hub.broker.queue(n).tier for n in mailbox_queues(latest)} == {"durable"}
    hub.clock.advance(601)
    assert mid not in srv.mq9.mailboxes
    assert all(hub.broker.queue(n) is None for n in mailbox_queues(mid))


def test_a_full_mailbox_refuses_with_a_json_error() -> None:
    """max_mailboxes and max_unread refuse with JSON errors; reading makes room."""
    srv = make_mq9_server(max_unread="3", max_mailboxes="2")
    c = Client(srv)
    create(c)
    assert create(c) != {"error": "too many mailboxes"}
    assert create(c) == {"error": "too many mailboxes"}
    srv.mq9.mailboxes.clear()
    mid = create(c)["mail_id"]
    for i in range(3):
        send(c, mid, "normal", b"%d" % i)
    c.send(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.urgent", b"over", "_INBOX.t.9"))
    replies = [json.loads(e[4]) for e in c.events() if e[0] == OP_MSG]
    assert replies == [{"error": f"mailbox {mid} is full"}]
    assert stored(srv, mid) == 3 and not c.closed
    c.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())   # reading makes room again
    assert bodies([e for e in c.events() if e[2] == "1"]) == [b"0", b"1", b"2"]
    send(c, mid, "urgent", b"fits")
    assert bodies(c.events()) == [b"fits"]


def test_mailbox_subscription_with_max_gets_exactly_max_and_the_rest_stays_unread() -> None:
    """A limited mailbox SUB gets exactly max messages; the rest stay unread."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    agent = Client(srv)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 7\r\nUNSUB 7 2\r\n".encode())
    c.send(b"".join(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.normal", b"%d" % i)
                    for i in range(5)))                 # one read: one drain
    assert bodies(agent.events()) == [b"0", b"1"]
    assert not agent.proto.subs
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert q["unread"] == 3 and [m["payload"] for m in q["messages"]] == ["2", "3", "4"]
    assert stored(srv, mid) == 0


def test_sweep_visits_only_mailboxes_with_something_due() -> None:
    """The mailbox TTL sweep pops due mailboxes from a heap instead of scanning every mailbox."""
    srv = make_mq9_server()
    c = Client(srv)
    boxes = [create(c, ttl=0)["mail_id"] for _ in range(50)]
    short = create(c, ttl=30)["mail_id"]
    c.send(codec.encode_hpub(f"$mq9.AI.INBOX.{boxes[0]}.normal",
                             codec.build_headers({"mq9-ttl": "5"}), b"brief"))
    assert len(srv.mq9._due_heap) == 1         # the short mailbox (message TTLs are the core's)
    srv.hub.clock.advance(6)
    assert srv.mq9.mailboxes[boxes[0]].count() == 0 and len(srv.mq9._due_heap) == 1
    srv.hub.clock.advance(25)
    assert short not in srv.mq9.mailboxes and not srv.mq9._due_heap
    assert len(srv.mq9.mailboxes) == 50


def test_persisted_broadcasts_past_the_bound_are_delivered_live_only() -> None:
    """Past max_unread stored broadcasts, a persisted broadcast is delivered but not kept."""
    srv = make_mq9_server(max_unread="2")
    pub, live = Client(srv), Client(srv)
    live.send(b"SUB $mq9.AI.BROADCAST.> 1\r\n")
    hdr = codec.build_headers({"mq9-persist": "true"})
    for i in range(3):
        pub.send(codec.encode_hpub("$mq9.AI.BROADCAST.a.b", hdr, b"%d" % i))
    assert bodies(live.events()) == [b"0", b"1", b"2"]
    assert len(srv.mq9.broadcasts) == 2 and srv.mq9.stats["refused"] == 1
    late = Client(srv)
    late.send(b"SUB $mq9.AI.BROADCAST.a.* 1\r\n")
    assert bodies(late.events()) == [b"0", b"1"]


def test_persisted_broadcasts_of_the_old_layout_are_moved_and_replayed() -> None:
    """Broadcasts stored under the old ``mq9/bc`` queue (which the core recovers as a queue of
    its own) move under mq9's reserved name on start and still replay to late subscribers."""
    from mqhub.store.batch import WriteBatch
    from mqhub.store.memory import MemoryStore
    from mqhub.testing import memory_hub

    store = MemoryStore()
    store.open()
    seed = memory_hub(store=store)
    now = seed.clock.seconds()
    msg_id = seed.broker.ids.next_id()
    batch = WriteBatch()
    batch.put_entries("mq9/bc", [(msg_id, 0, 0, 0.0, now + 600, "$mq9.AI.BROADCAST.a.b", None,
                                  b"kept", "nats")])
    result_of(store.commit(batch))
    hub = memory_hub(seed.clock, store=store)
    assert hub.broker.queue("mq9/bc") is not None      # the core took it for one of its own
    srv = make_mq9_server(hub)
    hub.clock.advance(0)
    assert hub.broker.queue("mq9/bc") is None
    assert result_of(store.count_entries("mq9/bc")) == 0
    late = Client(srv)
    late.send(b"SUB $mq9.AI.BROADCAST.> 1\r\n")
    assert bodies(late.events()) == [b"kept"]


def test_pushes_wait_for_the_commit_that_stored_them() -> None:
    """A mailbox message reaches a subscriber only after the store commit that holds it, and
    its delete (delivered = read) is committed after that put."""
    from twisted.internet.task import Clock

    from mqhub.hub import Hub
    from mqhub.store.memory import MemoryStore

    clock = Clock()
    clock.advance(1_800_000_000)
    store = MemoryStore(clock=clock)      # commits group on the next turn, like LMDB
    store.open()
    srv = make_mq9_server(Hub(clock=clock, store=store))
    c = Client(srv)
    c.send(b"SUB _INBOX.t.* 99\r\n" + codec.encode_pub("$mq9.AI.MAILBOX.CREATE", b"{}",
                                                      "_INBOX.t.1"))
    clock.advance(0)
    mid = json.loads([e for e in c.events() if e[0] == OP_MSG][0][4])["mail_id"]
    agent = Client(srv)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    send(c, mid, "urgent", b"u")
    assert agent.events() == []                    # not yet durable: not yet pushed
    clock.advance(0)
    assert bodies(agent.events()) == [b"u"]
    for _ in range(3):
        clock.advance(0)
    assert result_of(store.count_entries(mailbox_queue(mid, "urgent"))) == 0


def test_priority_ttl_is_the_longest_a_message_lives() -> None:
    """``mq9-ttl`` shortens a message's life; the priority TTL (the queue's) bounds it."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    for ttl, body in (("60", b"short"), ("7200", b"long")):
        c.send(codec.encode_hpub(f"$mq9.AI.INBOX.{mid}.normal",
                                 codec.build_headers({"mq9-ttl": ttl}), body))
    send(c, mid, "urgent", b"urgent")
    srv.hub.clock.advance(61)
    assert stored(srv, mid) == 2
    srv.hub.clock.advance(3600)
    assert stored(srv, mid) == 1
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert [m["payload"] for m in q["messages"]] == ["urgent"]


def test_a_backlog_beyond_the_window_stays_in_the_store_and_arrives_in_order() -> None:
    """Only a window of a mailbox's backlog is in memory; the rest is paged in as it drains."""
    from mqhub.testing import memory_hub

    hub = memory_hub(window=8)
    srv = make_mq9_server(hub)
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    c.send(b"".join(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.normal", b"%d" % i)
                    for i in range(50)))
    queue = hub.broker.queue(mailbox_queue(mid, "normal"))
    assert queue.depth == 50 and queue.stats()["in_memory"] <= 8
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}",
                json.dumps({"token": box["token"], "limit": 3}).encode())
    assert q["unread"] == 50 and [m["payload"] for m in q["messages"]] == ["0", "1", "2"]
    agent = Client(srv)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    got: list[bytes] = []
    for _ in range(50):
        got += bodies(agent.events())
        if len(got) >= 47:
            break
        hub.clock.advance(0)
    assert got == [b"%d" % i for i in range(3, 50)]
    assert stored(srv, mid) == 0


def test_a_live_subscriber_of_a_latest_mailbox_gets_only_the_newest_of_a_read() -> None:
    """Within one read, a latest mailbox pushes only its newest message, whatever the priority."""
    srv = make_mq9_server()
    c = Client(srv)
    mid = create(c, type="latest")["mail_id"]
    agent = Client(srv)
    agent.send(f"SUB $mq9.AI.INBOX.{mid}.* 1\r\n".encode())
    c.send(b"".join(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.{prio}", body) for prio, body in (
        ("normal", b"a"), ("urgent", b"b"), ("urgent", b"c"), ("notify", b"d"))))
    assert bodies(agent.events()) == [b"d"]
    assert stored(srv, mid) == 0
    c.send(b"".join(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.{prio}", body) for prio, body in (
        ("notify", b"e"), ("urgent", b"f"))))
    assert bodies(agent.events()) == [b"f"]


def test_sub_pattern_maps_a_trailing_hash_on_broadcast_subjects_only() -> None:
    """``#`` at the end of a broadcast SUB means ``>``; elsewhere a subject stays as written."""
    assert sub_pattern("$mq9.AI.BROADCAST.#") == "$mq9.AI.BROADCAST.>"
    assert sub_pattern("$mq9.AI.BROADCAST.orders.#") == "$mq9.AI.BROADCAST.orders.>"
    assert sub_pattern("$mq9.AI.BROADCAST.orders.x#") == "$mq9.AI.BROADCAST.orders.x#"
    assert sub_pattern("bench.#") == "bench.#"
