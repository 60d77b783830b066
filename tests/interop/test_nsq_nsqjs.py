"""nsqjs (npm) run by node against a real ``twistd -n mqhub`` broker."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable

import pytest

from tests.interop.broker import BrokerProcess
from tests.interop.conftest import NODE_DIR

pytestmark = pytest.mark.interop


@pytest.mark.parametrize("compression", ["plain", "deflate", "snappy"])
def test_nsqjs_writer_publish_mpub_and_reader_fin_req(
    make_broker: Callable[..., BrokerProcess], compression: str
) -> None:
    """nsqjs publishes one message and an array (MPUB); its Reader FINs all and REQs one back.

    Run plain, over deflate and over snappy (both directions compressed).
    """
    assert shutil.which("node"), "node is required for the nsqjs interop test"
    assert (NODE_DIR / "node_modules" / "nsqjs").is_dir(), "run `make node` to install nsqjs"
    broker = make_broker(["nsq"])
    proc = subprocess.run(
        ["node", str(NODE_DIR / "nsq_roundtrip.js"), "127.0.0.1", str(broker.port("nsq", "tcp")),
         "from_node", "25", compression],
        cwd=NODE_DIR, capture_output=True, text=True, timeout=40,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == []
    assert result["published"] == 25
    assert sorted(set(result["received"]), key=lambda b: int(b[1:])) == [f"m{i}" for i in range(25)]
    assert result["attempts"]["m0"] == 2  # requeued once, redelivered with attempts counted
    assert result["negotiated"] == {"snappy": compression == "snappy", "deflate": compression == "deflate"}
