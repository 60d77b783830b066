"""Log observers for ``--log-format``: text (twistd's default) or one JSON object per line."""

from __future__ import annotations

import sys
from typing import IO

from twisted.logger import ILogObserver, jsonFileLogObserver

#: Where twistd's JSON observer writes: None for stdout, else a file path (twistd --logfile).
json_log_path: str | None = None


def json_observer(out: IO[str] | None = None) -> ILogObserver:
    """An observer writing every event as one JSON object per line.

    Used as twistd's ``--logger`` factory when ``--log-format json`` is given. It writes to
    ``out``, else to the file named by twistd's ``--logfile`` (:data:`json_log_path`), else to
    stdout.
    """
    if out is None:
        if json_log_path is not None:
            out = open(json_log_path, "a", buffering=1, encoding="utf-8")
        else:
            out = sys.stdout
    return jsonFileLogObserver(out, recordSeparator="")
