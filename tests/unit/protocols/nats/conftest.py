"""The NATS frame scanner runs either its C loop (``_scan.c``) or the regular-expression
fallback; the tests that cover the scanner run with each (``scan_impl``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqhub.protocols.nats import scan

BUILT = scan.scan_run


@pytest.fixture(params=["native", "regex"])
def scan_impl(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with the C loop, then with the fallback (``scan.scan_run`` unset)."""
    saved = scan.scan_run
    scan.scan_run = BUILT if request.param == "native" else None
    try:
        yield request.param
    finally:
        scan.scan_run = saved
