"""Shared, immutable stand-ins for the containers an idle queue never fills.

Each part of a queue starts with these and replaces one by a container of its own at the first
write, so an idle queue costs no empty dict, set, deque or list. Reads (len, in, get,
iteration) work on them unchanged; nothing ever writes into them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

NO_MAP: Any = MappingProxyType({})
NO_IDS: Any = frozenset()
NO_LIST: Any = ()
