"""twistd glue: ``twistd -n mqhub`` options and the service they build.

Plugin discovery happens in ``postOptions`` (never at import time), so ``--plugin-path`` and
``MQHUB_PLUGIN_PATH`` are honoured and a broken drop-in is reported by file name.

Every option is declared once, here (``optParameters``, ``optFlags``, ``opt_*`` methods) or in a
plugin's settings dataclass; ``--config FILE`` (:mod:`mqhub.config`) reads the same options
from a TOML file before the command line, which overrides it.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
from typing import Any

from twisted.logger import Logger
from twisted.python import usage

from mqhub import config
from mqhub.core.broker import Broker
from mqhub.discovery import Discovery, load_plugins, plugin_dirs
from mqhub.errors import PluginError
from mqhub.gc_tuning import tune_gc, young_sweeps
from mqhub.hub import PAGING_KEYWORDS, HubService, StartFailed, build_hub
from mqhub.lameduck import DEFAULT_DURATION, DEFAULT_GRACE, LameDuck
from mqhub.lameduck import install_signal as install_lame_duck_signal
from mqhub.logs import forward_stdlib_logging
from mqhub.plugins.builtin import BUILTIN
from mqhub.store.journal import DEFAULT_RETENTION_BYTES, DEFAULT_RETENTION_SECONDS

log = Logger(namespace="mqhub.tap")

LOG_FORMATS = ("text", "json")
DURABILITY_MODES = ("sync", "batch", "none")
#: Default endpoint of the admin web listener (role admin.http).
ADMIN_ENDPOINT = "tcp:8750:interface=127.0.0.1"
#: Bounds of the core's paging options: option -> (lowest, highest, unit). They catch typos:
#: a window of 10 million entries is already 1,000 times the default.
PAGING_BOUNDS: dict[str, tuple[int, int, str]] = {
    "window": (1, 10_000_000, "entries"),
    "window-bytes": (64 << 10, 1 << 40, "bytes"),
    "tails-bytes": (64 << 10, 1 << 40, "bytes"),
    "windows-bytes": (64 << 10, 1 << 40, "bytes"),
}
#: The Broker's own defaults of those settings (the options' defaults, not restated here).
PAGING_DEFAULTS: dict[str, int] = {
    option: inspect.signature(Broker).parameters[keyword].default
    for option, keyword in PAGING_KEYWORDS.items()
}


def _split_assignment(value: str, flag: str) -> tuple[str, str]:
    """Split ``LEFT=RIGHT`` or raise a UsageError naming ``flag``."""
    left, sep, right = value.partition("=")
    if not sep or not left or not right:
        raise usage.UsageError(f"{flag} expects NAME=VALUE, got {value!r}")
    return left.strip(), right


class Options(usage.Options):
    """Command-line options of ``twistd mqhub``."""

    synopsis = (
        "[--config FILE] [--protocols LIST|all] [--data-dir DIR] [--listen NAME.ROLE=ENDPOINT ...] "
        "[--plugin-path DIR ...] [--log-format text|json] [--durability sync|batch|none] "
        "[--journal on|off] [--option NAME.KEY=VALUE ...]"
    )
    longdesc = (
        "Runs the mqhub broker: every chosen protocol plugin over one store, scheduler and "
        "address space. Endpoints are Twisted endpoint strings (tcp:, ssl:, unix:); eMQP roles "
        "take ZeroMQ addresses. Every default binds to 127.0.0.1."
    )
    examples = """\
Examples:
  twistd -n mqhub                                   all protocols, data in ./var
  twistd -n mqhub --config /etc/mqhub/mqhub.toml    options from a file (mqhub config example)
  twistd -n mqhub --protocols nsq,mq9 --data-dir /srv/mqhub
  twistd -n mqhub --listen nsq.tcp=tcp:4150:interface=0.0.0.0 --listen mq9=tcp:4333
  twistd -n mqhub --plugin-path plugins --protocols redis
  twistd -n mqhub --listen admin.http=tcp:9750:interface=127.0.0.1 --admin-token token.txt
  twistd -n mqhub --users users.toml                  per-user rights for every protocol
  twistd -n mqhub --manhole tcp:8722:interface=127.0.0.1 --manhole-keys ~/.ssh/authorized_keys
"""

    # A plain list: the hub's own [long, short, default, doc] lines, then the extra flags the
    # built-in descriptors declare (drop-ins use --option NAME.KEY=VALUE).
    optParameters: list[list[Any]] = [
        ["config", None, None,
         "TOML file of these options and the protocols' settings (mqhub config example "
         "writes one); the command line overrides it."],
        ["protocols", "p", "all", "Comma-separated protocol names (or aliases), or 'all'."],
        ["data-dir", "d", "./var", "Directory of the durable store."],
        ["log-format", None, "text", "Log output: text or json (one JSON object per line)."],
        ["durability", None, "sync", "Store commit mode: sync (fsync per group), batch, none."],
        ["admin-token", None, None,
         "File whose first line is the admin API token state changes must carry."],
        ["users", None, None,
         "TOML users file: credentials and publish/subscribe rights for every protocol "
         "(docs/security.md); re-read on SIGHUP. Without it every client may do everything."],
        ["admin-tls-cert", None, None,
         "PEM certificate (and key) making the admin listener HTTPS."],
        ["admin-tls-key", None, None, "PEM key when not in the --admin-tls-cert file."],
        ["admin-tls-ca", None, None,
         "PEM CA certificates admin clients' certificates must chain to (--admin-tls-verify)."],
        ["manhole", None, None, "Endpoint of the SSH manhole (off unless given)."],
        ["manhole-keys", None, None,
         "OpenSSH authorized_keys file of the keys that may log in to the manhole."],
        ["journal", None, "on", "Flow journal for analytics (docs/analytics.md): on or off."],
        ["lame-duck-duration", None, "120",
         "Seconds lame-duck mode (SIGUSR2, mqhub lameduck) takes to close every client."],
        ["lame-duck-grace", None, "10",
         "Seconds lame-duck mode waits before it starts closing clients."],
        ["journal-days", None, f"{DEFAULT_RETENTION_SECONDS / 86400.0:g}",
         "Delete closed journal files older than this many days."],
        ["journal-max-bytes", None, str(DEFAULT_RETENTION_BYTES),
         "Keep at most this many bytes of journal."],
        ["store-map-size", None, None,
         "Initial LMDB map size in MiB (default 256); the map doubles whenever it fills."],
        ["store-reserve", None, "16",
         "MiB of disk the store holds back so acks still commit when the disk fills (0: none)."],
        ["window", None, str(PAGING_DEFAULTS["window"]),
         "Ready entries each durable queue keeps in memory; the rest is read back from the "
         "store as the queue drains."],
        ["window-bytes", None, str(PAGING_DEFAULTS["window-bytes"]),
         "Bytes of message bodies each durable queue's window may hold (plain bytes)."],
        ["tails-bytes", None, str(PAGING_DEFAULTS["tails-bytes"]),
         "Bytes all durable queues' remembered tails may hold together (plain bytes): the "
         "entries a backlog need not read back from the store."],
        ["windows-bytes", None, str(PAGING_DEFAULTS["windows-bytes"]),
         "Bytes of message bodies all durable queues' windows may hold together (plain bytes): "
         "past it a window holds only what is left (at least 64 KiB or one message)."],
        ["cluster", None, None,
         "Comma-separated nats:// (or tls://) URLs of a JetStream cluster (nats-server >= "
         "2.12): run this node as a gateway over it (docs/cluster.md)."],
        ["cluster-replicas", None, "3", "Replicas of the cluster's streams (1-5)."],
        ["cluster-name", None, None,
         "This node's name in the cluster (default: host name and process id)."],
        ["cluster-tls-ca", None, None,
         "PEM file of the CA that signed the cluster servers' certificates (TLS)."],
        ["cluster-creds", None, None,
         "NATS credentials file (user JWT and nkey seed) for the cluster connection."],
        *[list(line) for plugin in BUILTIN for line in plugin.option_lines],
    ]

    optFlags: list[list[Any]] = [
        ["no-admin", None, "Do not serve the admin page, JSON API and /metrics (admin.http)."],
        ["admin-tls-verify", None, "Admin HTTPS clients must present a certificate signed by "
         "--admin-tls-ca."],
    ]

    def __init__(self) -> None:
        """Start with empty repeatable options."""
        super().__init__()
        self["listen"] = []
        self["plugin_path"] = []
        self["plugin_options"] = {}
        self["admin_endpoint"] = ADMIN_ENDPOINT
        self.discovery: Discovery | None = None
        #: the --config file, once read
        self.config_file: config.ConfigFile | None = None

    def parseOptions(self, options: list[str] | None = None) -> None:
        """Read the ``--config`` file's options first, then the command line over them."""
        args = sys.argv[1:] if options is None else list(options)
        path = config.config_argument(self, args)
        if path is not None:
            self.config_file = config.load(path)
            config.apply_options(self, self.config_file)
        super().parseOptions(args)

    def opt_listen(self, value: str) -> None:
        """NAME.ROLE=ENDPOINT (or NAME=ENDPOINT for the first role); repeatable."""
        target, endpoint = _split_assignment(value, "--listen")
        name, _, role = target.partition(".")
        self["listen"].append((name, role or None, endpoint))

    def opt_plugin_path(self, value: str) -> None:
        """Directory holding drop-in plugins as DIR/mqhub/plugins/*.py; repeatable."""
        if not os.path.isdir(value):
            raise usage.UsageError(f"--plugin-path: {value!r} is not a directory")
        self["plugin_path"].append(value)

    def opt_option(self, value: str) -> None:
        """NAME.KEY=VALUE: plugin setting, read as options["plugin_options"][NAME][KEY]."""
        target, setting = _split_assignment(value, "--option")
        name, dot, key = target.partition(".")
        if not dot or not name or not key:
            raise usage.UsageError(f"--option expects NAME.KEY=VALUE, got {value!r}")
        self["plugin_options"].setdefault(name, {})[key] = setting

    def _discover(self) -> Discovery:
        """Load plugins once, from mqhub.plugins and the drop-in directories."""
        if self.discovery is None:
            self.discovery = load_plugins(plugin_dirs(self["plugin_path"]))
        return self.discovery

    def getUsage(self, width: int | None = None) -> str:
        """The usual help text followed by every discovered protocol."""
        found = self._discover()
        lines = [super().getUsage(width), self.examples, "Protocols:"]
        for name, plugin in found.plugins.items():
            aliases = f" (alias {', '.join(plugin.aliases)})" if plugin.aliases else ""
            lines.append(f"  {name}{aliases}: {plugin.description}")
            for role, endpoint in plugin.default_endpoints.items():
                lines.append(f"      {role} = {endpoint}")
        for file_name, error in found.failures:
            lines.append(f"  (plugin {file_name} failed to load: {error})")
        return "\n".join(lines) + "\n"

    def _mib(self, key: str, minimum: int, too_small: str) -> None:
        """Turn option ``key`` into a whole number of MiB, at least ``minimum``."""
        try:
            self[key] = int(self[key])
        except ValueError:
            raise usage.UsageError(f"--{key} expects a number of MiB") from None
        if self[key] < minimum:
            raise usage.UsageError(f"--{key} {too_small}")

    def _paging(self) -> None:
        """Turn --window, --window-bytes, --tails-bytes and --windows-bytes into whole numbers
        within bounds."""
        for option, (low, high, unit) in PAGING_BOUNDS.items():
            value = str(self[option]).strip()
            try:
                number = int(value)
            except ValueError:
                number = low - 1
            if not low <= number <= high:
                raise usage.UsageError(
                    f"--{option} expects a whole number of {unit} from {low} to {high}, "
                    f"got {value!r}")
            self[option] = number

    def _cluster(self) -> None:
        """Check --cluster URLs and --cluster-replicas (mqhub.cluster reads them)."""
        if not self["cluster"]:
            return
        from mqhub.cluster.client import ServerUrl

        try:
            for url in self["cluster"].split(","):
                ServerUrl.parse(url.strip())
            replicas = int(self["cluster-replicas"])
        except ValueError as exc:
            raise usage.UsageError(f"--cluster: {exc}") from None
        if not 1 <= replicas <= 5:
            raise usage.UsageError("--cluster-replicas must be from 1 to 5")
        for key in ("cluster-tls-ca", "cluster-creds"):
            if self[key] and not os.path.isfile(self[key]):
                raise usage.UsageError(f"--{key}: {self[key]!r} is not a file")

    def postOptions(self) -> None:
        """Resolve protocol names and endpoints; reject unknown or duplicate names.

        An error about an option the config file set names the file's line.
        """
        try:
            self._resolve()
        except usage.UsageError as exc:
            if self.config_file is None:
                raise
            raise self.config_file.blame(exc, self) from None

    def _resolve(self) -> None:
        """Body of :meth:`postOptions`."""
        if self["log-format"] not in LOG_FORMATS:
            raise usage.UsageError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
        if self["durability"] not in DURABILITY_MODES:
            raise usage.UsageError(f"--durability must be one of {', '.join(DURABILITY_MODES)}")
        if self["journal"] not in ("on", "off"):
            raise usage.UsageError("--journal must be on or off")
        try:
            if float(self["journal-days"]) <= 0 or int(self["journal-max-bytes"]) <= 0:
                raise ValueError
        except ValueError as exc:
            raise usage.UsageError(
                "--journal-days and --journal-max-bytes must be positive numbers") from exc
        if self["store-map-size"] is not None:
            self._mib("store-map-size", 1, "must be at least 1 (MiB)")
        self._mib("store-reserve", 0, "must not be negative")
        try:
            for key in ("lame-duck-duration", "lame-duck-grace"):
                self[key] = float(self[key])
                if self[key] < 0:
                    raise ValueError
        except ValueError:
            raise usage.UsageError(
                "--lame-duck-duration and --lame-duck-grace must be seconds >= 0") from None
        self._paging()
        self._cluster()
        found = self._discover()
        available = ", ".join(found.plugins) or "none"
        requested = [n.strip() for n in self["protocols"].split(",") if n.strip()]
        if requested == ["all"]:
            chosen = list(found.plugins)
        else:
            chosen = []
            for name in requested:
                canonical = found.aliases.get(name)
                if canonical is None:
                    raise usage.UsageError(
                        f"--protocols: unknown protocol {name!r}; available: {available}")
                if canonical in chosen:
                    raise usage.UsageError(
                        f"--protocols: protocol {name!r} given twice; available: {available}")
                chosen.append(canonical)
        chosen.sort()
        endpoints = {n: dict(found.plugins[n].default_endpoints) for n in chosen}
        file = self.config_file
        for name, role, endpoint, where in file.listen if file is not None else ():
            try:
                self._listen_on(endpoints, name, role, endpoint, from_file=True)
            except usage.UsageError as exc:
                raise file.error(where, str(exc)) from None  # type: ignore[union-attr]
        for name, role, endpoint in self["listen"]:
            self._listen_on(endpoints, name, role, endpoint)
        by_plugin: dict[str, dict[str, Any]] = (
            {} if file is None else config.plugin_settings(file, found.aliases, found.plugins))
        for name, settings in self["plugin_options"].items():
            if name not in found.aliases:
                raise usage.UsageError(f"--option: unknown protocol {name!r}; available: {available}")
            by_plugin.setdefault(found.aliases[name], {}).update(settings)
        self["plugin_options"] = by_plugin
        self["plugins"] = [found.plugins[n] for n in chosen]
        self["endpoints"] = endpoints
        self._check_admin()
        if self["log-format"] == "json":
            self._use_json_logs(getattr(self, "parent", None))

    def _listen_on(self, endpoints: dict[str, dict[str, str]], name: str, role: str | None,
                   endpoint: str, from_file: bool = False) -> None:
        """Apply one ``--listen NAME.ROLE=ENDPOINT`` to ``endpoints`` (the admin's own).

        A config file's entry for a protocol that is not enabled is ignored (one file may serve
        several sets of protocols); on the command line it is an error.
        """
        if name == "admin":
            if role not in (None, "http"):
                raise usage.UsageError(f"--listen: admin has no role {role!r}; roles: http")
            self["admin_endpoint"] = endpoint
            return
        found = self._discover()
        canonical = found.aliases.get(name)
        if canonical is None:
            raise usage.UsageError(
                f"--listen: unknown protocol {name!r}; available: {', '.join(found.plugins)}")
        if canonical not in endpoints:
            if from_file:
                return
            raise usage.UsageError(f"--listen: protocol {name!r} is not enabled")
        plugin = found.plugins[canonical]
        roles = [*plugin.default_endpoints, *getattr(plugin, "optional_roles", ())]
        if role is None:
            role = roles[0]
        if role not in roles:
            raise usage.UsageError(
                f"--listen: {canonical} has no role {role!r}; roles: {', '.join(roles)}"
            )
        endpoints[canonical][role] = endpoint

    def _check_admin(self) -> None:
        """Read the admin token and validate the manhole settings (refusing a bad start)."""
        # imported only when used: twisted.conch and the web stack cost startup time
        self["admin_token_value"] = None
        if self["users"]:
            from mqhub.identity import UsersFile, UsersFileError

            try:
                UsersFile.load(self["users"])
            except UsersFileError as exc:
                raise usage.UsageError(f"--users: {exc}") from None
            self["users"] = os.path.abspath(self["users"])
        self["admin_tls"] = None
        if self["admin-tls-cert"]:
            from mqhub.tls import TlsConfigError, server_context

            try:
                self["admin_tls"] = server_context(
                    self["admin-tls-cert"], self["admin-tls-key"], self["admin-tls-ca"],
                    bool(self["admin-tls-verify"]))
            except TlsConfigError as exc:
                raise usage.UsageError(f"--admin-tls-cert: {exc}") from None
        elif self["admin-tls-verify"] or self["admin-tls-key"] or self["admin-tls-ca"]:
            raise usage.UsageError("--admin-tls-key, --admin-tls-ca and --admin-tls-verify "
                                   "need --admin-tls-cert")
        if self["admin-token"]:
            from mqhub.web.service import read_token

            try:
                self["admin_token_value"] = read_token(self["admin-token"])
            except (OSError, ValueError) as exc:
                raise usage.UsageError(f"--admin-token: {exc}") from None
        if self["manhole"]:
            from mqhub.manhole import ManholeError, check_config

            try:
                check_config(self["manhole"], self["manhole-keys"])
            except ManholeError as exc:
                raise usage.UsageError(str(exc)) from None
        elif self["manhole-keys"]:
            raise usage.UsageError("--manhole-keys needs --manhole ENDPOINT")

    @staticmethod
    def _use_json_logs(parent: Any) -> None:
        """Make twistd log through the JSON observer, to its --logfile if one applies."""
        if parent is None or parent.get("logger") is not None:
            return
        import mqhub.logs

        logfile = parent.get("logfile")
        if not logfile and not parent.get("nodaemon"):
            logfile = "twistd.log"  # twistd's own default when daemonized
        mqhub.logs.json_log_path = None if logfile in (None, "", "-") else os.path.abspath(logfile)
        parent["logger"] = "mqhub.logs.json_observer"


def _exit_failed() -> None:
    """End the process with status 1 after a failed start (logs flushed first)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def install_stop_signals(reactor: Any) -> None:
    """Make SIGTERM and SIGINT a graceful stop that exits with status 0.

    Twisted's own handlers re-raise the signal once the reactor has stopped, so twistd would
    die "killed by SIGTERM" even after a clean shutdown; a requested stop is not a failure.
    """

    def on_signal(signum: int, frame: Any) -> None:
        """Log the signal and stop the reactor (safe from a signal handler)."""
        log.info("received {signal}: stopping", signal=signal.Signals(signum).name)
        reactor.callFromThread(reactor.stop)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def install_reload_signal(reactor: Any, identity: Any) -> None:
    """Make SIGHUP re-read the users file (``--users``); a bad file keeps the rights in force."""
    from mqhub.identity import UsersFileError

    def reload() -> None:
        """Reload in the reactor thread (the error is already logged by the directory)."""
        try:
            identity.reload()
        except UsersFileError:
            pass

    def on_signal(signum: int, frame: Any) -> None:
        """Hand the reload to the reactor (safe from a signal handler)."""
        log.info("received SIGHUP: reloading the users file")
        reactor.callFromThread(reload)

    signal.signal(signal.SIGHUP, on_signal)


def makeService(options: Options) -> HubService:
    """twistd entry point: :func:`build_service` with the global reactor.

    A protocol that refuses to be built (a bad setting, a missing certificate) ends the
    process at once with status 1 and one line on stderr (the log has not begun yet).
    Also routes the stdlib ``logging`` of mqhub's core, scheduler and store into twistd's log
    and sets the process's garbage collector for batch work (:mod:`mqhub.gc_tuning`). The
    reactor comes without pyOpenSSL when no TLS is configured (:mod:`mqhub.startup`).
    """
    from mqhub.startup import import_reactor

    reactor = import_reactor(options, start_endpoints(options))

    forward_stdlib_logging()
    tune_gc()
    try:
        root = build_service(options, reactor)
    except StartFailed as exc:
        sys.stderr.write(f"mqhub could not start: {exc}\n")
        raise SystemExit(1) from None
    sweeps = young_sweeps(reactor)  # not a child: HubService's children are its listeners
    reactor.callWhenRunning(sweeps.startService)
    reactor.addSystemEventTrigger("before", "shutdown", sweeps.stopService)
    reactor.callWhenRunning(install_stop_signals, reactor)
    if root.hub.identity is not None and root.hub.identity.enforcing:
        reactor.callWhenRunning(install_reload_signal, reactor, root.hub.identity)
    reactor.callWhenRunning(install_lame_duck_signal, reactor, root.lame_duck)
    return root


def start_endpoints(options: Options) -> list[str]:
    """Every endpoint string a start listens on (protocols, admin, manhole)."""
    found = [e for roles in options["endpoints"].values() for e in roles.values()]
    if not options.get("no-admin"):
        found.append(options.get("admin_endpoint") or ADMIN_ENDPOINT)
    if options.get("manhole"):
        found.append(options["manhole"])
    return found


def build_service(options: Options, reactor: Any) -> HubService:
    """Build the HubService: the hub, then one service per chosen protocol (nothing started).

    :raises StartFailed: when a plugin raises PluginError while being built (a protocol the
        operator asked for that would not be served).
    """
    for file_name, error in options.discovery.failures if options.discovery else []:
        log.error("plugin {file} failed to load: {error}", file=file_name, error=error)
    data_dir = os.path.abspath(options["data-dir"])
    hub = build_hub({**dict(options), "data-dir": data_dir}, reactor, reactor=reactor)

    def stop_reactor(_: object) -> None:
        """Recovery failed: shut down (the store still closes) and exit with status 1."""
        reactor.addSystemEventTrigger("after", "shutdown", _exit_failed)
        if reactor.running:
            reactor.stop()
        else:  # twistd starts the application before it runs the reactor
            reactor.callWhenRunning(reactor.stop)

    root = HubService(hub, on_start_failure=stop_reactor)
    root.lame_duck = LameDuck(root, reactor, reactor.stop,
                              duration=float(options.get("lame-duck-duration", DEFAULT_DURATION)),
                              grace=float(options.get("lame-duck-grace", DEFAULT_GRACE)))
    for plugin in options["plugins"]:
        endpoints = options["endpoints"][plugin.name]
        try:
            service = plugin.make_service(hub, endpoints, dict(options))
        except PluginError as exc:
            raise StartFailed(config.refusal(plugin.name, exc)) from exc
        root.add_listener(plugin.name, service)
    add_admin_services(root, hub, options)
    return root


def add_admin_services(root: HubService, hub: Any, options: Options) -> None:
    """Add the admin web listener (unless --no-admin) and the manhole (if --manhole).

    Both start with the protocol listeners, after recovery.
    """
    if not options.get("no-admin"):
        from mqhub.web.service import make_admin_service

        root.add_listener("admin", make_admin_service(
            hub, root, options.get("admin_endpoint") or ADMIN_ENDPOINT,
            token=options.get("admin_token_value"), tls=options.get("admin_tls")))
    if options.get("manhole"):
        from mqhub.manhole import make_manhole_service

        root.add_listener("manhole", make_manhole_service(
            hub, root, options["manhole"], options.get("manhole-keys")))
