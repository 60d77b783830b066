"""NSQ server behaviour over StringTransport, a memory hub and a Clock (no reactor, no sockets)."""

from __future__ import annotations

import json
import zlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.nsq import codec as w
from mqhub.protocols.nsq import snappy
from mqhub.protocols.nsq.auth import SecretsFile
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.server import render_messages
from mqhub.protocols.nsq.topics import queue_name, topic_address
from mqhub.testing import advance
from tests.unit.protocols.nsq.harness import Harness

OK = w.Response(b"OK")


def test_pub_ok_only_after_commit_and_in_order() -> None:
    """Pipelined PUBs are confirmed only once the store commit happened, in command order."""
    h = Harness()
    p = h.client()
    commits = h.hub.store.commits
    p.send(b"".join(w.encode_pub("orders", b"m%d" % i) for i in range(50)) + w.encode_pub("other", b"x"))
    assert p.frames() == []  # nothing confirmed before the group commit
    h.settle()
    assert p.frames() == [OK] * 51
    # 50 PUBs to one topic and one to another: two publish batches, one grouped store commit
    assert h.hub.store.commits - commits <= 2
    assert h.service.registry.topic_depth(h.service.registry.get_topic("orders")) == 50


def test_mpub_runs_are_one_publish_with_one_ok_per_mpub_in_order() -> None:
    """Consecutive MPUBs to one topic in one read become one core publish; every MPUB still
    gets its own OK, after the commit, in order with other commands' responses; a topic
    change, a PUB or a NOP ends the run."""
    h = Harness()
    p = h.client()
    registry = h.service.registry
    real_publish = registry.publish
    calls: list[tuple[str, int]] = []

    def counting(name: str, bodies: list[bytes], defer_ms: int = 0) -> Any:
        calls.append((name, len(bodies)))
        return real_publish(name, bodies, defer_ms)

    registry.publish = counting  # type: ignore[method-assign]
    run = b"".join(w.encode_mpub("t", [b"a%d-%d" % (i, j) for j in range(3)]) for i in range(4))
    p.send(run)
    assert p.frames() == []
    h.settle()
    assert p.frames() == [OK] * 4
    assert calls == [("t", 12)]
    p.send(run + w.encode_mpub("u", [b"u1"]) + w.encode_pub("t", b"p") + b"NOP\n"
           + w.encode_mpub("t", [b"z1", b"z2"]) + w.encode_mpub("t", [b"z3"]))
    h.settle()
    assert p.frames() == [OK] * 8   # 4 + u + PUB + 2 (NOP has no response)
    assert calls[1:] == [("t", 12), ("u", 1), ("t", 1), ("t", 3)]
    c = h.consumer("t", "c", rdy=100)
    h.settle()
    got = [f.body for f in c.frames()]
    assert got[:12] == [b"a%d-%d" % (i, j) for i in range(4) for j in range(3)]
    assert got[24:] == [b"p", b"z1", b"z2", b"z3"] and len(got) == 28


def test_topic_buffers_until_first_channel_then_fans_out() -> None:
    """A topic keeps messages until its first channel; later messages reach every channel."""
    h = Harness()
    p = h.client()
    p.send(w.encode_mpub("t", [b"a", b"b", b"c"]))
    h.settle()
    assert p.frames() == [OK]
    c1 = h.consumer("t", "one", rdy=10)
    h.settle()
    assert [f.body for f in c1.frames()] == [b"a", b"b", b"c"]
    c2 = h.consumer("t", "two", rdy=10)
    p.send(w.encode_pub("t", b"d"))
    h.settle()
    assert [f.body for f in c1.frames()] == [b"d"]
    assert [f.body for f in c2.frames()] == [b"d"]


def test_messages_frames_carry_id_attempts_timestamp() -> None:
    """A delivered message has a 16-hex-char id, attempts 1 and the publish time in ns."""
    h = Harness()
    c = h.consumer("t", "c", rdy=1)
    p = h.client()
    p.send(w.encode_pub("t", b"body"))
    h.settle()
    (msg,) = c.frames()
    assert isinstance(msg, w.Message)
    assert len(msg.msg_id) == 16 and int(msg.msg_id, 16) > 0
    assert msg.attempts == 1 and msg.body == b"body"
    assert abs(msg.timestamp_ns - int(h.clock.seconds() * 1e9)) < 2_000_000


def test_rdy_flow_control_and_fin_refills() -> None:
    """Only RDY messages are in flight; each FIN lets one more through; RDY 0 pauses."""
    h = Harness()
    p = h.client()
    p.send(w.encode_mpub("t", [b"%d" % i for i in range(5)]))
    c = h.consumer("t", "c", rdy=2)
    h.settle()
    first = c.frames()
    assert [f.body for f in first] == [b"0", b"1"]
    c.send(w.encode_fin(first[0].msg_id))
    h.settle()
    assert [f.body for f in c.frames()] == [b"2"]
    c.send(w.encode_rdy(0), w.encode_fin(first[1].msg_id))
    h.settle()
    assert c.frames() == []
    c.send(w.encode_rdy(5))
    h.settle()
    assert [f.body for f in c.frames()] == [b"3", b"4"]


def test_competing_consumers_share_a_channel() -> None:
    """Within one channel each message goes to exactly one client."""
    h = Harness()
    a = h.consumer("t", "c", rdy=100)
    b = h.consumer("t", "c", rdy=100)
    p = h.client()
    p.send(w.encode_mpub("t", [b"%d" % i for i in range(20)]))
    h.settle()
    got_a = [f.body for f in a.frames()]
    got_b = [f.body for f in b.frames()]
    assert sorted(got_a + got_b, key=int) == [b"%d" % i for i in range(20)]
    assert not set(got_a) & set(got_b)


def test_fin_unknown_is_non_fatal_and_bad_id_is_fatal() -> None:
    """FIN of an id not in flight gets E_FIN_FAILED and the connection stays; a short id is fatal."""
    h = Harness()
    c = h.consumer("t", "c", rdy=1)
    c.send(w.encode_fin(b"00000000000000ff"), w.encode_fin(b"zzzzzzzzzzzzzzzz"))
    assert c.frames() == [
        w.ErrorFrame("E_FIN_FAILED", "FIN 00000000000000ff failed ID not in flight"),
        w.ErrorFrame("E_FIN_FAILED", "FIN zzzzzzzzzzzzzzzz failed ID not in flight"),
    ]
    assert not c.closed
    c.send(w.encode_req(b"00000000000000ff", 0), w.encode_touch(b"00000000000000ff"), b"NOP\n")
    assert c.frames() == [
        w.ErrorFrame("E_REQ_FAILED", "REQ 00000000000000ff failed ID not in flight"),
        w.ErrorFrame("E_TOUCH_FAILED", "TOUCH 00000000000000ff failed ID not in flight"),
    ]
    assert not c.closed
    c.send(b"FIN 123\n")
    assert c.frames() == [w.ErrorFrame("E_INVALID", "invalid message ID")]
    assert c.closed


def test_req_with_delay_redelivers_later_with_attempts() -> None:
    """REQ with a timeout defers the message; it comes back after the delay with attempts 2."""
    h = Harness()
    c = h.consumer("t", "c", rdy=5)
    p = h.client()
    p.send(w.encode_pub("t", b"job"))
    h.settle()
    (msg,) = c.frames()
    c.send(w.encode_req(msg.msg_id, 2000))
    h.settle()
    h.clock.advance(1.5)
    assert c.frames() == []
    advance(h.clock, 2.0, step=0.2)
    (again,) = c.frames()
    assert again.msg_id == msg.msg_id and again.attempts == 2 and again.body == b"job"
    c.send(w.encode_req(again.msg_id, 0))
    h.settle()
    (third,) = c.frames()
    assert third.attempts == 3


def test_msg_timeout_redelivers_and_touch_extends() -> None:
    """A message not FINed within msg_timeout is redelivered; TOUCH resets the deadline."""
    h = Harness()
    c = h.consumer("t", "c", rdy=5, identify={"msg_timeout": 1000})
    p = h.client()
    p.send(w.encode_pub("t", b"slow"))
    h.settle()
    (msg,) = c.frames()
    h.clock.advance(0.8)
    c.send(w.encode_touch(msg.msg_id))
    h.clock.advance(0.8)
    assert c.frames() == []  # touched at 0.8: deadline now 1.8
    advance(h.clock, 1.0)
    (again,) = c.frames()
    assert again.msg_id == msg.msg_id and again.attempts == 2
    stats = h.service.registry.get_channel("t", "c").stats()
    assert stats["timeout_count"] == 1


def test_dpub_defers_delivery() -> None:
    """DPUB is confirmed at once (durably) and delivered only after its delay."""
    h = Harness()
    c = h.consumer("t", "c", rdy=5)
    p = h.client()
    p.send(w.encode_dpub("t", 3000, b"later"))
    h.settle()
    assert p.frames() == [OK]
    h.clock.advance(2.0)
    assert c.frames() == []
    advance(h.clock, 2.0)
    assert [f.body for f in c.frames()] == [b"later"]


def test_commands_in_wrong_state_are_fatal() -> None:
    """RDY/FIN/REQ/TOUCH/CLS before SUB, and SUB twice, get nsqd's fatal E_INVALID."""
    h = Harness()
    for raw, verb in [(b"RDY 1\n", "RDY"), (w.encode_fin(b"0" * 16), "FIN"),
                      (w.encode_req(b"0" * 16, 0), "REQ"), (w.encode_touch(b"0" * 16), "TOUCH"),
                      (b"CLS\n", "CLS")]:
        c = h.client()
        c.send(raw)
        assert c.frames() == [w.ErrorFrame("E_INVALID", f"cannot {verb} in current state")]
        assert c.closed
    c = h.consumer("t", "c")
    c.send(w.encode_sub("t", "c"))
    assert c.frames() == [w.ErrorFrame("E_INVALID", "cannot SUB in current state")]
    assert c.closed
    c = h.consumer("t", "c")
    c.send(w.encode_identify({}))
    assert c.frames() == [w.ErrorFrame("E_INVALID", "cannot IDENTIFY in current state")]


def test_rdy_out_of_range_is_fatal() -> None:
    """RDY above max_rdy_count (or negative) closes the connection with nsqd's text."""
    h = Harness()
    c = h.consumer("t", "c")
    c.send(b"RDY 2501\n")
    assert c.frames() == [w.ErrorFrame("E_INVALID", "RDY count 2501 out of range 0-2500")]
    assert c.closed
    c = h.consumer("t", "c")
    c.send(b"RDY 2500\n")
    assert c.frames() == [] and not c.closed


def test_malformed_input_closes_only_that_connection() -> None:
    """Garbage on one connection is fatal for it; another client's publishes and deliveries go on."""
    h = Harness()
    good = h.consumer("t", "c", rdy=10)
    producer = h.client()
    bad = h.client()
    producer.send(w.encode_pub("t", b"1"))
    bad.send(b"PUB bad!topic\n\x00\x00\x00\x01x")
    producer.send(w.encode_pub("t", b"2"))
    h.settle()
    assert bad.frames() == [w.ErrorFrame("E_BAD_TOPIC", 'PUB topic name "bad!topic" is not valid')]
    assert bad.closed
    assert producer.frames() == [OK, OK] and not producer.closed
    assert [f.body for f in good.frames()] == [b"1", b"2"]


def test_oversize_body_gets_bad_message() -> None:
    """A PUB over max_msg_size is refused with E_BAD_MESSAGE before its body is read."""
    h = Harness(NsqConfig(max_msg_size=100, hostname="h"))
    c = h.client()
    c.send(b"PUB t\n\x00\x00\x00\x65")
    assert c.frames() == [w.ErrorFrame("E_BAD_MESSAGE", "PUB message too big 101 > 100")]
    assert c.closed


def test_good_commands_before_a_bad_one_are_answered_first() -> None:
    """PUBs pipelined ahead of a malformed command still get their OK before the error."""
    h = Harness()
    c = h.client()
    c.send(w.encode_pub("t", b"a") + w.encode_pub("t", b"b") + b"WHAT\n")
    h.settle()
    assert c.frames() == [OK, OK, w.ErrorFrame("E_INVALID", "invalid command WHAT")]
    assert c.closed
    assert h.service.registry.topic_depth(h.service.registry.get_topic("t")) == 2


def test_bad_magic() -> None:
    """A client that does not open with '  V2' gets E_BAD_PROTOCOL and is closed."""
    h = Harness()
    c = h.client(magic=False)
    c.send(b"GET / HTTP/1.1\r\n\r\n")
    assert c.frames() == [w.ErrorFrame("E_BAD_PROTOCOL", "")]
    assert c.closed


def test_identify_feature_negotiation_has_nsqd_fields() -> None:
    """IDENTIFY with feature_negotiation answers nsqd's 13 fields echoing negotiated values."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "msg_timeout": 5000, "sample_rate": 50,
                              "output_buffer_size": 1024, "output_buffer_timeout": 100,
                              "tls_v1": True, "snappy": False, "client_id": "me"}))
    (frame,) = c.frames()
    data = json.loads(frame.data)
    assert list(data) == ["max_rdy_count", "version", "max_msg_timeout", "msg_timeout", "tls_v1",
                          "deflate", "deflate_level", "max_deflate_level", "snappy", "sample_rate",
                          "auth_required", "output_buffer_size", "output_buffer_timeout"]
    assert data["max_rdy_count"] == 2500 and data["max_msg_timeout"] == 900000
    assert data["msg_timeout"] == 5000 and data["sample_rate"] == 50
    assert data["output_buffer_size"] == 1024 and data["output_buffer_timeout"] == 100
    assert data["tls_v1"] is False  # no certificate configured: declined
    assert data["snappy"] is False  # not asked for
    assert data["auth_required"] is False
    c.send(w.encode_identify({"client_id": "again"}))
    assert c.frames() == [OK]  # without negotiation: plain OK, and IDENTIFY may be repeated


def test_identify_minus_one_disables_buffering() -> None:
    """output_buffer_size -1 disables buffering (timeout 0); an explicit timeout still wins."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "output_buffer_size": -1}))
    data = json.loads(c.frames()[0].data)
    assert (data["output_buffer_size"], data["output_buffer_timeout"]) == (-1, 0)
    c.send(w.encode_identify({"feature_negotiation": True, "output_buffer_size": -1,
                              "output_buffer_timeout": -1}))
    data = json.loads(c.frames()[0].data)
    assert (data["output_buffer_size"], data["output_buffer_timeout"]) == (-1, -1)


def test_identify_bad_values_are_fatal_bad_body() -> None:
    """Out-of-range IDENTIFY values and bad JSON get E_BAD_BODY and close."""
    h = Harness()
    for body, text in [({"heartbeat_interval": 500}, "IDENTIFY heartbeat interval (500) is invalid"),
                       ({"msg_timeout": 999}, "IDENTIFY msg timeout (999) is invalid"),
                       ({"sample_rate": 100}, "IDENTIFY sample rate (100) is invalid"),
                       ({"output_buffer_size": 10}, "IDENTIFY output buffer size (10) is invalid"),
                       ({"output_buffer_timeout": 10},
                        "IDENTIFY output buffer timeout (10) is invalid"),
                       ({"msg_timeout": -1}, "IDENTIFY msg timeout (-1) is invalid")]:
        c = h.client()
        c.send(w.encode_identify(body))
        assert c.frames() == [w.ErrorFrame("E_BAD_BODY", text)]
        assert c.closed
    c = h.client()
    c.send(b"IDENTIFY\n\x00\x00\x00\x03{x}")
    assert c.frames() == [w.ErrorFrame("E_BAD_BODY", "IDENTIFY failed to decode JSON body")]


def test_heartbeats_and_idle_close() -> None:
    """Heartbeats go out every interval; a client silent for two intervals is closed."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"heartbeat_interval": 1000}))
    assert c.frames() == [OK]
    h.clock.advance(1.0)
    assert c.frames() == [w.Response(b"_heartbeat_")]
    c.send(b"NOP\n")
    h.clock.advance(1.0)
    assert c.frames() == [w.Response(b"_heartbeat_")]
    assert not c.closed
    h.clock.advance(1.0)
    assert c.closed
    assert c.frames() == []  # no error frame on an idle close, like nsqd


def test_sub_refused_with_heartbeats_disabled() -> None:
    """SUB needs heartbeats."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"heartbeat_interval": -1}), w.encode_sub("t", "c"))
    assert c.frames() == [OK, w.ErrorFrame("E_INVALID", "cannot SUB with heartbeats disabled")]


def test_cls_stops_delivery() -> None:
    """CLS answers CLOSE_WAIT, leaves the socket open and sends no more messages."""
    h = Harness()
    c = h.consumer("t", "c", rdy=10)
    c.send(b"CLS\n")
    assert c.frames() == [w.Response(b"CLOSE_WAIT")]
    p = h.client()
    p.send(w.encode_pub("t", b"x"))
    h.settle()
    assert c.frames() == [] and not c.closed
    c.send(b"RDY 5\n")  # ignored after CLS
    h.settle()
    assert c.frames() == []


def test_disconnect_returns_in_flight_messages() -> None:
    """Messages in flight on a client that goes away are delivered to another client."""
    h = Harness()
    a = h.consumer("t", "c", rdy=10)
    p = h.client()
    p.send(w.encode_mpub("t", [b"1", b"2"]))
    h.settle()
    assert len(a.frames()) == 2
    a.lose()
    b = h.consumer("t", "c", rdy=10)
    h.settle()
    got = b.frames()
    assert sorted(f.body for f in got) == [b"1", b"2"]
    assert all(f.attempts == 2 for f in got)


def test_ephemeral_channel_and_topic_removed_with_last_client() -> None:
    """#ephemeral channels are memory-tier and go with their last client; so does an ephemeral topic."""
    h = Harness()
    c = h.consumer("e#ephemeral", "c#ephemeral", rdy=1)
    reg = h.service.registry
    queue = reg.get_channel("e#ephemeral", "c#ephemeral")
    assert queue.tier == "memory"
    c.lose()
    h.settle()
    assert reg.get_topic("e#ephemeral") is None
    assert h.hub.broker.queue(queue_name("e#ephemeral", "c#ephemeral")) is None
    d = h.consumer("t", "c#ephemeral")
    assert reg.get_channel("t", "c#ephemeral").tier == "memory"
    d.lose()
    h.settle()
    assert reg.get_topic("t") is not None and reg.get_channel("t", "c#ephemeral") is None


def test_cross_protocol_publish_reaches_nsq_channels() -> None:
    """A publish on address 'orders' by any protocol reaches NSQ topic orders' channels."""
    h = Harness()
    c = h.consumer("orders", "billing", rdy=10)
    h.hub.broker.publish_batch("orders", [b"from-nats"], origin="mq9")
    h.settle()
    assert [f.body for f in c.frames()] == [b"from-nats"]
    assert topic_address("a..b#ephemeral") == "a.~.b~ephemeral"


def test_pause_topic_and_channel() -> None:
    """A paused topic or channel holds its messages until unpaused."""
    h = Harness()
    c = h.consumer("t", "c", rdy=10)
    reg = h.service.registry
    reg.pause_topic("t", True)
    p = h.client()
    p.send(w.encode_pub("t", b"held"))
    h.settle()
    assert p.frames() == [OK] and c.frames() == []
    reg.pause_topic("t", False)
    h.settle()
    assert [f.body for f in c.frames()] == [b"held"]
    reg.get_channel("t", "c").pause()
    p.send(w.encode_pub("t", b"again"))
    h.settle()
    assert c.frames() == []
    reg.get_channel("t", "c").unpause()
    h.settle()
    assert [f.body for f in c.frames()] == [b"again"]


def test_max_channel_consumers() -> None:
    """Over the consumer limit SUB fails with E_SUB_FAILED."""
    h = Harness(NsqConfig(max_channel_consumers=1, hostname="h"))
    h.consumer("t", "c")
    c = h.client()
    c.send(w.encode_sub("t", "c"))
    assert c.frames() == [w.ErrorFrame("E_SUB_FAILED", "SUB failed consumers for t:c exceeds limit of 1")]
    assert c.closed


def test_deflate_stream() -> None:
    """After deflate negotiation both directions are raw DEFLATE with sync flushes."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "deflate": True, "deflate_level": 9}))
    raw = c.transport.value()
    c.transport.clear()
    decoder = w.ClientCodec()
    size = int.from_bytes(raw[:4], "big")
    decoder.receive_data(raw[:4 + size])
    (reply,) = decoder.frames()
    negotiated = json.loads(reply.data)
    assert negotiated["deflate"] is True and negotiated["deflate_level"] == 6
    inflate = zlib.decompressobj(-15)
    decoder.receive_data(inflate.decompress(raw[4 + size:]))
    assert decoder.frames() == [OK]
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    c.send(deflate.compress(w.encode_pub("t", b"z" * 1000)) + deflate.flush(zlib.Z_SYNC_FLUSH))
    h.settle()
    decoder.receive_data(inflate.decompress(c.transport.value()))
    assert decoder.frames() == [OK]


def test_auth_with_secrets_file() -> None:
    """With a secrets file: auth_required, AUTH first, grants per topic, nsqd's errors."""
    secrets = SecretsFile.parse({"secrets": {
        "good": {"identity": "alice", "authorizations": [
            {"topic": "^orders$", "channels": ["^billing$"], "permissions": ["publish", "subscribe"]}]},
        "none": {"identity": "bob", "authorizations": []},
    }})
    h = Harness(secrets=secrets)
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True}))
    assert json.loads(c.frames()[0].data)["auth_required"] is True
    c.send(w.encode_pub("orders", b"x"))
    assert c.frames() == [w.ErrorFrame("E_AUTH_FIRST", "AUTH required before PUB")] and c.closed
    c = h.client()
    c.send(w.encode_auth(b"wrong"))
    assert c.frames() == [w.ErrorFrame("E_AUTH_FAILED", "AUTH failed")] and c.closed
    c = h.client()
    c.send(w.encode_auth(b"none"))
    assert c.frames() == [w.ErrorFrame("E_UNAUTHORIZED", "AUTH no authorizations found")]
    c = h.client()
    c.send(w.encode_auth(b"good"))
    assert json.loads(c.frames()[0].data) == {"identity": "alice", "identity_url": "",
                                              "permission_count": 1}
    c.send(w.encode_pub("orders", b"x"))
    h.settle()
    assert c.frames() == [OK]
    c.send(w.encode_pub("secret", b"x"))
    assert c.frames() == [w.ErrorFrame("E_UNAUTHORIZED", 'AUTH failed for PUB on "secret" ""')]
    c = h.client()
    c.send(w.encode_auth(b"good"), w.encode_sub("orders", "other"))
    assert c.frames()[-1] == w.ErrorFrame("E_UNAUTHORIZED", 'AUTH failed for SUB on "orders" "other"')
    h2 = Harness()
    c = h2.client()
    c.send(w.encode_auth(b"good"))
    assert c.frames() == [w.ErrorFrame("E_AUTH_DISABLED", "AUTH disabled")]


def test_publish_failure_is_fatal_and_never_ok() -> None:
    """When the store refuses a batch the client gets E_PUB_FAILED, never OK."""
    h = Harness()
    c = h.client()
    c.send(w.encode_pub("t", b"first"))
    h.settle()
    assert c.frames() == [OK]
    h.hub.store.close()
    c.send(w.encode_pub("t", b"lost"))
    h.settle()
    frames = c.frames()
    assert OK not in frames
    assert frames and isinstance(frames[0], w.ErrorFrame) and frames[0].code == "E_PUB_FAILED"
    assert c.closed


def test_deleting_a_channel_closes_its_clients() -> None:
    """A channel deleted through the admin API disconnects its consumers; others stay."""
    h = Harness()
    doomed = h.consumer("t", "gone", rdy=5)
    other = h.consumer("t", "kept", rdy=5)
    h.service.registry.delete_channel("t", "gone")
    h.settle()
    assert doomed.closed and not other.closed
    p = h.client()
    p.send(w.encode_pub("t", b"after"))
    h.settle()
    assert [f.body for f in other.frames()] == [b"after"]
    h.service.registry.delete_topic("t")
    h.settle()
    assert other.closed


def test_dpub_before_first_channel_is_delivered_after_its_delay() -> None:
    """A DPUB to a topic with no channel yet reaches the channel created before it is due."""
    h = Harness()
    p = h.client()
    p.send(w.encode_dpub("t", 1000, b"later"))
    h.settle()
    assert p.frames() == [OK]
    c = h.consumer("t", "c", rdy=5)
    h.clock.advance(0.5)
    h.settle()
    assert c.frames() == []  # not before its time
    advance(h.clock, 1.0)
    h.settle()  # the core routes the due batch to the channel bound by then: no sweep
    assert [f.body for f in c.frames()] == [b"later"]
    assert h.service.registry.topic_depth(h.service.registry.topics["t"]) == 0


def test_topic_empty_drops_held_messages_and_pending_delays() -> None:
    """/topic/empty (registry.empty_topic) drops what a channel-less topic holds, delays included."""
    h = Harness()
    p = h.client()
    p.send(w.encode_pub("t", b"held"), w.encode_dpub("t", 1000, b"delayed"))
    h.settle()
    assert p.frames() == [OK, OK]
    assert h.service.registry.topic_depth(h.service.registry.topics["t"]) == 1
    h.service.registry.empty_topic("t")
    h.settle()
    assert h.service.registry.topic_depth(h.service.registry.topics["t"]) == 0
    c = h.consumer("t", "c", rdy=5)
    advance(h.clock, 1.5)
    h.settle()
    assert c.frames() == []  # neither the held message nor the delayed one arrives
    p.send(w.encode_pub("t", b"fresh"))
    h.settle()
    assert [f.body for f in c.frames()] == [b"fresh"]


def test_producer_far_ahead_of_commits_is_paused_then_resumed() -> None:
    """Reading pauses while too many published messages wait for their commit, then resumes."""
    from mqhub.protocols.nsq import server

    h = Harness()
    p = h.client()
    bodies = [b"x"] * 300
    p.send(b"".join(w.encode_mpub("t", bodies) for _ in range(server.MAX_UNCONFIRMED // 300 + 2)))
    assert p.transport.producerState == "paused"
    h.settle()
    assert p.transport.producerState == "producing"
    assert set(p.frames()) == {OK}


_FUZZ_SEEDS = [
    w.encode_pub("t", b"x"), w.encode_mpub("t", [b"a", b"b"]), w.encode_dpub("t", 5, b"d"),
    w.encode_sub("t", "c"), b"RDY 3\n", w.encode_fin(b"0" * 16), w.encode_req(b"0" * 16, 1),
    w.encode_touch(b"0" * 16), b"CLS\n", b"NOP\n", w.encode_identify({"feature_negotiation": True}),
    w.encode_auth(b"s"),
]


def test_fuzzed_connections_never_break_the_broker() -> None:
    """Random mixes and mutations of commands only ever produce NSQ frames; a good client is unaffected."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    h = Harness()
    good = h.consumer("t", "good", rdy=2500)
    producer = h.client()
    sent = [0]

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.one_of(st.sampled_from(_FUZZ_SEEDS), st.binary(max_size=40)), max_size=12),
           st.integers(0, 40), st.binary(max_size=6))
    def scenario(parts: list[bytes], at: int, junk: bytes) -> None:
        """One fuzzed connection, then one good publish."""
        stream = b"".join(parts)
        if stream:
            at = min(at, len(stream) - 1)
            stream = stream[:at] + junk + stream[at + len(junk):]
        c = h.client()
        c.send(stream)
        h.clock.advance(0.05)
        decoder = w.ClientCodec()
        decoder.receive_data(c.transport.value())
        for frame in decoder.frames():  # everything written is a well-formed NSQ frame
            assert isinstance(frame, (w.Response, w.ErrorFrame, w.Message))
        c.lose()
        producer.send(w.encode_pub("t", b"ok"))
        sent[0] += 1
        h.settle()

    scenario()
    got = [f for f in good.frames() if isinstance(f, w.Message) and f.body == b"ok"]
    assert len(got) == sent[0]
    assert set(producer.frames()) == {OK}


def test_req_delay_and_dpub_survive_a_restart_of_the_hub() -> None:
    """Deferred REQ and DPUB live in the store's due index: after a restart they come back on time."""
    from mqhub.protocols.nsq.service import NsqService
    from mqhub.testing import restart_hub

    h = Harness()
    c = h.consumer("t", "c", rdy=5)
    p = h.client()
    p.send(w.encode_pub("t", b"retry"), w.encode_dpub("t", 5000, b"later"))
    h.settle()
    (msg,) = c.frames()
    c.send(w.encode_req(msg.msg_id, 5000))
    h.settle()
    hub = restart_hub(h.hub)
    service = NsqService(hub, {"tcp": "tcp:0", "http": ""}, h.config)
    service.registry.load()
    h.clock.advance(0)
    assert service.registry.get_channel("t", "c") is not None  # recovered from the store
    h.service = service
    c2 = h.consumer("t", "c", rdy=5)
    h.clock.advance(2)
    assert c2.frames() == []  # still deferred after the restart
    advance(h.clock, 4.0)
    got = {f.body: f for f in c2.frames()}
    assert set(got) == {b"retry", b"later"}
    assert got[b"retry"].attempts == 2 and got[b"later"].attempts == 1


def test_snappy_stream() -> None:
    """With a snappy library, both directions become snappy framed streams after IDENTIFY."""
    import cramjam

    assert snappy.available()
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "snappy": True}))
    raw = c.transport.value()
    c.transport.clear()
    size = int.from_bytes(raw[:4], "big")
    assert json.loads(raw[8:4 + size])["snappy"] is True
    decoder = w.ClientCodec()
    unsnappy = snappy.SnappyDecoder()  # the client's side of the stream
    decoder.receive_data(unsnappy.decode(raw[4 + size:]))
    assert decoder.frames() == [OK]
    stream = bytes(cramjam.snappy.compress(w.encode_pub("t", b"s" * 5000) + w.encode_sub("t", "c")
                                           + w.encode_rdy(1)))
    for i in range(0, len(stream), 7):  # chunks split anyhow
        c.send(stream[i:i + 7])
    h.settle()
    decoder.receive_data(unsnappy.decode(c.transport.value()))
    frames = decoder.frames()
    assert frames.count(OK) == 2  # PUB and SUB
    assert [f.body for f in frames if isinstance(f, w.Message)] == [b"s" * 5000]
    c.send(b"\x02\x00\x00\x00")  # a reserved chunk type is fatal
    assert c.closed


def test_snappy_and_deflate_together_are_refused() -> None:
    """Asking both compressions is nsqd's fatal E_IDENTIFY_FAILED (when both are available)."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
    assert c.frames() == [w.ErrorFrame("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")]
    assert c.closed


def _entry(msg_id: int, attempts: int, body: bytes) -> tuple:
    """A core entry tuple with the fields render_messages reads."""
    return (msg_id, 0, attempts, 0.0, 0.0, "nsq.t", None, body, "nsq")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, 65535),
                          st.binary(max_size=40)), min_size=1, max_size=30),
       st.sampled_from(["any", "one_ms", "one_ms_unsorted", "ms_runs", "ms_runs_unsorted"]),
       st.lists(st.integers(0, 3), min_size=150, max_size=150),
       st.integers(0, 40), st.integers(1, 150))
def test_render_messages_frames_each_entry(spec: list[tuple[int, int, bytes]], shape: str,
                                           steps: list[int], size: int, count: int) -> None:
    """Batch rendering (shared-head paths, column scatter for many small bodies, or neither)
    decodes to one exact frame per entry."""
    base = spec[0][0] & ~((1 << 22) - 1)
    if shape.startswith("one_ms"):  # one millisecond, size and attempts value: one shared head
        spec = [(base + i, spec[0][1], (b"%08d" % i * 6)[:size]) for i in range(count)]
        if shape == "one_ms_unsorted":
            spec.reverse()
    elif shape.startswith("ms_runs"):  # one size and attempts, ids over several milliseconds
        ms = [sum(steps[:i + 1]) for i in range(count)]
        ids = [base + (m << 22) + i for i, m in enumerate(ms)]
        if shape == "ms_runs_unsorted":
            ids.reverse()
        spec = [(m, spec[0][1], (b"%08d" % i * 6)[:size]) for i, m in enumerate(ids)]
    entries = [_entry(m, a, b) for m, a, b in spec]
    dec = w.ClientCodec()
    dec.receive_data(render_messages(entries))
    assert dec.frames() == [
        w.Message((1577836800000 + (m >> 22)) * 1_000_000, a, w.render_id(m), b) for m, a, b in spec]
    assert render_messages([]) == b""


def test_fin_runs_mixed_with_odd_ids_answer_in_order() -> None:
    """FINs taken by the fast path, a FIN with a non-hex id and an unknown id answer in order."""
    h = Harness()
    c = h.consumer("t", "c", rdy=10)
    p = h.client()
    p.send(w.encode_mpub("t", [b"a", b"b", b"c"]))
    h.settle()
    got = [f.msg_id for f in c.frames() if isinstance(f, w.Message)]
    assert len(got) == 3
    c.send(b"".join([w.encode_fin(got[0]), w.encode_fin(b"00000000000000ff"),
                     w.encode_fin(b"zzzzzzzzzzzzzzzz"), w.encode_fin(got[1]),
                     w.encode_fin(got[2].upper())]))
    assert c.frames() == [
        w.ErrorFrame("E_FIN_FAILED", "FIN 00000000000000ff failed ID not in flight"),
        w.ErrorFrame("E_FIN_FAILED", "FIN zzzzzzzzzzzzzzzz failed ID not in flight"),
    ]
    assert h.factory.hub.broker.queue(queue_name("t", "c")).in_flight == 0
    assert not c.closed


def test_fin_req_touch_of_another_clients_message_say_client_does_not_own_it() -> None:
    """As nsqd: a message in flight on another client fails with "client does not own message"."""
    h = Harness()
    a = h.consumer("t", "c", rdy=1)
    b = h.consumer("t", "c", rdy=0)
    p = h.client()
    p.send(w.encode_pub("t", b"m"))
    h.settle()
    (msg,) = [f for f in a.frames() if isinstance(f, w.Message)]
    b.send(w.encode_fin(msg.msg_id), w.encode_req(msg.msg_id, 0), w.encode_touch(msg.msg_id))
    text = msg.msg_id.decode()
    assert b.frames() == [
        w.ErrorFrame("E_FIN_FAILED", f"FIN {text} failed client does not own message"),
        w.ErrorFrame("E_REQ_FAILED", f"REQ {text} failed client does not own message"),
        w.ErrorFrame("E_TOUCH_FAILED", f"TOUCH {text} failed client does not own message"),
    ]
    assert not b.closed
    a.send(w.encode_fin(msg.msg_id))
    assert a.frames() == []  # the owner still holds it and finishes it
    a.send(w.encode_fin(msg.msg_id))
    assert a.frames() == [w.ErrorFrame("E_FIN_FAILED", f"FIN {text} failed ID not in flight")]


def test_channels_keep_mem_queue_size_messages_in_memory() -> None:
    """A durable channel's core window is NsqConfig.mem_queue_size (0: the broker's default)."""
    h = Harness(NsqConfig(hostname="test-host", mem_queue_size=1234))
    h.consumer("t", "c")
    queue = h.factory.hub.broker.queue(queue_name("t", "c"))
    assert queue.window == 1234 and queue.window_setting == 1234
    ephemeral = h.service.registry.ensure_channel("t", "e#ephemeral")
    assert not ephemeral.durable
    default = Harness(NsqConfig(hostname="test-host", mem_queue_size=0))
    default.consumer("t", "c")
    assert default.factory.hub.broker.queue(queue_name("t", "c")).window == \
        default.factory.hub.broker.window


def test_recovered_channel_takes_the_configured_window() -> None:
    """A channel queue made with another window (older run, other setting) is reconfigured on load."""
    from mqhub.protocols.nsq.topics import TopicRegistry

    h = Harness()
    broker = h.factory.hub.broker
    old = broker.declare_queue(queue_name("t", "old"), window=0)
    assert old.window_setting == 0
    registry = TopicRegistry(broker, h.factory.hub.store, channel_window=777)
    registry.load()
    h.settle()
    assert registry.get_channel("t", "old") is old
    assert old.window == 777 and old.settings()["window"] == 777
