"""The head-route loop of the NATS fast path (``heads.route_heads``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats.heads import route_heads


def _routes(n_targets: int) -> tuple[dict[bytes, tuple], list[list[bytes]], list[object]]:
    """A head table with a simple route ``PUB a`` to ``n_targets`` receivers and a special
    one ``PUB q``; also the receivers' output lists and their owners."""
    outs: list[list[bytes]] = [[] for _ in range(n_targets)]
    owners = [object() for _ in range(n_targets)]
    heads = [(owners[k], outs[k], b"MSG a %d " % k) for k in range(n_targets)]
    table = {b"PUB a": (heads, None, heads[0] if n_targets == 1 else None, None, [0, 0]),
             b"PUB q": (heads, ("special",), None, None, [0, 0])}
    return table, outs, owners


def test_one_target_delivers_each_frame_and_marks_dirty_once() -> None:
    """One receiver: every frame (an empty payload too) is delivered, its owner marked once."""
    table, outs, owners = _routes(1)
    buf = b"PUB a 3\r\nabc\r\nPUB a 0\r\n\r\nPUB a 2\r\nhi\r\n"
    dirty: list[object] = []
    pos, done, extra, nbytes = route_heads(buf, 0, table.get, dirty.append, 1024)
    assert (pos, done, extra, nbytes) == (len(buf), 3, 0, 5)
    assert table[b"PUB a"][4] == [3, 5]     # the route's delivery count: frames, payload
    assert b"".join(outs[0]) == b"MSG a 0 3\r\nabc\r\nMSG a 0 0\r\n\r\nMSG a 0 2\r\nhi\r\n"
    assert dirty == owners


def test_many_targets_share_the_tail_and_count_extra_copies() -> None:
    """Several receivers each get every frame; copies beyond one per PUB count as extra."""
    table, outs, owners = _routes(3)
    buf = b"PUB a 2\r\nhi\r\nPUB a 1\r\nx\r\n"
    dirty: list[object] = []
    assert route_heads(buf, 0, table.get, dirty.append, 1024) == (len(buf), 2, 4, 3)
    assert table[b"PUB a"][4] == [2, 3]
    for k in range(3):
        assert b"".join(outs[k]) == b"MSG a %d 2\r\nhi\r\nMSG a %d 1\r\nx\r\n" % (k, k)
    assert dirty == owners


def test_stops_before_lines_it_cannot_take() -> None:
    """Control lines, unknown or special heads, short, oversized or badly framed frames stop
    the loop before them, after what it took."""
    table, outs, _ = _routes(1)
    first = b"PUB a 1\r\nx\r\n"
    for rest in (b"PING\r\n", b"PUB b 1\r\nx\r\n", b"PUB q 1\r\nx\r\n", b"PUB a 9\r\nshort",
                 b"PUB a 2000\r\n" + b"y" * 2000 + b"\r\n", b"PUB a 1x\r\nx\r\n",
                 b"PUB a 1\r\nxy\r\n", b"PUB a 1\nx\r\n", b"PUB a 1\r\n"):
        outs[0].clear()
        pos, done, *_ = route_heads(first + rest, 0, table.get, [].append, 1024)
        assert (pos, done) == (len(first), 1), rest
        assert b"".join(outs[0]) == b"MSG a 0 1\r\nx\r\n"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=20), st.integers(0, 600))
def test_a_cut_anywhere_delivers_exactly_the_complete_frames(frames: list, cut: int) -> None:
    """A buffer cut anywhere: exactly the complete frames up to the first unknown head."""
    table, outs, _ = _routes(1)
    buf = b"".join(b"PUB %s %d\r\n%s\r\n" % (b"a" if known else b"b", size, b"z" * size)
                   for known, size in frames)
    part = buf[:cut]
    pos, done, *_ = route_heads(part, 0, table.get, [].append, 1024)
    expect = b""
    at = 0
    for known, size in frames:
        frame = b"PUB %s %d\r\n%s\r\n" % (b"a" if known else b"b", size, b"z" * size)
        if not known or at + len(frame) > len(part):
            break
        expect += b"MSG a 0 %d\r\n%s\r\n" % (size, b"z" * size)
        at += len(frame)
    assert pos == at
    assert b"".join(outs[0]) == expect
    assert done == expect.count(b"MSG ")
