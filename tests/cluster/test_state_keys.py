"""Adapter record keys as KV subject tokens (mqhub.cluster.state): every key an adapter writes
round-trips, a key's prefix encodes to a prefix of its token, and no token holds a character
a KV key (a subject token) may not."""

from __future__ import annotations

import re

from mqhub.cluster.state import decode_key, encode_key

KEYS = ["nsq/topic/orders", "nsq/topic/orders#ephemeral", "vibemq/q/jobs.high",
        "mqks/queue/ab*c", "mq9/mb/m0123abcd", "~cron/656d71702f", "a b=c", "ünï/ç:ode"]


def test_keys_round_trip_and_keep_their_prefixes() -> None:
    for key in KEYS:
        token = encode_key(key)
        assert re.fullmatch(r"[-/_=a-zA-Z0-9]+", token), token
        assert decode_key(token) == key
    for key in KEYS:
        prefix = key[: len(key) // 2]
        assert encode_key(key).startswith(encode_key(prefix))
