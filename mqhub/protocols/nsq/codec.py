"""Sans-IO codec for the NSQ TCP protocol V2 (nsqd's wire format); imports neither Twisted nor zope.

Strategy:

- The client opens with the 4-byte magic ``b"  V2"``; anything else is ``E_BAD_PROTOCOL``.
- Then commands: a text line ending ``\\n`` (a trailing ``\\r`` is stripped), parameters split on
  single spaces.  IDENTIFY, AUTH, PUB and DPUB are followed by ``[int32 size][size bytes]``; MPUB by
  ``[int32 body size][int32 count]`` and ``count`` times ``[int32 size][bytes]``.
- :class:`ServerCodec` turns bytes into command events (``receive_data`` then ``next_event`` until
  :data:`NEED_DATA`).  It checks syntax, names and size limits in nsqd's order and raises
  :class:`ProtocolError` carrying nsqd's wire code; every codec error is fatal (nsqd closes the
  connection for all of them), and a codec that raised keeps raising.  Connection *state* checks
  (``cannot FIN in current state``) belong to the server, which knows the state.
- While a body is incomplete the codec remembers how many bytes it needs and only joins incoming
  chunks once they are all there, so a 5 MiB MPUB arriving in 64 KiB reads is copied once.
  MPUB is parsed incrementally (message by message) because nsqd does not cross-check the
  declared body size against the messages that follow it.
- Server -> client frames are ``[int32 size][int32 type][data]``; type 0 response, 1 error,
  2 message.  Message data is ``[int64 ns timestamp][uint16 attempts][16-byte id][body]``.
  :class:`ClientCodec` decodes those frames (tests and the benchmark use it); the ``encode_*``
  functions build both directions.

Layout: this module is the public face and re-exports everything; the code lives in
:mod:`~mqhub.protocols.nsq.events` (constants, limits, errors, command events),
:mod:`~mqhub.protocols.nsq.parser` (:class:`ServerCodec`) and :mod:`~mqhub.protocols.nsq.frames`
(frame and command encoding, message ids, :class:`ClientCodec`).
"""

from __future__ import annotations

from mqhub.protocols.nsq.events import (
    CLOSE_WAIT,
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_LINE,
    DEFAULT_MAX_MSG_SIZE,
    DEFAULT_MAX_REQ_TIMEOUT_MS,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    NEED_DATA,
    OK,
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Identify,
    Mpub,
    NeedData,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    go_quote,
    is_ephemeral,
    is_valid_name,
)
from mqhub.protocols.nsq.frames import (
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    MSG_HEAD,
    OK_FRAME,
    ClientCodec,
    ErrorFrame,
    Frame,
    Message,
    Response,
    encode_auth,
    encode_command,
    encode_dpub,
    encode_error,
    encode_fin,
    encode_frame,
    encode_identify,
    encode_message,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_response,
    encode_sub,
    encode_touch,
    parse_id,
    parse_ids,
    render_id,
    render_ids,
)
from mqhub.protocols.nsq.parser import ServerCodec

#: Names kept importable from ``codec`` (the rest of mqhub, tests and tools use this module).
__all__ = [
    "CLOSE_WAIT", "CLOSE_WAIT_FRAME", "DEFAULT_MAX_BODY_SIZE", "DEFAULT_MAX_LINE",
    "DEFAULT_MAX_MSG_SIZE", "DEFAULT_MAX_REQ_TIMEOUT_MS", "FRAME_ERROR", "FRAME_MESSAGE",
    "FRAME_RESPONSE", "HEARTBEAT", "HEARTBEAT_FRAME", "MAGIC_V2", "MSG_HEAD", "NEED_DATA", "OK",
    "OK_FRAME", "Auth", "ClientCodec", "Cls", "Command", "Dpub", "ErrorFrame", "Fin", "Frame",
    "Identify", "Message", "Mpub", "NeedData", "Nop", "ProtocolError", "Pub", "Rdy", "Req",
    "Response", "ServerCodec", "Sub", "Touch", "encode_auth", "encode_command", "encode_dpub",
    "encode_error", "encode_fin", "encode_frame", "encode_identify", "encode_message",
    "encode_mpub", "encode_pub", "encode_rdy", "encode_req", "encode_response", "encode_sub",
    "encode_touch", "go_quote", "is_ephemeral", "is_valid_name", "parse_id", "parse_ids",
    "render_id", "render_ids",
]
