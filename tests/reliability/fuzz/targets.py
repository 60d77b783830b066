"""Fuzz targets: each feeds arbitrary bytes to one sans-IO codec the way its server does.

A target's :meth:`FuzzTarget.run` builds a fresh codec, feeds ``data`` in the pieces the
data itself chooses (so split handling is fuzzed too), drains every event and lets exactly
the codec's own protocol error through quietly; any other exception is a crash, and a
buffer above the codec's limits is a hang in waiting (asserted). A new codec joins the
fuzzing (Hypothesis, atheris and ``make fuzz``) by adding one subclass to :data:`TARGETS`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable

import brotli

from mqhub.protocols.emqp import frames as emqp
from mqhub.protocols.mqks import codec as mqks
from mqhub.protocols.mqks import evals as mqks_evals
from mqhub.protocols.nats import codec as nats
from mqhub.protocols.nsq import codec as nsq
from mqhub.protocols.nsq import snappy
from mqhub.protocols.vibemq import codec as vibemq


def pieces(data: bytes) -> list[bytes]:
    """Split ``data`` after its first byte into pieces of (first byte % 7 + 1) * 3 bytes."""
    if not data:
        return []
    step = (data[0] % 7 + 1) * 3
    rest = data[1:]
    return [rest[i:i + step] for i in range(0, len(rest), step)] or [b""]


class FuzzTarget:
    """One codec under fuzz: a name, seed inputs and :meth:`run`."""

    name = ""
    #: Valid commands or frames of the stream (the Hypothesis state machine strings them).
    units: list[bytes] = []
    #: What a stream starts with (NSQ's magic) and what goes between units.
    prefix = b""
    joiner = b""

    @property
    def seeds(self) -> list[bytes]:
        """Valid inputs (after the split byte) that mutations start from."""
        return [self.prefix + self.joiner.join(self.units)] if self.units else []

    def run(self, data: bytes) -> int:
        """Feed ``data``; return how many events came out. Raises only for a codec bug."""
        raise NotImplementedError


class NsqServer(FuzzTarget):
    """nsqd's client → server command stream (:class:`ServerCodec`), fast paths included."""

    name = "nsq"
    prefix = nsq.MAGIC_V2
    units = [
        nsq.encode_pub("t", b"hello"), nsq.encode_mpub("t", [b"a", b"bc"]),
        nsq.encode_dpub("t", 100, b"x"), nsq.encode_sub("t", "c"), nsq.encode_rdy(10),
        nsq.encode_fin(b"0123456789abcdef"), nsq.encode_req(b"0123456789abcdef", 5),
        nsq.encode_touch(b"0123456789abcdef"), nsq.encode_identify({"client_id": "x"}),
        nsq.encode_auth(b"secret"), b"NOP\n", b"CLS\n"]

    def run(self, data: bytes) -> int:
        """Decode with small limits, alternating the PUB/FIN fast paths and next_event."""
        codec = nsq.ServerCodec(max_line=256, max_body_size=8192, max_msg_size=2048)
        count = 0
        try:
            for piece in pieces(data):
                codec.receive_data(piece)
                while True:
                    _, pubs = codec.read_pubs()
                    fins = codec.read_fin_ids()
                    ev = codec.next_event()
                    count += len(pubs) + len(fins)
                    if ev is nsq.NEED_DATA:
                        if not pubs and not fins:
                            break
                    else:
                        count += 1
                assert codec.buffered <= 8192 + 512, codec.buffered
        except nsq.ProtocolError as exc:
            assert exc.code.startswith("E_")
        return count


class NsqClient(FuzzTarget):
    """The server → client frame stream (:class:`ClientCodec`)."""

    name = "nsq-client"
    units = [nsq.encode_response(b"OK"), nsq.encode_error(b"E_INVALID bad"),
             nsq.encode_message(1, 1, b"0123456789abcdef", b"body")]

    def run(self, data: bytes) -> int:
        """Decode frames with a 64 KiB frame limit."""
        codec = nsq.ClientCodec(max_frame=1 << 16)
        count = 0
        try:
            for piece in pieces(data):
                codec.receive_data(piece)
                count += len(codec.frames())
        except nsq.ProtocolError:
            pass
        return count


class NsqSnappy(FuzzTarget):
    """The snappy framing decoder of NSQ's ``snappy`` upgrade."""

    name = "nsq-snappy"
    units = [snappy.SnappyEncoder().encode(b"PUB t\n\x00\x00\x00\x05hello" * 20)] if snappy.available() else []

    def run(self, data: bytes) -> int:
        """Decode; the output of one call may not exceed what the format allows per chunk."""
        decoder = snappy.SnappyDecoder()
        count = 0
        try:
            for piece in pieces(data):
                out = decoder.decode(piece)
                count += len(out)
                assert len(out) <= (len(piece) // 4 + 1) * snappy.MAX_CHUNK, len(out)
        except nsq.ProtocolError as exc:
            assert exc.code == "E_BAD_BODY"
        return count


class NatsServer(FuzzTarget):
    """The NATS client → server operation stream (:class:`NatsParser`, server side)."""

    name = "nats"
    units = [
        nats.encode_connect({"verbose": False, "headers": True}), b"PING\r\n", b"PONG\r\n",
        nats.encode_pub("a.b", b"hi", reply="r"), nats.encode_hpub("a.b", b"NATS/1.0\r\nk: v\r\n\r\n", b"x"),
        nats.encode_sub("a.*", "1", queue="q"), nats.encode_unsub("1", 5),
        nats.encode_pub("$mq9.AI.INBOX.m1.normal", b"body")]
    server = True

    def run(self, data: bytes) -> int:
        """Parse with a 4 KiB payload limit; stop at the first fatal error."""
        parser = nats.NatsParser(server=self.server, max_payload=4096, max_control_line=256)
        count = 0
        try:
            for piece in pieces(data):
                parser.receive_data(piece)
                for ev in parser.events():
                    count += 1
                    if ev[0] == nats.OP_ERROR and ev[1].fatal:
                        return count
                assert parser.buffered <= 4096 + 512 or parser.buffered <= len(data), parser.buffered
        except nats.ProtocolError:
            pass
        return count


class NatsClient(NatsServer):
    """The NATS server → client stream (INFO, MSG, HMSG, +OK, -ERR)."""

    name = "nats-client"
    units = [nats.encode_info({"server_id": "x"}), b"+OK\r\n", b"-ERR 'x'\r\n", b"PING\r\n",
             nats.encode_msg("a", "1", "r", b"hi"),
             nats.encode_hmsg("a", "1", None, b"NATS/1.0\r\n\r\n", b"x")]
    server = False


class EmqpFrames(FuzzTarget):
    """eMQP multipart messages (frames split on ``|``) and the header, INFORM and SCHEDULE fields."""

    name = "emqp"
    units = [b"peer||eMQP/1.0|REQUEST|m1|default|guarantee,retry-count:2|[\"run\", {}]",
             b"w||eMQP/1.0|INFORM|m2|[[10, \"q\"]]|worker",
             b"s||eMQP/1.0|SCHEDULE|m3|default|interval_secs:5|10||[\"run\", {}]"]
    joiner = b"\n"

    def run(self, data: bytes) -> int:
        """Parse every message; on success also parse its headers, queues and schedule."""
        decoder = emqp.FrameDecoder(max_body=4096)
        for message in data[1:].split(b"\n"):
            decoder.receive_data(message.split(b"|"))
        count = 0
        while True:
            try:
                cmd = decoder.next_event()
                if cmd is emqp.NEED_DATA:
                    return count
                count += 1
                self._fields(cmd)  # type: ignore[arg-type]
            except emqp.ProtocolError:
                pass

    @staticmethod
    def _fields(cmd: emqp.Command) -> None:
        """Parse the client-supplied fields the router parses for this command."""
        parse: dict[bytes, Callable[[], object]] = {
            b"REQUEST": lambda: emqp.parse_headers(cmd.body[1]),
            b"INFORM": lambda: emqp.parse_inform_queues(cmd.body[0]),
            b"SCHEDULE": lambda: emqp.parse_schedule(cmd.body),
            b"UNSCHEDULE": lambda: emqp.parse_schedule(cmd.body, unschedule=True),
        }
        if cmd.name in parse:
            parse[cmd.name]()


class MqksRequests(FuzzTarget):
    """MQKS request lines: the line reader, then each line's split and action data parsed."""

    name = "mqks"
    units = [b"p1 publish --confirm e.1 hello world", b"c1 consume q1 e.1 e.2 --manual-ack",
             b"c2 consume --confirm q2 --add e.3 --delete-queue-when-unused=5.5",
             b"r1 rebind q1 e.4 --remove e.1 --remove-mask e.* --add x.y",
             b"a1 ack c1 m1", b"a2 reject c1 --all", b"d1 delete_queue q1",
             b"d2 delete_consumer c1", b"x ping data", b"e _eval len(state.queues)"]
    joiner = b"\n"
    #: the reader's line limit here (the server's is 1 MiB)
    MAX_LINE = 256

    def run(self, data: bytes) -> int:
        """Read lines with a small limit; parse each as the server does; only RequestError passes."""
        reader = mqks.LineReader(max_line=self.MAX_LINE)
        count = 0
        for piece in pieces(data):
            for line in reader.feed(piece):
                count += 1
                self._line(line)
            assert reader.buffered <= self.MAX_LINE, reader.buffered
            if reader.fatal is not None:
                assert reader.fatal in (mqks.FATAL_TAB, mqks.FATAL_TOO_LONG)
                break
        return count

    @staticmethod
    def _line(line: bytes) -> None:
        """One request line through the parsers of its action."""
        parts = mqks.split_request(line)
        if parts is None:
            return
        _, action, data = parts
        _, data = mqks.take_confirm(data)
        try:
            if action == b"consume":
                args = mqks.parse_consume(data)
                mqks.render_update(args.queue, args.replace + args.add, args.delete_when_unused,
                                   args.manual_ack)
            elif action == b"rebind":
                a = mqks.parse_rebind(data)
                mqks.apply_rebind({"e.1", "e.x.y", "nodot"}, a.replace, a.remove, a.remove_mask,
                                  a.add)
            elif action in (b"publish", b"ack", b"reject"):
                mqks.split2(data)
            elif action in (b"delete_queue", b"delete_consumer"):
                mqks.text(data)
            elif action == b"_eval":
                try:
                    mqks_evals.answer(data.decode("utf-8", "replace"), lambda name, queue: 7)
                except mqks_evals.EvalRefused:
                    pass
        except mqks.RequestError:
            pass


def _vibemq_units() -> list[bytes]:
    """Valid VibeMQ frames: plain, headers, an Error frame, and gzip and brotli compressed."""
    c = vibemq
    big = b'{"text":"' + b"all work and no play " * 80 + b'"}'
    body = c.encode_body(c.PUBLISH, "i3", "q", big, {"h": "v"})
    return [
        c.encode(c.Frame(c.CONNECT, "i0", None, None, {"supported-compression": "brotli,gzip"})),
        c.encode(c.Frame(c.PUBLISH, "i1", "orders", b'{"n":1}')),
        c.encode(c.Frame(c.SUBSCRIBE, "i2", "orders")), c.encode(c.Frame(c.ACK, "i2")),
        c.encode_error("i4", "QUEUE_NOT_FOUND", "no such queue"),
        c.frame(body, c.FLAG_GZIP, 0), c.frame(body, c.FLAG_BROTLI, 0),
        c.encode(c.Frame(c.CREATE_QUEUE, "i5", "q", b'{"maxQueueSize":10,"mode":1}')),
    ]


class VibeMqFrames(FuzzTarget):
    """VibeMQ frames: length prefix, flags, gzip/brotli bodies (bounded) and the body fields."""

    name = "vibemq"
    units = _vibemq_units()
    MAX_FRAME = 4096
    MAX_DECOMPRESSED = 16384

    def run(self, data: bytes) -> int:
        """Decode with small limits; on success also parse each frame's JSON payload."""
        decoder = vibemq.FrameDecoder(self.MAX_FRAME, self.MAX_DECOMPRESSED)
        count = 0
        try:
            for piece in pieces(data):
                for frame in decoder.feed(piece):
                    count += 1
                    if isinstance(frame, vibemq.Frame) and frame.payload:
                        try:
                            frame.json()
                        except ValueError:
                            pass
                assert decoder.buffered <= self.MAX_FRAME + 5, decoder.buffered
        except vibemq.ProtocolError:
            count += len(decoder.salvage())
        return count


def _compression_seeds() -> list[bytes]:
    """Decompression bombs and corrupt bodies as extra VibeMQ seeds."""
    zeros = bytes(1 << 16)
    return [vibemq.frame(gzip.compress(zeros), vibemq.FLAG_GZIP, 0),
            vibemq.frame(brotli.compress(zeros), vibemq.FLAG_BROTLI, 0),
            vibemq.frame(b"\x1f\x8b\x00\x00", vibemq.FLAG_GZIP, 0)]


VibeMqFrames.units = VibeMqFrames.units + _compression_seeds()


def resp_target() -> type[FuzzTarget] | None:
    """The Redis example plugin's RESP target (the plugin is a drop-in, loaded from its path)."""
    from mqhub.discovery import load_plugins
    from tests.plugins import EXAMPLE_PLUGINS, isolated_plugin_path

    with isolated_plugin_path():
        load_plugins([str(EXAMPLE_PLUGINS)])
        from mqhub.plugins._redis_example import resp

    class Resp(FuzzTarget):
        """RESP2/3 client requests (multibulk and inline) of the Redis example plugin."""

        name = "resp"
        units = [b"*3\r\n$7\r\nPUBLISH\r\n$4\r\nnews\r\n$2\r\nhi\r\n", b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n",
                 b"PING inline\r\n", b"*1\r\n$5\r\nHELLO\r\n"]

        def run(self, data: bytes) -> int:
            """Parse with small limits; only its ProtocolError may come out."""
            codec = resp.RespCodec(max_bulk=4096, max_args=64, max_inline=256)
            count = 0
            try:
                for piece in pieces(data):
                    codec.receive_data(piece)
                    while codec.next_event() is not resp.NEED_DATA:
                        count += 1
            except resp.ProtocolError:
                pass
            return count

    return Resp


def all_targets() -> dict[str, FuzzTarget]:
    """Every fuzz target, by name."""
    classes: list[type[FuzzTarget]] = [NsqServer, NsqClient, NsqSnappy, NatsServer, NatsClient,
                                       EmqpFrames, MqksRequests, VibeMqFrames]
    extra = resp_target()
    if extra is not None:
        classes.append(extra)
    return {cls.name: cls() for cls in classes}


def seed_inputs(target: FuzzTarget) -> list[bytes]:
    """The target's seeds with a split byte in front (whole and bytewise splits)."""
    return [bytes([k]) + seed for seed in target.seeds for k in (0, 6)]


def dump(data: bytes) -> str:
    """A reproducible literal of a crashing input, for a regression test."""
    return json.dumps(data.decode("latin-1"))
