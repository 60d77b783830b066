"""A token trie of NATS subscriptions with ``*`` and ``>`` wildcards (no Twisted, no zope).

A publish walks only the branches its tokens can match (literal, ``*``, ``>``); it never scans
every subscription. Queue subscribers are grouped by queue name across patterns, as
nats-server does, so one message reaches one member of each group.
"""

from __future__ import annotations

from typing import Any


class _Node:
    """One trie level: children by token, and the subscriptions that end here."""

    __slots__ = ("children", "plain", "queues")

    def __init__(self) -> None:
        """Start empty."""
        self.children: dict[str, _Node] = {}
        self.plain: list[Any] = []
        self.queues: dict[str, list[Any]] = {}

    def empty(self) -> bool:
        """True when nothing ends here and nothing hangs below."""
        return not (self.children or self.plain or self.queues)


class Sublist:
    """Subscriptions indexed by their subject pattern.

    A subscription is any object with ``subject`` (the pattern) and ``queue`` (a queue group
    name or None) attributes; identity is used for removal.
    """

    def __init__(self) -> None:
        """Start with no subscriptions."""
        self._root = _Node()
        self.count = 0

    def insert(self, sub: Any) -> None:
        """Add ``sub`` under its pattern."""
        node = self._root
        for tok in sub.subject.split("."):
            nxt = node.children.get(tok)
            if nxt is None:
                nxt = node.children[tok] = _Node()
            node = nxt
        if sub.queue is None:
            node.plain.append(sub)
        else:
            node.queues.setdefault(sub.queue, []).append(sub)
        self.count += 1

    def remove(self, sub: Any) -> bool:
        """Remove ``sub``; return whether it was present. Empty branches are pruned."""
        path = [self._root]
        node = self._root
        tokens = sub.subject.split(".")
        for tok in tokens:
            node = node.children.get(tok)  # type: ignore[assignment]
            if node is None:
                return False
            path.append(node)
        if sub.queue is None:
            try:
                node.plain.remove(sub)
            except ValueError:
                return False
        else:
            members = node.queues.get(sub.queue)
            if not members or sub not in members:
                return False
            members.remove(sub)
            if not members:
                del node.queues[sub.queue]
        self.count -= 1
        for depth in range(len(tokens), 0, -1):
            if path[depth].empty():
                del path[depth - 1].children[tokens[depth - 1]]
            else:
                break
        return True

    def match(self, subject: str) -> tuple[list[Any], dict[str, list[Any]]]:
        """Return ``(plain_subs, {queue: members})`` of every subscription matching ``subject``."""
        plain: list[Any] = []
        groups: dict[str, list[Any]] = {}
        tokens = subject.split(".")
        self._walk(self._root, tokens, 0, len(tokens), plain, groups)
        return plain, groups

    def _walk(self, node: _Node, tokens: list[str], i: int, n: int, plain: list[Any],
              groups: dict[str, list[Any]]) -> None:
        """Collect matches below ``node`` for ``tokens[i:]``."""
        children = node.children
        if i == n:
            _collect(node, plain, groups)
            return
        fwc = children.get(">")
        if fwc is not None:
            _collect(fwc, plain, groups)
        child = children.get(tokens[i])
        if child is not None:
            self._walk(child, tokens, i + 1, n, plain, groups)
        if tokens[i] != "*":
            pwc = children.get("*")
            if pwc is not None:
                self._walk(pwc, tokens, i + 1, n, plain, groups)

    def all(self) -> list[Any]:
        """Every subscription (for introspection)."""
        out: list[Any] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            out.extend(node.plain)
            for members in node.queues.values():
                out.extend(members)
            stack.extend(node.children.values())
        return out


def _collect(node: _Node, plain: list[Any], groups: dict[str, list[Any]]) -> None:
    """Add the subscriptions ending at ``node`` to the result."""
    if node.plain:
        plain.extend(node.plain)
    for name, members in node.queues.items():
        groups.setdefault(name, []).extend(members)


def subject_matches(pattern: str, subject: str) -> bool:
    """True when the NATS ``pattern`` matches the literal ``subject`` (cold-path helper)."""
    pt = pattern.split(".")
    st = subject.split(".")
    for i, tok in enumerate(pt):
        if tok == ">":
            return len(st) > i
        if i >= len(st):
            return False
        if tok != "*" and tok != st[i]:
            return False
    return len(pt) == len(st)
