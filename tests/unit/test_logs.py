"""mqhub.logs: stdlib ``logging`` records of mqhub modules reach twisted.logger observers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.logger import LogLevel, formatEvent

from mqhub.logs import forward_stdlib_logging


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    """Forward the ``mqhub`` stdlib logger into a list for the test, then restore it."""
    target = logging.getLogger("mqhub")
    saved = (target.level, target.propagate)
    seen: list[dict[str, Any]] = []
    handler = forward_stdlib_logging(seen.append)
    try:
        yield seen
    finally:
        target.removeHandler(handler)
        target.setLevel(saved[0])
        target.propagate = saved[1]


def test_records_become_events_with_namespace_and_level(events: list[dict[str, Any]]) -> None:
    """A warning of mqhub.store.lmdb arrives once, under its logger name, at warn level."""
    logging.getLogger("mqhub.store.lmdb").warning("segment %d: damaged at %d", 3, 120)
    logging.getLogger("mqhub.core.broker").info("recovered %s", "q")
    logging.getLogger("mqhub.core.broker").debug("below the forwarded level")
    logging.getLogger("elsewhere").error("not mqhub's")
    assert [(e["log_namespace"], e["log_level"], formatEvent(e)) for e in events] == [
        ("mqhub.store.lmdb", LogLevel.warn, "segment 3: damaged at 120"),
        ("mqhub.core.broker", LogLevel.info, "recovered q"),
    ]


def test_exceptions_travel_as_failures(events: list[dict[str, Any]]) -> None:
    """``log.exception`` keeps its traceback: the event carries the Failure at error level."""
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("mqhub.scheduler.service").exception("sweep %s failed", "ttl")
    (event,) = events
    assert event["log_level"] == LogLevel.error
    assert formatEvent(event) == "sweep ttl failed"
    assert event["log_failure"].check(ValueError)
