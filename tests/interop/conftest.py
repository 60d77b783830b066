"""Interop fixtures: real ``twistd -n mqhub`` subprocesses (see tests.interop.broker)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.broker import REPO_ROOT, BrokerProcess

EXAMPLE_PLUGINS = REPO_ROOT / "plugins"
NODE_DIR = REPO_ROOT / "tests" / "interop" / "node"


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Factory fixture: ``make_broker(["nsq"], **kw)`` returns a started broker; all are stopped after.

    Keyword arguments go to :class:`BrokerProcess` (``plugin_paths``, ``extra_args``, ...);
    ``start=False`` returns it unstarted. The data dir is ``tmp_path/data`` unless given.
    """
    brokers: list[BrokerProcess] = []

    def make(protocols: list[str], start: bool = True, **kwargs: Any) -> BrokerProcess:
        """Build (and by default start) a broker that is closed after the test."""
        kwargs.setdefault("data_dir", tmp_path / f"data{len(brokers) or ''}")
        kwargs.setdefault("log_dir", tmp_path)
        broker = BrokerProcess(protocols, **kwargs)
        brokers.append(broker)
        return broker.start() if start else broker

    yield make
    for broker in brokers:
        broker.close()
        # pytest shows captured output only for a failing test: the broker's log, for diagnosis.
        print(f"--- {broker.log_path} ---\n{broker.output()[-20000:]}")
