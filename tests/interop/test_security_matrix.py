"""The rights matrix over real clients: pynsq, nats-py, the MQKS and VibeMQ test clients and
eventmq × {publish, subscribe/consume} × {allowed user, denied user, anonymous allowed,
anonymous refused}. Each refusal must carry the protocol's own error, and the refused
connection and every other client must keep working (docs/security.md).

One broker per protocol set: ``open_hub`` has ``[anonymous]`` (MQKS and plain eMQP clients
are anonymous there); ``closed_hub`` has no ``[anonymous]``, runs MQKS as the listener-level
user alice (``--option mqks.user=alice``) and eMQP over CURVE with the users' keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nsq
import pytest
import zmq

from mqhub.protocols.vibemq import codec as vc
from tests.interop.broker import BrokerProcess, wait_until
from tests.interop.mqks_client import MqksSocket
from tests.interop.nsq_client import NsqSocket
from tests.interop.security_support import (
    Keys,
    NatsErrors,
    RecordingReader,
    V,
    collector,
    dealer,
    inform,
    mqks_refused,
    next_request,
    nsq_call,
    nsq_close,
    nsq_writer,
    quiet,
    run,
    start_broker,
    until,
)
from tests.interop.vibemq_client import ConnectionFailed, SocketClient, VibeError
from tests.unit.protocols.emqp.interop_support import Client, job_body

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """The CURVE certificates of the module."""
    return Keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def open_hub(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Iterator[BrokerProcess]:
    """Every protocol; users alice and bob, and [anonymous]."""
    broker = start_broker(tmp_path_factory.mktemp("open"), keys.users(anonymous=True))
    yield broker
    broker.close()
    print(broker.output()[-20000:])


@pytest.fixture(scope="module")
def closed_hub(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Iterator[BrokerProcess]:
    """No [anonymous]; MQKS acts as alice; eMQP speaks CURVE."""
    broker = start_broker(tmp_path_factory.mktemp("closed"), keys.users(anonymous=False),
                          "--option", "mqks.user=alice",
                          "--option", f"emqp.curve_secret_file={keys.paths['server']}")
    yield broker
    broker.close()
    print(broker.output()[-20000:])


def test_nsq_pynsq(open_hub: BrokerProcess) -> None:
    """AUTH with a users-file token; E_UNAUTHORIZED for a refused PUB or SUB keeps the
    connection (the next command works), and the other clients go on."""

    async def scenario() -> None:
        alice = await nsq_writer(open_hub, "alice-token")
        anon = await nsq_writer(open_hub, None)
        assert await nsq_call(alice.pub, "orders.nsq", b"o1") == b"OK"          # allowed user
        refused = await nsq_call(alice.pub, "payroll.nsq", b"p1")               # denied user
        assert isinstance(refused, nsq.Error) and "E_UNAUTHORIZED" in str(refused)
        assert 'PUB on "payroll.nsq"' in str(refused)
        assert await nsq_call(alice.pub, "orders.nsq", b"o2") == b"OK"          # still works
        assert await nsq_call(anon.pub, "public.nsq", b"pub1") == b"OK"         # anon allowed
        refused = await nsq_call(anon.pub, "orders.nsq", b"x")                  # anon refused
        assert isinstance(refused, nsq.Error) and "E_UNAUTHORIZED" in str(refused)
        assert await nsq_call(anon.pub, "public.nsq", b"pub2") == b"OK"
        readers = {"alice": RecordingReader(open_hub, "orders.nsq", "alice-token"),
                   "anon": RecordingReader(open_hub, "public.nsq", None),
                   "alice_denied": RecordingReader(open_hub, "payroll.nsq", "alice-token"),
                   "anon_denied": RecordingReader(open_hub, "orders.nsq", None)}
        try:
            await until(lambda: readers["alice"].bodies == [b"o1", b"o2"], "alice's orders")
            await until(lambda: readers["anon"].bodies == [b"pub1", b"pub2"], "public")
            for name in ("alice_denied", "anon_denied"):
                await until(lambda n=name: any("E_UNAUTHORIZED" in e for e in readers[n].errors),
                            f"{name}'s SUB refusal")
            assert await nsq_call(alice.pub, "orders.nsq", b"o3") == b"OK"
            await until(lambda: readers["alice"].bodies[-1:] == [b"o3"], "a later message")
            assert not readers["anon_denied"].bodies and not readers["alice_denied"].bodies
        finally:
            for r in readers.values():
                r.close()
            nsq_close(alice)
            nsq_close(anon)

    run(scenario)
    # the refused SUB left the connection usable: a raw client SUBs again on the same socket
    sock = NsqSocket(open_hub.port("nsq", "tcp"))
    from mqhub.protocols.nsq import codec as w
    sock.send(w.encode_sub("orders.raw", "ch"))
    frames = sock.read_until(lambda fs: bool(fs), "SUB answer")
    assert frames[0] == w.ErrorFrame("E_UNAUTHORIZED", 'AUTH failed for SUB on "orders.raw" "ch"')
    sock.send(w.encode_sub("public.raw", "ch"))
    assert sock.read_until(lambda fs: bool(fs), "second SUB") == [w.Response(b"OK")]
    sock.close()


def test_nats_py(open_hub: BrokerProcess) -> None:
    """user/password, token and anonymous CONNECTs; nats-server's Permissions Violation for a
    refused PUB or SUB (wildcards included) leaves the client connected."""
    url = f"nats://127.0.0.1:{open_hub.port('mq9', 'tcp')}"

    async def scenario() -> None:
        errors = {"alice": NatsErrors(), "anon": NatsErrors()}
        alice = await nats.connect(url, user="alice", password="alice-pw",
                                   error_cb=errors["alice"].cb)
        anon = await nats.connect(url, error_cb=errors["anon"].cb)
        token = await nats.connect(url, token="bob-token")
        got: dict[str, list[Any]] = {k: [] for k in ("alice", "anon", "bob", "alice_all",
                                                     "anon_orders")}
        await alice.subscribe("orders.*", cb=collector(got["alice"]))            # allowed
        await alice.subscribe(">", cb=collector(got["alice_all"]))               # denied user
        await anon.subscribe("public.>", cb=collector(got["anon"]))              # anon allowed
        await anon.subscribe("orders.nats", cb=collector(got["anon_orders"]))    # anon refused
        await token.subscribe(">", cb=collector(got["bob"]))
        for nc in (alice, anon, token):
            await nc.flush()
        await until(lambda: any('permissions violation for subscription to ">"' in t for t in errors["alice"].texts),
                    "alice's SUB > refusal")
        await until(lambda: any('permissions violation for subscription to "orders.nats"' in t
                                for t in errors["anon"].texts), "anonymous SUB refusal")
        await alice.publish("orders.nats", b"o")                                  # allowed
        await alice.publish("payroll.nats", b"p")                                 # denied user
        await anon.publish("public.nats", b"a")                                   # anon allowed
        await anon.publish("orders.nats", b"x")                                   # anon refused
        for nc in (alice, anon):
            await nc.flush()
        await until(lambda: any('permissions violation for publish to "payroll.nats"' in t
                                for t in errors["alice"].texts), "alice's PUB refusal")
        await until(lambda: any('permissions violation for publish to "orders.nats"' in t
                                for t in errors["anon"].texts), "anonymous PUB refusal")
        await until(lambda: [m.data for m in got["bob"]] == [b"o", b"a"], "bob sees both")
        assert [m.data for m in got["alice"]] == [b"o"] and [m.data for m in got["anon"]] == [b"a"]
        assert not got["alice_all"] and not got["anon_orders"]
        assert alice.is_connected and anon.is_connected
        # the refused clients keep working: request/reply through their _INBOX subscriptions
        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)

        await alice.subscribe("orders.echo", cb=echo)
        await token.subscribe("public.echo", cb=echo)
        assert (await alice.request("orders.echo", b"ping", timeout=5)).data == b"ping"
        assert (await anon.request("public.echo", b"pong", timeout=5)).data == b"pong"
        for nc in (alice, anon, token):
            await nc.close()

    run(scenario)


def test_mqks_client(open_hub: BrokerProcess, closed_hub: BrokerProcess) -> None:
    """MQKS as anonymous (open hub) and as the listener's user alice (closed hub): a refused
    publish or consume (masks included) is an error line; the connection goes on."""
    mqks_cells(open_hub, b"public.mqks", b"orders.mqks")       # anonymous
    mqks_cells(closed_hub, b"orders.mqks", b"payroll.mqks")    # the listener's user, alice


def mqks_cells(broker: BrokerProcess, ok_event: bytes, bad_event: bytes) -> None:
    """Consume and publish, allowed and refused, on one MQKS connection."""
    c = MqksSocket(broker.port("mqks", "tcp"))
    c.confirm(b"c1", b"consume", b"q1 " + ok_event)                           # allowed
    c.send(b"c2 consume --confirm q2 " + bad_event)                           # refused
    wait_until(lambda: mqks_refused(c, b"c2"), "refused consume")
    c.send(b"c3 consume --confirm q3 " + bad_event.split(b".")[0][:3] + b"*.>")  # a mask
    wait_until(lambda: mqks_refused(c, b"c3"), "refused mask")
    c.confirm(b"p1", b"publish", ok_event + b" hello")                        # allowed
    c.send(b"p2 publish --confirm " + bad_event + b" nope")                   # refused
    wait_until(lambda: mqks_refused(c, b"p2"), "refused publish")
    c.confirm(b"p3", b"publish", ok_event + b" again")
    assert [m["data"] for m in c.wait_messages(b"c1", 2)] == [b"hello", b"again"]
    assert not c.messages(b"c2") and not c.messages(b"c3")
    c.send(b"p4 ping x")
    c.wait_line(b"p4 ok x")                                                   # still open
    c.close()


def test_vibemq_client(open_hub: BrokerProcess) -> None:
    """Connect with a users-file password, or none (anonymous); NOT_AUTHORIZED for a refused
    Publish or Subscribe keeps the connection."""
    port = open_hub.port("vibemq", "tcp")
    alice, anon, bob = SocketClient(port), SocketClient(port), SocketClient(port)
    alice.connect("alice", "alice-pw")
    anon.connect()
    bob.connect("bob", "bob-pw")
    alice.subscribe("orders.vibe")                                               # allowed
    anon.subscribe("public.vibe")                                                # anon allowed
    for client, queue in ((alice, "payroll.vibe"), (anon, "orders.vibe")):       # refused
        with pytest.raises(VibeError) as refused:
            client.subscribe(queue)
        assert refused.value.code == "NOT_AUTHORIZED"
    alice.publish("orders.vibe", {"n": 1})
    anon.publish("public.vibe", {"n": 2})
    for client, queue in ((alice, "payroll.vibe"), (anon, "orders.vibe")):
        with pytest.raises(VibeError) as refused:
            client.publish(queue, {"secret": True})
        assert refused.value.code == "NOT_AUTHORIZED"
    assert json.loads(alice.receive(1, ack=True)[0].payload) == {"n": 1}
    assert json.loads(anon.receive(1, ack=True)[0].payload) == {"n": 2}
    bob.publish("orders.vibe", {"n": 3})                                         # others go on
    assert json.loads(alice.receive(1, ack=True)[0].payload) == {"n": 3}
    assert alice.ping().type == vc.PONG and anon.ping().type == vc.PONG
    stranger = SocketClient(port)
    with pytest.raises(ConnectionFailed) as failed:
        stranger.connect("alice", "wrong")
    assert failed.value.code == "AUTH_FAILED"
    stranger.connect("alice", "alice-pw")                 # the socket stays open, as VibeMQ's
    for c in (alice, anon, bob, stranger):
        c.sock.close()


def test_emqp_eventmq(open_hub: BrokerProcess) -> None:
    """eventmq's client as anonymous (no CURVE): REQUESTs to a queue it may use run; others
    get a PermissionError result; a worker serves only queues it may take; PUB carries only
    what anonymous subscribers may read."""
    from eventmq.client.messages import send_request

    backend = open_hub.url("emqp", "backend")
    worker, acked = inform(backend, "public")                                    # anon allowed
    _, refused_ack = inform(backend, "orders")                                   # anon refused
    assert acked and not refused_ack
    client = Client(open_hub.url("emqp", "frontend"))
    try:
        ok = send_request(client.sender, json.loads(job_body("x.work", 1)), reply_requested=True,
                          queue="public")                                        # anon allowed
        job = next_request(worker)
        assert job is not None and job[4] == b"public"
        worker.send_multipart([b"", V, b"REPLY", b"r1", b'{"value": 2}', job[3]])
        assert client.result_for(ok) == 2
        no = send_request(client.sender, json.loads(job_body("x.work", 1)), reply_requested=True,
                          queue="orders")                                        # anon refused
        assert client.result_for(no).startswith("PermissionError: not allowed to publish")
        # PUB/SUB: anonymous PUBLISH to public.* goes out, to orders.* is dropped
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(open_hub.url("emqp", "pub-out"))
        pub = dealer(open_hub.url("emqp", "pub-in"))

        def published() -> list[list[bytes]]:
            pub.send_multipart([b"", V, b"PUBLISH", b"m1", b"orders.emqp", b"secret"])
            pub.send_multipart([b"", V, b"PUBLISH", b"m2", b"public.emqp", b"hello"])
            got = []
            while sub.poll(100):
                got.append(sub.recv_multipart())
            return got

        got = wait_until(published, "PUB output")
        assert [b"public.emqp", b"hello"] in got and all(m[0] != b"orders.emqp" for m in got)
        sub.close()
        pub.close()
    finally:
        client.close()
        worker.close()


def test_closed_hub_users_and_no_anonymous(closed_hub: BrokerProcess, keys: Keys) -> None:
    """Without [anonymous]: NSQ needs AUTH (E_AUTH_FIRST), NATS refuses a bare CONNECT
    (Authorization Violation), VibeMQ answers AUTH_REQUIRED, and eMQP over CURVE knows its
    peers by key (alice's worker and REQUESTs; a stranger's key never gets in)."""
    from mqhub.protocols.nsq import codec as w

    sock = NsqSocket(closed_hub.port("nsq", "tcp"))
    sock.send(w.encode_pub("orders.x", b"x"))
    assert sock.read_until(lambda fs: bool(fs), "PUB answer") == [
        w.ErrorFrame("E_AUTH_FIRST", "AUTH required before PUB")]
    url = f"nats://127.0.0.1:{closed_hub.port('mq9', 'tcp')}"

    async def nats_scenario() -> None:
        errors = NatsErrors()
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises its own auth error
            await nats.connect(url, allow_reconnect=False, error_cb=errors.cb,
                               max_reconnect_attempts=0)
        assert any("authorization violation" in t.lower() for t in errors.texts)
        alice = await nats.connect(url, token="alice-token")
        await alice.publish("orders.x", b"fine")
        await alice.flush()
        assert alice.is_connected
        await alice.close()

    run(nats_scenario)
    vibe = SocketClient(closed_hub.port("vibemq", "tcp"))
    with pytest.raises(ConnectionFailed) as failed:
        vibe.connect()
    assert failed.value.code == "AUTH_REQUIRED"
    vibe.connect("bob", "bob-pw")
    vibe.sock.close()
    # eMQP over CURVE: alice's worker takes orders, bob's REQUEST runs there, alice may not
    # publish to payroll (unknown queue: default, which she may not use either)
    backend, frontend = closed_hub.url("emqp", "backend"), closed_hub.url("emqp", "frontend")
    worker, acked = inform(backend, "orders", keys, "alice")
    _, refused = inform(backend, "payroll", keys, "alice")
    assert acked and not refused
    for who, queue, allowed in (("alice", "orders", True), ("alice", "payroll", False)):
        client = dealer(frontend, keys, who)
        client.send_multipart([b"", V, b"REQUEST", b"q-" + queue.encode(), queue.encode(),
                               b"reply-requested", job_body("x.work", 1)])
        if allowed:
            job = next_request(worker)
            assert job is not None and job[4] == b"orders"
        else:
            reply = wait_until(lambda c=client: c.poll(100) and c.recv_multipart(), "a refusal")
            assert reply[2] == b"REPLY" and b"PermissionError" in reply[4]
        client.close()
    stranger = zmq.Context.instance().socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
    stranger.curve_serverkey = keys.public["server"]
    stranger.connect(backend)
    stranger.send_multipart([b"", V, b"INFORM", b"i", b'[[10, "orders"]]', b"worker"])
    assert not stranger.poll(1000)
    stranger.close()
    worker.close()


def test_denials_are_counted(open_hub: BrokerProcess) -> None:
    """Every protocol's refusals above show in /api/stats and mqhub_auth_denied_total."""
    import urllib.request

    port = open_hub.port("admin", "http")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": "Bearer bob-token"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    counted = {(m[1], m[0]): float(m[2]) for m in re.findall(
        r'^mqhub_auth_denied_total\{action="(\w+)",protocol="(\w+)"\} (\S+)$', text, re.M)}
    for protocol in ("nsq", "nats", "mqks", "vibemq", "emqp"):
        assert counted.get((protocol, "publish"), 0) >= 1, (protocol, counted)
        assert counted.get((protocol, "subscribe"), 0) >= 1, (protocol, counted)
    stats_req = urllib.request.Request(f"http://127.0.0.1:{port}/api/stats",
                                       headers={"Authorization": "Bearer alice-token"})
    stats = json.loads(urllib.request.urlopen(stats_req, timeout=10).read())
    assert stats["auth"]["denied"]["nats"]["publish"] >= 2
    log = Path(open_hub.log_path or "").read_text()
    assert "refused: user alice protocol nats action publish address payroll.nats" in log
    assert "alice-pw" not in log and "alice-token" not in log


def test_no_leaks_between_any_two_protocols(open_hub: BrokerProcess) -> None:
    """drop.* is write-only for alice and anonymous clients. Each of the five protocols
    publishes there; no subscriber of any protocol that lacks the right gets a message —
    its wildcard or mask subscriptions (NATS ``>``, MQKS ``*.nats``) are refused and its
    allowed ones see nothing of drop.* — while bob's NATS ``>`` sees all five."""
    from mqhub.protocols.nsq import codec as w

    protocols = ("nsq", "nats", "mqks", "vibemq", "emqp")
    # blocking subscribers without the right
    nsq_socks = []
    for topic in ("drop.nsq", "drop.nats", "public.leak"):
        sock = NsqSocket(open_hub.port("nsq", "tcp"))
        sock.send(w.encode_sub(topic, "ch") + w.encode_rdy(10))
        nsq_socks.append((topic, sock))
    mq = MqksSocket(open_hub.port("mqks", "tcp"))
    for rid, events in ((b"l1", b"drop.>"), (b"l2", b"*.nats"), (b"l3", b"drop.mq*")):
        mq.send(rid + b" consume --confirm " + rid + b"q " + events)
        wait_until(lambda r=rid: mqks_refused(mq, r), f"MQKS refusal of {events!r}")
    mq.confirm(b"l4", b"consume", b"l4q public.leak")
    vibe_anon, vibe_alice = (SocketClient(open_hub.port("vibemq", "tcp")) for _ in range(2))
    vibe_anon.connect()
    vibe_alice.connect("alice", "alice-pw")
    for client, queue in ((vibe_anon, "drop.vibemq"), (vibe_alice, "drop.nsq")):
        with pytest.raises(VibeError):
            client.subscribe(queue)
    vibe_alice.subscribe("orders.leak")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(open_hub.url("emqp", "pub-out"))
    emqp_pub = dealer(open_hub.url("emqp", "pub-in"))
    url = f"nats://127.0.0.1:{open_hub.port('mq9', 'tcp')}"
    got: dict[str, list[Any]] = {"bob": [], "anon": [], "alice": []}

    async def scenario() -> None:
        bob = await nats.connect(url, token="bob-token")
        anon = await nats.connect(url, error_cb=NatsErrors().cb)
        alice = await nats.connect(url, token="alice-token", error_cb=NatsErrors().cb)
        await bob.subscribe(">", cb=collector(got["bob"]))
        for nc, name, subjects in ((anon, "anon", (">", "drop.*", "public.>")),
                                   (alice, "alice", ("drop.>", "*.nats", "orders.>"))):
            for subject in subjects:
                await nc.subscribe(subject, cb=collector(got[name]))
        for nc in (bob, anon, alice):
            await nc.flush()
        # every protocol publishes to drop.<protocol> (and once to a readable address)
        writer = await nsq_writer(open_hub, "alice-token")
        assert await nsq_call(writer.pub, "drop.nsq", b"n") == b"OK"
        nsq_close(writer)
        await alice.publish("drop.nats", b"t")
        await alice.flush()
        mq.confirm(b"d1", b"publish", b"drop.mqks m")
        vibe_alice.publish("drop.vibemq", {"v": 1})
        emqp_pub.send_multipart([b"", V, b"PUBLISH", b"e1", b"drop.emqp", b"e"])
        mq.confirm(b"d2", b"publish", b"public.leak seen")
        await until(lambda: {m.subject for m in got["bob"]} >= {f"drop.{p}" for p in protocols},
                    "bob's copies of all five")
        await until(lambda: [m.subject for m in got["anon"]] == ["public.leak"],
                    "the readable message")
        await quiet()
        for nc in (bob, anon, alice):
            await nc.close()

    run(scenario)
    assert not got["alice"]
    leaked = [(t, s.read(0.1)) for t, s in nsq_socks]
    for topic, frames in leaked:
        bodies = [f.body for f in frames if isinstance(f, w.Message)]
        assert bodies == ([b"seen"] if topic == "public.leak" else []), (topic, frames)
        if topic != "public.leak":
            assert w.ErrorFrame("E_UNAUTHORIZED",
                                f'AUTH failed for SUB on "{topic}" "ch"') in frames
    assert [m["data"] for m in mq.messages(b"l4")] == [b"seen"]
    assert not any(mq.messages(r) for r in (b"l1", b"l2", b"l3"))
    assert not vibe_alice.deliveries and not vibe_anon.deliveries
    out = []
    while sub.poll(100):
        out.append(sub.recv_multipart())
    assert all(not m[0].startswith(b"drop.") for m in out), out
    for _, sock in nsq_socks:
        sock.close()
    for c in (vibe_anon, vibe_alice):
        c.sock.close()
    mq.close()
    sub.close()
    emqp_pub.close()


def test_dead_letters_are_admin_only(open_hub: BrokerProcess) -> None:
    """A dead letter of drop.dlq: its DLQ view is refused to VibeMQ clients without the
    right to drop.dlq, listing and replaying it over the admin API need an admin, and after
    a replay it reaches only its queue's reader."""
    import base64
    import urllib.error
    import urllib.request

    from mqhub.protocols.vibemq.options import REDIRECT_TO_DLQ, QueueOptions

    port = open_hub.port("vibemq", "tcp")
    bob, anon = SocketClient(port), SocketClient(port)
    bob.connect("bob", "bob-pw")
    anon.connect()
    bob.create_queue("drop.dlq", QueueOptions(max_queue_size=1, overflow_strategy=REDIRECT_TO_DLQ,
                                              enable_dead_letter_queue=True))
    anon.publish("drop.dlq", {"n": 1})                   # anonymous may write here
    anon.publish("drop.dlq", {"n": 2})                   # the first one is dead-lettered
    with pytest.raises(VibeError) as refused:
        anon.subscribe("drop.dlq.dlq")
    assert refused.value.code == "NOT_AUTHORIZED"
    admin = f"http://127.0.0.1:{open_hub.port('admin', 'http')}"

    def call(path: str, auth: str, body: bytes | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(admin + path, data=body, headers={
            "Authorization": auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    alice = "Basic " + base64.b64encode(b"alice:alice-pw").decode()
    assert call("/api/dlq/drop.dlq", alice)[0] == 403
    status, letters = call("/api/dlq/drop.dlq", "Bearer bob-token")
    assert status == 200 and letters["total"] == 1
    assert call("/api/dlq/drop.dlq/replay", alice, b"{}")[0] == 403
    bob.subscribe("drop.dlq")
    assert [json.loads(d.payload)["n"] for d in bob.receive(1, ack=True)] == [2]
    assert call("/api/dlq/drop.dlq/replay", "Bearer bob-token", b"{}") == (
        200, {"queue": "drop.dlq", "replayed": 1})
    assert [json.loads(d.payload)["n"] for d in bob.receive(1, ack=True)] == [1]
    assert not anon.deliveries
    bob.sock.close()
    anon.sock.close()


def test_nsq_http_api(open_hub: BrokerProcess) -> None:
    """nsqd's HTTP API under the users file: /pub and /mpub act as the Authorization header's
    user (else anonymous) with the same rights; topic and channel changes need an admin."""
    import urllib.request

    def post(path: str, body: bytes, auth: str | None = None) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{open_hub.port('nsq', 'http')}{path}"
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    assert post("/pub?topic=public.http", b"a") == (200, b"OK")
    assert post("/pub?topic=orders.http", b"b") == (403, b'{"message": "UNAUTHORIZED"}')
    assert post("/mpub?topic=orders.http", b"c\nd", "Bearer alice-token") == (200, b"OK")
    assert post("/pub?topic=orders.http", b"e", "Bearer wrong") == (
        401, b'{"message": "AUTH_FAILED"}')
    assert post("/topic/create?topic=orders.made", b"", "Bearer alice-token")[0] == 403
    assert post("/topic/create?topic=orders.made", b"", "Bearer bob-token")[0] == 200
