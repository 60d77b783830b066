"""DiskReserve: the store's headroom for acks on a full disk (mqhub/store/reserve.py)."""

from __future__ import annotations

from pathlib import Path

from mqhub.store.batch import WriteBatch
from mqhub.store.reserve import DiskReserve


def put_batch() -> WriteBatch:
    """A batch holding one new message."""
    b = WriteBatch()
    b.put_entries("q", [(1, 0, 0, 0.0, 0.0, "q", None, b"x", "")])
    return b


def ack_batch() -> WriteBatch:
    """A batch deleting one entry (an ack)."""
    b = WriteBatch()
    b.delete_entries("q", [(0, 1)])
    return b


def test_reserve_is_given_back_on_a_failed_write_and_new_messages_wait(tmp_path: Path) -> None:
    """Failed write: the file goes, puts are refused for retry_after, acks never; then it returns."""
    path = tmp_path / "reserve"
    r = DiskReserve(str(path), 1 << 20, retry_after=1.0)
    assert r.restore() and path.stat().st_size == 1 << 20
    assert not r.refuses(put_batch(), 100.0)
    r.write_failed(100.0)
    assert not path.exists() and r.releases == 1
    assert r.refuses(put_batch(), 100.5)
    assert not r.refuses(ack_batch(), 100.5)
    assert not r.refuses(put_batch(), 101.0)
    r.write_succeeded(100.9)  # too early to try again
    assert not path.exists()
    r.write_succeeded(101.0)
    assert path.exists() and r.held


def test_zero_size_disables_everything(tmp_path: Path) -> None:
    """size 0: no file, no refusal window."""
    r = DiskReserve(str(tmp_path / "reserve"), 0)
    assert not r.restore()
    r.write_failed(5.0)
    assert not r.refuses(put_batch(), 5.0)
    assert not (tmp_path / "reserve").exists()


def test_no_room_for_the_reserve_leaves_no_partial_file(tmp_path: Path) -> None:
    """A reserve that cannot be allocated is not half-created."""
    r = DiskReserve(str(tmp_path / "missing-dir" / "reserve"), 1 << 20)
    assert not r.restore() and not r.held
