"""Repeating schedules (eMQP SCHEDULE, cron and intervals) run once per cluster.

Every node has its own :class:`~mqhub.scheduler.service.SchedulerService` (durable one-shot
keys, sweeps); in cluster mode the hub's scheduler is a :class:`ClusterScheduler` around it:

* a schedule's definition (spec and payload) is a cluster-wide record
  (``~cron/<key hex>`` in :class:`~mqhub.cluster.state.ClusterState`), whichever node took
  the SCHEDULE or UNSCHEDULE;
* one node holds the **lease** ``$KV.MQHUB.lease.cron`` in the KV stream: a message with a
  per-message TTL (:data:`LEASE_TTL`), written only if the subject's last sequence is the one
  the writer expects (``Nats-Expected-Last-Subject-Sequence``: 0 = nobody holds it), renewed
  every :data:`LEASE_RENEW` seconds. The holder installs every definition in its own
  scheduler and runs them; every other node keeps none installed;
* a holder that dies (or is cut off) stops renewing: JetStream removes the lease when its TTL
  runs out and the next node to try takes it and installs the schedules (first run at the
  spec's next time from then; a run count starts again at 0).

One-shot keys (``call_at``) and sweeps stay per node, as before.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any, Protocol

from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from mqhub.cluster.client import Request
from mqhub.cluster.jetstream import KV_STREAM, JetStreamError
from mqhub.errors import ClusterUnavailable
from mqhub.protocols.nats.codec import build_headers
from mqhub.scheduler.spec import ScheduleSpec

if TYPE_CHECKING:  # pragma: no cover
    from twisted.internet.interfaces import IReactorTime

    from mqhub.cluster.client import NatsConnection
    from mqhub.cluster.jetstream import JetStream
    from mqhub.cluster.state import ClusterState

__all__ = ["ClusterScheduler", "LEASE_SUBJECT", "CRON_PREFIX"]

log = Logger()

LEASE_SUBJECT = "$KV.MQHUB.lease.cron"
CRON_PREFIX = "~cron/"
#: seconds a lease lives without renewal, and between renewals
LEASE_TTL = 6
LEASE_RENEW = 2.0


class CronNode(Protocol):
    """What the scheduler needs of its node (the ClusterBroker provides it; named here so
    this module does not import the broker that starts it)."""

    clock: IReactorTime
    conn: NatsConnection
    js: JetStream
    name: str
    ready: bool
    state: ClusterState


class ClusterScheduler(Service):
    """The hub's scheduler in cluster mode (see the module docstring).

    :param inner: this node's SchedulerService.
    :param broker: the node's cluster broker (connection, records, clock, name).
    """

    def __init__(self, inner: Any, broker: CronNode) -> None:
        self.inner = inner
        self.broker = broker
        self.clock = broker.clock
        #: the stream sequence of this node's lease message (0: not the holder)
        self.lease_seq = 0
        self._renewer: Any = None
        self._trying = False

    @property
    def leader(self) -> bool:
        """Whether this node runs the cluster's schedules now."""
        return self.lease_seq > 0

    @property
    def ready(self) -> defer.Deferred[None]:
        """Fires once the node's own scheduler has loaded."""
        return self.inner.ready

    # -- what the hub and adapters call -----------------------------------------------------

    def register(self, prefix: bytes, handler: Any) -> None:
        """Due rows of keys under ``prefix`` go to ``handler`` (this node's scheduler)."""
        self.inner.register(prefix, handler)

    def add_sweep(self, name: str, func: Any, interval: float) -> None:
        """A periodic sweep of this node."""
        self.inner.add_sweep(name, func, interval)

    def call_at(self, when: float, key: bytes, payload: bytes) -> defer.Deferred[None]:
        """A one-shot key of this node."""
        return self.inner.call_at(when, key, payload)

    def schedule(self, spec: ScheduleSpec, key: bytes, payload: bytes) -> defer.Deferred[None]:
        """Install a repeating schedule cluster-wide (its record); the lease holder runs it."""
        if not isinstance(spec, ScheduleSpec):
            spec = ScheduleSpec(**spec)
        batch = self.broker.state.batch()
        batch.put_meta(CRON_PREFIX + key.hex(), json.dumps({
            "spec": spec.encode().decode(), "payload": base64.b64encode(payload).decode()
        }).encode())
        d = self.broker.state.commit(batch)
        if self.leader:
            d.addCallback(lambda _: self.inner.schedule(spec, key, payload))
        return d

    def cancel(self, key: bytes) -> defer.Deferred[bool]:
        """Remove a schedule cluster-wide (a one-shot key: this node's)."""
        record = CRON_PREFIX + key.hex()
        if record not in self.broker.state.mirror:
            return self.inner.cancel(key)
        batch = self.broker.state.batch()
        batch.delete_meta(record)
        d = self.broker.state.commit(batch)
        d.addCallback(lambda _: self.inner.cancel(key))
        return d.addCallback(lambda _: True)

    def schedules(self) -> dict[bytes, ScheduleSpec]:
        """The cluster's repeating schedules by key."""
        out = {}
        for record, (value, _) in self.broker.state.mirror.items():
            if record.startswith(CRON_PREFIX) and value is not None:
                try:
                    out[bytes.fromhex(record[len(CRON_PREFIX):])] = ScheduleSpec.decode(
                        json.loads(value)["spec"].encode())
                except (ValueError, KeyError):
                    continue
        return out

    def run_counts(self) -> dict[bytes, int]:
        """Runs of each schedule on this node since it took the lease."""
        return self.inner.run_counts()

    def pending_keys(self) -> dict[bytes, float]:
        """This node's one-shot keys."""
        return self.inner.pending_keys()

    # -- lifecycle ---------------------------------------------------------------------------

    def startService(self) -> None:
        """Start this node's scheduler without the schedules it may have kept from an
        earlier run (only the lease holder installs them), watch the records, try the lease."""
        Service.startService(self)
        self.inner.startService()
        self.broker.state.watch(CRON_PREFIX, self._record_changed)
        self.inner.ready.addCallback(self._started)

    def _started(self, _: object) -> None:
        """Drop kept schedules, then try the lease now and every LEASE_RENEW seconds."""
        for key in self.inner.schedules():
            self.inner.cancel(key)
        self._tick()

    def stopService(self) -> Any:
        """Stop renewing; hand the lease back at once (another node takes it)."""
        Service.stopService(self)
        if self._renewer is not None and self._renewer.active():
            self._renewer.cancel()
        if self.leader:
            self.lease_seq = 0
            try:
                self.broker.conn.publish([b"HPUB %s %d %d\r\n%s\r\n" % (
                    LEASE_SUBJECT.encode(), len(_PURGE), len(_PURGE), _PURGE)])
            except ClusterUnavailable:
                pass
        return self.inner.stopService()

    # -- the lease ---------------------------------------------------------------------------

    def _tick(self) -> None:
        """Renew (holder) or try to take (others) the lease."""
        if not self.running:
            return
        self._renewer = self.clock.callLater(LEASE_RENEW, self._tick)
        if self._trying or not self.broker.ready:
            return
        self._trying = True
        d = self._renew() if self.leader else self._take()
        d.addErrback(self._lost)
        d.addBoth(self._tried)

    def _tried(self, _: object) -> None:
        self._trying = False

    @defer.inlineCallbacks
    def _take(self) -> Any:
        """Take the lease if nobody holds it (its last message is gone or a release)."""
        try:
            reply = yield self.broker.js.get_message(KV_STREAM,
                                                     last_by_subject=LEASE_SUBJECT)
            msg = reply["message"]
            hdrs = base64.b64decode(msg.get("hdrs") or "")
            if b"KV-Operation" not in hdrs:
                return            # held by another node
            expected = int(msg["seq"])
        except JetStreamError as exc:
            if not exc.not_found:
                raise
            expected = 0
        seq = yield self._write(expected)
        if seq:
            self.lease_seq = seq
            log.info("cluster: this node runs the cluster's schedules now (lease taken)")
            yield self._install()

    @defer.inlineCallbacks
    def _renew(self) -> Any:
        """Write the lease again, expecting this node's last write."""
        seq = yield self._write(self.lease_seq)
        if seq:
            self.lease_seq = seq
        else:
            self._demote("another node holds the lease")

    def _write(self, expected: int) -> defer.Deferred[int]:
        """One lease write; fires with its sequence, or 0 when the expected sequence was not
        the subject's last (someone else wrote it)."""
        block = build_headers([("Nats-TTL", f"{LEASE_TTL}s"),
                               ("Nats-Expected-Last-Subject-Sequence", str(expected))])
        body = self.broker.name.encode()
        conn = self.broker.conn
        reply = conn.reply_subject()
        try:
            conn.publish([b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                LEASE_SUBJECT.encode(), reply.encode(), len(block), len(block) + len(body),
                block, body)])
        except ClusterUnavailable as exc:
            return defer.fail(exc)
        waiter = Request(reply, self.clock.seconds() + conn.timeout)
        conn.wait(waiter)

        def answered(ack: dict) -> int:
            if ack.get("error"):
                return 0
            return int(ack.get("seq", 0))
        return waiter.done.addCallback(answered)

    def _lost(self, failure: Any) -> None:
        """The cluster did not answer: a holder can no longer be sure it holds the lease."""
        if self.leader:
            self._demote(failure.getErrorMessage())

    def _demote(self, why: str) -> None:
        """Stop running the schedules here."""
        self.lease_seq = 0
        log.info("cluster: schedules no longer run on this node ({why})", why=why)
        for key in self.inner.schedules():
            self.inner.cancel(key)

    @defer.inlineCallbacks
    def _install(self) -> Any:
        """Install every schedule of the cluster in this node's scheduler."""
        rows = yield self.broker.state.scan_meta(CRON_PREFIX)
        for record, value in rows:
            self._put(record, value)

    def _put(self, record: str, value: bytes) -> None:
        """Install one schedule record."""
        try:
            data = json.loads(value)
            spec = ScheduleSpec.decode(data["spec"].encode())
            payload = base64.b64decode(data["payload"])
            key = bytes.fromhex(record[len(CRON_PREFIX):])
        except (ValueError, KeyError, TypeError):
            log.warn("cluster: unreadable schedule record {r}", r=record)
            return
        self.inner.schedule(spec, key, payload)

    def _record_changed(self, record: str, value: bytes | None) -> None:
        """Another node scheduled or unscheduled: the holder follows."""
        if not self.leader:
            return
        if value is None:
            self.inner.cancel(bytes.fromhex(record[len(CRON_PREFIX):]))
        else:
            self._put(record, value)


_PURGE = build_headers([("KV-Operation", "PURGE"), ("Nats-Rollup", "sub")])
