"""NSQ topics and channels over the core: a topic is an address, a channel is a queue bound to it.

Mapping (see docs/protocols/nsq.md):

- topic ``T`` publishes to address ``T`` (so any protocol publishing to ``T`` reaches its
  channels). NSQ names may hold what an address may not: an empty dot-separated part becomes
  ``~`` and the ``#ephemeral`` suffix becomes ``~ephemeral`` (no NSQ name contains ``~``, so
  the mapping cannot collide with another topic).
- channel ``C`` of ``T`` is the queue ``nsq/T/C`` bound to the topic's address. Durable unless
  the channel or its topic is ``#ephemeral`` (then memory tier, and the channel is removed with
  its last consumer; an ephemeral topic goes with its last channel).
- a topic keeps messages until its first channel exists: the topic's address is parked in the
  core (durable parking queue), and the first channel's binding takes the backlog.
- topic pause = core ``pause_address``; channel pause = ``Queue.pause``.

Known topics are kept in store metadata ``nsq/topic/<T>`` so they survive restarts; channels are
recovered from the core's durable queues named ``nsq/...``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed

from mqhub.interfaces import IAdapterState, ICore, IQueue
from mqhub.protocols.nsq.codec import is_ephemeral

META_PREFIX = "nsq/topic/"
QUEUE_PREFIX = "nsq/"


def topic_address(topic: str) -> str:
    """The core address an NSQ topic publishes to."""
    if topic.endswith("#ephemeral"):
        topic = topic[: -len("#ephemeral")] + "~ephemeral"
    if topic.startswith(".") or topic.endswith(".") or ".." in topic:
        topic = ".".join(part or "~" for part in topic.split("."))
    return topic


def queue_name(topic: str, channel: str) -> str:
    """The core queue that holds channel ``channel`` of ``topic``."""
    return f"{QUEUE_PREFIX}{topic}/{channel}"


@dataclass
class Topic:
    """One NSQ topic known to this broker (its channels are core queues)."""

    name: str
    address: str
    ephemeral: bool
    channels: dict[str, IQueue] = field(default_factory=dict)  # channel name -> core queue
    paused: bool = False
    message_count: int = 0
    message_bytes: int = 0


class TopicRegistry:
    """Every NSQ topic and channel; shared by the TCP server and the HTTP API.

    :param broker: the core (ICore).
    :param state: where topic records are kept (the core's IAdapterState, or anything that
        adapts to it).
    :param channel_window: ready messages a durable channel keeps in memory (the core queue's
        ``window``; nsqd's ``--mem-queue-size``); 0 = the broker's default.
    """

    def __init__(self, broker: ICore, state: Any, channel_window: int = 0) -> None:
        """Start empty; call :meth:`load` to recover topics from the store."""
        self.broker = broker
        self.state: IAdapterState = IAdapterState(state)
        self.channel_window = max(0, int(channel_window))
        self.topics: dict[str, Topic] = {}
        #: called with (topic, channel) when a channel is deleted (the server closes its clients)
        self.on_channel_deleted: list[Any] = []

    # recovery ---------------------------------------------------------------------------------

    def load(self) -> Deferred[None]:
        """Recover topics from metadata and channels from the core's ``nsq/`` queues."""
        d = self.state.scan_meta(META_PREFIX)

        def restore(rows: list[tuple[str, bytes]]) -> None:
            """Rebuild topics from metadata rows and channels from the core's queues."""
            for key, value in rows:
                name = key[len(META_PREFIX):]
                topic = self._topic_object(name)
                topic.paused = value == b"paused"
            self._adopt_channels()
            self.state.watch(META_PREFIX, self.record_changed)

        return d.addCallback(restore)

    def _adopt_channels(self, only: str | None = None) -> None:
        """Know every channel queue (``nsq/T/C``) of the core, of topic ``only`` or of all."""
        for queue in self.broker.queues():
            qname = queue.name
            if not qname.startswith(QUEUE_PREFIX):
                continue
            tname, _, cname = qname[len(QUEUE_PREFIX):].partition("/")
            if not cname or (only is not None and tname != only):
                continue
            topic = self.topics.get(tname) or self._topic_object(tname)
            if topic.channels.get(cname) is not queue:
                topic.channels[cname] = queue
                self._apply_window(queue)

    def record_changed(self, key: str, value: bytes | None) -> None:
        """Another node of the hub wrote topic ``key``'s record (``IAdapterState.watch``): know
        the topic, its pause and its channels; a deleted topic goes, and the clients of its
        channels here are closed, as nsqd does."""
        name = key[len(META_PREFIX):]
        if value is None:
            topic = self.topics.pop(name, None)
            if topic is not None:
                gone = list(topic.channels)
                topic.channels.clear()
                for channel in gone:
                    self._notify_deleted(name, channel)
            return
        topic = self.topics.get(name) or self._topic_object(name)
        topic.paused = value == b"paused"
        self._adopt_channels(name)

    # topics -----------------------------------------------------------------------------------

    def _topic_object(self, name: str) -> Topic:
        """Create the in-memory record of ``name`` (no store write)."""
        topic = self.topics[name] = Topic(name, topic_address(name), is_ephemeral(name))
        return topic

    def get_topic(self, name: str) -> Topic | None:
        """The topic ``name`` or None."""
        return self.topics.get(name)

    def ensure_topic(self, name: str) -> Topic:
        """Return topic ``name``, creating it (parked until its first channel) if needed."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        topic = self._topic_object(name)
        self.broker.park(topic.address)
        if not topic.ephemeral:
            batch = self.state.batch()
            batch.put_meta(META_PREFIX + name, b"")
            self.state.commit(batch)
        return topic

    def delete_topic(self, name: str) -> Deferred[Any]:
        """Delete ``name`` with every channel and its parked backlog."""
        topic = self.topics.pop(name, None)
        if topic is None:
            return succeed(None)
        ds = [self.broker.delete_queue(q.name) for q in list(topic.channels.values())]
        gone = list(topic.channels)
        topic.channels.clear()
        for channel in gone:
            self._notify_deleted(name, channel)
        ds.append(self._empty_parked(topic))
        ds.append(maybeDeferred(self.broker.unpark, topic.address))
        if topic.paused:
            ds.append(maybeDeferred(self.broker.resume_address, topic.address))
        batch = self.state.batch()
        batch.delete_meta(META_PREFIX + name)
        ds.append(self.state.commit(batch))
        return DeferredList(ds, consumeErrors=True)

    def _empty_parked(self, topic: Topic) -> Deferred[Any]:
        """Drop the messages the topic holds for channels that do not exist yet (and its delays)."""
        return maybeDeferred(self.broker.empty_parked, topic.address)

    def empty_topic(self, name: str) -> Deferred[Any]:
        """Drop the topic's own backlog (messages not yet handed to a channel)."""
        topic = self.topics[name]
        return self._empty_parked(topic)

    def pause_topic(self, name: str, paused: bool) -> Deferred[Any]:
        """Pause (or resume) delivery from the topic to its channels; persisted."""
        topic = self.topics[name]
        topic.paused = paused
        if paused:
            d = maybeDeferred(self.broker.pause_address, topic.address)
        else:
            d = maybeDeferred(self.broker.resume_address, topic.address)
        if not topic.ephemeral:
            batch = self.state.batch()
            batch.put_meta(META_PREFIX + name, b"paused" if paused else b"")
            self.state.commit(batch)
        return d

    def topic_depth(self, topic: Topic) -> int:
        """Messages the topic holds that no channel has taken yet."""
        return int(self.broker.parked_depth(topic.address))

    # channels ---------------------------------------------------------------------------------

    def ensure_channel(self, topic_name: str, channel: str) -> IQueue:
        """Return the queue of ``topic_name``/``channel``, creating topic, queue and binding."""
        topic = self.ensure_topic(topic_name)
        queue = topic.channels.get(channel)
        if queue is not None and self.broker.queue(queue.name) is queue:
            return queue
        ephemeral = topic.ephemeral or is_ephemeral(channel)
        queue = self.broker.declare_queue(
            queue_name(topic_name, channel),
            tier="memory" if ephemeral else "durable",
            auto_delete=is_ephemeral(channel),
            window=self.channel_window,
        )
        self._apply_window(queue)
        self.broker.bind_queue(topic.address, queue.name)
        topic.channels[channel] = queue
        return queue

    def _apply_window(self, queue: IQueue) -> None:
        """Give a durable channel the configured in-memory window (a queue made with another)."""
        if queue.durable and queue.window_setting != self.channel_window:
            queue.configure(window=self.channel_window)

    def get_channel(self, topic_name: str, channel: str) -> IQueue | None:
        """The queue of a channel or None."""
        topic = self.topics.get(topic_name)
        return None if topic is None else topic.channels.get(channel)

    def delete_channel(self, topic_name: str, channel: str) -> Deferred[Any]:
        """Delete one channel (and an ephemeral topic left without channels)."""
        topic = self.topics[topic_name]
        queue = topic.channels.pop(channel)
        d = self.broker.delete_queue(queue.name)
        self._notify_deleted(topic_name, channel)
        if topic.ephemeral and not topic.channels:
            self.delete_topic(topic_name)
        return d

    def _notify_deleted(self, topic: str, channel: str) -> None:
        """Tell the listeners that ``topic``/``channel`` is gone."""
        for callback in list(self.on_channel_deleted):
            callback(topic, channel)

    def forget_if_gone(self, topic_name: str, channel: str) -> None:
        """After a consumer left: drop a channel the core auto-deleted, and its ephemeral topic."""
        topic = self.topics.get(topic_name)
        if topic is None:
            return
        queue = topic.channels.get(channel)
        if queue is not None and self.broker.queue(queue.name) is None:
            del topic.channels[channel]
        if topic.ephemeral and not topic.channels:
            self.delete_topic(topic_name)

    def publish(self, name: str, bodies: list[bytes], defer_ms: int = 0,
                core: ICore | None = None) -> Deferred[None]:
        """Publish ``bodies`` to topic ``name`` (created if new) with one core call; count them.

        The Deferred fires once the messages are durable (at once for an ephemeral topic).
        ``core`` is the publishing connection's handle (its rights; default: the hub's core).

        :raises QueueFull: or InvalidName, from the core, before anything is counted;
            Unauthorized when the connection may not publish to the topic.
        """
        topic = self.ensure_topic(name)
        broker = self.broker
        deliver_at = broker.clock.seconds() + defer_ms / 1000.0 if defer_ms else 0.0
        d: Deferred[None] = (core or broker).publish_batch(
            topic.address, bodies, origin="nsq", deliver_at=deliver_at,
            persist=not topic.ephemeral)
        topic.message_count += len(bodies)
        topic.message_bytes += sum(map(len, bodies))
        return d
