"""Print the reliability figures file (JSON lines) as tables: ``python -m tests.reliability.report FILE``."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    """Group rows by kind and print each group as an aligned table."""
    groups: dict[str, list[dict[str, object]]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                groups[str(row.pop("kind"))].append(row)
    for kind, rows in groups.items():
        cols = [c for c in rows[0] if c != "losses"]
        widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
        print(f"\n{kind}")
        print("  ".join(c.ljust(widths[c]) for c in cols))
        for r in rows:
            print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))


if __name__ == "__main__":
    main(sys.argv[1])
