"""Malformed MQKS lines get the original's handling and affect no other client (MQKS or NSQ)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from mqhub.protocols.nsq import codec as nsq_wire
from tests.interop.broker import BrokerProcess
from tests.interop.mqks_client import MqksSocket
from tests.interop.nsq_client import NsqSocket

pytestmark = pytest.mark.interop

ERROR = re.compile(rb"(\S+) error \d{20}[0-9A-Za-z]{4}")


def errors(lines: list[bytes]) -> list[bytes]:
    """The request ids of the error replies among ``lines``."""
    return [m.group(1) for m in map(ERROR.fullmatch, lines) if m]


def test_malformed_lines_leave_other_clients_alone(make_broker: Callable[..., BrokerProcess]) -> None:
    """Unsplittable, unknown action/flag, non-UTF-8, TAB and over-long lines; others unaffected."""
    broker = make_broker(["mqks", "nsq"], extra_args=["--option", "mqks.max_line=1024"])
    port = broker.port("mqks", "tcp")
    bystander = MqksSocket(port)
    bystander.confirm(b"bc", b"consume", b"bq b.e --manual-ack")
    nsq = NsqSocket(broker.port("nsq", "tcp"))
    nsq.send(nsq_wire.encode_sub("bt", "c") + nsq_wire.encode_rdy(10))
    nsq.read_until(lambda fs: nsq_wire.Response(b"OK") in fs, "SUB OK")

    s = MqksSocket(port)
    s.send(b"x ping", b"", b"a  ping x", b"u nosuch data", b"c consume q --nope",
           b"p publish e1", b"n consume \xff\xfe", b"ev _eval len(state.queues)", b"ok ping fine")
    s.wait_line(b"ok ok fine")
    assert errors(s.lines) == [b"None", b"None", b"a", b"u", b"c", b"p", b"n", b"ev"]
    # a TAB closes the connection without a reply; the lines before it were run
    t = MqksSocket(port)
    t.send_raw(b"t1 ping before\nt2 ping in\tside\nt3 ping after\n")
    t.wait_closed()
    assert t.lines == [b"t1 ok before"]
    # an over-long line: None error, then closed
    o = MqksSocket(port)
    o.send_raw(b"o1 ping short\no2 publish e " + b"x" * 2000)
    o.wait_closed()
    assert o.lines[0] == b"o1 ok short" and errors(o.lines[1:]) == [b"None"]
    # everyone else still works
    s.confirm(b"m", b"publish", b"b.e still")
    assert bystander.wait_messages(b"bc", 1)[0]["data"] == b"still"
    nsq.send(nsq_wire.encode_pub("bt", b"nsq fine"))
    assert [m.body for m in nsq.messages_until(1, "the NSQ message")] == [b"nsq fine"]
    for sock in (s, t, o, bystander):
        sock.close()
    nsq.close()
