"""eMQP answers to clients that wait for the store: a client's dispatch ack and a job's result
go out only once every store write issued before them is durable.

:class:`StoredReplies` holds them; :func:`send_logged` is the send the router uses wherever one
unreachable peer must not stop a loop (these replies, heartbeats).
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.protocols.emqp import frames as F
from mqhub.protocols.emqp.jobs import Frames, Send

log = Logger(namespace="mqhub.emqp")


def send_logged(send: Send, frames: Frames) -> None:
    """Send, logging (not raising) a failure to reach one peer."""
    try:
        send(frames)
    except Exception as exc:  # noqa: BLE001 - one unreachable peer must not stop the loop
        log.debug("eMQP: send to {p} failed: {e}", p=F.peer_label(frames[0]), e=exc)


class StoredReplies:
    """Client frames sent once every store write made so far is durable.

    ``broker.barrier()`` fires once every write the core issued so far (the job's publish, the
    ack that finishes it) is durable, without committing anything itself. A client's dispatch
    ack therefore means "stored", and it never sees the result of a job that a crash could
    still run again. When nothing is pending the frames go out at once; otherwise the frames of
    a turn are sealed at the end of that turn under one barrier taken then, so it covers every
    commit the turn issued (a barrier taken earlier, or one still outstanding from an earlier
    turn, would not cover a later publish).
    """

    def __init__(self, broker: Any, clock: Any, send: Send) -> None:
        """:param broker: the core (its ``barrier()``). :param clock: IReactorTime for the
        end-of-turn call. :param send: sends one frame list on the frontend ROUTER."""
        self.broker = broker
        self.clock = clock
        self.send = send
        #: frames of this turn waiting to be sealed under one barrier
        self.pending: list[Frames] = []
        #: the end-of-turn call that seals ``pending`` (None when none is scheduled)
        self.seal_call: Any = None

    def after_commit(self, frames: list[Frames]) -> None:
        """Send ``frames`` now if nothing is waiting for the store, else at the end of the
        turn once a barrier over everything issued by then fires."""
        if self.seal_call is None:
            if self.broker.barrier().called:
                for msg in frames:
                    send_logged(self.send, msg)
                return
            self.seal_call = self.clock.callLater(0, self.seal)
        self.pending.extend(frames)

    def seal(self) -> None:
        """End of the turn: the frames gathered wait for a barrier over everything issued."""
        self.seal_call = None
        post, self.pending = self.pending, []

        def flush(outcome: Any) -> None:
            """Send them once stored; withhold them (logged) when a write failed."""
            if isinstance(outcome, Failure):  # not stored: no ack (eMQP has no error frame)
                log.error("eMQP: {n} client replies withheld, a store write failed: {e}",
                          n=len(post), e=outcome.getErrorMessage())
                return
            for msg in post:
                send_logged(self.send, msg)

        self.broker.barrier().addBoth(flush)

    def cancel(self) -> None:
        """Cancel the end-of-turn seal (the router stops)."""
        if self.seal_call is not None and self.seal_call.active():
            self.seal_call.cancel()
        self.seal_call = None
