"""Bindings (address pattern -> queue or live subscriber) and the cached routes a publish uses.

A :class:`Route` is resolved once per address and cached until the binding epoch changes, so a
publish costs one dict lookup; resolving walks the token trie and never scans all bindings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zope.interface import implementer

from mqhub.core.address import AddressTrie
from mqhub.interfaces import IBinding, IRoute

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.queue import Queue

MAX_CACHED_ROUTES = 100_000


@implementer(IBinding)
class Binding:
    """One subscription: ``pattern`` to a queue, or to a live ``target`` (IDeliveryTarget)."""

    __slots__ = ("id", "pattern", "queue", "target", "group", "tag", "broker")

    def __init__(self, bid: int, pattern: str, queue: Queue | None, target: Any,
                 group: str | None, tag: Any, broker: Any) -> None:
        """Made by the broker only (``bind_queue`` / ``subscribe``)."""
        self.id = bid
        self.pattern = pattern
        self.queue = queue
        self.target = target
        self.group = group
        self.tag = tag
        self.broker = broker

    def __repr__(self) -> str:
        """Readable form for the manhole."""
        to = (f"queue {self.queue.name}") if self.queue is not None else repr(self.target)
        group = f" group {self.group}" if self.group else ""
        return f"<Binding {self.id} {self.pattern} -> {to}{group}>"


@implementer(IRoute)
class Route:
    """Everything a publish to one address reaches; immutable except the group rotation.

    Every address that nothing matches shares one empty Route per epoch (its ``address`` is "").
    """

    __slots__ = ("epoch", "address", "queues", "targets", "groups", "park", "empty", "_rr")

    def __init__(self, epoch: int, address: str, queues: tuple[Queue, ...],
                 targets: tuple[Binding, ...], groups: tuple[tuple[Binding, ...], ...],
                 park: Queue | None) -> None:
        """Made by :class:`Router` only."""
        self.epoch = epoch
        self.address = address
        self.queues = queues
        self.targets = targets
        self.groups = groups
        self.park = park
        self.empty = not (queues or targets or groups or park is not None)
        self._rr: list[int] | None = None

    def pick(self, i: int) -> Binding:
        """Return the member of group ``i`` that gets the next batch (round robin)."""
        members = self.groups[i]
        rr = self._rr
        if rr is None:
            rr = self._rr = [0] * len(self.groups)
        n = rr[i]
        rr[i] = n + 1
        return members[n % len(members)]


class Router:
    """The trie of bindings plus the per-address route cache and the binding epoch."""

    def __init__(self) -> None:
        """Start with no bindings."""
        self.trie = AddressTrie()
        self.epoch = 0
        self.cache: dict[str, Route] = {}
        self.parking: dict[str, Queue] = {}     # address -> its parking queue (parked or paused)
        self.paused: set[str] = set()
        self._empty = Route(self.epoch, "", (), (), (), None)

    def changed(self) -> None:
        """Bindings, parking or pauses changed: new epoch, empty cache."""
        self.epoch += 1
        self.cache.clear()
        self._empty = Route(self.epoch, "", (), (), (), None)

    def route(self, address: str) -> Route:
        """Return the (cached) route of ``address``."""
        r = self.cache.get(address)
        if r is None:
            r = self.resolve(address)
            if len(self.cache) >= MAX_CACHED_ROUTES:
                self.cache.clear()
            self.cache[address] = r
        return r

    def resolve(self, address: str) -> Route:
        """Resolve ``address`` against the trie (uncached)."""
        matched = self.trie.match(address)
        if not self.parking or address not in self.parking:
            if not matched:
                return self._empty   # one shared route for every address nothing matches
            if len(matched) == 1:    # the common case: one binding
                b = matched[0]
                if b.queue is not None:
                    return Route(self.epoch, address, (b.queue,), (), (), None)
                if b.group:
                    return Route(self.epoch, address, (), (), ((b,),), None)
                return Route(self.epoch, address, (), (b,), (), None)
        queues: list[Any] = []
        targets: list[Binding] = []
        groups: dict[str, list[Binding]] | None = None
        for b in matched:
            q = b.queue
            if q is not None:
                if q not in queues:
                    queues.append(q)
            elif b.group:
                if groups is None:
                    groups = {}
                groups.setdefault(b.group, []).append(b)
            else:
                targets.append(b)
        park = None
        if self.parking:
            park = self.parking.get(address)
            if park is not None and not (address in self.paused or not queues):
                park = None
            if park is not None:
                queues = []
        return Route(self.epoch, address, tuple(queues), tuple(targets),
                     tuple(tuple(g) for g in groups.values()) if groups else (), park)
