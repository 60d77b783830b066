"""The Redis pub/sub subset served over the hub's address space (Twisted adapter).

Commands: PING, ECHO, HELLO, CLIENT (SETNAME/SETINFO/GETNAME/ID), SELECT 0, COMMAND, QUIT,
RESET, PUBLISH, SUBSCRIBE, PSUBSCRIBE, UNSUBSCRIBE, PUNSUBSCRIBE. Anything else gets redis'
``ERR unknown command``.

Channels are hub addresses: PUBLISH to ``news.sport`` reaches NATS, NSQ, MQKS... subscribers
of that address, and a message published there by any protocol reaches a Redis SUBSCRIBEr.
PSUBSCRIBE globs are translated to hub patterns token by token (see :func:`glob_to_pattern`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.records import BODY, validate_address

from .resp import NEED_DATA, ErrorReply, ProtocolError, Reply, RespCodec, SimpleString, encode

PUBSUB_ONLY = {b"SUBSCRIBE", b"PSUBSCRIBE", b"UNSUBSCRIBE", b"PUNSUBSCRIBE", b"PING", b"QUIT", b"RESET"}
SERVER_INFO_VERSION = "7.2.0"
MAX_PUBSUB_BUFFER = 32 * 1024 * 1024


def glob_to_pattern(glob: str) -> str:
    """Translate a Redis PSUBSCRIBE glob into a hub address pattern.

    Token by token (tokens are separated by ``.``): a final ``*`` becomes ``>`` (Redis' ``*``
    also matches dots, so ``news.*`` keeps matching ``news.a.b``); any other ``*`` stays a hub
    wildcard, matching within one token only. ``?``, ``[...]`` and ``\\`` have no hub equivalent.

    :raises InvalidName: for globs the hub cannot express.
    """
    if any(c in glob for c in "?[]\\"):
        raise InvalidName(f"pattern {glob!r}: only '*' wildcards are supported")
    tokens = glob.split(".")
    if tokens[-1] == "*":
        tokens[-1] = ">"
    return ".".join(tokens)


@implementer(IDeliveryTarget, IPushProducer)
class RespProtocol(Protocol):
    """One Redis client connection."""

    protocol_name = "redis"
    log = Logger()

    def __init__(self, hub: Any, max_pubsub_buffer: int = MAX_PUBSUB_BUFFER) -> None:
        """:param hub: the :class:`mqhub.hub.Hub`.
        :param max_pubsub_buffer: bytes of pushes allowed to pile up while the client does not
            read (redis' client-output-buffer-limit for pubsub); beyond it the client is dropped.
        """
        self.hub = hub
        self.max_pubsub_buffer = max_pubsub_buffer
        self._core: ICore | None = None    # this connection's core session, on first use
        self.codec = RespCodec()
        self._writes_paused = False
        self._pending_push_bytes = 0
        self.proto = 2
        self.client_name: bytes | None = None
        self.channels: dict[bytes, Any] = {}
        self.patterns: dict[bytes, Any] = {}
        self._out: list[bytes] = []
        self._queued: deque[list[bytes]] = deque()
        self._error: ProtocolError | None = None
        self._waiting: Deferred[Any] | None = None
        self._closing = False
        self._handlers = {
            b"PING": self.on_ping,
            b"ECHO": self.on_echo,
            b"HELLO": self.on_hello,
            b"CLIENT": self.on_client,
            b"SELECT": self.on_select,
            b"COMMAND": self.on_command,
            b"QUIT": self.on_quit,
            b"RESET": self.on_reset,
            b"PUBLISH": self.on_publish,
            b"SUBSCRIBE": self.on_subscribe,
            b"PSUBSCRIBE": self.on_psubscribe,
            b"UNSUBSCRIBE": self.on_unsubscribe,
            b"PUNSUBSCRIBE": self.on_punsubscribe,
        }

    # input -------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Feed the codec, queue every complete command, and run them."""
        self.codec.receive_data(data)
        while self._error is None:
            try:
                command = self.codec.next_event()
            except ProtocolError as exc:
                self._error = exc
                break
            if command is NEED_DATA:
                break
            self._queued.append(command)  # type: ignore[arg-type]
        self._run_queued()

    def _run_queued(self) -> None:
        """Run queued commands until none is left or a publish is pending; write replies once.

        Consecutive ``PUBLISH`` commands to the same channel are run as one batch.
        """
        queued = self._queued
        while queued and self._waiting is None and not self._closing:
            command = queued.popleft()
            verb = command[0].upper()
            if verb == b"PUBLISH" and len(command) == 3:
                bodies = [command[2]]
                while queued and len(queued[0]) == 3 and queued[0][0].upper() == b"PUBLISH" \
                        and queued[0][1] == command[1]:
                    bodies.append(queued.popleft()[2])
                self._dispatch(command, bodies)
            else:
                self._dispatch(command)
        if not queued and self._waiting is None and self._error is not None and not self._closing:
            self._reply(ErrorReply(str(self._error)))
            self._closing = True
        self._flush()
        if self._closing and self.transport is not None:
            self.transport.loseConnection()

    def _dispatch(self, command: list[bytes], bodies: list[bytes] | None = None) -> None:
        """Run one command through the handler table."""
        verb = command[0].upper()
        handler = self._handlers.get(verb)
        if handler is None:
            # redis-server's wording: every argument quoted and followed by a space
            args = "".join(f"'{a.decode(errors='replace')[:128]}' " for a in command[1:8])
            self._reply(ErrorReply(
                f"ERR unknown command '{command[0].decode(errors='replace')}', "
                f"with args beginning with: {args}"
            ))
            return
        if self.proto == 2 and (self.channels or self.patterns) and verb not in PUBSUB_ONLY:
            self._reply(ErrorReply(
                f"ERR Can't execute '{verb.decode().lower()}': only (P|S)SUBSCRIBE / "
                "(P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
            ))
            return
        try:
            if bodies is not None:
                self.publish(command[1], bodies)
            else:
                handler(command[1:])
        except UnicodeDecodeError:
            self._reply(ErrorReply("ERR channel names must be UTF-8"))
        except MqhubError as exc:
            self._reply(ErrorReply(f"ERR {exc}"))
        except Exception:
            # A bug, not bad input: say so, log it, and close only this connection.
            self.log.failure("redis command {verb} failed", verb=verb)
            self._reply(ErrorReply("ERR internal error"))
            self._closing = True

    def _arity(self, verb: str, args: list[bytes], low: int, high: int | None = None) -> bool:
        """Reply redis' arity error unless ``low <= len(args) <= high``."""
        if len(args) < low or (high is not None and len(args) > high):
            self._reply(ErrorReply(f"ERR wrong number of arguments for '{verb}' command"))
            return False
        return True

    # output ------------------------------------------------------------------------------

    def _reply(self, value: Reply, push: bool = False) -> None:
        """Queue one reply for the next write."""
        self._out.append(encode(value, self.proto, push))

    def _flush(self) -> None:
        """Write every queued reply in one writeSequence."""
        if self._out and self.transport is not None:
            out, self._out = self._out, []
            self.transport.writeSequence(out)

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Render messages from any protocol as Redis ``message``/``pmessage`` pushes.

        Slow consumer rule (redis' pubsub output limit): while the transport's buffer is full
        the pushed bytes are counted, and past ``max_pubsub_buffer`` the client is dropped.
        """
        if self._closing:
            return
        kind, name = binding.tag
        channel = address.encode()
        # Everything but the body is the same for the whole batch: encode it once.
        if kind == "message":
            head = encode([b"message", channel, b""], self.proto, push=True)
        else:
            head = encode([b"pmessage", name, channel, b""], self.proto, push=True)
        head = head[: -len(b"$0\r\n\r\n")]
        out = self._out
        for entry in messages:
            body = entry[BODY]
            out.append(b"%s$%d\r\n" % (head, len(body)))
            out.append(body)
            out.append(b"\r\n")
        if self._writes_paused:
            self._pending_push_bytes += sum(len(chunk) for chunk in self._out)
            if self._pending_push_bytes > self.max_pubsub_buffer:
                self.log.warn("redis client dropped: {n} bytes of pushes not read",
                              n=self._pending_push_bytes)
                self._out.clear()
                self._closing = True
                self._unsubscribe_all()
                if self.transport is not None:
                    self.transport.abortConnection()
                return
        self._flush()

    # flow control (the transport tells us when its write buffer is full) ----------------

    def connectionMade(self) -> None:
        """Register as the transport's producer to learn when the client stops reading."""
        if self.transport is not None:
            self.transport.registerProducer(self, True)

    def pauseProducing(self) -> None:
        """The client's socket buffer is full: start counting pushed bytes."""
        self._writes_paused = True

    def resumeProducing(self) -> None:
        """The client reads again."""
        self._writes_paused = False
        self._pending_push_bytes = 0

    def stopProducing(self) -> None:
        """The connection is going away."""
        self._writes_paused = False

    # connection handlers -----------------------------------------------------------------

    def on_ping(self, args: list[bytes]) -> None:
        """PING [message]."""
        if not self._arity("ping", args, 0, 1):
            return
        if self.proto == 2 and (self.channels or self.patterns):
            self._reply([b"pong", args[0] if args else b""])
        else:
            self._reply(args[0] if args else SimpleString("PONG"))

    def on_echo(self, args: list[bytes]) -> None:
        """ECHO message."""
        if self._arity("echo", args, 1, 1):
            self._reply(args[0])

    def on_hello(self, args: list[bytes]) -> None:
        """HELLO [protover [AUTH user pass] [SETNAME name]]: switch RESP2/RESP3, describe the server."""
        if args:
            try:
                version = int(args[0])
            except ValueError:
                self._reply(ErrorReply("ERR Protocol version is not an integer or out of range"))
                return
            if version not in (2, 3):
                self._reply(ErrorReply("NOPROTO unsupported protocol version"))
                return
            rest = args[1:]
            name = self.client_name
            while rest:
                option = rest[0].upper()
                if option == b"AUTH":
                    self._reply(ErrorReply("ERR AUTH is not supported by this server"))
                    return
                if option == b"SETNAME" and len(rest) >= 2:
                    name, rest = rest[1], rest[2:]
                    continue
                self._reply(ErrorReply(f"ERR Syntax error in HELLO option '{rest[0].decode(errors='replace')}'"))
                return
            self.client_name = name
            self.proto = version
        self._reply({
            "server": "mqhub",
            "version": SERVER_INFO_VERSION,
            "proto": self.proto,
            "id": id(self) & 0x7FFFFFFF,
            "mode": "standalone",
            "role": "master",
            "modules": [],
        })

    def on_client(self, args: list[bytes]) -> None:
        """CLIENT SETNAME / GETNAME / SETINFO / ID."""
        if not self._arity("client", args, 1):
            return
        sub = args[0].upper()
        if sub == b"SETNAME" and len(args) == 2:
            self.client_name = args[1]
            self._reply(SimpleString("OK"))
        elif sub == b"GETNAME":
            self._reply(self.client_name)
        elif sub == b"SETINFO" and len(args) == 3:
            self._reply(SimpleString("OK"))
        elif sub == b"ID":
            self._reply(id(self) & 0x7FFFFFFF)
        else:
            self._reply(ErrorReply(f"ERR unknown subcommand '{args[0].decode(errors='replace')}'"))

    def on_select(self, args: list[bytes]) -> None:
        """SELECT 0 (the hub has one address space)."""
        if not self._arity("select", args, 1, 1):
            return
        if args[0] == b"0":
            self._reply(SimpleString("OK"))
        else:
            self._reply(ErrorReply("ERR DB index is out of range"))

    def on_command(self, args: list[bytes]) -> None:
        """COMMAND [...]: an empty list (redis-cli asks for command docs on start)."""
        self._reply([])

    def on_quit(self, args: list[bytes]) -> None:
        """QUIT: reply OK and close."""
        self._reply(SimpleString("OK"))
        self._closing = True

    def on_reset(self, args: list[bytes]) -> None:
        """RESET: drop subscriptions, back to RESP2."""
        self._unsubscribe_all()
        self.proto = 2
        self.client_name = None
        self._reply(SimpleString("RESET"))

    # pub/sub -----------------------------------------------------------------------------

    def _broker(self) -> ICore:
        """This connection's handle on the core (``ICore.session``), or an error when the hub
        has no core."""
        if self._core is None:
            broker = self.hub.broker
            if broker is None:
                raise MqhubError("the broker core is not available")
            self._core = broker.session(None)
        return self._core

    def on_publish(self, args: list[bytes]) -> None:
        """PUBLISH channel message (pipelined ones are batched by ``_run_queued``)."""
        if self._arity("publish", args, 2, 2):
            self.publish(args[0], [args[1]])

    def publish(self, channel: bytes, bodies: list[bytes]) -> None:
        """Publish ``bodies`` to the address ``channel`` in one core call.

        Each PUBLISH is answered with the number of receivers (live subscribers, queue groups
        and queues the address routes to) once the batch is stored.
        """
        broker = self._broker()
        address = channel.decode("utf-8")
        validate_address(address)
        route = broker.route(address)
        receivers = len(route.targets) + len(route.groups) + len(route.queues)
        done = broker.publish_batch(address, bodies, origin=self.protocol_name)
        count = len(bodies)

        def confirmed(_: object) -> None:
            """Stored: answer each PUBLISH with its receiver count."""
            for _i in range(count):
                self._reply(receivers)

        def failed(failure: Failure) -> None:
            """Not stored: log it and answer each PUBLISH with an error."""
            self.log.failure("publish to {address} failed", failure, address=address)
            for _i in range(count):
                self._reply(ErrorReply(f"ERR publish failed: {failure.getErrorMessage()}"))

        done.addCallbacks(confirmed, failed)
        if not done.called:
            self._wait(done)

    def _wait(self, d: Deferred[Any]) -> None:
        """Hold later commands (and reads) until ``d`` fires, so replies stay in order."""
        self._waiting = d
        if self.transport is not None:
            self.transport.pauseProducing()

        def resume(_: object) -> None:
            """Read again and run the commands that queued meanwhile."""
            self._waiting = None
            if self.transport is not None and self.connected:
                self.transport.resumeProducing()
                self._run_queued()

        d.addBoth(resume)

    def _count(self) -> int:
        """Number of channels and patterns this connection listens to."""
        return len(self.channels) + len(self.patterns)

    def on_subscribe(self, args: list[bytes]) -> None:
        """SUBSCRIBE channel [channel ...]."""
        if not self._arity("subscribe", args, 1):
            return
        broker = self._broker()
        for channel in args:
            if channel not in self.channels:
                address = channel.decode("utf-8", errors="strict")
                validate_address(address)
                self.channels[channel] = broker.subscribe(address, self, tag=("message", channel))
            self._reply([b"subscribe", channel, self._count()], push=True)

    def on_psubscribe(self, args: list[bytes]) -> None:
        """PSUBSCRIBE pattern [pattern ...]."""
        if not self._arity("psubscribe", args, 1):
            return
        broker = self._broker()
        for glob in args:
            if glob not in self.patterns:
                pattern = glob_to_pattern(glob.decode("utf-8", errors="strict"))
                self.patterns[glob] = broker.subscribe(pattern, self, tag=("pmessage", glob))
            self._reply([b"psubscribe", glob, self._count()], push=True)

    def _unsubscribe(self, kind: bytes, table: dict[bytes, Any], names: list[bytes]) -> None:
        """Shared UNSUBSCRIBE / PUNSUBSCRIBE: all when ``names`` is empty."""
        targets = names or list(table)
        if not targets:
            self._reply([kind, None, self._count()], push=True)
            return
        for name in targets:
            binding = table.pop(name, None)
            if binding is not None:
                self._broker().unbind(binding)
            self._reply([kind, name, self._count()], push=True)

    def on_unsubscribe(self, args: list[bytes]) -> None:
        """UNSUBSCRIBE [channel ...]."""
        self._unsubscribe(b"unsubscribe", self.channels, args)

    def on_punsubscribe(self, args: list[bytes]) -> None:
        """PUNSUBSCRIBE [pattern ...]."""
        self._unsubscribe(b"punsubscribe", self.patterns, args)

    def _unsubscribe_all(self) -> None:
        """Remove every binding of this connection, silently."""
        for table in (self.channels, self.patterns):
            for binding in table.values():
                self._broker().unbind(binding)
            table.clear()

    def connectionLost(self, reason: Failure | None = None) -> None:
        """Unbind everything this connection subscribed."""
        self._unsubscribe_all()


class RespFactory(Factory):
    """Builds one RespProtocol per connection; holds only the hub."""

    def __init__(self, hub: Any, max_pubsub_buffer: int = MAX_PUBSUB_BUFFER) -> None:
        """:param hub: the :class:`mqhub.hub.Hub`. :param max_pubsub_buffer: see RespProtocol."""
        self.hub = hub
        self.max_pubsub_buffer = max_pubsub_buffer

    def buildProtocol(self, addr: Any) -> RespProtocol:
        """A new connection."""
        return RespProtocol(self.hub, self.max_pubsub_buffer)
