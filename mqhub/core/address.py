"""The address space: dotted names, pattern syntaxes and the token trie that matches them.

Patterns (one syntax covers every protocol):

- a literal token matches itself;
- ``*`` as a whole token matches exactly one token (NATS);
- ``*`` inside a token (``user*``, ``a*b``) is an MQKS mask: it matches any run of characters
  within one token;
- ``>`` or ``#`` as the last token matches one or more tokens (NATS ``>``, mq9 ``#``).

:class:`AddressTrie` indexes patterns by token so matching an address only visits the nodes its
tokens reach; :func:`pattern_matches` is the plain reference matcher used by property tests.
This module imports neither Twisted nor zope.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

from mqhub.records import MAX_ADDRESS, is_pattern, validate_address, validate_pattern

__all__ = ["MAX_ADDRESS", "AddressTrie", "is_pattern", "pattern_matches", "validate_address",
           "validate_pattern"]


def _mask_regex(token: str) -> re.Pattern[str]:
    """Compile an MQKS mask token (``*`` = any run of characters inside one token)."""
    return re.compile("[^.]*".join(re.escape(p) for p in token.split("*")), re.DOTALL)


def _token_matches(pt: str, token: str) -> bool:
    """Reference matching of one pattern token against one address token."""
    if pt == "*":
        return True
    if "*" in pt:
        return _mask_regex(pt).fullmatch(token) is not None
    return pt == token


def pattern_matches(pattern: str, address: str) -> bool:
    """Reference (brute-force) matcher: does ``pattern`` match ``address``?"""
    pts = pattern.split(".")
    ats = address.split(".")
    for i, pt in enumerate(pts):
        if pt in (">", "#") and i == len(pts) - 1:
            return len(ats) > i
        if i >= len(ats) or not _token_matches(pt, ats[i]):
            return False
    return len(ats) == len(pts)


# Shared, immutable stand-ins for a node's empty containers (replaced at the first write), so a
# node costs one small object: one mq9 mailbox alone adds four nodes.
_NO_MAP: Any = MappingProxyType({})
_NO_LIST: Any = ()


class _Node:
    """One trie level: literal children, the ``*`` child, mask children and terminal values."""

    __slots__ = ("children", "star", "masks", "values", "tail", "wild")

    def __init__(self) -> None:
        """Start empty."""
        self.children: dict[str, _Node] = _NO_MAP
        self.star: _Node | None = None
        self.masks: dict[str, tuple[re.Pattern[str], _Node]] = _NO_MAP
        self.values: list[Any] = _NO_LIST      # patterns ending exactly here
        self.tail: list[Any] = _NO_LIST        # patterns ending here with ``>``/``#``
        self.wild: list[tuple[re.Pattern[str] | None, _Node]] = _NO_LIST   # star then masks

    def rebuild(self) -> None:
        """Recompute ``wild`` (the ``*`` child first, then mask children) after a change."""
        wild: list[tuple[re.Pattern[str] | None, _Node]] = []
        if self.star is not None:
            wild.append((None, self.star))
        wild.extend(self.masks.values())
        self.wild = wild if wild else _NO_LIST

    def is_empty(self) -> bool:
        """True when no pattern passes through this node."""
        return not (self.children or self.star or self.masks or self.values or self.tail)


class AddressTrie:
    """Patterns indexed by token; ``match`` visits only the nodes an address's tokens reach."""

    def __init__(self) -> None:
        """Start with no patterns."""
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        """Number of (pattern, value) pairs stored."""
        return self._count

    def add(self, pattern: str, value: Any) -> None:
        """Index ``value`` under ``pattern`` (a value may be added under many patterns)."""
        node = self._root
        tokens = pattern.split(".")
        last = len(tokens) - 1
        for i, token in enumerate(tokens):
            if i == last and token in (">", "#"):
                if node.tail is _NO_LIST:
                    node.tail = []
                node.tail.append(value)
                self._count += 1
                return
            if token == "*":
                if node.star is None:
                    node.star = _Node()
                    node.rebuild()
                node = node.star
            elif "*" in token:
                mask = node.masks.get(token)
                if mask is None:
                    if node.masks is _NO_MAP:
                        node.masks = {}
                    mask = node.masks[token] = (_mask_regex(token), _Node())
                    node.rebuild()
                node = mask[1]
            else:
                child = node.children.get(token)
                if child is None:
                    if node.children is _NO_MAP:
                        node.children = {}
                    child = node.children[token] = _Node()
                node = child
        if node.values is _NO_LIST:
            node.values = []
        node.values.append(value)
        self._count += 1

    def remove(self, pattern: str, value: Any) -> bool:
        """Remove one ``value`` stored under ``pattern``; return whether it was there."""
        tokens = pattern.split(".")
        path: list[tuple[_Node, str]] = []
        node = self._root
        last = len(tokens) - 1
        for i, token in enumerate(tokens):
            if i == last and token in (">", "#"):
                return self._discard(node.tail, value, path, node)
            path.append((node, token))
            if token == "*":
                nxt = node.star
            elif "*" in token:
                mask = node.masks.get(token)
                nxt = mask[1] if mask else None
            else:
                nxt = node.children.get(token)
            if nxt is None:
                return False
            node = nxt
        return self._discard(node.values, value, path, node)

    def _discard(self, items: list[Any], value: Any, path: list[tuple[_Node, str]],
                 node: _Node) -> bool:
        """Drop ``value`` from ``items`` and prune empty nodes along ``path``."""
        for i, v in enumerate(items):
            if v is value or v == value:
                del items[i]
                break
        else:
            return False
        self._count -= 1
        while path and node.is_empty():
            parent, token = path.pop()
            if token == "*":
                parent.star = None
                parent.rebuild()
            elif "*" in token:
                del parent.masks[token]
                parent.rebuild()
            else:
                del parent.children[token]
            node = parent
        return True

    def match(self, address: str) -> list[Any]:
        """Return the values of every pattern matching ``address`` (duplicates removed)."""
        out: list[Any] = []
        node = self._root
        nodes: list[_Node] | None = None
        for token in address.split("."):
            if nodes is None:
                # one node on the frontier (the common case): no list juggling
                if node.tail:
                    out.extend(node.tail)
                if node.wild:
                    child = node.children.get(token)
                    nodes = [child] if child is not None else []
                    for rx, wnode in node.wild:
                        if rx is None or rx.fullmatch(token) is not None:
                            nodes.append(wnode)
                    if len(nodes) == 1:
                        node = nodes[0]
                        nodes = None
                    elif not nodes:
                        break
                    continue
                child = node.children.get(token)
                if child is None:
                    nodes = []
                    break
                node = child
                continue
            nxt: list[_Node] = []
            for n in nodes:
                if n.tail:
                    out.extend(n.tail)
                child = n.children.get(token)
                if child is not None:
                    nxt.append(child)
                if n.wild:
                    for rx, wnode in n.wild:
                        if rx is None or rx.fullmatch(token) is not None:
                            nxt.append(wnode)
            if not nxt:
                return out if len(out) < 2 else list(dict.fromkeys(out))
            nodes = nxt
        if nodes is None:
            if node.values:
                out.extend(node.values)
        else:
            for n in nodes:
                if n.values:
                    out.extend(n.values)
        if len(out) > 1:
            return list(dict.fromkeys(out))
        return out
