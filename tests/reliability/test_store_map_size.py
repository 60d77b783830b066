"""``twistd mqhub --store-map-size MIB``: the initial LMDB map the crash cycles shrink to 1 MiB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from mqhub.discovery import ENV_PLUGIN_PATH
from mqhub.hub import build_hub
from mqhub.tap import Options
from tests.plugins import isolated_plugin_path


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No plugin path from the environment; mqhub.plugins restored afterwards."""
    monkeypatch.delenv(ENV_PLUGIN_PATH, raising=False)
    with isolated_plugin_path():
        yield


def test_store_map_size_is_parsed_and_reaches_the_store(tmp_path: Path) -> None:
    """A number of MiB becomes the store's initial map; without it the default stays."""
    options = Options()
    options.parseOptions(["--protocols", "nsq", "--store-map-size", "3"])
    assert options["store-map-size"] == 3
    hub = build_hub({"data-dir": str(tmp_path / "a"), "store-map-size": 3}, MemoryReactorClock())
    assert hub.store.stats()["map_size"] == 3 << 20
    default = build_hub({"data-dir": str(tmp_path / "b")}, MemoryReactorClock())
    assert default.store.stats()["map_size"] == 256 << 20


@pytest.mark.parametrize("value", ["0", "-1", "lots"])
def test_bad_store_map_size_is_a_usage_error(value: str) -> None:
    """Zero, negative and non-numbers are refused."""
    with pytest.raises(usage.UsageError):
        Options().parseOptions(["--protocols", "nsq", "--store-map-size", value])


def test_store_reserve_option(tmp_path: Path) -> None:
    """--store-reserve: 16 MiB by default, 0 allowed, negatives refused; the file is made on open."""
    options = Options()
    options.parseOptions(["--protocols", "nsq"])
    assert options["store-reserve"] == 16
    with pytest.raises(usage.UsageError):
        Options().parseOptions(["--protocols", "nsq", "--store-reserve", "-1"])
    hub = build_hub({"data-dir": str(tmp_path), "store-reserve": 2}, MemoryReactorClock())
    hub.store.open()
    try:
        assert (tmp_path / "store" / "reserve").stat().st_size == 2 << 20
    finally:
        hub.store.close()
