"""Log plumbing for twistd: ``--log-format`` observers and the stdlib ``logging`` bridge.

twistd logs through ``twisted.logger``; mqhub's core, scheduler and store log through stdlib
``logging`` (the store and codecs must not need Twisted). :func:`forward_stdlib_logging` sends
those records into ``twisted.logger`` so they land in twistd's log, in its format (text or JSON).
"""

from __future__ import annotations

import logging
import sys
from typing import IO

from twisted.logger import (
    ILogObserver,
    Logger,
    LogLevel,
    globalLogPublisher,
    jsonFileLogObserver,
)
from twisted.python.failure import Failure

#: Where twistd's JSON observer writes: None for stdout, else a file path (twistd --logfile).
json_log_path: str | None = None


def json_observer(out: IO[str] | None = None) -> ILogObserver:
    """An observer writing every event as one JSON object per line.

    Used as twistd's ``--logger`` factory when ``--log-format json`` is given. It writes to
    ``out``, else to the file named by twistd's ``--logfile`` (:data:`json_log_path`), else to
    stdout.
    """
    if out is None:
        if json_log_path is not None:
            out = open(json_log_path, "a", buffering=1, encoding="utf-8")
        else:
            out = sys.stdout
    return jsonFileLogObserver(out, recordSeparator="")


def _level(levelno: int) -> LogLevel:
    """The twisted.logger level of a stdlib level number."""
    if levelno >= logging.CRITICAL:
        return LogLevel.critical
    if levelno >= logging.ERROR:
        return LogLevel.error
    if levelno >= logging.WARNING:
        return LogLevel.warn
    if levelno >= logging.INFO:
        return LogLevel.info
    return LogLevel.debug


class TwistedLogHandler(logging.Handler):
    """A stdlib logging handler that re-emits each record as a ``twisted.logger`` event.

    The event's namespace is the stdlib logger name; an exception (``log.exception``) travels
    as the event's failure, so twistd prints its traceback.
    """

    def __init__(self, observer: ILogObserver) -> None:
        """:param observer: where events go (twistd's global log publisher in the broker)."""
        super().__init__()
        self.observer = observer

    def emit(self, record: logging.LogRecord) -> None:
        """Forward one record."""
        try:
            message = record.getMessage()
            logger = Logger(namespace=record.name, observer=self.observer)
            level = _level(record.levelno)
            exc_type, exc_value, exc_tb = record.exc_info or (None, None, None)
            if exc_value is not None:
                failure = Failure(exc_value, exc_type, exc_tb)
                logger.failure("{message}", failure, level, message=message)
            else:
                logger.emit(level, "{message}", message=message)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def forward_stdlib_logging(
    observer: ILogObserver | None = None, name: str = "mqhub", level: int = logging.INFO
) -> TwistedLogHandler:
    """Send stdlib records of logger ``name`` (and its children) at ``level`` or above to
    ``observer`` (default: twisted's global log publisher) instead of stderr.

    :returns: the installed handler (``logging.getLogger(name).removeHandler`` undoes it).
    """
    handler = TwistedLogHandler(observer if observer is not None else globalLogPublisher)
    target = logging.getLogger(name)
    target.addHandler(handler)
    target.setLevel(level)
    target.propagate = False
    return handler
