"""Rights enforced at the core seam: the handle ``core.session(session)`` returns.

``ICore.session(principal)`` gives the handle a connection acts through; with no rights in force
the adapter passes None and gets the core itself (nothing is checked, nothing costs). An
authenticated connection passes its :class:`mqhub.identity.Session`, and the core returns
``session.handle(core)``: a :class:`GuardedCore` that checks, with the session's cached
decisions, every call through which a connection publishes or receives, then hands it on:

- ``publish_batch`` / ``publish_entries``: publish on the address;
- ``subscribe(pattern, group=...)``: subscribe on the pattern for that group (coverage);
- ``bind_queue(pattern, queue)``: the queue's readers will receive ``pattern``;
- ``attach(queue)``, ``dead_letters(queue)``, ``delete_queue(queue)``: receiving (or
  destroying) what the queue holds needs the right to receive every pattern bound to it —
  whichever protocol declared the queue;
- ``replay_dead_letters`` / ``purge_dead_letters``: admin only.

A refusal raises :class:`mqhub.errors.Unauthorized` (counted and logged by the directory);
each adapter answers it with its protocol's own error. Group restrictions (an NSQ channel, an
MQKS queue name, a NATS queue group) that ``bind_queue`` and ``attach`` cannot see are checked
by the adapters with the same session. Everything else is the core's own method.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zope.interface import implementer

from mqhub.errors import Unauthorized
from mqhub.identity.session import ADMIN, PUBLISH, SUBSCRIBE, Session
from mqhub.interfaces import IBinding, IConsumer, ICore, IQueue

__all__ = ["GuardedCore"]


@implementer(ICore)
class GuardedCore:
    """One connection's handle on the core: its session's rights, checked before each call.

    :ivar core: the core every call goes to.
    :ivar access: the :class:`Session` whose rights are checked.
    """

    def __init__(self, core: ICore, session: Session) -> None:
        """Check with ``session``, act with ``core``."""
        self.core = core
        self.access = session

    def __getattr__(self, name: str) -> Any:
        """Every other member of ICore is the core's own (reads, settings, lifecycle)."""
        return getattr(self.core, name)

    def __repr__(self) -> str:
        """Whose handle this is."""
        return f"<GuardedCore {self.access!r}>"

    def session(self, principal: object) -> ICore:
        """A handle for another principal (from the core, not nested in this one)."""
        return self.core.session(principal)

    # publishing ------------------------------------------------------------------------------

    def publish_batch(self, address: str, bodies: list[bytes], **kw: Any) -> Any:
        """Publish, if the session may publish to ``address``."""
        session = self.access
        if not session.publish_all and not session.check_publish(address):
            raise Unauthorized(PUBLISH, address)
        return self.core.publish_batch(address, bodies, **kw)

    def publish_entries(self, address: str, entries: list[Any], **kw: Any) -> Any:
        """Publish prebuilt entries, if the session may publish to ``address``."""
        session = self.access
        if not session.publish_all and not session.check_publish(address):
            raise Unauthorized(PUBLISH, address)
        return self.core.publish_entries(address, entries, **kw)

    # receiving -------------------------------------------------------------------------------

    def subscribe(self, pattern: str, target: Any, *, group: str | None = None,
                  tag: Any = None) -> IBinding:
        """A live subscription, if the session's grants cover ``pattern`` for ``group``."""
        session = self.access
        if not session.subscribe_all and not session.check_subscribe(pattern, group):
            raise Unauthorized(SUBSCRIBE, pattern)
        return self.core.subscribe(pattern, target, group=group, tag=tag)

    def bind_queue(self, pattern: str, queue_name: str) -> IBinding:
        """Bind, if the session may receive ``pattern`` (the queue's readers will)."""
        self._may_receive((pattern,))
        return self.core.bind_queue(pattern, queue_name)

    def attach(self, queue: IQueue, target: Any, **kw: Any) -> IConsumer:
        """Attach, if the session may receive every pattern bound to ``queue``."""
        self._may_receive(b.pattern for b in self.core.bindings(queue.name))
        return self.core.attach(queue, target, **kw)

    def dead_letters(self, queue_name: str, **kw: Any) -> Any:
        """A queue's dead letters, if the session may receive what the queue is bound to."""
        self._may_receive(b.pattern for b in self.core.bindings(queue_name))
        return self.core.dead_letters(queue_name, **kw)

    def delete_queue(self, name: str) -> Any:
        """Delete a queue, if the session may receive (so also destroy) what it holds."""
        self._may_receive(b.pattern for b in self.core.bindings(name))
        return self.core.delete_queue(name)

    def replay_dead_letters(self, queue_name: str, msg_ids: Iterable[int] | None = None) -> Any:
        """Replay dead letters: an admin's call."""
        self._admin("replay dead letters of " + queue_name)
        return self.core.replay_dead_letters(queue_name, msg_ids)

    def purge_dead_letters(self, queue_name: str, msg_ids: Iterable[int] | None = None) -> Any:
        """Purge dead letters: an admin's call."""
        self._admin("purge dead letters of " + queue_name)
        return self.core.purge_dead_letters(queue_name, msg_ids)

    def _may_receive(self, patterns: Iterable[str]) -> None:
        """:raises Unauthorized: unless the session may receive every pattern (any group)."""
        session = self.access
        if session.subscribe_all:
            return
        for pattern in patterns:
            if not session.may_receive(pattern):
                session.refuse(SUBSCRIBE, pattern)
                raise Unauthorized(SUBSCRIBE, pattern)

    def _admin(self, what: str) -> None:
        """:raises Unauthorized: unless the session is an admin's."""
        if not self.access.admin:
            self.access.refuse(ADMIN, what)
            raise Unauthorized(ADMIN, what)
