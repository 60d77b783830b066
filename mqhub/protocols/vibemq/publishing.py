"""The VibeMQ publish limits and the payload check the connection applies to each Publish.

The publish path itself (one core call per run of Publishes to one queue, overflow handling)
is :class:`mqhub.protocols.vibemq.server.VibeMQProtocol`'s.
"""

from __future__ import annotations

import msgspec

MAX_HEADERS = 50
#: publishes per connection handed to the core and not yet stored, above which reading pauses
#: until commits catch up (NSQ and MQKS use the same bound)
MAX_UNCONFIRMED = 50_000
MAX_HEADER_VALUE = 4096


_RAW = msgspec.json.Decoder(msgspec.Raw).decode


def validate_json(payload: bytes) -> None:
    """Check that ``payload`` is UTF-8 JSON, without building it.

    msgspec parses the syntax into a ``Raw`` span (no objects made: about 10x the stdlib's
    ``json.loads`` on 1 KiB documents) but does not check the UTF-8 inside strings, so non-ASCII
    payloads are also decoded.

    :raises ValueError: (or msgspec.DecodeError, RecursionError) when it is not.
    """
    _RAW(payload)
    if not payload.isascii():
        payload.decode("utf-8")
