"""Rights as address patterns: who may publish to, and subscribe to, which addresses.

A grant is a NATS-syntax pattern (``*`` one token, ``>`` one or more tokens, last), optionally
followed by a space and a *group* pattern, as in nats-server's queue permissions: the group is
the name of the consumer group that shares the subscription (a NATS queue group, an NSQ channel,
an MQKS queue). Two questions are asked of a set of grants:

- :meth:`Grants.allows`: may a message on this literal address be published (or received)?
- :meth:`Grants.covers`: does this *subscription pattern* (NATS ``*``/``>``, mq9's trailing
  ``#``, MQKS masks such as ``user.*.seen`` or ``ab*c``) only ever match addresses the grants
  allow? A subscription is refused unless it is covered, as nats-server refuses a SUB whose
  subject its allow list does not match, so a message reaches only principals allowed its
  address.

Legacy files (NSQ's secrets with topic/channel regular expressions, VibeMQ's case-insensitive
queue globs) cannot be written as token patterns; their grants are :data:`Matcher` callables
that answer for literal addresses only (a wildcard subscription is covered only by patterns).
NATS's own permissions (allow and deny lists of the plugin's users and JWTs) are
:data:`Oracle` callables that answer for patterns too (their coverage rule is NATS's).

Pure module: no Twisted, no I/O. Decisions here are not cached; :mod:`mqhub.identity.session`
caches them per connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["ALL_RIGHTS", "Grant", "Grants", "Matcher", "Oracle", "Principal", "Rights", "RightsError", "NOTHING",
           "EVERYTHING", "parse_grant", "covers_tokens", "split_pattern"]

#: A legacy grant for literal addresses: ``matcher(address, group) -> allowed``.
Matcher = Callable[[str, "str | None"], bool]
#: A grant that decides for patterns too: ``oracle(pattern, group) -> covered``.
Oracle = Callable[[str, "str | None"], bool]


class RightsError(ValueError):
    """A grant is not a valid pattern."""


class Grant(NamedTuple):
    """One pattern grant: address tokens, and group tokens (None: any group, or none)."""

    tokens: tuple[str, ...]
    group: tuple[str, ...] | None

    def __str__(self) -> str:
        """The grant as written in the users file."""
        text = ".".join(self.tokens)
        return text if self.group is None else f"{text} {'.'.join(self.group)}"


def split_pattern(pattern: str) -> tuple[str, ...]:
    """Tokens of a subscription or address pattern, mq9's trailing ``#`` read as ``>``."""
    tokens = tuple(pattern.split("."))
    if tokens and tokens[-1] == "#":
        tokens = tokens[:-1] + (">",)
    return tokens


def _check_tokens(text: str, what: str) -> tuple[str, ...]:
    """The tokens of a grant pattern (NATS syntax only) or RightsError."""
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise RightsError(f"{what} {text!r} is empty or holds whitespace")
    tokens = tuple(text.split("."))
    for i, tok in enumerate(tokens):
        if not tok:
            raise RightsError(f"{what} {text!r} has an empty token")
        if tok == ">" and i != len(tokens) - 1:
            raise RightsError(f"{what} {text!r}: '>' may only be the last token")
        if ("*" in tok and tok != "*") or (">" in tok and tok != ">"):
            raise RightsError(f"{what} {text!r}: '*' and '>' must be whole tokens (NATS syntax)")
    return tokens


def parse_grant(text: str) -> Grant:
    """Parse ``"PATTERN"`` or ``"PATTERN GROUP"``.

    :raises RightsError: when either part is not a NATS-syntax pattern.
    """
    if not isinstance(text, str):
        raise RightsError(f"a grant must be a string, got {text!r}")
    parts = text.split()
    if len(parts) == 1 and text == parts[0]:
        return Grant(_check_tokens(parts[0], "pattern"), None)
    if len(parts) == 2 and text == f"{parts[0]} {parts[1]}":
        return Grant(_check_tokens(parts[0], "pattern"), _check_tokens(parts[1], "group"))
    raise RightsError(f"grant {text!r} must be 'PATTERN' or 'PATTERN GROUP' (one space)")


def covers_tokens(grant: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    """True when every address ``wanted`` can match is matched by ``grant``.

    ``wanted`` may hold ``*`` (one token), ``>`` (last: one or more) and MQKS masks (``*``
    inside a token: one token). A literal grant token covers only the same literal token; a
    ``*`` covers any one-token part; a ``>`` covers the rest, one token or more.
    """
    n = len(wanted)
    for i, g in enumerate(grant):
        if g == ">":
            return n > i
        if i >= n:
            return False
        w = wanted[i]
        if w == ">":
            return False
        if g == "*":
            continue
        if w != g or "*" in w:
            return False
    return n == len(grant)


@dataclass(frozen=True)
class Grants:
    """The patterns (and legacy matchers) of one right (publish or subscribe)."""

    patterns: tuple[Grant, ...] = ()
    matchers: tuple[Matcher, ...] = ()
    oracles: tuple[Oracle, ...] = ()
    #: True when a plain ``>`` grant allows every address and group (checks can be skipped)
    everything: bool = field(init=False)

    def __post_init__(self) -> None:
        """Work out :attr:`everything` once."""
        object.__setattr__(self, "everything",
                           any(g.tokens == (">",) and g.group is None for g in self.patterns))

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Grants:
        """Grants from users-file strings.

        :raises RightsError: on an invalid entry.
        """
        return cls(tuple(parse_grant(t) for t in texts))

    def __len__(self) -> int:
        """How many grants (patterns, matchers and oracles)."""
        return len(self.patterns) + len(self.matchers) + len(self.oracles)

    def allows(self, address: str, group: str | None = None) -> bool:
        """May a message on the literal ``address`` be handled (received by ``group``)?"""
        if self.everything:
            return True
        if self.covers(address, group):
            return True
        return any(m(address, group) for m in self.matchers)

    def covers(self, pattern: str, group: str | None = None) -> bool:
        """Is every address ``pattern`` matches allowed (for consumer group ``group``)?

        nats-server's queue rule: when grants with a group match the pattern, a subscription
        with a group is allowed only if one of their group patterns matches its group;
        otherwise the plain grants decide. A subscription without a group needs a plain grant.
        Legacy matchers answer only for a literal pattern.
        """
        if self.everything:
            return True
        wanted = split_pattern(pattern)
        plain = False
        grouped: list[tuple[str, ...]] = []
        for g in self.patterns:
            if covers_tokens(g.tokens, wanted):
                if g.group is None:
                    plain = True
                else:
                    grouped.append(g.group)
        if group is not None and grouped:
            name = tuple(group.split("."))
            return any(covers_tokens(g, name) for g in grouped)
        return plain or self._callables(pattern, group, wanted)

    def reaches(self, pattern: str) -> bool:
        """Is every address ``pattern`` matches allowed for *some* consumer group?

        What the core seam asks when a queue is bound or attached: the address rule of
        :meth:`covers` without the group (a protocol that knows the group checks it too).
        """
        if self.everything:
            return True
        wanted = split_pattern(pattern)
        if any(covers_tokens(g.tokens, wanted) for g in self.patterns):
            return True
        return self._callables(pattern, None, wanted)

    def _callables(self, pattern: str, group: str | None, wanted: tuple[str, ...]) -> bool:
        """What the oracles say, or for a literal pattern the legacy matchers."""
        if any(o(pattern, group) for o in self.oracles):
            return True
        if self.matchers and not any("*" in t or t == ">" for t in wanted):
            return any(m(pattern, group) for m in self.matchers)
        return False


NOTHING = Grants()
EVERYTHING = Grants((Grant((">",), None),))


@dataclass(frozen=True)
class Rights:
    """What one principal may do: publish, subscribe (and receive), administer."""

    publish: Grants = NOTHING
    subscribe: Grants = NOTHING
    admin: bool = False

    @property
    def count(self) -> int:
        """Number of grants (NSQ's AUTH reply calls it ``permission_count``)."""
        return len(self.publish) + len(self.subscribe) + (1 if self.admin else 0)


@dataclass(frozen=True)
class Principal:
    """Who a connection acts as.

    :ivar name: the user's name, or None for an anonymous client.
    :ivar rights: what it may do.
    :ivar source: where it was defined: ``users`` (the users file), ``anonymous``,
        ``nsq-secrets``, ``vibemq-users`` or ``option`` (a protocol's own auth option).
    """

    name: str | None
    rights: Rights
    source: str = "users"

    @property
    def label(self) -> str:
        """The name shown in logs (never a credential)."""
        return self.name if self.name is not None else "(anonymous)"


#: Every right: what a client has when no users file is configured.
ALL_RIGHTS = Rights(EVERYTHING, EVERYTHING, True)
