"""The ``_eval`` lookup table: fixed read-only expressions answered without ``eval``/``exec``.

The original server ran ``str(eval(code))``: remote code execution. mqhub never evaluates
anything. With ``--mqks-eval stats`` the expressions of the original ``stats.py`` (and a few
per-queue ones) are *recognised as text* and answered from mqhub's own counters; any other text
is an error, like everything when ``_eval`` is off (the default). See docs/protocols/mqks.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: expression (whitespace removed) -> fact name
SPELLS: dict[str, str] = {
    "state.published": "published",
    "state.queued": "queued",
    "state.consumed": "consumed",
    "len(state.queues)": "queues",
    "len([uforuinstate.queues_used.itervalues()ifu.is_set()])": "queues_used",
    "len(state.queues_to_delete_when_unused)": "queues_to_delete_when_unused",
    "state.commands_put": "zero",
    "state.commands_got": "zero",
    "sum(c.qsize()forcinstate.commands_to_workers.itervalues())": "zero",
    "sum(q.qsize()forqinstate.queues.itervalues())": "messages_in_queues",
    "sum(len(ms)formsinstate.messages_by_consumer_ids.itervalues())": "messages_waiting_ack",
    "sum(q.qsize()forqinstate.responses_by_clients.itervalues())": "responses_waiting",
    "len(state.queues_by_events)": "events_subscribed",
    "len(state.events_by_queues)": "queues_subscribed",
    "len(state.queues_by_consumer_ids)": "consumers",
    "sum(len(cs)forcsinstate.consumers_by_queues.itervalues())": "consumers",
    "len(state.consumer_ids_by_clients)": "clients_of_consumers",
    "len(set(state.clients_by_consumer_ids.itervalues()))": "clients_of_consumers",
    "len(state.socks_by_clients)": "clients_connected",
    "state.worker": "zero",
}

#: per-queue expressions: regexp over the whitespace-free text -> fact name
NAMED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"state\.queues\[(['\"])(?P<q>[^'\"]+)\1\]\.qsize\(\)"), "queue_depth"),
    (re.compile(r"len\(state\.consumers_by_queues\[(['\"])(?P<q>[^'\"]+)\1\]\)"),
     "queue_consumers"),
    (re.compile(r"len\(state\.events_by_queues\[(['\"])(?P<q>[^'\"]+)\1\]\)"), "queue_events"),
)

_WORKER = re.compile(r"--worker=(\d+) ")


class EvalRefused(ValueError):
    """The expression is not in the table (or ``_eval`` is off)."""


def lookup(code: str) -> tuple[str, str | None]:
    """``(fact, queue)`` for an ``_eval`` text, after its optional ``--worker=N `` prefix.

    :raises EvalRefused: when the text is not one of the table's expressions or names a worker
        other than 0 (mqhub is one worker).
    """
    m = _WORKER.match(code)
    if m:
        if int(m.group(1)) != 0:
            raise EvalRefused("mqhub is worker 0")
        code = code[m.end():]
    key = "".join(code.split())
    fact = SPELLS.get(key)
    if fact is not None:
        return fact, None
    for rx, name in NAMED:
        found = rx.fullmatch(key)
        if found:
            return name, found.group("q")
    raise EvalRefused("not an allowed expression")


def answer(code: str, facts: Callable[[str, str | None], int]) -> str:
    """The reply data for ``code``: the fact's value as the original's ``str()`` would print it.

    :raises EvalRefused: see :func:`lookup`; also when ``facts`` raises KeyError (unknown queue).
    """
    fact, queue = lookup(code)
    if fact == "zero":
        return "0"
    try:
        return str(int(facts(fact, queue)))
    except KeyError:
        raise EvalRefused("no such queue") from None
