"""What a node's local files cover in cluster mode, for ``mqhub snapshot/export/analytics``.

A cluster node writes :data:`MARKER` into its data directory when it starts. ``mqhub snapshot``
copies it into the snapshot (and says what the snapshot covers); ``export`` and ``analytics``
say the same when their source holds it. In cluster mode the node's store holds only its flow
journal (what this node published, delivered, acked, requeued, dead-lettered and expired) and
node-local entry lists (mq9's persisted broadcasts); messages, queues, dead letters and adapter
records live in the JetStream cluster (docs/cluster.md, "Operations").
"""

from __future__ import annotations

import json
import os
import shutil

__all__ = ["MARKER", "COVERAGE", "write_marker", "copy_marker", "coverage_note"]

MARKER = "cluster.json"
COVERAGE = ("cluster mode: this covers node {node}'s local store only: its flow journal "
            "(what this node published, delivered, acked, requeued, dead-lettered, expired) "
            "and node-local mq9 broadcasts. Messages, queues, dead letters and adapter "
            "records live in the JetStream cluster ({cluster}): back them up with the NATS "
            "tools (nats stream backup MQHUB / MQHUB_DLQ / KV_MQHUB).")


def write_marker(data_dir: str, node: str, cluster: list[str]) -> None:
    """Record in ``data_dir`` that this node runs in cluster mode."""
    tmp = os.path.join(data_dir, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"node": node, "cluster": cluster}, f)
    os.replace(tmp, os.path.join(data_dir, MARKER))


def _places(directory: str) -> list[str]:
    """Where the marker of ``directory`` may be: in it, or beside it when it is the store
    inside a data directory."""
    places = [os.path.join(directory, MARKER)]
    if os.path.basename(os.path.abspath(directory)) == "store":
        places.append(os.path.join(os.path.dirname(os.path.abspath(directory)), MARKER))
    return places


def _read(directory: str) -> dict | None:
    """The marker of ``directory`` (a data directory, its store, a snapshot or an export)."""
    for path in _places(directory):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def copy_marker(source: str, out_dir: str) -> None:
    """Carry the marker into a snapshot or export made of ``source`` (if it has one)."""
    for path in _places(source):
        if os.path.exists(path):
            shutil.copyfile(path, os.path.join(out_dir, MARKER))
            return


def coverage_note(directory: str) -> str | None:
    """What a data directory or snapshot covers when it is a cluster node's (else None)."""
    data = _read(directory)
    if data is None:
        return None
    return COVERAGE.format(node=data.get("node", "?"),
                           cluster=",".join(map(str, data.get("cluster") or [])))
