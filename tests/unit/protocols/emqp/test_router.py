"""Tests of the eMQP router on a memory hub: workers, jobs, replies, retries, peers, pub/sub."""

from __future__ import annotations

import pytest

from mqhub.protocols.emqp import frames as F
from mqhub.testing import CollectingTarget, advance, restart_hub, result_of
from tests.unit.protocols.emqp.helpers import Rig, V, job


def test_inform_gets_ack_and_immediate_heartbeat():
    """INFORM is ACKed (5 frames, acked id) and followed by a HEARTBEAT so READYs come at once."""
    rig = Rig()
    rig.worker(b"w1", [[10, "default"]])
    assert rig.back[0][:4] == [b"w1", b"", V, b"ACK"] and rig.back[0][5] == b"inf-" + b"w1".hex().encode()
    assert len(rig.back[0]) == 6
    assert rig.back[1][3] == b"HEARTBEAT"


def test_request_waits_for_ready_then_dispatches_with_ack():
    """A REQUEST with no free slot waits durably; READY sends it and the client gets an ack."""
    rig = Rig()
    rig.worker(b"w1", [[10, "default"]])
    rig.request(b"c1", b"m1", headers=b"timeout:5")
    assert rig.jobs_to(b"w1") == []
    assert rig.queue().depth == 1
    rig.ready(b"w1")
    [req] = rig.sent(rig.back, b"REQUEST", b"w1")
    assert req[4:] == [b"m1", b"default", b"timeout:5,reply-requested", job()]
    [ack] = rig.sent(rig.front, b"REPLY", b"c1")
    assert ack[5] == b"m1" and len(ack) == 6
    assert rig.queue().in_flight == 1


def test_reply_forwarded_only_when_requested_and_job_finished():
    """With reply-requested the result reaches the client; either way the job leaves the queue."""
    rig = Rig()
    rig.worker(b"w1", ready=2)
    rig.request(b"c1", b"m1", headers=b"reply-requested")
    rig.request(b"c2", b"m2")
    rig.reply(b"w1", b"m1", b'{"value": 14}')
    rig.reply(b"w1", b"m2", b'{"value": 15}')
    results = [f for f in rig.sent(rig.front, b"REPLY") if len(f) == 7]
    assert [(f[0], f[5], f[6]) for f in results] == [(b"c1", b'{"value": 14}', b"m1")]
    assert rig.queue().in_flight == 0 and rig.queue().depth == 0
    assert rig.router.workers[b"w1"].slots == 2


def test_unknown_queue_goes_to_default():
    """A REQUEST for a queue no worker serves runs on default, as eventmq does."""
    rig = Rig()
    rig.worker(b"w1", [[10, "default"]], ready=1)
    rig.request(b"c1", b"m1", queue=b"no-such-queue")
    [req] = rig.sent(rig.back, b"REQUEST", b"w1")
    assert req[5] == b"default"


def test_empty_inform_serves_router_default_queues():
    """An INFORM with '' queues gets the router's configured default queues."""
    rig = Rig(default_queues=[(10, "default"), (5, "mail")])
    rig.worker(b"w1", None, ready=2)
    rig.request(b"c1", b"m1", queue=b"mail")
    assert rig.sent(rig.back, b"REQUEST", b"w1")[0][5] == b"mail"


def test_highest_weight_wins_and_equal_weights_rotate():
    """Weight decides while the heavy worker has a slot; equal weights take turns."""
    rig = Rig()
    rig.worker(b"heavy", [[20, "default"]], ready=1)
    rig.worker(b"a", [[10, "default"]], ready=5)
    rig.worker(b"b", [[10, "default"]], ready=5)
    for i in range(5):
        rig.request(b"c", b"m%d" % i)
    assert rig.jobs_to(b"heavy") == [b"m0"]
    assert rig.jobs_to(b"a") == [b"m1", b"m3"]
    assert rig.jobs_to(b"b") == [b"m2", b"m4"]


def test_ready_serves_queues_in_inform_order():
    """A READY takes the waiting job of the worker's first INFORMed queue first."""
    rig = Rig()
    rig.worker(b"w1", [[10, "mail"], [10, "default"]])
    rig.request(b"c", b"d1", queue=b"default")
    rig.request(b"c", b"m1", queue=b"mail")
    rig.ready(b"w1")
    assert rig.jobs_to(b"w1") == [b"m1"]
    rig.ready(b"w1")
    assert rig.jobs_to(b"w1") == [b"m1", b"d1"]


def test_batch_of_requests_in_one_read_is_one_commit():
    """Many REQUESTs in one read are stored with one store commit."""
    rig = Rig()
    rig.worker(b"w1")
    before = rig.hub.store.commits
    rig.router.frontend_received([[b"c", b"", V, b"REQUEST", b"m%d" % i, b"default", b"", job(i)]
                                  for i in range(100)])
    assert rig.queue().depth == 100
    assert rig.hub.store.commits - before == 1
    rig.ready(b"w1", 100)
    assert len(rig.jobs_to(b"w1")) == 100


def test_retry_count_redispatches_timeouts_then_dead_letters():
    """retry-count:2 re-runs a timed-out job twice more, then it becomes a dead letter."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.request(b"c", b"m1", headers=b"retry-count:2")
    for _ in range(3):
        assert rig.jobs_to(b"w1")[-1] == b"m1"
        rig.reply(b"w1", b"m1", b'{"value": "TimeoutError"}')
    assert rig.jobs_to(b"w1") == [b"m1"] * 3
    dead = result_of(rig.hub.broker.dead_letters("emqp.jobs.default"))
    assert [d.reason for d in dead] == ["max_attempts"]


def test_timeout_without_retry_is_finished():
    """A timed-out job without retry-count is not re-run (eventmq semantics)."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.request(b"c", b"m1")
    rig.reply(b"w1", b"m1", b'{"value": "TimeoutError"}')
    assert rig.jobs_to(b"w1") == [b"m1"]
    assert rig.queue().depth == 0 and rig.queue().in_flight == 0


def test_silent_worker_removed_and_retryable_jobs_move():
    """A worker silent past the timeout is removed; its retryable job goes to another worker."""
    rig = Rig(heartbeat_interval=3.0, heartbeat_timeout=10.0)
    rig.worker(b"w1", ready=2)
    rig.request(b"c", b"keep", headers=b"retry-count:1")
    rig.request(b"c", b"lose")
    assert rig.jobs_to(b"w1") == [b"keep", b"lose"]
    rig.worker(b"w2")
    for _ in range(5):  # w2 keeps talking, w1 is silent
        advance(rig.clock, 3.0)
        rig.router.backend_received([[b"w2", b"", V, b"HEARTBEAT", b"h", b"1"]])
    assert b"w1" not in rig.router.workers
    rig.ready(b"w2")
    assert rig.jobs_to(b"w2") == [b"keep"]


def test_heartbeats_every_interval_to_workers_and_schedulers():
    """The broker heartbeats workers (backend) and schedulers (frontend) every 3 s."""
    rig = Rig()
    rig.worker(b"w1")
    rig.router.frontend_received([[b"s1", b"", V, b"INFORM", b"i", b"", b"scheduler"]])
    assert rig.sent(rig.front, b"ACK", b"s1")
    rig.back.clear()
    for _ in range(3):
        rig.router.backend_received([[b"w1", b"", V, b"HEARTBEAT", b"h", b"1"]])
        rig.router.frontend_received([[b"s1", b"", V, b"HEARTBEAT", b"h", b"1"]])
        advance(rig.clock, 3.0)
    assert len(rig.sent(rig.back, b"HEARTBEAT", b"w1")) == 3
    assert len(rig.sent(rig.front, b"HEARTBEAT", b"s1")) == 3


def test_worker_kbye_gets_no_new_jobs_but_may_finish():
    """After KBYE a worker gets no new jobs; its running job's REPLY is still accepted."""
    rig = Rig()
    rig.worker(b"w1", ready=2)
    rig.request(b"c", b"m1", headers=b"reply-requested")
    rig.router.backend_received([[b"w1", b"", V, b"KBYE", b"k"]])
    rig.request(b"c", b"m2")
    assert rig.jobs_to(b"w1") == [b"m1"]
    rig.reply(b"w1", b"m1")
    assert [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    assert b"w1" not in rig.router.workers
    assert rig.queue().depth == 1


def test_client_disconnect_ends_only_that_client():
    """DISCONNECT from a client gets a KBYE to that client; the broker keeps serving others."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.router.frontend_received([[b"bad", b"", V, b"DISCONNECT", b"d"]])
    assert [f[0] for f in rig.sent(rig.front, b"KBYE")] == [b"bad"]
    rig.request(b"good", b"m1")
    assert rig.jobs_to(b"w1") == [b"m1"]
    assert not rig.sent(rig.back, b"KBYE")


def test_garbage_and_binary_identity_leave_others_served():
    """Garbage frames are dropped and a binary identity is served; other peers are unaffected."""
    rig = Rig()
    rig.worker(b"\x00\xff\x10\x80\x01", ready=1)
    rig.worker(b"w2", ready=1)
    rig.router.frontend_received([
        [b"x"],
        [b"\x00\x9f", b"junk", b"\xff" * 10],
        [b"\x00\x9f", b"", V, b"REQUEST", b"m", b"default", b"", b"not json"],
        [b"\x00\x9f", b"", V, b"REQUEST", b"m", b"default", b"", b"\xff\xfe"],
        [b"\x00\x9f", b"", V, b"READY", b"m"],
        [b"\x00\x9f", b"", V, b"REQUEST", b"bin-1", b"default", b"", job()],
        [b"c2", b"", V, b"REQUEST", b"ok-1", b"default", b"", job()],
    ])
    rig.router.backend_received([[b"stranger", b"", V, b"READY", b"r"], [b"w2", b"\x01"]])
    assert rig.router.drops.total == 7
    sent = {f[4]: f[0] for f in rig.sent(rig.back, b"REQUEST")}
    assert set(sent) == {b"bin-1", b"ok-1"}
    assert rig.sent(rig.front, b"REPLY", b"\x00\x9f")[0][5] == b"bin-1"


def test_publish_goes_to_pub_socket_and_hub_subscribers():
    """PUBLISH reaches the PUB socket as [topic, message] and hub subscribers of the topic."""
    rig = Rig()
    target = CollectingTarget("nats")
    rig.hub.broker.subscribe("news.*", target)
    rig.router.pubin_received([[b"p", b"", V, b"PUBLISH", b"m1", b"news.sport", b'{"score": 3}'],
                               [b"p", b"", V, b"PUBLISH", b"m2", b"bad topic!", b"x"],
                               [b"p", b"", V, b"REQUEST", b"m3", b"q", b"", b"x"]])
    assert rig.pub == [[b"news.sport", b'{"score": 3}'], [b"bad topic!", b"x"]]
    assert target.bodies == [b'{"score": 3}']
    assert target.entries[0][8] == "emqp"
    assert rig.router.drops.total == 1


def test_foreign_message_on_job_address_becomes_a_job():
    """A message another protocol publishes to emqp.jobs.<queue> runs as a job; junk is rejected."""
    rig = Rig()
    rig.worker(b"w1", ready=2)
    result_of(rig.hub.broker.publish_batch("emqp.jobs.default", [job(5), b"junk"], origin="nsq"))
    rig.router.pump("default")
    [req] = rig.sent(rig.back, b"REQUEST", b"w1")
    assert req[7] == job(5)
    dead = result_of(rig.hub.broker.dead_letters("emqp.jobs.default"))
    assert [d.body for d in dead] == [b"junk"]


def test_guaranteed_waiting_job_survives_restart():
    """A waiting job is a durable queue entry: after a restart it reaches a new worker."""
    rig = Rig()
    rig.request(b"c", b"g1", headers=b"guarantee")
    rig.router.stop()
    hub2 = restart_hub(rig.hub)
    rig2 = Rig(hub2)
    rig2.worker(b"w9", ready=1)
    assert rig2.jobs_to(b"w9") == [b"g1"]


def test_in_flight_job_after_restart_runs_again_but_finished_does_not():
    """A finished job is gone after a restart; one still in flight is dispatched again."""
    rig = Rig()
    rig.worker(b"w1", ready=2)
    rig.request(b"c", b"done", headers=b"guarantee")
    rig.request(b"c", b"running", headers=b"guarantee")
    rig.reply(b"w1", b"done")
    rig.router.stop()
    hub2 = restart_hub(rig.hub)
    rig2 = Rig(hub2)
    rig2.worker(b"w2", ready=5)
    assert rig2.jobs_to(b"w2") == [b"running"]


SCHED_JOB = job(99)
SID = F.schedule_id(SCHED_JOB.decode())


def schedule(rig, headers=b"", interval=b"10", cron=b"", command=b"SCHEDULE", body=SCHED_JOB):
    """A client's SCHEDULE/UNSCHEDULE (9 frames)."""
    rig.router.frontend_received([[b"c", b"", V, command, b"s", b"default", headers, interval,
                                   body, cron]])


def test_schedule_runs_every_interval_until_unscheduled():
    """SCHEDULE with an interval runs at once and every interval; UNSCHEDULE stops it."""
    rig = Rig()
    rig.worker(b"w1", ready=100)
    schedule(rig)
    rig.tick(0.5)
    assert len(rig.jobs_to(b"w1")) == 1
    rig.tick(20.0)
    assert len(rig.jobs_to(b"w1")) == 3
    schedule(rig, command=b"UNSCHEDULE", interval=b"-1")
    rig.tick(50.0)
    assert len(rig.jobs_to(b"w1")) == 3
    assert rig.hub.scheduler.schedules() == {}


def test_schedule_nohaste_and_run_count():
    """nohaste delays the first run by one interval; run_count:2 stops after two runs."""
    rig = Rig()
    rig.worker(b"w1", ready=100)
    schedule(rig, headers=b"nohaste,run_count:2", interval=b"4")
    rig.tick(3.5)
    assert rig.jobs_to(b"w1") == []
    rig.tick(20.0)
    assert len(rig.jobs_to(b"w1")) == 2


def test_reschedule_same_job_replaces_it():
    """SCHEDULE of the same callable+args twice keeps one schedule (id = eventmq's sha1)."""
    rig = Rig()
    schedule(rig, interval=b"10")
    schedule(rig, interval=b"30")
    scheds = rig.hub.scheduler.schedules()
    assert list(scheds) == [b"emqp/s/" + SID.encode()]
    assert scheds[b"emqp/s/" + SID.encode()].interval == 30.0


def test_schedule_survives_restart():
    """A schedule lives in the hub's scheduler store: after a restart it keeps running."""
    rig = Rig()
    schedule(rig, headers=b"nohaste", interval=b"5")
    rig.router.stop()
    hub2 = restart_hub(rig.hub)
    rig2 = Rig(hub2)
    rig2.worker(b"w1", ready=10)
    rig2.tick(11.0)
    assert len(rig2.jobs_to(b"w1")) == 2


def test_cron_schedule_and_bad_schedules():
    """A cron SCHEDULE is installed; a bad cron or body is dropped with a log line."""
    rig = Rig()
    schedule(rig, interval=b"-1", cron=b"*/5 * * * *")
    assert rig.hub.scheduler.schedules()[b"emqp/s/" + SID.encode()].cron == "*/5 * * * *"
    schedule(rig, interval=b"-1", cron=b"not a cron", body=job(1))
    schedule(rig, interval=b"5", body=b'["run"]')
    assert len(rig.hub.scheduler.schedules()) == 1
    assert rig.router.drops.total == 2


def test_forward_mode_hands_schedules_to_emq_scheduler():
    """With schedules=forward, SCHEDULE goes to the newest scheduler, UNSCHEDULE to all."""
    rig = Rig(forward_schedules=True)
    for s in (b"s1", b"s2"):
        rig.router.frontend_received([[s, b"", V, b"INFORM", b"i", b"", b"scheduler"]])
    schedule(rig)
    assert [f[0] for f in rig.sent(rig.front, b"SCHEDULE")] == [b"s2"]
    assert len(rig.sent(rig.front, b"SCHEDULE")[0]) == 10
    schedule(rig, command=b"UNSCHEDULE", interval=b"-1")
    assert sorted(f[0] for f in rig.sent(rig.front, b"UNSCHEDULE")) == [b"s1", b"s2"]
    assert rig.hub.scheduler.schedules() == {}


def test_scheduler_peer_requests_are_jobs():
    """A real emq-scheduler's REQUESTs are dispatched like any client's."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.router.frontend_received([[b"s1", b"", V, b"INFORM", b"i", b"", b"scheduler"],
                                  [b"s1", b"", V, b"REQUEST", b"r1", b"default",
                                   b"reply-requested", job()]])
    assert rig.jobs_to(b"w1") == [b"r1"]


@pytest.mark.parametrize("queues", [b"[40, 'email']", b"40,email", b"{}"])
def test_bad_inform_queues_get_no_ack(queues):
    """An INFORM whose queues are not JSON pairs is dropped without ACK, as eventmq does."""
    rig = Rig()
    rig.router.backend_received([[b"w", b"", V, b"INFORM", b"i", queues, b"worker"]])
    assert rig.back == [] and b"w" not in rig.router.workers


def test_pub_bridge_copies_foreign_messages_to_pub():
    """With pub_bridge, messages other protocols publish reach PUB; eMQP's own are not doubled."""
    from mqhub.testing import memory_hub

    rig = Rig(memory_hub(), pub_bridge=("news.>",))
    result_of(rig.hub.broker.publish_batch("news.tech", [b"from-nats"], origin="nats"))
    result_of(rig.hub.broker.publish_batch("other", [b"x"], origin="nats"))
    rig.router.pubin_received([[b"p", b"", V, b"PUBLISH", b"m1", b"news.sport", b"own"]])
    assert rig.pub == [[b"news.tech", b"from-nats"], [b"news.sport", b"own"]]
    rig.router.stop()
    result_of(rig.hub.broker.publish_batch("news.tech", [b"late"], origin="nats"))
    assert len(rig.pub) == 2


def test_unreachable_worker_at_send_loses_no_job():
    """A REQUEST that cannot be routed (worker gone) goes back to the queue, even without
    retry headers, and reaches the next worker; the dead worker is forgotten."""
    rig = Rig()

    def send_backend(frames):
        if frames[0] == b"dead" and frames[3] == b"REQUEST":
            rig.router.peer_unreachable(b"dead")  # what the ROUTER_MANDATORY socket reports
            return
        rig.back.append(frames)

    rig.router.send_backend = send_backend
    rig.worker(b"dead", [[20, "default"]], ready=2)
    rig.worker(b"alive", [[10, "default"]], ready=2)
    rig.request(b"c", b"plain")
    rig.request(b"c", b"retry", headers=b"retry-count:1")
    assert b"dead" not in rig.router.workers
    assert sorted(rig.jobs_to(b"alive")) == [b"plain", b"retry"]
    assert sorted(f[5] for f in rig.sent(rig.front, b"REPLY", b"c")) == [b"plain", b"retry"]
    assert rig.queue().depth == 0 and rig.queue().in_flight == 2


def test_reused_client_msgid_keeps_jobs_apart():
    """Two jobs with the same client msgid on one worker both finish; both results come back."""
    rig = Rig()
    rig.worker(b"w1", ready=2)
    rig.request(b"c", b"same", headers=b"reply-requested", body=job(1))
    rig.request(b"c", b"same", headers=b"reply-requested", body=job(2))
    first, second = rig.jobs_to(b"w1")
    assert first == b"same" and second != b"same"
    rig.reply(b"w1", second, b'{"value": 2}')
    rig.reply(b"w1", first, b'{"value": 1}')
    results = [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    assert [(f[5], f[6]) for f in results] == [(b'{"value": 2}', b"same"),
                                              (b'{"value": 1}', b"same")]
    assert rig.queue().in_flight == 0


def test_backlog_larger_than_the_memory_window_is_paged_to_workers():
    """With a 10-entry window, 60 stored jobs (after a restart) all reach workers in order."""
    from mqhub.testing import memory_hub

    rig = Rig(memory_hub(window=10))
    rig.router.frontend_received([[b"c", b"", V, b"REQUEST", b"m%02d" % i, b"default", b"",
                                   job(i)] for i in range(60)])
    rig.router.stop()
    rig2 = Rig(restart_hub(rig.hub, window=10))
    rig2.worker(b"w1", ready=25)
    rig2.worker(b"w2", ready=25)
    for _ in range(50):
        rig2.clock.advance(0)
        done = rig2.jobs_to(b"w1") + rig2.jobs_to(b"w2")
        for peer in (b"w1", b"w2"):
            for msgid in rig2.jobs_to(peer):
                if rig2.router.workers[peer].inflight.get(msgid):
                    rig2.reply(peer, msgid)
        if len(done) == 60:
            break
    assert sorted(done) == [b"m%02d" % i for i in range(60)]
    assert rig2.queue().depth == 0


def test_a_failing_handler_costs_only_its_own_message(monkeypatch):
    """An unexpected error while handling one message is logged; the rest of the read is served."""
    rig = Rig()
    rig.worker(b"w1", ready=1)

    def broken(cmd):
        raise RuntimeError("bug")

    monkeypatch.setattr(rig.router.schedules, "command", broken)
    rig.router.frontend_received([
        [b"c", b"", V, b"SCHEDULE", b"s", b"default", b"", b"5", job(), b""],
        [b"c", b"", V, b"REQUEST", b"after", b"default", b"", job()],
    ])
    assert rig.jobs_to(b"w1") == [b"after"]


def test_only_the_final_failure_is_forwarded():
    """With retry-count:1 and reply-requested, the retried timeout is quiet; the last one and a
    success are forwarded."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.request(b"c", b"t", headers=b"reply-requested,retry-count:1")
    rig.reply(b"w1", b"t", b'{"value": "TimeoutError"}')
    assert not [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    rig.reply(b"w1", b"t", b'{"value": "TimeoutError"}')
    results = [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    assert [f[5] for f in results] == [b'{"value": "TimeoutError"}']
    rig.request(b"c", b"ok", headers=b"reply-requested,retry-count:3")
    rig.reply(b"w1", b"ok", b'{"value": 5}')
    results = [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    assert results[-1][5:] == [b'{"value": 5}', b"ok"]


def test_client_acks_and_results_wait_for_their_commit():
    """With grouped commits, the dispatch ack waits for the job's commit and the result for the
    commit that removes the job."""
    from twisted.internet.task import Clock

    from mqhub.store.memory import MemoryStore
    from mqhub.testing import START_TIME, memory_hub

    clock = Clock()
    clock.advance(START_TIME)
    store = MemoryStore(clock=clock)
    store.open()
    rig = Rig(memory_hub(clock, store=store))
    rig.worker(b"w1", ready=1)
    rig.request(b"c", b"m1", headers=b"reply-requested")
    assert rig.jobs_to(b"w1") == []  # a durable job is dispatched once it is stored
    assert rig.sent(rig.front, b"REPLY", b"c") == []  # the dispatch ack waits for the commit
    clock.advance(0)
    assert result_of(store.count_entries("emqp.jobs.default")) == 1
    assert rig.jobs_to(b"w1") == [b"m1"]
    assert [f[5] for f in rig.sent(rig.front, b"REPLY", b"c")] == [b"m1"]
    rig.reply(b"w1", b"m1", b'{"value": 1}')
    assert not [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    clock.advance(0)
    assert [f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]
    assert result_of(store.count_entries("emqp.jobs.default")) == 0


def test_replies_wait_on_the_core_barrier_without_empty_commits():
    """Client acks and results wait for durability through broker.barrier(): the router never
    commits an empty WriteBatch to find out."""
    from twisted.internet.task import Clock

    from mqhub.store.memory import MemoryStore
    from mqhub.testing import START_TIME, memory_hub

    clock = Clock()
    clock.advance(START_TIME)
    store = MemoryStore(clock=clock)
    store.open()
    batches = []
    real_commit = store.commit

    def recording_commit(batch):
        batches.append(batch)
        return real_commit(batch)
    store.commit = recording_commit
    rig = Rig(memory_hub(clock, store=store))
    rig.worker(b"w1", ready=2)
    rig.request(b"c", b"m1", headers=b"reply-requested")
    rig.request(b"c", b"m2", headers=b"reply-requested")
    clock.advance(0)
    rig.reply(b"w1", b"m1")
    rig.reply(b"w1", b"m2")
    clock.advance(0)
    clock.advance(0)
    assert len([f for f in rig.sent(rig.front, b"REPLY", b"c") if len(f) == 7]) == 2
    assert batches and all(batch for batch in batches)


def test_result_from_a_pre_restart_worker_settles_the_recovered_job():
    """A job in flight at a restart is recovered as waiting; when the old jobmanager's result
    arrives before another worker takes it, the job is finished (not run again) and the
    client gets the result."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.request(b"c", b"long", headers=b"guarantee,reply-requested")
    assert rig.jobs_to(b"w1") == [b"long"]
    rig.router.stop()
    hub2 = restart_hub(rig.hub)
    rig2 = Rig(hub2)
    assert rig2.queue().depth == 1
    rig2.reply(b"w1", b"long", b'{"value": 42}')   # w1 is unknown to the new broker
    advance(rig2.clock, 0.1)
    results = [f for f in rig2.sent(rig2.front, b"REPLY", b"c") if len(f) == 7]
    assert [(f[5], f[6]) for f in results] == [(b'{"value": 42}', b"long")]
    assert rig2.queue().depth == 0 and rig2.router.stats["late_replies"] == 1
    hub3 = restart_hub(hub2)
    rig3 = Rig(hub3)
    rig3.worker(b"w2", ready=1)
    assert rig3.jobs_to(b"w2") == []


def test_late_failure_of_a_retryable_job_lets_it_run_again():
    """A timed-out result from before the restart of a guaranteed job: the job runs again."""
    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.request(b"c", b"j", headers=b"guarantee")
    rig.router.stop()
    rig2 = Rig(restart_hub(rig.hub))
    rig2.reply(b"w1", b"j", b'{"value": "TimeoutError"}')
    rig2.worker(b"w2", ready=1)
    assert rig2.jobs_to(b"w2") == [b"j"]


def test_late_reply_matching_no_single_job_is_dropped():
    """An unknown worker's REPLY that names no waiting job is dropped and counted."""
    rig = Rig()
    rig.reply(b"ghost", b"nothing")
    assert rig.router.drops.total >= 1 and rig.router.stats["late_replies"] == 0


def test_peers_lists_workers_clients_schedulers_publishers_and_forgets_them():
    """router.peers(): kinds and sockets; DISCONNECT and silence remove clients; bounded."""
    from mqhub.protocols.emqp.peers import PEER_IDLE, PeerTable

    rig = Rig()
    rig.worker(b"w1", ready=1)
    rig.request(b"c1", b"m1")
    rig.request(b"c1", b"m2")
    rig.router.frontend_received([[b"s1", b"", V, b"INFORM", b"i", b"", b"scheduler"]])
    rig.router.pubin_received([[b"p1", b"", V, b"PUBLISH", b"x", b"news", b"hi"],
                               [b"p2", b"", V, b"NOPE", b"x"]])
    rows = {r["peer"]: r for r in rig.router.peers()}
    assert {p: (r["kind"], r["listener"]) for p, r in rows.items()} == {
        "w1": ("worker", "emqp-backend"), "c1": ("client", "emqp-frontend"),
        "s1": ("scheduler", "emqp-frontend"), "p1": ("publisher", "emqp-pub-in")}
    assert rows["c1"]["messages"] == 2 and rows["w1"]["in_flight"] == 1
    rig.router.frontend_received([[b"c1", b"", V, b"DISCONNECT", b"d"]])
    assert "c1" not in {r["peer"] for r in rig.router.peers()}
    rig.request(b"c2", b"m3")
    rig.tick(PEER_IDLE + 5)  # w1 heartbeats; c2, p1 and s1 fall silent
    assert {r["peer"] for r in rig.router.peers()} == {"w1"}
    table = PeerTable(max_peers=3)
    for i in range(5):
        table.seen(b"%d" % i, float(i))
    assert list(table.peers) == [b"2", b"3", b"4"]


def test_jobs_the_core_refuses_are_counted_not_acked() -> None:
    """A REQUEST batch a full ``reject`` queue refuses is counted in ``stats["refused"]``
    (the admin's eMQP ``refused`` counter), and is not stored."""
    rig = Rig()
    rig.request(b"c1", b"m1")
    advance(rig.clock, 0.5)
    rig.queue().configure(max_size=1, overflow="reject")
    rig.request(b"c1", b"m2")
    rig.request(b"c1", b"m3")
    advance(rig.clock, 0.5)
    assert rig.router.stats["refused"] == 2 and rig.router.stats["requests"] == 3
    assert rig.queue().depth == 1
