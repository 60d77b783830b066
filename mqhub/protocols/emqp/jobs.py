"""eMQP jobs on the hub core: where they live, the headers they carry, what a job body is.

eMQP queue ``Q`` is the durable core queue (and address) ``emqp.jobs.Q``. Each stored job
carries the client's request as ``emqp-*`` headers so that the router can answer the client
after a restart; ``mqhub-max-attempts`` marks a job that may run again after a failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from mqhub.protocols.emqp import frames as F
from mqhub.records import HEADERS

Frames = list[bytes]
Send = Callable[[Frames], None]
#: This read's jobs for one queue: bodies and their per-job headers.
JobBatch = tuple[list[bytes], list[dict[str, str] | None]]

JOB_PREFIX = "emqp.jobs."
DEFAULT_QUEUES: list[tuple[int, str]] = [(10, "default")]
#: In-flight deadline handed to the core; the router itself decides about lost jobs.
CONSUMER_TIMEOUT = 7 * 86400.0
#: Attempts a ``guarantee`` job without ``retry-count`` gets after lost workers.
GUARANTEE_ATTEMPTS = 4

H_MSGID = "emqp-msgid"
H_CLIENT = "emqp-client"
H_HEADERS = "emqp-headers"
H_REPLY = "emqp-reply"
H_MAX = "mqhub-max-attempts"


def valid_job(body: bytes) -> bool:
    """True when ``body`` is an eventmq job (a JSON list whose second item is an object)."""
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, list) and len(value) >= 2 and isinstance(value[1], dict)


def request_headers(cmd: F.Command, headers_raw: bytes) -> dict[str, str]:
    """The core headers stored with the job of one client REQUEST.

    They keep the client's msgid, identity and eMQP headers, whether a reply was asked for,
    and (``retry-count`` or ``guarantee``) how many attempts the job may take.
    """
    h = F.parse_headers(headers_raw)
    meta = {H_MSGID: cmd.msgid.decode(), H_CLIENT: cmd.peer.hex(),
            H_HEADERS: headers_raw.decode()}
    if h.reply_requested:
        meta[H_REPLY] = "1"
    if h.retry_count > 0:
        meta[H_MAX] = str(h.retry_count + 1)
    elif h.guarantee:
        meta[H_MAX] = str(GUARANTEE_ATTEMPTS)
    return meta


def waiting_jobs(consumers: Iterable[Any], msgid: str) -> list[tuple[Any, tuple]]:
    """``(queue, entry)`` of every waiting job, on the queues of ``consumers``, whose client
    msgid is ``msgid`` (a REPLY from before a restart names its job this way)."""
    found: list[tuple[Any, tuple]] = []
    for consumer in consumers:
        queue = consumer.queue
        for entry in queue.peek(queue.depth):
            meta = entry[HEADERS]
            if meta is not None and meta.get(H_MSGID) == msgid:
                found.append((queue, entry))
    return found
