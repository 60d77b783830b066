"""MQKS against a real broker over TCP: every action and flag, as the original server answers.

One broker serves the module (``--mqks-eval stats``, prefetch 2 so tail order and flow control
are visible); every test uses its own queue and event names.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.interop.broker import BrokerProcess, wait_until
from tests.interop.mqks_client import MqksClient, MqksSocket, pump_until

pytestmark = pytest.mark.interop

ERROR_ID = re.compile(rb"\d{20}[0-9A-Za-z]{4}")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One MQKS broker for the module."""
    base = tmp_path_factory.mktemp("mqks")
    proc = BrokerProcess(["mqks"], base / "data", log_dir=base,
                         extra_args=["--mqks-eval", "stats", "--option", "mqks.prefetch=2"])
    proc.start()
    yield proc
    proc.close()
    print(f"--- {proc.log_path} ---\n{proc.output()[-20000:]}")


#: ``conn()`` opens a raw MQKS socket to the module broker
Connect = Callable[[], MqksSocket]


@pytest.fixture
def conn(broker: BrokerProcess) -> Iterator[Connect]:
    """``conn()`` opens a raw MQKS socket closed after the test."""
    opened: list[MqksSocket] = []

    def make() -> MqksSocket:
        """A new connection."""
        sock = MqksSocket(broker.port("mqks", "tcp"))
        opened.append(sock)
        return sock

    yield make
    for sock in opened:
        sock.close()


def is_error(line: bytes, rid: bytes) -> bool:
    """``line`` is ``{rid} error {24-char error id}``."""
    head = rid + b" error "
    return line.startswith(head) and ERROR_ID.fullmatch(line[len(head):]) is not None


def eval_(sock: MqksSocket, rid: bytes, code: bytes) -> bytes:
    """Run ``_eval`` and return its reply line."""
    sock.send(rid + b" _eval " + code)
    sock.until(lambda ls: any(x.startswith(rid + b" ") for x in ls), f"_eval {rid!r}")
    return next(x for x in sock.lines if x.startswith(rid + b" "))


def test_hello_world(conn: Connect) -> None:
    """The protocol text's hello world: Alice or Bob gets it, Charlie gets it too."""
    alice, bob, charlie, dave = conn(), conn(), conn(), conn()
    alice.confirm(b"Alice", b"consume", b"greetings hi hello")
    bob.confirm(b"Bob", b"consume", b"greetings hi hello")
    charlie.confirm(b"Charlie", b"consume", b"greetings-and-byes hi hello bye good-bye")
    dave.send(b"Dave publish hello world")
    charlie.wait_line(b"Charlie ok Dave event=hello world")
    pump_until([alice, bob], lambda: b"Alice ok Dave event=hello world" in alice.lines
               or b"Bob ok Dave event=hello world" in bob.lines, "Alice or Bob to get the greeting")
    alice.quiet(0.2)
    bob.quiet(0.2)
    got = [x for x in alice.lines + bob.lines if b"Dave" in x]
    assert len(got) == 1


def test_confirm_reply_has_trailing_space_and_ping(conn: Connect) -> None:
    """``ok `` with its space; ping echoes; ``--confirm`` only with its space; CRLF accepted."""
    s = conn()
    s.send_raw(b"c1 rebind --confirm cq1 ce1\r\npg1 ping service1\np ping --confirm x y\n"
               b"x ping --confirm\npg2 ping a  b   \n")
    s.until(lambda ls: len(ls) >= 5, "five replies")
    assert s.lines[:5] == [b"c1 ok ", b"pg1 ok service1", b"p ok x y", b"x ok --confirm",
                           b"pg2 ok a  b"]
    assert s.buf == b""


def test_manual_ack_reject_retry_and_tail_order(conn: Connect) -> None:
    """Reject returns a message to the tail with retry+1; prefetch 2 bounds the unacked."""
    p, c = conn(), conn()
    p.confirm(b"rb", b"rebind", b"mq1 me1")
    for i in range(1, 5):
        p.confirm(b"m%d" % i, b"publish", b"me1 d%d" % i)
    c.confirm(b"c1", b"consume", b"mq1 --manual-ack")
    msgs = c.wait_messages(b"c1", 2)
    assert [(m["id"], m["event"], m["data"]) for m in msgs] == [
        (b"m1", b"me1", b"d1"), (b"m2", b"me1", b"d2")]
    assert c.quiet(0.3) and len(c.messages(b"c1")) == 2  # prefetch 2: nothing more while unacked
    c.confirm(b"r1", b"reject", b"c1 m1")
    msgs = c.wait_messages(b"c1", 3)
    assert msgs[2]["id"] == b"m3" and "retry" not in msgs[2]  # m1 went to the tail, after m4
    c.confirm(b"a1", b"ack", b"c1 m2")
    c.confirm(b"a2", b"ack", b"c1 m3")
    msgs = c.wait_messages(b"c1", 5)
    assert [(m["id"], m.get("retry")) for m in msgs[3:]] == [(b"m4", None), (b"m1", b"1")]
    c.confirm(b"r2", b"reject", b"c1 m1")
    msgs = c.wait_messages(b"c1", 6)
    assert (msgs[5]["id"], msgs[5]["retry"]) == (b"m1", b"2")
    assert c.lines.count(b"c1 ok m1 event=me1,retry=2 d1") == 1
    c.confirm(b"a3", b"ack", b"c1 --all")
    p.confirm(b"m5", b"publish", b"me1 d5")
    assert c.wait_messages(b"c1", 7)[6]["id"] == b"m5"


def test_reject_all(conn: Connect) -> None:
    """``reject c --all`` returns every unacked message with retry=1."""
    c = conn()
    c.confirm(b"c2", b"consume", b"rq2 re2 --manual-ack")
    c.send(b"k1 publish re2 one", b"k2 publish re2 two")
    c.wait_messages(b"c2", 2)
    c.confirm(b"ra", b"reject", b"c2 --all")
    msgs = c.wait_messages(b"c2", 4)
    assert sorted((m["id"], m["retry"]) for m in msgs[2:]) == [(b"k1", b"1"), (b"k2", b"1")]


def test_unknown_consumer_gets_no_confirm(conn: Connect) -> None:
    """ack/reject/delete_consumer of an unknown consumer answer nothing, even with --confirm."""
    s = conn()
    s.send(b"a ack --confirm nobody m1", b"r reject --confirm nobody --all",
           b"d delete_consumer --confirm nobody", b"q delete_queue --confirm no-such-queue",
           b"end ping end")
    s.wait_line(b"end ok end")
    assert s.lines == [b"q ok ", b"end ok end"]


def test_rebind_masks_order_and_update(conn: Connect) -> None:
    """Masks never cross a dot, only dotted events are tested; fixed order; --update lines."""
    c, p = conn(), conn()
    c.confirm(b"c3", b"consume", b"bq3 --manual-ack")
    c.confirm(b"rb1", b"rebind", b"bq3 e1 e5.id1.a1 e5.id2.a2 x.y.a1 plain")
    c.wait_line(b"c3 ok --update bq3 e1 e5.id1.a1 e5.id2.a2 plain x.y.a1 --manual-ack")
    # the original client sends --add before --remove-mask: the order is still fixed
    c.confirm(b"rb2", b"rebind", b"bq3 --add e6 --remove-mask e5.*.a1 *.*.a1")
    c.wait_line(b"c3 ok --update bq3 e1 e5.id2.a2 e6 plain --manual-ack")
    c.confirm(b"rb3", b"rebind", b"bq3 --add a1.b --remove-mask a*.* e1*")
    c.wait_line(b"c3 ok --update bq3 a1.b e1 e5.id2.a2 e6 plain --manual-ack")
    c.confirm(b"rb4", b"rebind", b"bq3 --remove e6 plain a1.b")
    c.wait_line(b"c3 ok --update bq3 e1 e5.id2.a2 --manual-ack")
    before = len(c.lines)
    c.confirm(b"rb5", b"rebind", b"bq3 --remove nothing")  # no change: no --update
    p.confirm(b"x1", b"publish", b"e5.id1.a1 gone")
    p.confirm(b"x2", b"publish", b"e5.id2.a2 kept")
    c.wait_messages(b"c3", 1)
    assert not any(b"--update" in x for x in c.lines[before:])
    c.quiet(0.2)
    assert [m["id"] for m in c.messages(b"c3")] == [b"x2"]
    c.send(b"rb6 rebind bq3", b"rb7 rebind bq3 --bogus x", b"rb8 rebind bq3 --replace r.1")
    c.wait_line(b"c3 ok --update bq3 r.1 --manual-ack")
    errors = [x for x in c.lines if b" error " in x]
    assert is_error(errors[0], b"rb6") and is_error(errors[1], b"rb7")


def test_consume_add_keep_and_update_to_others(conn: Connect) -> None:
    """Replace does not notify the consumer itself; --add does; no events keeps bindings."""
    a, b, p = conn(), conn(), conn()
    a.confirm(b"ca", b"consume", b"uq4 u1 u2")
    b.confirm(b"cb", b"consume", b"uq4 u3")  # replaces: a is told, b is not
    a.wait_line(b"ca ok --update uq4 u3")
    b.confirm(b"cb2", b"consume", b"uq4 --add u4 --manual-ack")
    for line in (b"ca ok --update uq4 u3 u4", b"cb ok --update uq4 u3 u4",
                 b"cb2 ok --update uq4 u3 u4 --manual-ack"):
        (a if line.startswith(b"ca") else b).wait_line(line)
    b.confirm(b"cb3", b"consume", b"uq4")  # no events: bindings kept, no update
    assert not any(x.startswith(b"cb3 ok --update") for x in b.quiet(0.2))
    p.confirm(b"u", b"publish", b"u4 x")
    pump_until([a, b], lambda: any(x.endswith(b" u event=u4 x") for x in a.lines + b.lines),
               "u4 delivered")
    assert not [x for x in a.lines + b.lines if b"event=u1" in x]
    b.send(b"cx consume uq4 --bogus")
    b.until(lambda ls: any(is_error(x, b"cx") for x in ls), "unknown flag error")


def test_update_shows_delete_when_unused(conn: Connect) -> None:
    """A changed --delete-queue-when-unused value is sent as ``=5.0``; a plain consume clears it."""
    a, b = conn(), conn()
    a.confirm(b"da", b"consume", b"dq5 d1 --manual-ack")
    b.confirm(b"db", b"consume", b"dq5 --delete-queue-when-unused=5")
    a.wait_line(b"da ok --update dq5 d1 --delete-queue-when-unused=5.0 --manual-ack")
    b.confirm(b"dc", b"consume", b"dq5")
    a.wait_line(b"da ok --update dq5 d1 --manual-ack")
    b.confirm(b"dd", b"consume", b"dq5 --delete-queue-when-unused")
    a.wait_line(b"da ok --update dq5 d1 --delete-queue-when-unused --manual-ack")
    b.send(b"de consume dq5 --delete-queue-when-unused=abc")
    b.until(lambda ls: any(is_error(x, b"de") for x in ls), "bad seconds error")


def queue_exists(s: MqksSocket, name: bytes, n: list[int]) -> bool:
    """Ask ``_eval`` whether MQKS queue ``name`` exists (its depth is an error when it does not)."""
    n[0] += 1
    return not is_error(eval_(s, b"ev%d" % n[0], b'state.queues["%s"].qsize()' % name),
                        b"ev%d" % n[0])


def test_delete_when_unused_timing(conn: Connect) -> None:
    """There before the delay, gone after it; a new consume cancels; =0 and bare flag delete at once."""
    s, c = conn(), conn()
    n = [0]
    c.confirm(b"w1", b"consume", b"wq6 we6 --delete-queue-when-unused=3")
    c.confirm(b"w2", b"delete_consumer", b"w1")
    left = time.monotonic()
    assert queue_exists(s, b"wq6", n)
    wait_until(lambda: not queue_exists(s, b"wq6", n), "wq6 deleted", timeout=15)
    assert time.monotonic() - left >= 2.9
    # cancelled by a new consume within the delay
    c.confirm(b"w3", b"consume", b"wq7 we7 --delete-queue-when-unused=1")
    c.confirm(b"w4", b"delete_consumer", b"w3")
    c.confirm(b"w5", b"consume", b"wq7 --delete-queue-when-unused=1")
    time.sleep(1.5)  # past the delay: the queue must still be there (a bounded check, not a wait)
    assert queue_exists(s, b"wq7", n)
    # immediate deletion: =0, and the flag without a value; disconnect starts it too
    for q, flag in ((b"wq8", b"=0"), (b"wq9", b"")):
        d = conn()
        d.confirm(b"w6", b"consume", q + b" we8 --delete-queue-when-unused" + flag)
        assert queue_exists(s, q, n)
        d.close()
        wait_until(partial(lambda name: not queue_exists(s, name, n), q),
                   f"{q!r} deleted on disconnect")


def test_disconnect_requeues_with_retry_plus_one(conn: Connect) -> None:
    """A manual-ack consumer's unacked messages return to the queue with retry+1 on disconnect."""
    a, b, p = conn(), conn(), conn()
    a.confirm(b"ka", b"consume", b"lq10 le10 --manual-ack")
    p.confirm(b"k1", b"publish", b"le10 one")
    a.wait_messages(b"ka", 1)
    for i in range(2):
        a.confirm(b"kr%d" % i, b"reject", b"ka k1")
    assert a.wait_messages(b"ka", 3)[2]["retry"] == b"2"
    p.confirm(b"k3", b"publish", b"le10 three")
    a.wait_messages(b"ka", 4)
    b.confirm(b"kb", b"consume", b"lq10 --manual-ack")
    a.close()
    msgs = b.wait_messages(b"kb", 2)
    assert sorted((m["id"], m["retry"]) for m in msgs) == [(b"k1", b"3"), (b"k3", b"1")]


def test_slow_auto_ack_consumer_is_not_flooded(conn: Connect) -> None:
    """A consumer that does not read stops receiving once its socket is full: the rest waits in
    the queue (the original pushed everything into memory); reading again delivers all."""
    c, p = conn(), conn()
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    c.confirm(b"sc", b"consume", b"slowq slow.e")
    body = b"y" * 10_000
    for chunk in range(8):
        p.send(*[b"s%d-%d publish slow.e %s" % (chunk, i, body) for i in range(250)])
    p.confirm(b"s-last", b"publish", b"slow.e " + body)
    wait_until(lambda: eval_(p, b"ev%d" % time.monotonic_ns(),
                             b'state.queues["slowq"].qsize()').split(b" ")[-1].isdigit(), "depth")
    depth = int(eval_(p, b"evd", b'state.queues["slowq"].qsize()').split(b" ")[-1])
    assert depth > 1000, depth  # 20 MB did not go into the consumer's socket and buffers
    c.until(lambda _: len(c.messages(b"sc")) == 2001, "all 2001 messages", timeout=60)


def test_round_robin(conn: Connect) -> None:
    """Two consumers of one queue take turns: exactly alternating for one publish per read, an
    equal share of a burst."""
    a, b, p = conn(), conn(), conn()
    a.confirm(b"ra", b"consume", b"rrq rr")
    b.confirm(b"rb", b"consume", b"rrq")
    for i in range(6):
        p.confirm(b"rr%d" % i, b"publish", b"rr x")
    pump_until([a, b], lambda: len(a.messages(b"ra")) + len(b.messages(b"rb")) == 6,
               "six deliveries")
    got_a = [m["id"] for m in a.messages(b"ra")]
    got_b = [m["id"] for m in b.messages(b"rb")]
    assert len(got_a) == len(got_b) == 3
    assert sorted([got_a, got_b]) == [[b"rr0", b"rr2", b"rr4"], [b"rr1", b"rr3", b"rr5"]]
    # a burst in one read is shared message by message too (not one batch to one consumer)
    p.send(*[b"burst%d publish rr x" % i for i in range(100)])
    pump_until([a, b], lambda: len(a.messages(b"ra")) + len(b.messages(b"rb")) == 106,
               "the burst")
    assert len(a.messages(b"ra")) - 3 == len(b.messages(b"rb")) - 3 == 50


def test_delete_queue(conn: Connect) -> None:
    """Consumers get ``--update Q`` and nothing more; the queue and its messages are gone."""
    c, p = conn(), conn()
    c.confirm(b"qc", b"consume", b"xq11 xe11")
    p.confirm(b"qd", b"delete_queue", b"xq11")
    c.wait_line(b"qc ok --update xq11")
    p.confirm(b"qm", b"publish", b"xe11 lost")
    assert c.quiet(0.2) == [b"qc ok ", b"qc ok --update xq11"]


def test_eval_runs_nothing(conn: Connect, tmp_path: Path) -> None:
    """``_eval`` is a lookup table: code is never run; known stats answer from mqhub's counters."""
    s = conn()
    marker = tmp_path / "pwned"
    line = eval_(s, b"e1", b'__import__("os").getpid()')
    assert is_error(line, b"e1")
    line = eval_(s, b"e2", b'__import__("os").system("touch %s")' % str(marker).encode())
    assert is_error(line, b"e2") and not marker.exists()
    s.confirm(b"ec", b"consume", b"evq12 ev12")
    assert int(eval_(s, b"e3", b"len(state.queues)").split(b" ", 2)[2]) >= 1
    assert eval_(s, b"e4", b"--worker=0 len(state.consumers_by_queues['evq12'])") == b"e4 ok 1"
    assert is_error(eval_(s, b"e5", b"--worker=1 len(state.queues)"), b"e5")
    assert is_error(eval_(s, b"e6", b"len(state.queues) or 1"), b"e6")


def test_masks_bind_as_hub_patterns(conn: Connect) -> None:
    """An event with ``*`` binds as an MQKS mask over hub addresses (within one token)."""
    c, p = conn(), conn()
    c.confirm(b"mc", b"consume", b"mq13 user.*.seen")
    p.confirm(b"m1", b"publish", b"user.42.seen yes")
    p.confirm(b"m2", b"publish", b"user.42.x.seen no")
    assert c.wait_messages(b"mc", 1)[0]["event"] == b"user.42.seen"
    c.quiet(0.2)
    assert len(c.messages(b"mc")) == 1
    p.send(b"m3 publish user.*.seen bad")
    p.until(lambda ls: any(is_error(x, b"m3") for x in ls), "publishing a mask is an error")


def test_original_client_wire_behaviour_and_reconnect(broker: BrokerProcess) -> None:
    """The client/mqks.py behaviour: confirm by empty data, --update kept, consumer survives
    a dropped connection (reconnect, new consumer id, on_reconnect)."""
    client = MqksClient(broker.port("mqks", "tcp"))
    got: list[dict[str, str]] = []
    swaps: list[tuple[str, str]] = []
    try:
        cid = client.consume("cq14", ["ce14"], got.append, on_reconnect=lambda o, n: swaps.append((o, n)),
                             manual_ack=True, confirm=True)
        mid = client.publish("ce14", "hello", confirm=True)
        wait_until(lambda: len(got) == 1, "first message")
        assert (got[0]["id"], got[0]["event"], got[0]["data"]) == (mid, "ce14", "hello")
        client.ack(cid, mid, confirm=True)
        client.sock.shutdown(2)  # type: ignore[union-attr]  # the connection drops
        wait_until(lambda: len(swaps) == 1, "on_reconnect")
        assert swaps[0][0] == cid and swaps[0][1] != cid
        # the re-sent consume has no confirm: wait until the new consumer exists, then publish
        probe = MqksSocket(broker.port("mqks", "tcp"))
        wait_until(lambda: eval_(probe, b"p%d" % time.monotonic_ns(),
                                 b"len(state.consumers_by_queues['cq14'])").endswith(b" ok 1"),
                   "the re-consumed consumer")
        probe.close()
        mid2 = client.publish("ce14", "again", confirm=True)
        wait_until(lambda: len(got) == 2, "message after reconnect")
        assert got[1]["id"] == mid2 and got[1]["consumer"] == swaps[0][1]
        assert client.errors == []
    finally:
        client.close()
