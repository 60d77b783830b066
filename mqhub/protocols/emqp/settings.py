"""EmqpSettings: the definition of every ``--option emqp.KEY=VALUE`` (``[emqp]`` in the config
file), read by :func:`mqhub.protocols.emqp.service.emqp_options`, which refuses any other key."""

from __future__ import annotations

import json
from dataclasses import dataclass

from mqhub.protocols.emqp.frames import DEFAULT_MAX_BODY
from mqhub.protocols.emqp.jobs import DEFAULT_QUEUES

#: Messages the frontend buffers from one client by default (``--option emqp.receive_hwm``):
#: its jobs are stored and may be big (2 MiB jobs: 32 MiB per client); small jobs still flow
#: (the kernel's socket buffer holds the rest and ZeroMQ refills the queue as it is read).
FRONTEND_HWM = 16


@dataclass
class EmqpSettings:
    """The eMQP plugin's options (docs/protocols/emqp.md), with their defaults."""

    #: seconds between the broker's HEARTBEATs to every worker and scheduler
    heartbeat_interval: float = 3.0
    #: a worker or scheduler that has sent nothing for this long (seconds) is removed
    heartbeat_timeout: float = 15.0
    #: JSON queues for a worker whose INFORM names none (eventmq's QUEUES)
    queues: str = json.dumps([list(q) for q in DEFAULT_QUEUES])
    #: internal (SCHEDULE runs in the hub's scheduler) or forward (to a connected emq-scheduler)
    schedules: str = "internal"
    #: the largest frame accepted (bytes)
    max_body: int = DEFAULT_MAX_BODY
    #: messages the frontend buffers from one client before TCP holds it back
    receive_hwm: int = FRONTEND_HWM
    #: comma-separated hub address patterns whose messages go out on PUB
    pub_bridge: str | None = None
    #: ZeroMQ certificate with the server's secret key: every eMQP socket speaks CURVE
    curve_secret_file: str | None = None
    #: with curve_secret_file: directory of the client public certificates let in
    curve_clients: str | None = None
