"""eMQP SCHEDULE and UNSCHEDULE: recurring jobs kept by the hub's SchedulerService (or, with
``forward_schedules``, handed to a connected emq-scheduler as the original broker does)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from mqhub.protocols.emqp import frames as F
from mqhub.protocols.emqp.jobs import H_HEADERS, H_MSGID, JobBatch, Send
from mqhub.scheduler.spec import ScheduleSpec

SCHEDULE_KEY_PREFIX = b"emqp/s/"

log = Logger(namespace="mqhub.emqp")


class ScheduleFront:
    """Installs and cancels eMQP schedules and turns their due runs into jobs."""

    def __init__(self, scheduler: Any, schedulers: dict[bytes, float], send_frontend: Send,
                 ids: F.MsgIds, stats: dict[str, int], *, forward: bool,
                 known: Callable[[str], bool],
                 enqueue: Callable[[str, list[bytes], list[dict[str, str] | None]], None]) -> None:
        """:param scheduler: the hub's SchedulerService.
        :param schedulers: the router's emq-scheduler peers (last seen, most recent last).
        :param stats: the router's counters (``scheduled_runs`` is counted here).
        :param forward: hand SCHEDULE to an emq-scheduler instead of the SchedulerService.
        :param known: whether an eMQP queue is known (else its runs go to ``default``).
        :param enqueue: stores one batch of jobs on an eMQP queue."""
        self.scheduler = scheduler
        self.schedulers = schedulers
        self.send_frontend = send_frontend
        self.ids = ids
        self.stats = stats
        self.forward = forward
        self.known = known
        self.enqueue = enqueue

    def command(self, cmd: F.Command) -> None:
        """SCHEDULE/UNSCHEDULE: install in (or cancel from) the hub's SchedulerService."""
        unschedule = cmd.name == b"UNSCHEDULE"
        spec = F.parse_schedule(cmd.body, unschedule)
        if self.forward:
            self.forward_command(cmd, unschedule)
            return
        key = SCHEDULE_KEY_PREFIX + spec.schedule_id.encode()
        if unschedule:
            self.scheduler.cancel(key).addErrback(
                lambda f: log.failure("eMQP: UNSCHEDULE failed", f))
            for peer in self.schedulers:  # old schedules an emq-scheduler may still hold
                self.send_frontend(F.build(peer, cmd.name, cmd.msgid, *cmd.body))
            return
        h = F.parse_headers(spec.headers)
        try:
            if spec.interval > 0:
                sched = ScheduleSpec(interval=float(spec.interval), nohaste=h.nohaste,
                                     run_count=h.run_count)
            else:
                sched = ScheduleSpec(cron=spec.cron, nohaste=h.nohaste, run_count=h.run_count)
        except ValueError as exc:
            raise F.ProtocolError(F.E_BAD_VALUE, f"bad schedule: {exc}") from None
        payload = json.dumps({"queue": spec.queue, "body": spec.body}).encode()
        self.scheduler.schedule(sched, key, payload).addErrback(
            lambda f: log.failure("eMQP: SCHEDULE failed", f))

    def forward_command(self, cmd: F.Command, unschedule: bool) -> None:
        """The original's way: SCHEDULE to the newest scheduler peer, UNSCHEDULE to all."""
        if not self.schedulers:
            log.warn("eMQP: {c} with no scheduler connected, dropped", c=cmd.name.decode())
            return
        peers = list(self.schedulers) if unschedule else [list(self.schedulers)[-1]]
        for peer in peers:
            self.send_frontend(F.build(peer, cmd.name, cmd.msgid, *cmd.body))

    def due(self, rows: list[tuple[float, bytes, bytes]], batch: Any, now: float) -> None:
        """SchedulerService handler: each due schedule run becomes one job on its queue."""
        jobs: dict[str, JobBatch] = {}
        for _when, _key, payload in rows:
            try:
                data = json.loads(payload)
                qname = data["queue"] if self.known(data["queue"]) else "default"
                body = data["body"].encode()
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warn("eMQP: unreadable schedule payload skipped")
                continue
            batch_for = jobs.setdefault(qname, ([], []))
            batch_for[0].append(body)
            batch_for[1].append({H_MSGID: self.ids.next().decode(), H_HEADERS: ""})
            self.stats["scheduled_runs"] += 1
        for qname, (bodies, headers) in jobs.items():
            self.enqueue(qname, bodies, headers)
