"""NsqConfig.from_options: plugin options, the nsq-* flags, type parsing and errors."""

from __future__ import annotations

import pytest

from mqhub.errors import PluginError
from mqhub.protocols.nsq.config import NsqConfig


def test_options_are_parsed_by_field_type() -> None:
    """Numbers, booleans and dashed keys from ``--option nsq.KEY=VALUE`` land typed."""
    config = NsqConfig.from_options({"plugin_options": {"nsq": {
        "max-rdy-count": "10", "snappy": "off", "deflate": "yes", "broadcast_address": "10.0.0.1"}}})
    assert config.max_rdy_count == 10
    assert config.snappy is False and config.deflate is True
    assert config.broadcast_address == "10.0.0.1"


def test_one_pem_file_serves_as_certificate_and_key() -> None:
    """``--nsq-tls-cert`` alone uses the same file for the key; an explicit key is kept."""
    alone = NsqConfig.from_options({"nsq-tls-cert": "/x/both.pem"})
    assert (alone.tls_cert, alone.tls_key, alone.tls_enabled) == ("/x/both.pem", "/x/both.pem", True)
    both = NsqConfig.from_options({"nsq-tls-cert": "/x/c.pem", "nsq-tls-key": "/x/k.pem"})
    assert (both.tls_cert, both.tls_key) == ("/x/c.pem", "/x/k.pem")
    assert NsqConfig.from_options({}).tls_enabled is False


@pytest.mark.parametrize(("options", "message"), [
    ({"no_such": "1"}, "nsq: unknown option 'no_such'"),
    ({"max_msg_size": "big"}, "nsq: option max_msg_size expects a number, got 'big'"),
])
def test_bad_options_raise_plugin_error(options: dict[str, str], message: str) -> None:
    """An unknown key or a non-number for a number field is refused with PluginError."""
    with pytest.raises(PluginError, match=message):
        NsqConfig.from_options({"plugin_options": {"nsq": options}})
