"""The TOML configuration file (``twistd -n mqhub --config FILE``), derived from the option
definitions.

Nothing here lists an option. The file's top-level keys are the options ``twistd mqhub``
declares (``optParameters``, ``optFlags`` and ``opt_*`` methods of :class:`mqhub.tap.Options`,
built-in protocols' ``option_lines`` included), ``[listen]`` holds ``--listen`` endpoints and a
section per protocol (``[nsq]``, ``[nats]``, ...) holds the fields of that plugin's settings
dataclass (:mod:`mqhub.plugin_settings`). An option added in one of those places is accepted by
the file, checked by ``mqhub config check`` and shown by ``mqhub config example``::

    protocols = "nsq,mq9"                 # an option by its long name
    data-dir = "/srv/mqhub"
    no-admin = false                      # a flag is a boolean
    plugin-path = ["/opt/mqhub-plugins"]  # a repeatable option takes a list

    [listen]                              # --listen NAME.ROLE=ENDPOINT
    "nsq.tcp" = "tcp:4150:interface=0.0.0.0"

    [nsq]                                 # --option nsq.KEY=VALUE, typed
    max_rdy_count = 2500

The command line overrides the file. Unknown keys and bad values are usage errors naming the
file, the line and the key. tomllib gives no line numbers, so :func:`key_lines` finds them.
"""

from __future__ import annotations

import getopt
import json
import re
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.python import usage

from mqhub.errors import PluginError
from mqhub.plugin_settings import Setting, apply_settings, describe, settings_class

#: top-level options that have a place of their own in the file (or none)
LISTEN = "listen"
NOT_IN_FILE = ("config", "option", "help", "version")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_KEY_PART = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_KEY_LINE = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_TABLE_LINE = re.compile(rf"^\s*\[(\[?)\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]")
_KINDS = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
_KIND_WORDS = {"bool": "true or false", "int": "a whole number", "float": "a number",
               "str": "a string"}


# -- the options of twistd mqhub ------------------------------------------------------------

@dataclass(frozen=True)
class TapOption:
    """One ``twistd mqhub`` option as the file sees it.

    :ivar kind: ``param`` (one value), ``flag`` (a boolean) or ``handler`` (an ``opt_*``
        method: repeatable, a list in the file).
    """

    name: str
    kind: str
    default: Any
    help: str


def tap_options(options: usage.Options) -> list[TapOption]:
    """Every option ``options`` declares, in declaration order (help and version left out)."""
    out: dict[str, TapOption] = {}
    for line in getattr(options, "optParameters", []):
        out[line[0]] = TapOption(line[0], "param", line[2], line[3] or "")
    for line in getattr(options, "optFlags", []):
        out[line[0]] = TapOption(line[0], "flag", False, line[2] or "")
    for attr in sorted(dir(type(options))):
        if attr.startswith("opt_"):
            name = attr[4:].replace("_", "-")
            doc = (getattr(options, attr).__doc__ or "").strip().splitlines()
            out.setdefault(name, TapOption(name, "handler", [], doc[0] if doc else ""))
    return [o for name, o in out.items() if name not in NOT_IN_FILE]


def config_argument(options: usage.Options, args: Sequence[str]) -> str | None:
    """The value of ``--config`` on a command line (abbreviations as getopt takes them)."""
    try:
        found, _ = getopt.getopt(list(args), options.shortOpt, options.longOpt)
    except getopt.error:
        return None  # the real parse reports it
    paths = [value for flag, value in found if flag == "--config"]
    return paths[-1] if paths else None


# -- the file ----------------------------------------------------------------------------------

@dataclass
class ConfigFile:
    """A parsed config file: its data, where each key is, and what was taken from it.

    :ivar applied: top-level option -> the value the file gave it (to blame later errors).
    :ivar listen: ``(name, role or None, endpoint, key path)`` of every ``[listen]`` entry.
    :ivar sections: protocol section name -> its table (checked once plugins are found).
    """

    path: str
    data: dict[str, Any]
    lines: dict[tuple[str, ...], int]
    applied: dict[str, Any] = field(default_factory=dict)
    listen: list[tuple[str, str | None, str, tuple[str, ...]]] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def line(self, keys: tuple[str, ...]) -> int:
        """The line of ``keys`` (or of the nearest enclosing key), 0 when unknown."""
        for n in range(len(keys), 0, -1):
            if keys[:n] in self.lines:
                return self.lines[keys[:n]]
        return 0

    def error(self, keys: tuple[str, ...], message: str) -> usage.UsageError:
        """A usage error naming this file, the line of ``keys`` and the key."""
        return usage.UsageError(f"{self.path}:{self.line(keys)}: {'.'.join(keys)}: {message}")

    def blame(self, exc: usage.UsageError, options: usage.Options) -> usage.UsageError:
        """``exc`` with the file's line when it names ``--NAME`` of an option whose value
        came from this file (and the command line did not change it)."""
        text = str(exc)
        for name, value in self.applied.items():
            if f"--{name}" in text and options.get(name) == value:
                return usage.UsageError(f"{self.path}:{self.line((name,))}: {text}")
        return exc


def load(path: str) -> ConfigFile:
    """Read and parse ``path``.

    :raises usage.UsageError: when it cannot be read or is not valid TOML (with its line).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise usage.UsageError(f"--config: cannot read {path}: {exc.strerror}") from None
    text = raw.decode("utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise usage.UsageError(f"{path}: {exc}") from None
    return ConfigFile(path, data, key_lines(text))


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Full key path -> line number (1-based) of every key and table header in TOML ``text``."""
    out: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    in_string = False
    for number, line in enumerate(text.splitlines(), start=1):
        quotes = line.count('"""') + line.count("'''")
        if in_string:
            in_string = quotes % 2 == 0
            continue
        header = _TABLE_LINE.match(line)
        if header:
            table = _split_key(header.group(2))
            out.setdefault(table, number)
        else:
            key = _KEY_LINE.match(line)
            if key:
                out.setdefault(table + _split_key(key.group(1)), number)
        in_string = quotes % 2 == 1
    return out


def _split_key(dotted: str) -> tuple[str, ...]:
    """The parts of a dotted TOML key (quotes removed)."""
    parts = re.findall(_KEY_PART, dotted)
    return tuple(json.loads(p) if p.startswith('"') else p.strip("'") for p in parts)


# -- applying it ----------------------------------------------------------------------------

def apply_options(options: usage.Options, config: ConfigFile) -> None:
    """Set the file's top-level options on ``options`` (before the command line is parsed, so
    the command line overrides them); keep ``[listen]`` and protocol sections for
    :func:`apply_listen` and :func:`plugin_settings`, which need the plugins.

    :raises usage.UsageError: on an unknown key or a value of the wrong kind.
    """
    known = {o.name: o for o in tap_options(options)}
    for key, value in config.data.items():
        name = key.replace("_", "-")
        option = known.get(name)
        if key == LISTEN:
            config.listen = list(_listen_entries(config, value))
        elif option is not None:
            _apply_option(options, option, value, config)
        elif isinstance(value, dict):
            config.sections[key] = value
        else:
            raise config.error((key,), "unknown option (twistd mqhub --help lists them)")


def _apply_option(options: usage.Options, option: TapOption, value: Any,
                  config: ConfigFile) -> None:
    """Give one top-level option the file's value, through the option's own handler."""
    where = (option.name,)
    if option.kind == "flag":
        if not isinstance(value, bool):
            raise config.error(where, f"expects true or false, got {value!r}")
        options[option.name] = 1 if value else 0
    elif option.kind == "handler":
        handler = getattr(options, "opt_" + option.name.replace("-", "_"))
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                raise config.error(where, f"expects a string or a list of them, got {item!r}")
            try:
                handler(str(item))
            except usage.UsageError as exc:
                raise config.error(where, str(exc)) from None
        return
    else:
        if option.name == "protocols" and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        if isinstance(value, (dict, list)) or isinstance(value, bool):
            raise config.error(where, f"expects a string or a number, got {value!r}")
        options[option.name] = str(value)
    config.applied[option.name] = options[option.name]


def _listen_entries(config: ConfigFile, table: Any
                    ) -> Iterator[tuple[str, str | None, str, tuple[str, ...]]]:
    """``(name, role, endpoint, key path)`` of a ``[listen]`` table: ``"NAME.ROLE" = ENDPOINT``,
    ``NAME = ENDPOINT`` (its first role) or ``[listen.NAME]`` with ``ROLE = ENDPOINT``."""
    if not isinstance(table, dict):
        raise config.error((LISTEN,), "expects a table of NAME.ROLE = ENDPOINT")
    for key, value in table.items():
        if isinstance(value, dict):
            for role, endpoint in value.items():
                if not isinstance(endpoint, str):
                    raise config.error((LISTEN, key, role), "expects an endpoint string")
                yield key, role, endpoint, (LISTEN, key, role)
        elif isinstance(value, str):
            name, _, role = key.partition(".")
            yield name, role or None, value, (LISTEN, key)
        else:
            raise config.error((LISTEN, key), "expects an endpoint string")


def plugin_settings(config: ConfigFile, aliases: dict[str, str], plugins: dict[str, Any]
                    ) -> dict[str, dict[str, Any]]:
    """The protocol sections of the file, checked against each plugin's settings dataclass:
    canonical plugin name -> key -> typed value.

    :raises usage.UsageError: on a section that is no protocol, an unknown key or a value of
        the wrong type.
    """
    out: dict[str, dict[str, Any]] = {}
    for section, table in config.sections.items():
        name = aliases.get(section)
        if name is None:
            raise config.error((section,), "unknown option or protocol section; protocols: "
                               + ", ".join(plugins))
        settings = _settings_of(plugins[name], config, (section,))
        target = out.setdefault(name, {})
        for key, value in table.items():
            target[key.replace("-", "_")] = _checked(settings, name, key, value, config,
                                                     (section, key))
    return out


def _settings_of(plugin: Any, config: ConfigFile, where: tuple[str, ...]) -> list[Setting] | None:
    """The plugin's described settings (None when it declares none)."""
    try:
        cls = settings_class(plugin)
    except PluginError as exc:
        raise config.error(where, str(exc)) from None
    return None if cls is None else describe(cls)


def _checked(settings: list[Setting] | None, plugin: str, key: str, value: Any,
             config: ConfigFile, where: tuple[str, ...]) -> Any:
    """``value`` when it suits the setting ``key`` of ``plugin`` (any value when the plugin
    declares no settings)."""
    if settings is None:
        return value
    by_key = {s.key: s for s in settings}
    setting = by_key.get(key.replace("-", "_"))
    if setting is None:
        raise config.error(where, f"unknown {plugin} option; known: {', '.join(by_key)}")
    kinds = _KINDS[setting.kind]
    if not isinstance(value, kinds) or (isinstance(value, bool) and setting.kind != "bool"):
        raise config.error(where, f"expects {_KIND_WORDS[setting.kind]}, got {value!r}")
    return value


# -- checking what a start would build --------------------------------------------------------

def check_plugins(options: usage.Options) -> None:
    """Build every chosen protocol's service on a throwaway memory hub (nothing opens or
    listens): the plugins' own checks of their settings, files and certificates run as they
    would at start.

    :raises PluginError: naming the protocol whose settings it refuses.
    """
    from twisted.internet.task import Clock

    from mqhub.hub import build_hub

    hub = build_hub({"data-dir": None, "durability": "none"}, Clock())
    for plugin in options["plugins"]:
        try:
            plugin.make_service(hub, options["endpoints"][plugin.name], dict(options))
        except PluginError as exc:
            raise PluginError(refusal(plugin.name, exc)) from exc


def refusal(name: str, exc: PluginError) -> str:
    """A plugin's refusal as one line starting with its name (once)."""
    text = str(exc)
    return text if text.startswith(f"{name}:") else f"{name}: {text}"


# -- writing one ------------------------------------------------------------------------------

EXAMPLE_TITLE = """mqhub configuration: twistd -n mqhub --config FILE (the command line overrides it).
Every option of `twistd mqhub --help` by its long name, [listen] for --listen, and one section
per protocol for its --option settings, each shown with its default. Unset options are
commented out. Check a file with: mqhub config check FILE (docs/operations.md)."""


def effective(options: Any, title: str = EXAMPLE_TITLE) -> str:
    """The configuration a parsed :class:`mqhub.tap.Options` amounts to, as a config file:
    every option's value, every enabled listener's endpoint and every enabled protocol's
    settings (defaults filled in). With no options given this is the complete example."""
    plugins = list(options["plugins"])
    listen = {f"{p.name}.{role}": endpoint
              for p in plugins for role, endpoint in options["endpoints"][p.name].items()}
    listen["admin.http"] = options["admin_endpoint"]
    return render(options, plugins, dict(options), listen, options["plugin_options"], title)


def toml_value(value: Any) -> str:
    """``value`` as a TOML value (strings through JSON's escaping, which TOML shares)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    text = str(value)
    if '"' in text and "'" not in text and text.isprintable():
        return f"'{text}'"  # a literal string reads better than escaped quotes
    return json.dumps(text, ensure_ascii=False)


def toml_key(key: str) -> str:
    """A TOML key, quoted when it is not bare."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _text_value(text: Any) -> Any:
    """An option's text as the file shows it: a whole number or a number when it is one."""
    if not isinstance(text, str):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _entry(key: str, value: Any, help_text: str) -> list[str]:
    """The lines of one key: its help as comments, then ``key = value`` (commented out when
    the value is unset)."""
    lines = [f"# {line}" for line in _wrap(help_text)]
    if value is None:
        lines.append(f"# {toml_key(key)} = ...")
    else:
        lines.append(f"{toml_key(key)} = {toml_value(value)}")
    return lines


def _wrap(text: str, width: int = 94) -> list[str]:
    """``text`` in lines of at most ``width`` characters."""
    out: list[str] = []
    for word in text.split():
        if out and len(out[-1]) + 1 + len(word) <= width:
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def render(options: usage.Options, plugins: Sequence[Any], values: dict[str, Any],
           listen: dict[str, str], plugin_values: dict[str, dict[str, Any]],
           title: str) -> str:
    """A complete config file: every top-level option with ``values`` (an option missing from
    ``values`` shows its default), ``[listen]``, then a section per plugin of ``plugins``
    with every setting (``plugin_values`` over its defaults), each with its help."""
    lines = [f"# {line}" for line in title.splitlines()]
    for option in tap_options(options):
        if option.name == LISTEN:
            continue
        value = values.get(option.name, values.get(option.name.replace("-", "_"),
                                                   option.default))
        if option.kind == "flag":
            value = bool(value)
        elif option.kind == "handler":
            value = list(value or [])
        else:
            value = _text_value(value)
        lines += ["", *_entry(option.name, value, option.help)]
    lines += ["", "# Where each listener binds (--listen NAME.ROLE=ENDPOINT). Entries of protocols",
              "# that are not enabled are ignored.", f"[{LISTEN}]"]
    lines += [f"{toml_key(key)} = {toml_value(endpoint)}" for key, endpoint in listen.items()]
    off = [f"{p.name}.{role}" for p in plugins for role in getattr(p, "optional_roles", ())
           if f"{p.name}.{role}" not in listen]
    if off:
        lines.append("# Roles that are off unless given an endpoint:")
        lines += [f"# {toml_key(key)} = ..." for key in off]
    for plugin in plugins:
        cls = settings_class(plugin)
        aliases = f" (also [{'], ['.join(plugin.aliases)}])" if plugin.aliases else ""
        lines += ["", f"# {plugin.name}{aliases}: {plugin.description}"]
        if cls is None:
            lines.append(f"# {plugin.name} declares no settings: any key is passed to it.")
            lines.append(f"[{plugin.name}]")
            continue
        lines.append(f"[{plugin.name}]")
        given = plugin_values.get(plugin.name, {})
        current = apply_settings(cls(), given, plugin.name)
        for setting in describe(cls):
            lines += ["", *_entry(setting.key, getattr(current, setting.key), setting.help)]
    return "\n".join(lines) + "\n"
