"""NsqConfig: every nsqd-compatible limit and switch of the NSQ plugin, read from twistd options."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqhub.plugin_settings import apply_settings


@dataclass
class NsqConfig:
    """Limits and features (nsqd's defaults; times in milliseconds like nsqd's flags).

    Plugin options (``--option nsq.KEY=VALUE``) use these field names; the TLS and auth file
    paths can also be given as ``--nsq-tls-cert``, ``--nsq-tls-key`` and ``--nsq-auth-secrets``.
    """

    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_rdy_count: int = 2500
    msg_timeout: int = 60_000
    max_msg_timeout: int = 900_000
    max_req_timeout: int = 3_600_000
    client_timeout: int = 60_000
    max_heartbeat_interval: int = 60_000
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout: int = 30_000
    max_channel_consumers: int = 0
    #: ready messages a durable channel keeps in memory before the rest is read back from the
    #: store as it drains (nsqd's --mem-queue-size, whose default is 10,000; see
    #: docs/protocols/nsq.md "Decisions" for why mqhub keeps more)
    mem_queue_size: int = 50_000
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_required: bool = False
    #: CA certificates (PEM) client certificates must chain to (nsqd's --tls-root-ca-file)
    tls_ca: str | None = None
    #: require and verify a client certificate after tls_v1 (nsqd's
    #: --tls-client-auth-policy=require-verify)
    tls_verify: bool = False
    auth_secrets: str | None = None
    broadcast_address: str = "127.0.0.1"
    hostname: str = field(default_factory=socket.gethostname)
    version: str = "1.3.0"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> NsqConfig:
        """Build from twistd options: ``plugin_options['nsq']`` plus the ``nsq-*`` option lines.

        :raises PluginError: on an unknown key or a value of the wrong type.
        """
        raw: dict[str, Any] = dict((options.get("plugin_options") or {}).get("nsq", {}))
        for flag, key in (("nsq-tls-cert", "tls_cert"), ("nsq-tls-key", "tls_key"),
                          ("nsq-auth-secrets", "auth_secrets")):
            if options.get(flag):
                raw[key] = options[flag]
        config = apply_settings(cls(), raw, "nsq")
        if config.tls_cert and not config.tls_key:
            config.tls_key = config.tls_cert  # one PEM file holding both is fine
        return config

    @property
    def tls_enabled(self) -> bool:
        """True when a certificate is configured (tls_v1 is then accepted)."""
        return bool(self.tls_cert)
