"""MQKS identity: a listener-level user, since MQKS has no credentials on its wire.

With the hub's users file (``--users``) every MQKS connection acts as the user named by
``--option mqks.user=NAME`` (for trusted networks), or as ``[anonymous]`` when that option is
not set; with neither, every publish and consume is refused. Rights, in the model's terms:

- ``publish {event} ...`` needs publish on the event (an address): the connection publishes
  through its session's handle on the core, which refuses it (``Unauthorized``);
- ``consume {queue} events...`` and ``rebind`` need subscribe, for the consumer group
  ``{queue}``, on every event the queue is bound to *after* the change (masks and ``*``
  included: a mask is allowed only when the user's grants cover every address it matches),
  so a queue never takes in what its consumers may not read; ``delete_queue`` needs the same
  on the events the queue has.

Refusals are MQKS error lines (``{id} error {error_id}``; the reason goes to the log) and the
connection goes on. No Twisted import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mqhub.errors import PluginError
from mqhub.identity import Principal, Rights, Session
from mqhub.protocols.mqks.codec import RequestError

__all__ = ["MqksGuard", "Refused", "check_events"]


class Refused(RequestError):
    """The connection's user may not do this (answered with an MQKS error line)."""


class MqksGuard:
    """The session every MQKS connection of one listener acts in.

    :param identity: the hub's :class:`mqhub.identity.Directory`, or None.
    :param user: ``--option mqks.user=NAME``, or None.
    :raises PluginError: when ``user`` is set but the users file has no such user.
    """

    def __init__(self, identity: Any, user: str | None) -> None:
        """Check the listener's user against the users file."""
        self.identity = identity
        self.user = user
        self.enforcing = identity is not None and identity.enforcing
        if user and not self.enforcing:
            raise PluginError("mqks.user needs a users file (twistd mqhub --users FILE)")
        if user and identity.named(user) is None:
            raise PluginError(f"mqks.user: no user {user!r} in the users file")

    def open(self, peer: str) -> Session | None:
        """A new connection's session (None: nothing is checked)."""
        if not self.enforcing:
            return None
        directory = self.identity
        principal = directory.named(self.user) if self.user else directory.anonymous
        if principal is None:  # no [anonymous]: a session that may do nothing
            principal = Principal(None, Rights(), "anonymous")
        return directory.session("mqks", principal, peer)


def check_events(session: Session | None, queue: str, events: Iterable[str]) -> None:
    """:raises Refused: unless ``session`` may receive every event for group ``queue``."""
    if session is None or session.subscribe_all:
        return
    for event in sorted(events):
        if not session.check_subscribe(event, queue):
            raise Refused(f"not allowed to receive {event!r} on queue {queue!r}")
