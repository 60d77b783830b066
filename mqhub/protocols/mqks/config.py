"""MqksConfig: the MQKS plugin's settings, read from twistd options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqhub.errors import PluginError
from mqhub.plugin_settings import apply_settings
from mqhub.protocols.mqks.codec import DEFAULT_MAX_LINE

#: ``--mqks-eval`` values: ``off`` (every ``_eval`` is an error) or ``stats`` (the lookup table)
EVAL_MODES = ("off", "stats")


@dataclass
class MqksConfig:
    """Limits and switches of the MQKS plugin.

    ``--option mqks.prefetch=N`` (unacked messages per consumer, default 1,000),
    ``--option mqks.max_line=BYTES`` (longest request line, default 1 MiB),
    ``--option mqks.window=N`` (ready messages a queue keeps in memory before the rest is read
    back from the store, default 50,000, like NSQ's channels) and
    ``--mqks-eval off|stats`` (default ``off``; ``--option mqks.eval=`` works too) and
    ``--option mqks.user=NAME`` (with ``--users``: the user every MQKS connection acts as;
    unset: ``[anonymous]``; see docs/security.md).
    """

    prefetch: int = 1000
    max_line: int = DEFAULT_MAX_LINE
    eval: str = "off"
    window: int = 50_000
    user: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MqksConfig:
        """Build from ``plugin_options['mqks']`` and the ``mqks-eval`` option line.

        :raises PluginError: on an unknown key or a bad value.
        """
        raw: dict[str, Any] = dict((options.get("plugin_options") or {}).get("mqks", {}))
        if options.get("mqks-eval"):
            raw["eval"] = options["mqks-eval"]
        config = apply_settings(cls(), raw, "mqks")
        for key in ("prefetch", "max_line", "window"):
            if getattr(config, key) < 1:
                raise PluginError(f"mqks: option {key} must be at least 1")
        if config.eval not in EVAL_MODES:
            raise PluginError(f"mqks: --mqks-eval must be one of {', '.join(EVAL_MODES)}")
        return config
