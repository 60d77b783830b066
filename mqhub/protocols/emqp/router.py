"""The eMQP router: eventmq's broker behaviour on top of the hub's core, without sockets.

:class:`EmqpRouter` is handed whole batches of received multipart messages per socket
(``frontend_received``, ``backend_received``, ``pubin_received``) and sends through three
callables, so unit tests drive it with plain lists and a ``task.Clock``. The Twisted/ZeroMQ
glue is in :mod:`mqhub.protocols.emqp.service`; answers to clients wait for the store in
:mod:`mqhub.protocols.emqp.replies`.

Jobs are durable core queue entries: eMQP queue ``Q`` is the core queue (and address)
``emqp.jobs.Q``. The router attaches one consumer per queue and grants it credit only for free
worker slots it has already chosen by eventmq's rule (highest weight with a free slot, equal
weights rotate), so the core never delivers a job no worker can take.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.protocols.emqp import frames as F
from mqhub.protocols.emqp.access import EmqpGuard, refusal_result
from mqhub.protocols.emqp.droplog import DropLog
from mqhub.protocols.emqp.jobs import (
    CONSUMER_TIMEOUT,
    DEFAULT_QUEUES,
    H_CLIENT,
    H_HEADERS,
    H_MAX,
    H_MSGID,
    H_REPLY,
    JOB_PREFIX,
    Frames,
    JobBatch,
    Send,
    request_headers,
    valid_job,
    waiting_jobs,
)
from mqhub.protocols.emqp.peers import PeerTable, connection_rows
from mqhub.protocols.emqp.pubsub import PubRelay
from mqhub.protocols.emqp.replies import StoredReplies, send_logged
from mqhub.protocols.emqp.schedules import SCHEDULE_KEY_PREFIX, ScheduleFront
from mqhub.protocols.emqp.workers import Routes, Worker
from mqhub.records import ATTEMPTS, BODY, HEADERS, MSG_ID

log = Logger(namespace="mqhub.emqp")

#: a job's result for a client connected to another node of the hub (cluster mode) travels
#: on this live address; every node's router forwards those of its own clients
REMOTE_RESULTS = "~emqp.results"
_REMOTE_TAG = ("emqp", "remote results")


def _text(raw: bytes) -> str:
    """A queue name frame as text (undecodable bytes replaced)."""
    return raw.decode("utf-8", "replace") or "default"


@implementer(IDeliveryTarget)
class EmqpRouter:
    """eventmq's router, scheduler front and pub/sub relay on the hub core (see module doc)."""

    protocol_name = "emqp"

    def __init__(self, hub: Any, send_frontend: Send, send_backend: Send,
                 send_pub: Send | None = None, *, heartbeat_interval: float = 3.0,
                 heartbeat_timeout: float = 15.0,
                 default_queues: list[tuple[int, str]] | None = None,
                 forward_schedules: bool = False, max_body: int = F.DEFAULT_MAX_BODY,
                 pub_bridge: tuple[str, ...] = (), guard: EmqpGuard | None = None) -> None:
        """Build the router; nothing runs until :meth:`start`.

        :param hub: the Hub (clock, broker, scheduler).
        :param send_frontend: sends a routed message on the frontend ROUTER.
        :param send_backend: sends a routed message on the backend ROUTER.
        :param send_pub: sends ``[topic, message]`` on the PUB socket (None: no pub/sub).
        :param heartbeat_interval: seconds between HEARTBEATs to workers and schedulers.
        :param heartbeat_timeout: a worker or scheduler silent this long is removed.
        :param default_queues: queues of a worker whose INFORM names none.
        :param forward_schedules: hand SCHEDULE to a connected emq-scheduler (as the original)
            instead of the hub's SchedulerService.
        :param max_body: largest accepted frame.
        :param pub_bridge: hub address patterns whose messages from other protocols are copied
            to the PUB socket (e.g. ``("news.>",)``).
        :param guard: peers' users and rights (:mod:`.access`); None or not enforcing: every
            peer may do everything.
        """
        self.hub = hub
        self.clock = hub.clock
        self.broker: ICore = hub.broker
        #: the peers' rights when a users file is in force (None: nothing is checked)
        self.guard = guard if guard is not None and guard.enforcing else None
        self.scheduler = hub.scheduler
        self.send_frontend = send_frontend
        self.send_backend = send_backend
        self.send_pub = send_pub
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.default_queues = list(default_queues or DEFAULT_QUEUES)
        self.forward_schedules = forward_schedules
        self.max_body = max_body
        self.ids = F.MsgIds()
        self.drops = DropLog(self.clock)
        self.workers: dict[bytes, Worker] = {}
        #: emq-scheduler peers on the frontend -> last seen (most recent INFORM last)
        self.schedulers: dict[bytes, float] = {}
        self.routes = Routes()
        #: clients (and schedulers) seen on the frontend, publishers on pub-in
        self.clients = PeerTable()
        self.publishers = PeerTable()
        self.consumers: dict[str, Any] = {}
        #: jobs the core delivered when no slot was planned; sent on the next free slot
        self.held: dict[str, list[tuple]] = {}
        self._plan: list[Worker] = []
        self._pumping = False
        self._repump: set[str] = set()
        self._sending: tuple[Worker, bytes] | None = None
        #: dispatch acks and results, sent once what they confirm is stored (replies.py)
        self.replies = StoredReplies(self.broker, self.clock, send_frontend)
        self._heartbeat: LoopingCall | None = None
        self._remote_results: Any = None
        self.stats = {"requests": 0, "dispatched": 0, "replies": 0, "retries": 0,
                      "published": 0, "scheduled_runs": 0, "late_replies": 0, "refused": 0}
        self.pubsub = PubRelay(self.broker, send_pub, self.drops, max_body, self.stats,
                               tuple(pub_bridge), self.publishers, self.clock, self.guard)
        if self.guard is not None:
            self.guard.on_change(self._rights_changed)
        self.schedules = ScheduleFront(self.scheduler, self.schedulers, send_frontend, self.ids,
                                       self.stats, forward=forward_schedules, known=self.known,
                                       enqueue=self.enqueue)
        if self.scheduler is not None and hasattr(self.scheduler, "register"):
            self.scheduler.register(SCHEDULE_KEY_PREFIX, self.schedules.due)

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Attach to recovered job queues and start heartbeating."""
        for queue in self.broker.queues():
            if queue.name.startswith(JOB_PREFIX):
                self._consumer(queue.name[len(JOB_PREFIX):])
        self.pubsub.start()
        self._remote_results = self.broker.subscribe(REMOTE_RESULTS, self, tag=_REMOTE_TAG)
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = self.clock
        self._heartbeat.start(self.heartbeat_interval, now=False)

    def stop(self) -> None:
        """Stop heartbeating and detach (in-flight jobs return to their queues)."""
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        self.replies.cancel()
        self.pubsub.stop()
        if self._remote_results is not None:
            self.broker.unbind(self._remote_results)
            self._remote_results = None
        for qname, consumer in list(self.consumers.items()):
            queue = self.broker.queue(JOB_PREFIX + qname)
            if queue is not None:
                queue.detach(consumer, requeue=True)
        self.consumers.clear()

    # queues ----------------------------------------------------------------------------------

    def _consumer(self, qname: str) -> Any:
        """The dispatcher's consumer on eMQP queue ``qname`` (declared and bound on first use)."""
        consumer = self.consumers.get(qname)
        if consumer is None:
            name = JOB_PREFIX + qname
            queue = self.broker.declare_queue(name, tier="durable")
            self.broker.bind_queue(name, name)
            consumer = self.broker.attach(queue, self, credit=0, timeout=CONSUMER_TIMEOUT,
                                          tag=qname)
            self.consumers[qname] = consumer
        return consumer

    def known(self, qname: str) -> bool:
        """True when a worker has INFORMed ``qname``, it holds recovered jobs, or the hub has
        its queue (a worker of another node informed it)."""
        return qname in self.routes or qname in self.consumers or \
            self.broker.queue(JOB_PREFIX + qname) is not None

    # receiving: frontend ---------------------------------------------------------------------

    def frontend_received(self, messages: list[Frames]) -> None:
        """Handle every message one read of the frontend ROUTER returned."""
        jobs: dict[str, JobBatch] = {}
        now = self.clock.seconds()
        seen: list[bytes] = []  # peers of the valid messages: the table is marked once
        mark = seen.append
        for frames in messages:
            try:
                cmd = F.parse_routed(frames, self.max_body)
                mark(cmd.peer)
                name = cmd.name
                if name == b"REQUEST":
                    self._take_request(cmd, jobs)
                elif name == b"HEARTBEAT":
                    pass  # a scheduler's liveness is refreshed below, as for every command
                elif name == b"INFORM":
                    self._inform_scheduler(cmd, now)
                elif name == b"SCHEDULE" or name == b"UNSCHEDULE":
                    if self.guard is not None and cmd.body and not self.guard.may_publish(
                            "frontend", cmd.peer, JOB_PREFIX + _text(cmd.body[0])):
                        self.stats["refused"] += 1
                        raise F.ProtocolError(F.E_UNAUTHORIZED, "not allowed to schedule on "
                                              + _text(cmd.body[0]))
                    self.schedules.command(cmd)
                elif name == b"DISCONNECT" or name == b"KBYE":
                    self.clients.seen_all(seen, now)  # before it is forgotten, as in order
                    seen.clear()
                    self._frontend_bye(cmd)
                else:
                    raise F.ProtocolError(F.E_COMMAND, f"{name.decode()} on the frontend")
                if cmd.peer in self.schedulers:
                    self.schedulers[cmd.peer] = now
            except F.ProtocolError as exc:
                self.drops.drop("frontend", frames[0] if frames else b"", str(exc))
            except Exception:  # noqa: BLE001 - one message must never cost the rest of the read
                log.failure("eMQP frontend: handling a message failed")
        self.clients.seen_all(seen, now)
        for qname, (bodies, headers) in jobs.items():
            self.enqueue(qname, bodies, headers)

    def _take_request(self, cmd: F.Command, jobs: dict[str, JobBatch]) -> None:
        """Validate one REQUEST and add it to this read's batch for its queue."""
        queue_raw, headers_raw, body = cmd.body
        qname = queue_raw.decode() or "default"
        if not self.known(qname):
            qname = "default"
        if self.guard is not None and not self.guard.may_publish("frontend", cmd.peer,
                                                                 JOB_PREFIX + qname):
            self.stats["refused"] += 1
            self.send_frontend(F.reply_result(cmd.peer, self.ids.next(), refusal_result(
                f"not allowed to publish to {JOB_PREFIX + qname}"), cmd.msgid))
            return
        if not valid_job(body):
            raise F.ProtocolError(F.E_BAD_VALUE, "REQUEST body is not an eventmq job")
        meta = request_headers(cmd, headers_raw)
        batch = jobs.get(qname)
        if batch is None:
            batch = jobs[qname] = ([], [])
        batch[0].append(body)
        batch[1].append(meta)
        self.stats["requests"] += 1

    def enqueue(self, qname: str, bodies: list[bytes],
                 headers: list[dict[str, str] | None]) -> None:
        """Store one batch of jobs on eMQP queue ``qname`` and hand out what free slots allow."""
        try:
            self._consumer(qname)
            d = self.broker.publish_batch(JOB_PREFIX + qname, bodies, origin="emqp",
                                          headers=headers)
        except MqhubError as exc:
            self.stats["refused"] += len(bodies)
            log.error("eMQP: {n} jobs for queue {q} refused: {e}", n=len(bodies), q=qname, e=exc)
            return
        # a durable queue dispatches jobs once they are stored: pump again then (the core has
        # put them in the queue's window before this callback runs)
        d.addCallbacks(lambda _: self.pump(qname), self._not_stored, errbackArgs=(len(bodies),))
        self.pump(qname)

    def _not_stored(self, failure: Failure, n: int) -> None:
        """A batch of ``n`` jobs failed its commit: counted as refused (no client is acked)."""
        self.stats["refused"] += n
        log.failure("eMQP: storing jobs failed", failure)

    def _inform_scheduler(self, cmd: F.Command, now: float) -> None:
        """INFORM on the frontend: an emq-scheduler announcing itself; ACK it."""
        if cmd.body[1] != b"scheduler":
            raise F.ProtocolError(F.E_BAD_VALUE, "only schedulers INFORM on the frontend")
        self.schedulers.pop(cmd.peer, None)
        self.schedulers[cmd.peer] = now  # most recent last
        self.send_frontend(F.ack(cmd.peer, self.ids.next(), cmd.msgid))

    def _frontend_bye(self, cmd: F.Command) -> None:
        """DISCONNECT or KBYE from a frontend peer ends that peer only (never the broker)."""
        self.schedulers.pop(cmd.peer, None)
        self.clients.forget(cmd.peer)
        if cmd.name == b"DISCONNECT":
            self.send_frontend(F.kbye(cmd.peer, self.ids.next()))
            log.info("eMQP: frontend peer {p} disconnected", p=F.peer_label(cmd.peer))

    # receiving: backend ----------------------------------------------------------------------

    def backend_received(self, messages: list[Frames]) -> None:
        """Handle every message one read of the backend ROUTER returned."""
        now = self.clock.seconds()
        acks: dict[str, list[int]] = {}
        retries: dict[str, list[int]] = {}
        results: list[Frames] = []
        freed: set[bytes] = set()
        for frames in messages:
            try:
                cmd = F.parse_routed(frames, self.max_body)
                name = cmd.name
                if name == b"INFORM":
                    self._inform_worker(cmd, now)
                    continue
                worker = self.workers.get(cmd.peer)
                if worker is None:
                    if name == b"REPLY" and self._orphan_reply(cmd, results):
                        continue
                    raise F.ProtocolError(F.E_BAD_VALUE, f"{name.decode()} from an unknown worker")
                worker.last_seen = now
                if name == b"READY":
                    if not worker.leaving:
                        worker.slots += 1
                        freed.add(worker.peer)
                elif name == b"REPLY":
                    self._reply(worker, cmd, acks, retries, results)
                elif name == b"HEARTBEAT":
                    pass
                elif name == b"KBYE" or name == b"DISCONNECT":
                    self._worker_leaving(worker, cmd.name == b"DISCONNECT")
                else:
                    raise F.ProtocolError(F.E_COMMAND, f"{name.decode()} on the backend")
            except F.ProtocolError as exc:
                self.drops.drop("backend", frames[0] if frames else b"", str(exc))
            except Exception:  # noqa: BLE001 - one message must never cost the rest of the read
                log.failure("eMQP backend: handling a message failed")
        self._settle(acks, retries)
        if results:
            self.replies.after_commit(results)
        touched: list[str] = list(retries)
        for peer in freed:
            worker = self.workers.get(peer)
            if worker is not None:
                touched.extend(name for _, name in worker.queues)
        for qname in dict.fromkeys(touched):
            self.pump(qname)

    def _inform_worker(self, cmd: F.Command, now: float) -> None:
        """INFORM from a jobmanager: (re)register it with no slots, ACK, and heartbeat it."""
        queues = F.parse_inform_queues(cmd.body[0]) or list(self.default_queues)
        if self.guard is not None:
            queues = [(w, q) for w, q in queues
                      if self.guard.may_receive("backend", cmd.peer, JOB_PREFIX + q)]
            if not queues:
                raise F.ProtocolError(F.E_UNAUTHORIZED, "INFORM: no queue this worker may serve")
        good: list[tuple[int, str]] = []
        for weight, qname in queues:
            try:
                self._consumer(qname)
            except (InvalidName, MqhubError) as exc:
                log.warn("eMQP: worker queue {q} skipped: {e}", q=qname, e=exc)
                continue
            good.append((weight, qname))
        old = self.workers.get(cmd.peer)
        if old is not None:
            self._remove_worker(old)
        worker = Worker(cmd.peer, good, now)
        self.workers[cmd.peer] = worker
        self.routes.add(worker)
        self.send_backend(F.ack(cmd.peer, self.ids.next(), cmd.msgid))
        # eventmq's jobmanager starts its processes on the broker's first HEARTBEAT
        self.send_backend(F.heartbeat(cmd.peer, self.ids.next(), now))
        log.info("eMQP: worker {p} serves {q}", p=F.peer_label(cmd.peer), q=good)

    def _rights_changed(self) -> None:
        """The users file was reloaded: a worker serves only the queues it may still receive
        (one left with none is removed; its unfinished jobs follow the lost-worker rule)."""
        guard = self.guard
        if guard is None:
            return
        for worker in list(self.workers.values()):
            kept = [(w, q) for w, q in worker.queues
                    if guard.may_receive("backend", worker.peer, JOB_PREFIX + q)]
            if len(kept) == len(worker.queues):
                continue
            log.info("eMQP: worker {p} may no longer serve {q}", p=F.peer_label(worker.peer),
                     q=[q for _, q in worker.queues if (_, q) not in kept])
            self.routes.remove(worker)
            if not kept:
                self._remove_worker(worker)
                continue
            worker.queues = kept
            self.routes.add(worker)

    def _reply(self, worker: Worker, cmd: F.Command, acks: dict[str, list[int]],
               retries: dict[str, list[int]], results: list[Frames]) -> None:
        """A job's result: forward it if the client asked, then finish or retry the job."""
        if len(cmd.body) != 2:
            raise F.ProtocolError(F.E_ARITY, "worker REPLY needs a result and a request id")
        result, req = cmd.body
        job = worker.inflight.pop(req, None)
        if job is None:
            raise F.ProtocolError(F.E_BAD_VALUE, "REPLY for a job not in flight on this worker")
        qname, core_id, client, wants, retryable, client_msgid, last = job
        self.stats["replies"] += 1
        failed = F.is_failure(result)
        if retryable and failed:
            retries.setdefault(qname, []).append(core_id)  # the last one becomes a dead letter
        else:
            acks.setdefault(qname, []).append(core_id)
        if wants and client and (last or not failed):  # a failure that will be retried is quiet
            self._result(client, result, client_msgid, results)
        if worker.leaving and not worker.inflight:
            self._remove_worker(worker)

    def _result(self, client: bytes, result: bytes, msgid: bytes,
                results: list[Frames]) -> None:
        """A job's result for ``client``: sent from here when the client is this node's (or
        the hub has no other eMQP node), else handed to the other nodes (cluster mode: the
        job was sent to another node and ran on a worker of this one)."""
        if client in self.clients.peers or not self.broker.peers("emqp"):
            results.append(F.reply_result(client, self.ids.next(), result, msgid))
            return
        self.broker.publish_batch(REMOTE_RESULTS, [result], origin="emqp", persist=False,
                                  headers={H_CLIENT: client.hex(), H_MSGID: msgid.decode()})

    def _results_in(self, messages: list[tuple]) -> None:
        """Results other nodes handed on: to those of this node's clients."""
        results: list[Frames] = []
        for entry in messages:
            meta = entry[HEADERS] or {}
            try:
                client = bytes.fromhex(meta.get(H_CLIENT, ""))
            except ValueError:
                continue
            if client and client in self.clients.peers:
                results.append(F.reply_result(client, self.ids.next(), entry[BODY],
                                              meta.get(H_MSGID, "").encode()))
        for frames in results:
            send_logged(self.send_frontend, frames)

    def _orphan_reply(self, cmd: F.Command, results: list[Frames]) -> bool:
        """A REPLY from a worker this broker does not know (it ran the job before a restart).

        The job it names (by the request id, which is the client's msgid) was recovered as a
        waiting job. When exactly one waiting job carries that msgid, it is settled now with
        ``Queue.remove`` instead of running again, and its result goes to the client if asked.
        A failure of a retryable job is left to run again, like any retry. Returns False when
        no single waiting job matches (the REPLY is then dropped as before).
        """
        if len(cmd.body) != 2:
            return False
        result, req = cmd.body
        msgid = req.decode("utf-8", "replace")
        found = waiting_jobs(self.consumers.values(), msgid)
        if len(found) != 1:
            return False
        queue, entry = found[0]
        meta = entry[HEADERS]
        if H_MAX in meta and F.is_failure(result):
            return True  # a retryable job that failed runs again, as a retry would
        if queue.remove([entry[MSG_ID]]):
            return False
        self.stats["late_replies"] += 1
        client = bytes.fromhex(meta.get(H_CLIENT, ""))
        if client and H_REPLY in meta:
            results.append(F.reply_result(client, self.ids.next(), result, req))
        log.info("eMQP: job {m} settled by a result from before the restart", m=msgid)
        return True

    def _settle(self, acks: dict[str, list[int]], retries: dict[str, list[int]]) -> None:
        """Ack finished jobs and requeue failed retryable ones, one core call per queue."""
        for qname, ids in acks.items():
            consumer = self.consumers.get(qname)
            if consumer is not None:
                consumer.queue.ack(consumer, ids)
        for qname, ids in retries.items():
            consumer = self.consumers.get(qname)
            if consumer is not None:
                self.stats["retries"] += len(ids)
                consumer.queue.requeue(consumer, ids, error="job failed")

    def _worker_leaving(self, worker: Worker, reply_kbye: bool) -> None:
        """KBYE/DISCONNECT from a worker: no new jobs; its running jobs may still reply."""
        if reply_kbye:
            self.send_backend(F.kbye(worker.peer, self.ids.next()))
        worker.leaving = True
        worker.slots = 0
        self.routes.remove(worker)
        if not worker.inflight:
            self._remove_worker(worker)

    def _remove_worker(self, worker: Worker) -> None:
        """Forget ``worker``; its unfinished jobs are retried when allowed, else finished."""
        self.routes.remove(worker)
        if self.workers.get(worker.peer) is worker:
            del self.workers[worker.peer]
        acks: dict[str, list[int]] = {}
        retries: dict[str, list[int]] = {}
        for qname, core_id, _client, _wants, retryable, _msgid, _last in worker.inflight.values():
            (retries if retryable else acks).setdefault(qname, []).append(core_id)
        worker.inflight.clear()
        worker.slots = 0
        self._settle(acks, retries)
        for qname in retries:
            self.pump(qname)

    # dispatch --------------------------------------------------------------------------------

    def _usable(self, worker: Worker) -> bool:
        """True while ``worker`` is registered and not leaving."""
        return self.workers.get(worker.peer) is worker and not worker.leaving

    def pump(self, qname: str) -> None:
        """Hand out queue ``qname``'s waiting jobs to free slots (re-entrant calls are queued)."""
        if self._pumping:
            self._repump.add(qname)
            return
        self._pumping = True
        try:
            self._pump_queue(qname)
            while self._repump:
                self._pump_queue(self._repump.pop())
        finally:
            self._pumping = False

    def _pump_queue(self, qname: str) -> None:
        """Send held jobs, then grant the queue's consumer credit for chosen free slots."""
        held = self.held.get(qname)
        while held:
            worker = self.routes.pick(qname, self.workers)
            if worker is None:
                return
            self._send_job(worker, qname, held.pop(0))
        consumer = self.consumers.get(qname)
        if consumer is None:
            return
        queue = consumer.queue
        if consumer.credit > 0:
            queue.dispatch()  # spend credit granted earlier if its entries are here now
            if consumer.credit > 0:
                return  # still waiting for entries paged in from the store
        while queue.deliverable > 0:   # (jobs being stored come later)
            plan: list[Worker] = []
            want = queue.deliverable
            while len(plan) < want:
                worker = self.routes.pick(qname, self.workers)
                if worker is None:
                    break
                plan.append(worker)
            if not plan:
                return
            self._plan = plan
            consumer.add_credit(len(plan))
            leftover, self._plan = self._plan, []
            for worker in leftover:  # not delivered now: give the slots back
                if self._usable(worker):
                    worker.slots += 1
            if leftover:
                return
        if consumer.credit <= 0 and self.broker.peers("emqp"):
            # another node of the hub takes jobs for this queue: they arrive without a publish
            # of this node's to pump on, so free slots stay granted until jobs come
            free = sum(w.slots for w in self.workers.values()
                       if self._usable(w) and any(q == qname for _, q in w.queues))
            if free:
                consumer.set_credit(free)
                queue.dispatch()

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Core delivery of jobs to the dispatcher: send each to a planned (or best) worker."""
        qname = binding.tag
        if qname is _REMOTE_TAG:
            self._results_in(messages)
            return
        plan = self._plan
        for entry in messages:
            worker = plan.pop(0) if plan else None
            if worker is None or not self._usable(worker):
                worker = self.routes.pick(qname, self.workers)
            if worker is None:
                self.held.setdefault(qname, []).append(entry)
            else:
                self._send_job(worker, qname, entry)

    def _send_job(self, worker: Worker, qname: str, entry: tuple) -> None:
        """Forward one job to ``worker`` and acknowledge the dispatch to its client."""
        meta = entry[HEADERS]
        body = entry[BODY]
        if meta is not None and H_MSGID in meta:
            msgid = meta[H_MSGID].encode()
            headers = meta.get(H_HEADERS, "").encode()
            client = bytes.fromhex(meta.get(H_CLIENT, ""))
            wants = H_REPLY in meta
            retryable = H_MAX in meta
        else:  # published by another protocol to emqp.jobs.<queue>
            msgid, headers, client, wants = self.ids.next(), b"", b"", False
            retryable = meta is not None and H_MAX in meta
            if not valid_job(body):
                consumer = self.consumers[qname]
                consumer.queue.reject(consumer, [entry[MSG_ID]], reason="rejected",
                                      error="not an eventmq job")
                worker.slots += 1
                return
        last = True
        if retryable:
            try:
                last = entry[ATTEMPTS] >= int(meta[H_MAX])
            except (ValueError, TypeError):
                retryable = False
        # the client's msgid goes to the worker, as in eventmq, unless that worker already runs
        # a job with the same msgid (a client reusing ids): then a fresh one keeps them apart
        wid = msgid if msgid not in worker.inflight else self.ids.next()
        worker.inflight[wid] = (qname, entry[MSG_ID], client, wants, retryable, msgid, last)
        # always ask for the result: it tells exactly which job finished
        self._sending = (worker, wid)
        self.send_backend(F.request(worker.peer, wid, qname.encode(),
                                    F.add_header(headers, b"reply-requested"), body))
        self._sending = None
        if self.workers.get(worker.peer) is not worker:
            return  # unreachable: the removal already retried or finished this job
        if client:
            self.replies.after_commit([F.reply_ack(client, self.ids.next(), msgid)])
        self.stats["dispatched"] += 1

    # heartbeats ------------------------------------------------------------------------------

    def _beat(self) -> None:
        """Heartbeat every worker and scheduler; remove the ones silent for too long."""
        now = self.clock.seconds()
        limit = now - self.heartbeat_timeout
        for worker in list(self.workers.values()):
            if worker.last_seen < limit:
                log.info("eMQP: worker {p} silent, removed", p=F.peer_label(worker.peer))
                self._remove_worker(worker)
            elif not worker.leaving:
                send_logged(self.send_backend, F.heartbeat(worker.peer, self.ids.next(), now))
        for peer, seen in list(self.schedulers.items()):
            if seen < limit:
                del self.schedulers[peer]
                self.clients.forget(peer)
            else:
                send_logged(self.send_frontend, F.heartbeat(peer, self.ids.next(), now))
        self.clients.expire(now)
        self.publishers.expire(now)

    def peers(self) -> list[dict[str, Any]]:
        """Every peer known on the ZeroMQ sockets, as connection rows (see :mod:`.peers`)."""
        return connection_rows(self.workers, self.schedulers, self.clients, self.publishers)

    def peer_unreachable(self, peer: bytes) -> None:
        """The backend could not route to ``peer``: the worker is gone.

        A job whose REQUEST could not be sent never reached it, so that job goes back to its
        queue whatever its headers say; the worker's other jobs follow the lost-worker rule.
        """
        worker = self.workers.get(peer)
        if worker is None:
            return
        log.info("eMQP: worker {p} unreachable, removed", p=F.peer_label(peer))
        sending = self._sending
        if sending is not None and sending[0] is worker:
            job = worker.inflight.pop(sending[1], None)
            if job is not None:
                consumer = self.consumers.get(job[0])
                if consumer is not None:
                    consumer.queue.requeue(consumer, [job[1]])
                    self.pump(job[0])
        self._remove_worker(worker)

    # pub/sub ---------------------------------------------------------------------------------

    def pubin_received(self, messages: list[Frames]) -> None:
        """PUBLISH on the pub/sub ROUTER: out on PUB and into the hub (see :class:`PubRelay`)."""
        self.pubsub.received(messages)
