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

    #: largest message body PUB, DPUB and each MPUB message may carry (bytes)
    max_msg_size: int = 1024 * 1024
    #: largest command body, an MPUB as a whole (bytes)
    max_body_size: int = 5 * 1024 * 1024
    #: highest RDY a client may send
    max_rdy_count: int = 2500
    #: default time a delivered message may stay unfinished before it is requeued (ms)
    msg_timeout: int = 60_000
    #: highest msg_timeout a client may ask for in IDENTIFY (ms)
    max_msg_timeout: int = 900_000
    #: longest REQ (and DPUB) delay (ms)
    max_req_timeout: int = 3_600_000
    #: a client's heartbeat interval defaults to half of this (ms)
    client_timeout: int = 60_000
    #: highest heartbeat_interval a client may ask for in IDENTIFY (ms)
    max_heartbeat_interval: int = 60_000
    #: highest output_buffer_size a client may ask for (bytes; accepted and echoed)
    max_output_buffer_size: int = 65536
    #: highest output_buffer_timeout a client may ask for (ms; accepted and echoed)
    max_output_buffer_timeout: int = 30_000
    #: consumers one channel may have at once (0 = no limit)
    max_channel_consumers: int = 0
    #: ready messages a durable channel keeps in memory before the rest is read back from the
    #: store as it drains (nsqd's --mem-queue-size, whose default is 10,000; see
    #: docs/protocols/nsq.md "Decisions" for why mqhub keeps more)
    mem_queue_size: int = 50_000
    #: offer deflate compression to clients that ask for it
    deflate: bool = True
    #: highest deflate level a client may ask for
    max_deflate_level: int = 6
    #: offer snappy compression to clients that ask for it
    snappy: bool = True
    #: PEM certificate (and key) enabling the tls_v1 upgrade (also --nsq-tls-cert)
    tls_cert: str | None = None
    #: PEM key when it is not in the tls_cert file (also --nsq-tls-key)
    tls_key: str | None = None
    #: refuse clients that do not upgrade to TLS (accepted, not enforced yet: docs/protocols/nsq.md)
    tls_required: bool = False
    #: CA certificates (PEM) client certificates must chain to (nsqd's --tls-root-ca-file)
    tls_ca: str | None = None
    #: require and verify a client certificate after tls_v1 (nsqd's
    #: --tls-client-auth-policy=require-verify)
    tls_verify: bool = False
    #: JSON secrets file; clients must AUTH (also --nsq-auth-secrets; docs/protocols/nsq.md)
    auth_secrets: str | None = None
    #: address the HTTP API and /lookup announce for this node
    broadcast_address: str = "127.0.0.1"
    #: host name the HTTP API and IDENTIFY report (default: this machine's)
    hostname: str = field(default_factory=socket.gethostname)
    #: nsqd version reported to clients
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
