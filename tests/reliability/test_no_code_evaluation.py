"""No code path evaluates client-supplied code: an AST scan of mqhub/ and the example plugins.

Every call that can run or import code (``eval``, ``exec``, ``compile``, ``__import__``,
``importlib``, ``exec_module``) or deserialise objects (``pickle``, ``marshal``, ``shelve``,
``dill``, ``yaml.load``) is listed; each allowed site names why its input is never a client's.
A new such call fails this test until it is reviewed and added here with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.interop.broker import REPO_ROOT

ROOTS = [REPO_ROOT / "mqhub", REPO_ROOT / "plugins"]
RUNS_CODE = {"eval", "exec", "compile", "__import__", "import_module", "exec_module",
             "spec_from_file_location", "run_path", "run_module"}
DESERIALISERS = {"pickle", "cPickle", "marshal", "shelve", "dill", "yaml", "jsonpickle"}

#: (file, call) -> why the input is not client-supplied.
ALLOWED = {
    ("mqhub/cli.py", "spec_from_file_location"): "`mqhub bench NAME` loads benchmarks/NAME_bench.py "
                                                 "from the source tree, named by the operator",
    ("mqhub/cli.py", "exec_module"): "the same benchmark module",
    ("mqhub/discovery.py", "import_module"): "protocol plugins from operator-configured plugin paths",
    ("mqhub/plugins/builtin.py", "import_module"): "built-in protocol modules by fixed names",
    ("mqhub/plugin_settings.py", "import_module"): "a plugin's settings dataclass, named by the "
                                                   "plugin descriptor's own code",
    ("mqhub/store/due_rows.py", "marshal.loads"): "due rows older mqhub versions wrote to the "
                                                  "store; marshal builds values, it never runs code",
    ("mqhub/store/due_rows.py", "import marshal"): "the same read-only compatibility decoder",
}


def code_sites() -> set[tuple[str, str]]:
    """Every (file, call) site that runs or imports code or deserialises objects."""
    found: set[tuple[str, str]] = set()
    for root in ROOTS:
        for path in root.rglob("*.py"):
            rel = path.relative_to(REPO_ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Call):
                    func = node.func
                    if isinstance(func, ast.Name) and func.id in RUNS_CODE:
                        found.add((rel, func.id))
                    elif isinstance(func, ast.Attribute):
                        owner = func.value.id if isinstance(func.value, ast.Name) else ""
                        if func.attr in RUNS_CODE and owner != "re":  # re.compile builds regexes
                            found.add((rel, func.attr))
                        elif owner in DESERIALISERS:
                            found.add((rel, f"{owner}.{func.attr}"))
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    found |= {(rel, f"import {n}") for n in names if n.split(".")[0] in DESERIALISERS}
    return found


def test_only_reviewed_sites_run_or_deserialise_code() -> None:
    """Every such site is in ALLOWED (with its reason); ALLOWED lists no site that is gone."""
    sites = code_sites()
    assert sites - ALLOWED.keys() == set(), "new code-running or deserialising call: review it"
    assert ALLOWED.keys() - sites == set(), "ALLOWED names a site that no longer exists"


def test_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scanner is not blind: it flags eval, pickle and exec in a sample."""
    sample = "import pickle\nx = eval(data)\npickle.loads(data)\nexec(data)\n"
    tree = ast.parse(sample)
    calls = {n.func.id if isinstance(n.func, ast.Name) else n.func.attr
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert {"eval", "exec", "loads"} <= calls
