"""The MQKS codec: the original's grammar quirks, masks, rendering, and fuzzing (Hypothesis)."""

from __future__ import annotations

import base64
import json
import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.mqks import codec as wire
from mqhub.protocols.mqks.evals import EvalRefused, answer, lookup
from mqhub.testing import property_examples


def test_split_request_like_the_original() -> None:
    """rstrip, then split on the first two single spaces; fewer than three parts is None."""
    assert wire.split_request(b"m1 publish e1 d1  \r") == (b"m1", b"publish", b"e1 d1")
    assert wire.split_request(b"x ping") is None
    assert wire.split_request(b"") is None
    assert wire.split_request(b"a  ping x") == (b"a", b"", b"ping x")
    assert wire.split_request(b"p ping  x") == (b"p", b"ping", b" x")


def test_confirm_only_with_its_space_at_the_start() -> None:
    """``--confirm `` must be the first 10 bytes of data."""
    assert wire.take_confirm(b"--confirm x y") == (True, b"x y")
    assert wire.take_confirm(b"--confirm") == (False, b"--confirm")
    assert wire.take_confirm(b"x --confirm y") == (False, b"x --confirm y")
    assert wire.encode_ok(b"c1") == b"c1 ok \n"


def test_error_id_format() -> None:
    """20 digits of UTC time with microseconds, then 4 base62 characters."""
    eid = wire.make_error_id(1_795_000_000.123456, random.Random(1))
    assert re.fullmatch(rb"\d{20}[0-9A-Za-z]{4}", eid)
    assert eid[:14] == time.strftime("%Y%m%d%H%M%S", time.gmtime(1_795_000_000)).encode()
    assert eid[14:20] == b"123456"
    assert wire.encode_error(b"x", eid) == b"x error " + eid + b"\n"


def test_line_reader_tab_and_limit() -> None:
    """A TAB or an over-long line stops the reader; the lines before it are kept."""
    r = wire.LineReader(10)
    assert r.feed(b"a b c\nd e") == [b"a b c"]
    assert r.feed(b" f\n") == [b"d e f"]
    assert r.feed(b"ok\nt\tab\nnever\n") == [b"ok"] and r.fatal == wire.FATAL_TAB
    assert r.feed(b"more\n") == []
    r = wire.LineReader(10)
    assert r.feed(b"short\n" + b"x" * 11) == [b"short"] and r.fatal == wire.FATAL_TOO_LONG
    r = wire.LineReader(10)
    assert r.feed(b"x" * 5) == [] and r.fatal is None
    assert r.feed(b"y" * 6) == [] and r.fatal == wire.FATAL_TOO_LONG


def test_parse_consume_tokens_in_any_order() -> None:
    """Events before --add replace, after it add; flags anywhere; unknown flags fail."""
    a = wire.parse_consume(b"q1 --manual-ack e1 --delete-queue-when-unused=5 e2 --add e3")
    assert (a.queue, a.replace, a.add, a.delete_when_unused, a.manual_ack) == (
        "q1", ["e1", "e2"], ["e3"], 5.0, True)
    assert wire.parse_consume(b"q1").replace == []
    assert wire.parse_consume(b"q1  e1").replace == ["e1"]
    assert wire.parse_consume(b"q --delete-queue-when-unused").delete_when_unused is True
    for bad in (b"q --nope", b"q --delete-queue-when-unused=x", b"q --delete-queue-when-unused=-1",
                b"q --delete-queue-when-unused=inf", b" q", b"\xff"):
        with pytest.raises(wire.RequestError):
            wire.parse_consume(bad)


def test_rebind_fixed_order_and_masks() -> None:
    """The reference's verified example, and add after remove-mask whatever the token order."""
    a = wire.parse_rebind(b"q1 --add e6 --remove-mask e5.*.a1 *.*.a1")
    old = {"e1", "e5.id1.a1", "e5.id2.a2", "x.y.a1", "plain"}
    assert wire.apply_rebind(old, a.replace, a.remove, a.remove_mask, a.add) == {
        "e1", "e5.id2.a2", "e6", "plain"}
    assert wire.apply_rebind({"a1"}, [], [], ["a*"], []) == {"a1"}  # undotted: never tested
    assert wire.apply_rebind({"a.b", "ab.c.d"}, [], [], ["a*.*"], ["a.b"]) == {"a.b", "ab.c.d"}
    assert wire.apply_rebind({"x.y"}, ["n"], ["n"], [], ["m"]) == {"m"}
    for bad in (b"q1", b"q1 --bogus x", b""):
        with pytest.raises(wire.RequestError):
            wire.parse_rebind(bad)


def test_update_line_and_seconds() -> None:
    """Sorted events, ``=5.0`` as Python 2 printed floats, per-consumer --manual-ack."""
    assert wire.render_update("q", ["b", "a"], 5.0, True) == (
        b"--update q a b --delete-queue-when-unused=5.0 --manual-ack")
    assert wire.render_update("q", [], True, False) == b"--update q --delete-queue-when-unused"
    assert wire.render_update("q", [], None, False) == b"--update q"
    assert [wire.format_seconds(x) for x in (1.5, 100.0, 0.1 + 0.2, 1e20)] == [
        "1.5", "100.0", "0.3", "1e+20"]


def test_render_body_rule() -> None:
    """Verbatim when MQKS can carry it; JSON for LF/CR/TAB; base64 for non-UTF-8."""
    assert wire.render_body("héllo".encode()) == (b"", "héllo".encode())
    assert wire.render_body(b"a\nb") == (b",enc=json", b'"a\\nb"')
    assert wire.render_body(b"\xff") == (b",enc=base64", b"/w==")
    assert wire.render_message(b"c", b"m", b"e", 2, b"d") == b"c ok m event=e,retry=2 d\n"


def test_eval_table_never_evaluates() -> None:
    """Only table expressions are answered; everything else is refused."""
    facts = {"queues": 3, "queue_depth": 7}
    get = lambda name, q: facts[name] if q in (None, "q1") else {}[q]  # noqa: E731
    assert answer("len(state.queues)", get) == "3"
    assert answer("--worker=0 state.queues['q1'].qsize()", get) == "7"
    assert answer("state.commands_put", get) == "0"
    for code in ('__import__("os").getpid()', "len(state.queues)+1", "--worker=2 state.published",
                 "state.queues['nope'].qsize()"):
        with pytest.raises(EvalRefused):
            answer(code, get)
    assert lookup("len( state.queues )") == ("queues", None)


# -- fuzzing ----------------------------------------------------------------------------------------

lines = st.lists(st.binary(max_size=40), max_size=20)


@settings(max_examples=property_examples(300), deadline=None)
@given(lines, st.lists(st.integers(1, 50), max_size=10), st.integers(5, 60))
def test_line_reader_matches_a_split(chunks: list[bytes], cuts: list[int], limit: int) -> None:
    """Any chunking gives the lines a plain split gives, up to the first bad line."""
    data = b"".join(chunks)
    reader = wire.LineReader(limit)
    got: list[bytes] = []
    pos = 0
    for cut in cuts + [len(data)]:
        got += reader.feed(data[pos:pos + cut])
        pos += cut
    got += reader.feed(data[pos:])
    expected = []
    *complete, tail = data.split(b"\n")
    for line in complete:
        if b"\t" in line or len(line) > limit:
            break
        expected.append(line)
    assert got == expected
    bad = len(expected) < len(complete) or b"\t" in tail or len(tail) > limit
    assert (reader.fatal is not None) == bad


@settings(max_examples=property_examples(500), deadline=None)
@given(st.binary(max_size=200))
def test_request_parsers_never_crash(data: bytes) -> None:
    """Every parser either returns or raises RequestError, on any bytes."""
    wire.split_request(data)
    wire.take_confirm(data)
    for parse in (wire.parse_consume, wire.parse_rebind, wire.split2):
        try:
            parse(data)
        except wire.RequestError:
            pass
    try:
        lookup(data.decode("utf-8", "replace"))
    except EvalRefused:
        pass


@settings(max_examples=property_examples(300), deadline=None)
@given(st.binary(max_size=100))
def test_render_body_is_lossless_and_one_line(body: bytes) -> None:
    """Every body renders to one line without TAB, and decodes back to the same bytes."""
    extra, data = wire.render_body(body)
    assert not re.search(rb"[\n\r\t]", data)
    if extra == b",enc=base64":
        assert base64.b64decode(data) == body
    elif extra == b",enc=json":
        assert json.loads(data).encode() == body
    else:
        assert extra == b"" and data == body


masks = st.lists(st.from_regex(r"[a-c*]{1,3}(\.[a-c*]{1,3}){0,2}", fullmatch=True), min_size=1,
                 max_size=3)
events = st.sets(st.from_regex(r"[a-c]{1,3}(\.[a-c]{1,3}){0,2}", fullmatch=True), max_size=8)


@settings(max_examples=property_examples(300), deadline=None)
@given(events, masks)
def test_remove_mask_never_crosses_a_dot(evs: set[str], ms: list[str]) -> None:
    """remove-mask removes exactly the dotted events a mask matches token by token."""
    def matches(mask: str, event: str) -> bool:
        mt, et = mask.split("."), event.split(".")
        return len(mt) == len(et) and all(
            re.fullmatch(".*".join(map(re.escape, m.split("*"))), e) for m, e in zip(mt, et, strict=True))
    kept = wire.apply_rebind(evs, [], [], ms, [])
    assert kept == {e for e in evs if "." not in e or not any(matches(m, e) for m in ms)}
