"""The five built-in protocol descriptors (import-light: server code loads in make_service)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from zope.interface import implementer

from mqhub.errors import PluginError
from mqhub.interfaces import IProtocolPlugin

#: One extra ``twistd mqhub`` option of a built-in protocol, as a usage.Options
#: ``optParameters`` line: (long name, short name, default, help).
OptionLine = tuple[str, str | None, str | None, str]


def _tcp(port: int) -> str:
    """Twisted endpoint string for TCP ``port`` on the loopback interface."""
    return f"tcp:{port}:interface=127.0.0.1"


@implementer(IProtocolPlugin)
@dataclass(frozen=True, eq=False)
class BuiltinProtocol:
    """Descriptor of a protocol whose server lives in ``mqhub.protocols.<package>.service``.

    The server module must define ``make_service(hub, endpoints, options) -> IService``.
    ``option_lines`` are protocol-specific ``twistd mqhub`` flags (read from ``options`` by the
    server); every other setting goes through ``--option NAME.KEY=VALUE``.
    """

    name: str
    package: str
    description: str
    default_endpoints: dict[str, str]
    aliases: tuple[str, ...] = field(default=())
    #: roles that exist but are off unless ``--listen NAME.ROLE=ENDPOINT`` turns them on
    optional_roles: tuple[str, ...] = field(default=())
    option_lines: tuple[OptionLine, ...] = field(default=())

    def make_service(self, hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> Any:
        """Import the protocol's server module and build (not start) its service.

        :raises PluginError: when the server module does not exist yet or fails to import.
        """
        module_name = f"mqhub.protocols.{self.package}.service"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                raise PluginError(f"protocol {self.name} is not implemented yet") from exc
            raise PluginError(f"protocol {self.name} cannot load: {exc}") from exc
        except ImportError as exc:
            raise PluginError(f"protocol {self.name} cannot load: {exc}") from exc
        factory = getattr(module, "make_service", None)
        if factory is None:
            raise PluginError(f"protocol {self.name} is not implemented yet")
        return factory(hub, endpoints, options)


nsq = BuiltinProtocol(
    name="nsq",
    package="nsq",
    description="NSQ: nsqd TCP protocol V2 plus the nsqd HTTP API and nsqlookupd-style /lookup",
    default_endpoints={"tcp": _tcp(4150), "http": _tcp(4151)},
    option_lines=(
        ("nsq-auth-secrets", None, None,
         "NSQ: JSON secrets file; clients must AUTH (see docs/protocols/nsq.md)."),
        ("nsq-tls-cert", None, None, "NSQ: PEM certificate (and key) enabling the tls_v1 upgrade."),
        ("nsq-tls-key", None, None, "NSQ: PEM key when not in the --nsq-tls-cert file."),
    ),
)

mq9 = BuiltinProtocol(
    name="mq9",
    package="nats",
    description="NATS client protocol; $mq9.AI.* subjects get mq9 agent-mailbox semantics",
    default_endpoints={"tcp": _tcp(4222)},
    aliases=("nats",),
    # nats-server's monitoring port (-m 8222) and websocket {} block, off unless asked for
    optional_roles=("monitor", "ws"),
)

emqp = BuiltinProtocol(
    name="emqp",
    package="emqp",
    description="eMQP (EventMQ over ZeroMQ): job router, workers, pub/sub and scheduler",
    default_endpoints={
        "frontend": "tcp://127.0.0.1:47291",
        "backend": "tcp://127.0.0.1:47290",
        "pub-in": "tcp://127.0.0.1:47298",
        "pub-out": "tcp://127.0.0.1:47299",
    },
)

mqks = BuiltinProtocol(
    name="mqks",
    package="mqks",
    description="MQKS text protocol: queues bound to event masks, consume with confirm",
    default_endpoints={"tcp": _tcp(25000)},
    option_lines=(
        ("mqks-eval", None, "off",
         "MQKS: _eval mode, off (default) or stats (a fixed table of read-only stats; "
         "nothing is ever evaluated)."),
    ),
)

vibemq = BuiltinProtocol(
    name="vibemq",
    package="vibemq",
    description="VibeMQ binary frames: queues, publish acks, compression",
    default_endpoints={"tcp": _tcp(2925)},
    option_lines=(
        ("vibemq-users", None, None,
         "VibeMQ: JSON users file; clients must send authUsername/authPassword "
         "(see docs/protocols/vibemq.md)."),
    ),
)

#: Every built-in descriptor (tap.Options adds their ``option_lines`` to its flags).
BUILTIN: tuple[BuiltinProtocol, ...] = (nsq, mq9, emqp, mqks, vibemq)
