"""Fuzzing the eMQP router: no input on any socket raises, and a well-behaved pair still works."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.protocols.emqp.helpers import Rig, V, job

COMMANDS = [b"INFORM", b"READY", b"REQUEST", b"REPLY", b"HEARTBEAT", b"SCHEDULE", b"UNSCHEDULE",
            b"DISCONNECT", b"KBYE", b"PUBLISH", b"ACK", b"BOGUS"]
PEERS = [b"w1", b"c1", b"\x00\xff\x01", b"s1"]
FIELDS = st.one_of(
    st.binary(max_size=20),
    st.sampled_from([b"", b"default", b"worker", b"scheduler", b'[[10, "default"]]', b"-1",
                     b"5", b"* * * * *", b"reply-requested,retry-count:2", b"timeout:1",
                     b'{"value": "TimeoutError"}', b"m1", job(), b"[1, 2]", b'["run"]']),
)


@st.composite
def messages(draw: st.DrawFn) -> list[bytes]:
    """A message that is often well-formed in its envelope and arbitrary in its body."""
    peer = draw(st.sampled_from(PEERS))
    if draw(st.integers(0, 9)) == 0:
        return [peer, *draw(st.lists(st.binary(max_size=12), max_size=12))]
    body = draw(st.lists(FIELDS, max_size=6))
    return [peer, b"", V, draw(st.sampled_from(COMMANDS)), draw(st.sampled_from([b"m1", b"m2"])),
            *body]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["frontend", "backend", "pubin", "tick"]),
                          st.lists(messages(), min_size=1, max_size=8)), max_size=12))
def test_random_traffic_never_raises_and_others_are_served(steps):
    """Random batches on every socket never raise; afterwards a fresh worker and client still
    complete a job with its result forwarded."""
    rig = Rig()
    router = rig.router
    for where, batch in steps:
        if where == "frontend":
            router.frontend_received(batch)
        elif where == "backend":
            router.backend_received(batch)
        elif where == "pubin":
            router.pubin_received(batch)
        else:
            rig.clock.advance(4.0)
    rig.worker(b"good-worker", [[100, "default"]], ready=1)
    rig.request(b"good-client", b"good-1", headers=b"reply-requested")
    answered: set[bytes] = set()
    for _ in range(100):  # jobs the fuzz traffic queued before ours are served first
        if [f for f in rig.sent(rig.front, b"REPLY", b"good-client") if len(f) == 7]:
            break
        pending = [m for m in rig.jobs_to(b"good-worker") if m not in answered]
        assert pending, "the good worker got no job"
        for msgid in pending:
            answered.add(msgid)
            rig.reply(b"good-worker", msgid)
    results = [f for f in rig.sent(rig.front, b"REPLY", b"good-client") if len(f) == 7]
    assert [f[6] for f in results] == [b"good-1"]
