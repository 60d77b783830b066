"""Rights at the core seam: ``core.session(session)`` is a GuardedCore that checks publish,
subscribe, bind, attach, dead letters and deletes with the session's cached decisions, and
the core itself for ``session(None)`` (no rights: nothing checked, nothing paid)."""

from __future__ import annotations

from pathlib import Path

import pytest
from zope.interface.verify import verifyObject

from mqhub.errors import Unauthorized
from mqhub.identity import GuardedCore
from mqhub.interfaces import ICore
from mqhub.testing import CollectingTarget, memory_hub, result_of, settle
from tests.unit.identity.helpers import directory


def test_no_principal_is_the_core_itself() -> None:
    """Without a session the handle is the core: not a wrapper, not a lookup."""
    hub = memory_hub()
    assert hub.broker.session(None) is hub.broker


def test_a_session_handle_enforces_rights(tmp_path: Path) -> None:
    """alice may publish and read orders.*; everything else raises Unauthorized, counted."""
    hub = memory_hub()
    d = directory(tmp_path, hub.clock)
    core = hub.broker
    alice = core.session(d.session("vibemq", d.by_token("alice-token")))
    assert isinstance(alice, GuardedCore) and verifyObject(ICore, alice)
    assert alice.clock is core.clock and alice.epoch == core.epoch   # the rest is the core's
    q = core.declare_queue("orders.q")
    alice.bind_queue("orders.>", "orders.q")
    target = CollectingTarget()
    alice.attach(q, target, ready=10)
    result_of(alice.publish_batch("orders.eu", [b"o"], origin="vibemq"))
    settle(hub)
    assert [e[7] for e in target.entries] == [b"o"]
    with pytest.raises(Unauthorized):
        alice.publish_batch("payroll.x", [b"p"])
    with pytest.raises(Unauthorized):
        alice.subscribe(">", CollectingTarget())
    with pytest.raises(Unauthorized):
        alice.bind_queue("payroll.>", "orders.q")
    secret = core.declare_queue("mixed")
    core.bind_queue("orders.x", "mixed")
    core.bind_queue("payroll.x", "mixed")                 # fed by an address alice may not read
    with pytest.raises(Unauthorized):
        alice.attach(secret, CollectingTarget())
    with pytest.raises(Unauthorized):
        alice.dead_letters("mixed")
    with pytest.raises(Unauthorized):
        alice.delete_queue("mixed")
    with pytest.raises(Unauthorized):
        alice.replay_dead_letters("orders.q")              # admin only
    assert d.counters[("vibemq", "publish")] == 1 and d.counters[("vibemq", "admin")] == 1
    assert d.counters[("vibemq", "subscribe")] == 5
    bob = core.session(d.session("nats", d.by_password("bob", "builder")))
    assert result_of(bob.replay_dead_letters("orders.q")) == 0   # an admin may
    with pytest.raises(Unauthorized):
        bob.attach(secret, CollectingTarget())                     # but not read orders.x


def test_group_grants_reach_the_seam(tmp_path: Path) -> None:
    """`jobs.> workers` lets a queue bound to jobs.* be read (the group is the
    adapter's to check) but a live subscription only with that group."""
    hub = memory_hub()
    d = directory(tmp_path, hub.clock,
                  text='[[user]]\nname = "w"\ntoken = "w"\nsubscribe = ["jobs.> workers"]\n')
    w = hub.broker.session(d.session("nats", d.by_token("w")))
    q = hub.broker.declare_queue("jobs")
    w.bind_queue("jobs.*", "jobs")
    w.attach(q, CollectingTarget())
    w.subscribe("jobs.x", CollectingTarget(), group="workers")
    with pytest.raises(Unauthorized):
        w.subscribe("jobs.x", CollectingTarget())
