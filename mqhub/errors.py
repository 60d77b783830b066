"""Domain exceptions shared by the core, the store and the protocol adapters.

These carry no wire codes: each protocol maps them to its own error in one place.
"""


class MqhubError(Exception):
    """Base class of every mqhub domain error."""


class StoreError(MqhubError):
    """A write could not be made durable, or the store could not be read."""


class StoreClosed(StoreError):
    """The store was used after it was closed."""


class InvalidName(MqhubError):
    """An address, queue, topic or channel name breaks the naming rules."""


class NoSuchQueue(MqhubError):
    """The named queue does not exist."""


class NoSuchMessage(MqhubError):
    """The message id is not in flight (or not known) on this queue."""


class QueueFull(MqhubError):
    """A queue at its size limit rejected a new message (overflow policy ``reject``)."""


class MessageTooLarge(MqhubError):
    """A body is larger than the configured limit."""


class PluginError(MqhubError):
    """A protocol plugin could not be loaded or refused to start."""


class ClusterUnavailable(StoreError):
    """Cluster mode: the JetStream cluster (or a stream's quorum) did not accept a write in
    time. A StoreError, so every protocol refuses the publish with its own error."""


class Unauthorized(MqhubError):
    """The connection's principal may not do this (mqhub.identity): each protocol answers
    with its own refusal and the connection goes on.

    :ivar action: ``publish``, ``subscribe`` or ``admin``.
    :ivar address: the address or pattern refused.
    """

    def __init__(self, action: str, address: str) -> None:
        """Remember what was refused."""
        super().__init__(f"not allowed to {action} {address!r}")
        self.action = action
        self.address = address
