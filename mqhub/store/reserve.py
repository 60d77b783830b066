"""DiskReserve: headroom the store gives back when the disk fills, so acks still commit.

LMDB never overwrites a page in place: even deleting an entry (an ack) writes a few fresh
pages. On a completely full filesystem acknowledgements would therefore fail along with
publishes, and nothing could ever free space again without a restart. The store keeps a
preallocated ``reserve`` file in its directory; when a group commit fails it deletes that file
(the deletes and acks that follow have room) and refuses *new messages* for ``retry_after``
seconds, so the freed room is not eaten by publishers at once. After that, new messages are
tried again; once one commits, the reserve is re-created (when the disk has room for it).

No Twisted import; the caller passes the time.
"""

from __future__ import annotations

import os
from typing import Any


class DiskReserve:
    """A preallocated file of ``size`` bytes at ``path`` and the store's low-disk state."""

    def __init__(self, path: str, size: int, retry_after: float = 1.0) -> None:
        """:param size: bytes to hold back (0 disables the reserve and the refusal window)."""
        self.path = path
        self.size = max(0, int(size))
        self.retry_after = retry_after
        self.held = False
        self.refuse_until = 0.0
        self._next_restore = 0.0
        self.releases = 0

    def restore(self) -> bool:
        """Create (or complete) the reserve file; False when the disk has no room for it."""
        if not self.size:
            return False
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o644)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, self.size)
            self.held = True
        except OSError:
            self.held = False
        finally:
            os.close(fd)
        if not self.held:
            self._unlink()
        return self.held

    def refuses(self, batch: Any, now: float) -> bool:
        """True while new messages (puts, delayed puts) are refused after a failed write."""
        return now < self.refuse_until and bool(batch.puts or batch.due_puts)

    def write_failed(self, now: float) -> None:
        """A group commit failed: give the reserve back and refuse new messages for a while."""
        if not self.size:
            return
        if self.held:
            self._unlink()
            self.held = False
            self.releases += 1
        self.refuse_until = now + self.retry_after
        self._next_restore = now + self.retry_after

    def write_succeeded(self, now: float) -> None:
        """A group commit succeeded: re-create a released reserve (at most once per retry_after)."""
        if self.size and not self.held and now >= self._next_restore:
            self._next_restore = now + self.retry_after
            self.restore()

    def _unlink(self) -> None:
        """Delete the reserve file if it exists."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
