"""Fixtures for the core unit tests: a memory hub on a Clock."""

from __future__ import annotations

import pytest

from mqhub.hub import Hub
from mqhub.testing import memory_hub


@pytest.fixture
def hub() -> Hub:
    """A fresh memory hub (MemoryStore, Clock, started broker and scheduler)."""
    return memory_hub()
