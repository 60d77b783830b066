"""SchedulerService: durable timers over the store's due-index, driven by an injected clock.

One timer is armed for the earliest due row (``store.next_due()``). When it fires, at most
``slice_size`` rows that are due *now* are read, handed to the handler registered for the longest
matching key prefix together with one WriteBatch, deleted in that batch (unless the handler put
the key again) and committed; a full slice continues on the next turn. So after a restart only
rows that are really due fire, a slice at a time. Repeating schedules (interval or cron,
``nohaste``, ``run_count``) are due rows too, their specs kept in meta ``sc/<hex key>``; one-shot
keys made with ``call_at`` are noted in meta ``sk/<hex key>`` so ``cancel`` can tell whether they
existed. Periodic sweeps (TTL and the like) run in slices with ``now`` passed in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.interfaces import IScheduler
from mqhub.scheduler.spec import ScheduleSpec
from mqhub.store.batch import WriteBatch

log = logging.getLogger(__name__)

Row = tuple[float, bytes, bytes]
Handler = Callable[[list[Row], WriteBatch, float], Callable[[Any], None] | None]
Sweep = Callable[[float, int], bool]
INF = float("inf")
RETRY_UNHANDLED = 60.0


def _key_meta(key: bytes) -> str:
    """The meta key noting one-shot due key ``key``."""
    return "sk/" + key.hex()


@implementer(IScheduler)
class SchedulerService(Service):
    """Durable one-shot and repeating timers plus sliced sweeps (see the module docstring)."""

    name = "scheduler"  # type: ignore[assignment]

    def __init__(self, store: Any, clock: Any, *, slice_size: int = 1000,
                 sweep_budget: int = 10_000) -> None:
        """:param store: an opened IMessageStore. :param clock: the IReactorTime to use."""
        self.store = store
        self.clock = clock
        self.slice_size = slice_size
        self.sweep_budget = sweep_budget
        self._handlers: list[tuple[bytes, Handler]] = []
        self._keys: dict[bytes, float] = {}
        self._schedules: dict[bytes, ScheduleSpec] = {}
        self._runs: dict[bytes, int] = {}
        self._sweeps: dict[str, tuple[Sweep, float]] = {}
        self._loops: dict[str, LoopingCall] = {}
        self._timer: Any = None
        self._timer_at = INF
        self._firing = False
        self._noted = INF
        self.fired = 0
        self.ready: Deferred[None] = Deferred()

    # -- registry ------------------------------------------------------------------------------

    def register(self, prefix: bytes, handler: Handler) -> None:
        """Route due rows whose key starts with ``prefix`` to ``handler(rows, batch, now)``.

        A handler may return a callable; it is called once ``batch`` has been committed, with the
        commit's result (None, or the Failure when the commit failed).
        """
        self._handlers = [(p, h) for p, h in self._handlers if p != prefix]
        self._handlers.append((prefix, handler))
        self._handlers.sort(key=lambda ph: -len(ph[0]))

    def _handler_for(self, key: bytes) -> Handler | None:
        """The handler with the longest prefix of ``key``."""
        for prefix, handler in self._handlers:
            if key.startswith(prefix):
                return handler
        return None

    def add_sweep(self, name: str, func: Sweep, interval: float) -> None:
        """Call ``func(now, budget)`` every ``interval`` s; it returns True while work remains."""
        self._sweeps[name] = (func, interval)
        if self.running:
            self._start_sweep(name)

    def _start_sweep(self, name: str) -> None:
        """Start the LoopingCall of sweep ``name``."""
        interval = self._sweeps[name][1]
        old = self._loops.pop(name, None)
        if old is not None and old.running:
            old.stop()
        loop = LoopingCall(self._run_sweep, name)
        loop.clock = self.clock
        self._loops[name] = loop
        loop.start(interval, now=False)

    def _run_sweep(self, name: str) -> None:
        """One slice of sweep ``name``; continue on the next turn while it has more."""
        func, _ = self._sweeps[name]
        try:
            more = func(self.clock.seconds(), self.sweep_budget)
        except Exception:
            log.exception("sweep %s failed", name)
            return
        if more and self.running:
            self.clock.callLater(0, self._run_sweep, name)

    # -- service -------------------------------------------------------------------------------

    def startService(self) -> None:
        """Load schedules and one-shot keys, arm the timer for the next due row, start sweeps."""
        Service.startService(self)
        d = self.store.scan_meta("sk/")
        d.addCallback(self._loaded_keys)
        d.addCallback(lambda _: self.store.scan_meta("sc/"))
        d.addCallback(self._loaded_schedules)
        d.addCallback(lambda _: self._arm())
        d.addErrback(lambda f: log.error("scheduler recovery failed: %s", f.getErrorMessage()))
        d.addBoth(lambda _: self.ready.callback(None) if not self.ready.called else None)
        for name in self._sweeps:
            self._start_sweep(name)

    def _loaded_keys(self, rows: list[tuple[str, bytes]]) -> None:
        """Recover the one-shot keys."""
        for k, v in rows:
            self._keys[bytes.fromhex(k[3:])] = float(json.loads(v)["when"])

    def _loaded_schedules(self, rows: list[tuple[str, bytes]]) -> None:
        """Recover the repeating schedules."""
        for k, v in rows:
            raw = json.loads(v)
            key = bytes.fromhex(k[3:])
            self._schedules[key] = ScheduleSpec.decode(raw["spec"].encode())
            self._runs[key] = int(raw.get("runs", 0))

    def stopService(self) -> Any:
        """Cancel the timer and the sweeps."""
        Service.stopService(self)
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._timer_at = INF
        for loop in self._loops.values():
            if loop.running:
                loop.stop()
        self._loops.clear()
        return None

    # -- IScheduler ----------------------------------------------------------------------------

    def call_at(self, when: float, key: bytes, payload: bytes) -> Deferred[None]:
        """Durably hand ``payload`` to the handler of ``key`` at ``when``; replaces ``key``."""
        b = WriteBatch()
        if key in self._schedules:
            self._forget_schedule(key, b)
        b.put_due(when, key, payload)
        b.put_meta(_key_meta(key), json.dumps({"when": when}).encode())
        self._keys[key] = when
        return self._commit_and_note(b, when)

    def cancel(self, key: bytes) -> Deferred[bool]:
        """Remove the one-shot entry or schedule ``key``; fire with whether it existed."""
        b = WriteBatch()
        existed = key in self._keys or key in self._schedules
        b.delete_due(key)
        if self._keys.pop(key, None) is not None:
            b.delete_meta(_key_meta(key))
        if key in self._schedules:
            self._forget_schedule(key, b)
        return self.store.commit(b).addCallback(lambda _: existed)

    def schedule(self, spec: ScheduleSpec, key: bytes, payload: bytes) -> Deferred[None]:
        """Durably install a repeating schedule (replacing ``key``)."""
        if not isinstance(spec, ScheduleSpec):
            spec = ScheduleSpec(**spec)
        b = WriteBatch()
        if self._keys.pop(key, None) is not None:
            b.delete_meta(_key_meta(key))
        first = spec.first_time(self.clock.seconds())
        self._schedules[key] = spec
        self._runs[key] = 0
        b.put_due(first, key, payload)
        self._put_schedule_meta(key, b)
        return self._commit_and_note(b, first)

    def schedules(self) -> dict[bytes, ScheduleSpec]:
        """The installed repeating schedules by key."""
        return dict(self._schedules)

    def run_counts(self) -> dict[bytes, int]:
        """How many times each installed schedule has run."""
        return dict(self._runs)

    def pending_keys(self) -> dict[bytes, float]:
        """One-shot keys made with ``call_at`` that have not fired, with their times."""
        return dict(self._keys)

    def _forget_schedule(self, key: bytes, b: WriteBatch) -> None:
        """Drop schedule ``key`` from memory and meta."""
        self._schedules.pop(key, None)
        self._runs.pop(key, None)
        b.delete_meta("sc/" + key.hex())

    def _put_schedule_meta(self, key: bytes, b: WriteBatch) -> None:
        """Store schedule ``key``'s spec and run count."""
        b.put_meta("sc/" + key.hex(), json.dumps(
            {"spec": self._schedules[key].encode().decode(), "runs": self._runs[key]}).encode())

    def _commit_and_note(self, b: WriteBatch, when: float) -> Deferred[None]:
        """Commit ``b`` and arm for ``when`` once it is stored."""
        d = self.store.commit(b)

        def noted(result: Any) -> Any:
            self.note_due(when)
            return result
        return d.addCallback(noted)

    # -- timer ---------------------------------------------------------------------------------

    def note_due(self, when: float) -> None:
        """A due row for ``when`` was stored: arm earlier if needed (O(1))."""
        if not self.running:
            return
        if self._firing:
            if when < self._noted:
                self._noted = when
            return
        self._set_timer(when)

    def _set_timer(self, when: float) -> None:
        """Make sure the one timer fires no later than ``when``."""
        if self._timer is not None and self._timer.active():
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.clock.callLater(max(0.0, when - self.clock.seconds()), self._fire)

    def _arm(self) -> Deferred[None]:
        """Read the earliest due time from the store and arm for it."""
        if not self.running:
            return succeed(None)

        def arm(when: float | None) -> None:
            if when is not None and self.running and not self._firing:
                self._set_timer(when)
        return self.store.next_due().addCallback(arm)

    def _fire(self) -> None:
        """Run one slice of due rows."""
        self._timer = None
        self._timer_at = INF
        if self._firing or not self.running:
            return
        self._firing = True
        now = self.clock.seconds()
        d = self.store.read_due(now, self.slice_size)
        d.addCallback(self._process, now)
        d.addErrback(self._failed)
        d.addCallback(self._fired)

    def _failed(self, failure: Any) -> bool:
        """A slice failed: log and retry in a second."""
        log.error("scheduler slice failed: %s", failure.getErrorMessage())
        self._noted = min(self._noted, self.clock.seconds() + 1.0)
        return False

    def _fired(self, full: bool) -> None:
        """After a slice: continue at once when it was full, else arm for the next row."""
        self._firing = False
        noted, self._noted = self._noted, INF
        if not self.running:
            return
        if full:
            self._set_timer(self.clock.seconds())
            return
        if noted < INF:
            self._set_timer(noted)
        self._arm()

    def _process(self, rows: list[Row], now: float) -> Any:
        """Hand a slice of rows to their handlers in one batch; fire with whether it was full."""
        if not rows:
            return False
        b = WriteBatch()
        groups: dict[Handler, list[Row]] = {}   # insertion order is the order handlers run
        for row in rows:
            key = row[1]
            if key in self._schedules:
                self._advance_schedule(row, b, now)
            elif self._keys.pop(key, None) is not None:
                b.delete_meta(_key_meta(key))
            handler = self._handler_for(key)
            if handler is None:
                log.warning("no handler for due key %r; retrying in %ss", key, RETRY_UNHANDLED)
                b.put_due(now + RETRY_UNHANDLED, key, row[2])
                continue
            groups.setdefault(handler, []).append(row)
        after: list[Callable[[Any], None]] = []
        for handler, handled in groups.items():
            try:
                done = handler(handled, b, now)
                if done is not None:
                    after.append(done)
            except Exception:
                log.exception("due handler %r failed; retrying its rows in %ss", handler,
                              RETRY_UNHANDLED)
                for _, key, payload in handled:
                    b.put_due(now + RETRY_UNHANDLED, key, payload)
        self.fired += len(rows)
        reput = {k for _, k, _ in b.due_puts}
        for _, key, _ in rows:
            if key not in reput:
                b.delete_due(key)
        full = len(rows) >= self.slice_size

        def committed(result: Any) -> bool:
            for func in after:
                try:
                    func(result)
                except Exception:
                    log.exception("after-commit hook %r failed", func)
            if isinstance(result, Failure):
                log.error("scheduler slice commit failed: %s", result.getErrorMessage())
            return full
        return self.store.commit(b).addBoth(committed)

    def _advance_schedule(self, row: Row, b: WriteBatch, now: float) -> None:
        """Count one run of a schedule and put its next run (or remove it after run_count)."""
        when, key, payload = row
        spec = self._schedules[key]
        runs = self._runs.get(key, 0) + 1
        self._runs[key] = runs
        if spec.run_count > 0 and runs >= spec.run_count:
            self._forget_schedule(key, b)
            self._runs[key] = runs
            return
        b.put_due(spec.next_time(when, now), key, payload)
        self._put_schedule_meta(key, b)
