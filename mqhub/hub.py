"""The Hub: the shared context every protocol plugin receives.

A Hub holds the store, the broker core, the scheduler, the clock and the configuration;
plugins get it in ``make_service`` and keep a reference (like twisted.words' realm).
HubService (ordered start and stop) is added beside it by the foundation work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Hub:
    """Shared context handed to protocol plugins.

    :ivar clock: the IReactorTime everything reads time from (a task.Clock in tests).
    :ivar store: the opened IMessageStore provider.
    :ivar broker: the protocol-neutral core (:class:`mqhub.core.broker.Broker`).
    :ivar scheduler: the SchedulerService (durable timers, cron, sweeps).
    :ivar config: parsed options (plugin-specific keys included).
    :ivar data_dir: where durable data lives, or None for a memory hub.
    """

    clock: Any
    store: Any
    broker: Any = None
    scheduler: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    data_dir: Optional[str] = None
