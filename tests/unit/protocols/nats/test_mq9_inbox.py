"""The mq9 INBOX fast path: groups per subject per read, the subject cache, frames split anywhere."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import OP_HMSG, OP_MSG
from mqhub.protocols.nats.mq9 import mailbox_queues
from mqhub.protocols.nats.mq9_push import render_plain
from mqhub.protocols.nats.server import NatsServer
from mqhub.testing import result_of
from tests.unit.protocols.nats.helpers import Client, make_mq9_server, request

PRIOS = ("urgent", "normal", "notify")


def create(c: Client, **req: object) -> dict:
    """CREATE a mailbox and return the reply."""
    return request(c, "$mq9.AI.MAILBOX.CREATE", json.dumps(req).encode())


def received(events: list[tuple]) -> list[tuple[str, bytes]]:
    """(subject, payload) of each MSG/HMSG event, in order."""
    out = []
    for e in events:
        if e[0] == OP_MSG:
            out.append((e[1], e[4]))
        elif e[0] == OP_HMSG:
            out.append((e[1], e[5]))
    return out


def stored(srv: NatsServer, mail_id: str) -> int:
    """Entries the store holds for a mailbox after the next turn's commit."""
    srv.hub.clock.advance(0)
    return sum(result_of(srv.hub.store.count_entries(name)) for name in mailbox_queues(mail_id))


class CountingPublish:
    """Wraps the real ``broker.publish_batch`` and records the address of every call."""

    def __init__(self, srv: NatsServer) -> None:
        """Install on ``srv``'s broker."""
        self.real = srv.mq9.broker.publish_batch
        self.calls: list[str] = []
        srv.mq9.broker.publish_batch = self  # type: ignore[method-assign]

    def __call__(self, address: str, bodies: list[bytes], **kw: Any) -> Any:
        """Record and forward."""
        self.calls.append(address)
        return self.real(address, bodies, **kw)


def test_mixed_mailboxes_and_priorities_in_one_read_make_one_core_call_per_subject() -> None:
    """Interleaved PUBs to two mailboxes and three priorities in one read: one publish_batch
    per subject, urgent first; each subscriber gets every message of its mailbox once, FIFO
    per priority, and the durable ones are deleted once pushed."""
    srv = make_mq9_server()
    pub = Client(srv)
    a, b = create(pub)["mail_id"], create(pub)["mail_id"]
    sa, sb = Client(srv), Client(srv)
    sa.send(f"SUB $mq9.AI.INBOX.{a}.* 1\r\n".encode())
    sb.send(f"SUB $mq9.AI.INBOX.{b}.* 2\r\n".encode())
    sent: list[tuple[str, bytes]] = []
    for i in range(60):
        box = (a, b)[i % 2]
        subject = f"$mq9.AI.INBOX.{box}.{PRIOS[i % 3]}"
        sent.append((subject, b"m%d" % i))
    counter = CountingPublish(srv)
    pub.send(b"".join(codec.encode_pub(s, p) for s, p in sent))
    assert sorted(counter.calls) == sorted({s for s, _ in sent})       # one call per subject
    assert [c.rsplit(".", 1)[1] for c in counter.calls] == [
        "urgent", "urgent", "normal", "normal", "notify", "notify"]
    got_a, got_b = received(sa.events()), received(sb.events())
    for box, got in ((a, got_a), (b, got_b)):
        mine = [m for m in sent if f".{box}." in m[0]]
        assert sorted(got) == sorted(mine)
        for prio in PRIOS:
            assert [m for m in got if m[0].endswith(prio)] == \
                [m for m in mine if m[0].endswith(prio)]
    assert stored(srv, a) == 0 and stored(srv, b) == 0


def test_a_new_ttl_in_the_middle_of_a_run_keeps_the_subjects_order() -> None:
    """A message with its own mq9-ttl starts a new group of the subject; FIFO is kept."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    subject = f"$mq9.AI.INBOX.{mid}.normal"
    ttl = codec.build_headers({"mq9-ttl": "30"})
    counter = CountingPublish(srv)
    c.send(codec.encode_pub(subject, b"1") + codec.encode_hpub(subject, ttl, b"2")
           + codec.encode_pub(subject, b"3") + codec.encode_pub(subject, b"4"))
    assert counter.calls == [subject] * 3
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert [m["payload"] for m in q["messages"]] == ["1", "2", "3", "4"]
    assert q["messages"][1]["headers"] == {"mq9-ttl": "30"}
    assert q["messages"][0]["headers"] == {}


def test_the_room_of_a_mailbox_is_checked_on_the_fast_path_too() -> None:
    """max_unread holds within one read of plain PUBs: the excess is refused (an error for the
    one with a reply subject), never stored."""
    srv = make_mq9_server(max_unread="3")
    c = Client(srv)
    box = create(c)
    mid = box["mail_id"]
    subject = f"$mq9.AI.INBOX.{mid}.normal"
    c.send(b"".join(codec.encode_pub(subject, b"%d" % i) for i in range(5)))
    assert stored(srv, mid) == 3
    assert request(c, subject, b"late") == {"error": f"mailbox {mid} is full"}
    assert srv.mq9.stats["refused"] == 3


def test_a_mailbox_expiring_between_two_reads_is_not_served_from_the_cache() -> None:
    """The subject cache holds a mailbox; once it expires (before and after the sweep ran), a
    publish to it is refused and nothing is stored or pushed."""
    srv = make_mq9_server(sweep_interval="100")
    c = Client(srv)
    box = create(c, ttl=10)
    mid = box["mail_id"]
    subject = f"$mq9.AI.INBOX.{mid}.normal"
    c.send(codec.encode_pub(subject, b"early"))
    assert subject in srv.mq9.inbox_cache and stored(srv, mid) == 1
    srv.hub.clock.advance(11)                  # past its TTL, the sweep has not run yet
    c.send(codec.encode_pub(subject, b"a") + codec.encode_pub(subject, b"b"))
    assert request(c, subject, b"c") == {"error": f"mailbox {mid} does not exist"}
    srv.hub.clock.advance(100)                 # the sweep removes it and clears the cache
    assert mid not in srv.mq9.mailboxes and subject not in srv.mq9.inbox_cache
    assert request(c, subject, b"d") == {"error": f"mailbox {mid} does not exist"}
    assert stored(srv, mid) == 0


def test_a_mailbox_created_after_a_miss_is_found() -> None:
    """CREATE clears the cache, so a subject resolved before is resolved again."""
    srv = make_mq9_server()
    c = Client(srv)
    assert request(c, "$mq9.AI.INBOX.mnope.normal", b"x") == {
        "error": "mailbox mnope does not exist"}
    mid = create(c)["mail_id"]
    assert not srv.mq9.inbox_cache
    subject = f"$mq9.AI.INBOX.{mid}.urgent"
    c.send(codec.encode_pub(subject, b"1") + codec.encode_pub(subject, b"2"))
    assert stored(srv, mid) == 2


def test_latest_mailbox_keeps_the_newest_of_a_read_across_priorities() -> None:
    """In a latest mailbox only the last message of the read is kept, whatever its priority."""
    srv = make_mq9_server()
    c = Client(srv)
    box = create(c, type="latest")
    mid = box["mail_id"]
    c.send(b"".join(codec.encode_pub(f"$mq9.AI.INBOX.{mid}.{p}", p.encode())
                    for p in ("urgent", "notify", "normal", "urgent", "normal")))
    q = request(c, f"$mq9.AI.MAILBOX.QUERY.{mid}", json.dumps({"token": box["token"]}).encode())
    assert [m["payload"] for m in q["messages"]] == ["normal"]


def test_render_plain_matches_one_msg_per_entry() -> None:
    """The one-bytes rendering of a push equals MSG frames one by one."""
    entries = [(1, 1, 0, 0.0, 0.0, "$mq9.AI.INBOX.m1.normal", None, b"abc", "nats"),
               (2, 1, 0, 0.0, 0.0, "$mq9.AI.INBOX.m1.normal", None, b"", "nats"),
               (3, 2, 0, 0.0, 0.0, "$mq9.AI.INBOX.m1.urgent", None, b"abc", "nats")]
    assert render_plain(entries, "7") == (
        b"MSG $mq9.AI.INBOX.m1.normal 7 3\r\nabc\r\nMSG $mq9.AI.INBOX.m1.normal 7 0\r\n\r\n"
        b"MSG $mq9.AI.INBOX.m1.urgent 7 3\r\nabc\r\n")


message = st.tuples(st.integers(0, 2), st.sampled_from(PRIOS),
                    st.binary(max_size=40), st.sampled_from(["", "ttl", "reply", "hdr"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(message, min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 10_000), max_size=12), live=st.booleans())
def test_frames_split_anywhere_deliver_every_message_once_in_order(
        msgs: list[tuple[int, str, bytes, str]], cuts: list[int], live: bool) -> None:
    """Whatever the read boundaries, each mailbox gets every message once, FIFO per priority,
    with its headers and reply subject; live (pushed) or offline (QUERY)."""
    srv = make_mq9_server()
    pub = Client(srv)
    boxes = [create(pub) for _ in range(3)]
    subs = []
    if live:
        for i, box in enumerate(boxes):
            s = Client(srv)
            s.send(f"SUB $mq9.AI.INBOX.{box['mail_id']}.* {i}\r\n".encode())
            subs.append(s)
    stream = b""
    for k, prio, body, extra in msgs:
        subject = f"$mq9.AI.INBOX.{boxes[k]['mail_id']}.{prio}"
        if extra == "ttl":
            stream += codec.encode_hpub(subject, codec.build_headers({"mq9-ttl": "60"}), body)
        elif extra == "hdr":
            stream += codec.encode_hpub(subject, codec.build_headers({"k": "v"}), body)
        elif extra == "reply":
            stream += codec.encode_pub(subject, body, "re.ply")
        else:
            stream += codec.encode_pub(subject, body)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    for lo, hi in zip(points, points[1:], strict=False):
        pub.send(stream[lo:hi])
    pub.send(codec.PING)
    assert (codec.OP_PONG,) in pub.events()
    for k, box in enumerate(boxes):
        mine = [(p, b, x) for i, p, b, x in msgs if i == k]
        if live:
            evs = [e for e in subs[k].events() if e[0] in (OP_MSG, OP_HMSG)]
            got = [(e[1].rsplit(".", 1)[1], e[4] if e[0] == OP_MSG else e[5], e[3])
                   for e in evs]
            for prio in PRIOS:
                want = [(b, "re.ply" if x == "reply" else None) for p, b, x in mine if p == prio]
                assert [(b, r) for p, b, r in got if p == prio] == want
            hdrs = [e for e in evs if e[0] == OP_HMSG]
            assert len(hdrs) == sum(1 for _, _, x in mine if x in ("ttl", "hdr"))
        else:
            q = request(pub, f"$mq9.AI.MAILBOX.QUERY.{box['mail_id']}",
                        json.dumps({"token": box["token"]}).encode())
            assert q["unread"] == len(mine)
            for prio in PRIOS:
                want = [b for p, b, _ in mine if p == prio]
                assert [_payload(m) for m in q["messages"] if m["priority"] == prio] == want
        assert stored(srv, box["mail_id"]) == 0       # pushed or queried = read = deleted


def _payload(item: dict[str, Any]) -> bytes:
    """A QUERY item's payload as bytes."""
    import base64

    if item["encoding"] == "base64":
        return base64.b64decode(item["payload"])
    return str(item["payload"]).encode()


def test_messages_accepted_for_a_mailbox_removed_before_the_flush_are_not_dropped_silently(
) -> None:
    """Publishes made outside a read (as the core bridge does) wait for the next flush; when
    the sweep removes their mailbox first, every one of them (the first of the group and the
    fast-path ones) is counted in ``no_mailbox`` and the one carrying a reply subject gets
    mq9's ``does not exist`` error; nothing is stored."""
    srv = make_mq9_server(sweep_interval="100")
    c = Client(srv)
    mid = create(c, ttl=10)["mail_id"]
    c.send(b"SUB _INBOX.gone 7\r\n")
    c.events()
    subject = f"$mq9.AI.INBOX.{mid}.normal"
    mq9 = srv.mq9
    mq9.publish(None, subject, None, None, b"first")        # opens the subject's group
    mq9.publish(None, subject, None, None, b"fast")         # the per-read fast path
    mq9.publish(None, subject, "_INBOX.gone", None, b"asks")
    assert mq9.pending_publishes()
    srv.hub.clock.advance(100)                 # the sweep removes the mailbox, then flushes
    assert mid not in mq9.mailboxes and not mq9.pending_publishes()
    assert mq9.stats["no_mailbox"] == 3 and mq9.stats["stored"] == 0
    srv.hub.clock.advance(0)
    replies = [json.loads(p) for s, p in received(c.events()) if s == "_INBOX.gone"]
    assert replies == [{"error": f"mailbox {mid} does not exist"}]
    assert stored(srv, mid) == 0


def test_a_publish_to_a_missing_mailbox_without_reply_is_counted() -> None:
    """No reply subject means no error reply, but the refusal is counted."""
    srv = make_mq9_server()
    c = Client(srv)
    c.send(codec.encode_pub("$mq9.AI.INBOX.mnope.urgent", b"x") * 2)
    assert srv.mq9.stats["no_mailbox"] == 2
