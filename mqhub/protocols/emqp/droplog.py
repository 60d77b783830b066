"""Rate-limited logging of the eMQP messages the router drops (bad frames, unknown peers)."""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from mqhub.protocols.emqp import frames as F

log = Logger(namespace="mqhub.emqp")


class DropLog:
    """Rate-limited log of dropped messages: at most ``per_second`` lines, the rest counted."""

    def __init__(self, clock: Any, per_second: int = 20) -> None:
        """:param clock: IReactorTime for the one-second windows."""
        self.clock = clock
        self.per_second = per_second
        self.window = -1
        self.lines = 0
        self.suppressed = 0
        self.total = 0

    def drop(self, socket: str, peer: bytes, reason: str) -> None:
        """Count one dropped message and log it unless this second's budget is spent."""
        self.total += 1
        second = int(self.clock.seconds())
        if second != self.window:
            if self.suppressed:
                log.warn("eMQP: {n} more dropped messages not logged", n=self.suppressed)
            self.window, self.lines, self.suppressed = second, 0, 0
        if self.lines < self.per_second:
            self.lines += 1
            log.warn("eMQP {socket}: dropped message from {peer}: {reason}", socket=socket,
                     peer=F.peer_label(peer), reason=reason)
        else:
            self.suppressed += 1
