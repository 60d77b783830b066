"""Log observers for ``--log-format``: text (twistd's default) or one JSON object per line."""

from __future__ import annotations

import sys
from typing import IO

from twisted.logger import ILogObserver, jsonFileLogObserver


def json_observer(out: IO[str] | None = None) -> ILogObserver:
    """An observer writing every event as one JSON object per line (to stdout by default).

    Used as twistd's ``--logger`` factory when ``--log-format json`` is given.
    """
    return jsonFileLogObserver(out if out is not None else sys.stdout, recordSeparator="")
