"""Crash-cycle targets: one small adapter module per durable protocol path.

A new protocol joins the crash cycles by adding one module here with a class that follows
:class:`tests.reliability.crash.CrashTarget` and listing it in :data:`TARGETS`.
"""

from __future__ import annotations

from tests.reliability.targets.emqp import EmqpGuaranteedJobs
from tests.reliability.targets.mq9 import Mq9Inbox
from tests.reliability.targets.mqks import MqksPublish
from tests.reliability.targets.nsq import NsqPublish
from tests.reliability.targets.vibemq import VibeMqPublish

#: Every crash-cycle target, by the name used in test ids and figures.
TARGETS = {t.name: t for t in (NsqPublish, Mq9Inbox, EmqpGuaranteedJobs, MqksPublish,
                                       VibeMqPublish)}
