"""Adapters' own durable state (``ICore.state``) in the embedded core: straight into the store.

NSQ topics, MQKS and VibeMQ queue settings, mq9 mailboxes and persisted broadcasts are records
and entry lists of the adapters themselves; in the embedded core they are store meta keys and
store entry lists, committed as the adapter's own batches (not through the core's commits: an
adapter's commit fails to the adapter, in issue order with every other store commit).

A store adapts to IAdapterState too (``IAdapterState(store)`` wraps it in a
:class:`StoreState`), so code handed a store where it keeps state works unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zope.interface import implementer
from zope.interface.declarations import classImplements
from zope.interface.interface import InterfaceClass, adapter_hooks

from mqhub.interfaces import IAdapterState, IMessageStore, IStateBatch
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry

if TYPE_CHECKING:  # pragma: no cover
    from twisted.internet.defer import Deferred

# a WriteBatch is the embedded core's batch of adapter writes (it has more, for the core's use)
classImplements(WriteBatch, IStateBatch)


@implementer(IAdapterState)
class StoreState:
    """:class:`mqhub.interfaces.IAdapterState` over one IMessageStore."""

    __slots__ = ("store",)

    def __init__(self, store: IMessageStore) -> None:
        """Keep the adapters' state in ``store``."""
        self.store = store

    def watch(self, prefix: str, changed: Callable[[str, bytes | None], None]) -> None:
        """One node: no other node ever writes these records, so ``changed`` is never called."""

    def batch(self) -> WriteBatch:
        """A new, empty batch of writes."""
        return WriteBatch()

    def commit(self, batch: IStateBatch) -> Deferred[None]:
        """Apply ``batch`` in the store's next group commit; fire when durable."""
        return self.store.commit(batch)

    def scan_meta(self, prefix: str) -> Deferred[list[tuple[str, bytes]]]:
        """Every record whose key starts with ``prefix``, in key order."""
        return self.store.scan_meta(prefix)

    def read_entries(self, name: str, after: tuple[int, int] | None,
                     limit: int) -> Deferred[list[Entry]]:
        """Up to ``limit`` entries of the list ``name`` in ready order after ``after``."""
        return self.store.read_entries(name, after, limit)


def _adapt(provided: InterfaceClass, obj: Any) -> Any:
    """zope adapter hook: ``IAdapterState(store)`` is the store's :class:`StoreState`."""
    if provided is IAdapterState and IMessageStore.providedBy(obj):
        return StoreState(obj)
    return None


adapter_hooks.append(_adapt)
