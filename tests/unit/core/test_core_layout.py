"""The layout of ``mqhub/core`` (issue 10): no import circle, no reach into another's privates,
no module much over 600 lines. Checked from the modules' source, so it fails on the commit that
breaks it rather than in review."""

from __future__ import annotations

import ast
from pathlib import Path

import mqhub.core

CORE = Path(mqhub.core.__file__).parent
PACKAGE = "mqhub.core"
ROOT = CORE.parent.parent
#: what calls the core through its seam (mqhub.interfaces ICore...), never its internals
SEAM_USERS = ("mqhub/protocols", "plugins", "mqhub/web", "mqhub/introspect.py",
              "mqhub/manhole.py")
#: what a seam user may not import: the core's modules and the embedded store's
BEHIND_THE_SEAM = ("mqhub.core", "mqhub.store")
MAX_LINES = 620


def _modules() -> dict[str, ast.Module]:
    """Every module of mqhub/core, parsed, by dotted name."""
    return {f"{PACKAGE}.{p.stem}": ast.parse(p.read_text(), str(p))
            for p in sorted(CORE.glob("*.py")) if p.stem != "__init__"}


def _imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every import in ``tree``: type-only and local ones too."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    """Core module -> the core modules it imports."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, tree in mods.items():
        deps = set()
        for module, names in _imports(tree):
            if module in mods:
                deps.add(module)
            elif module == PACKAGE:
                deps.update(f"{PACKAGE}.{n}" for n in names if f"{PACKAGE}.{n}" in mods)
        graph[name] = deps - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _own_names(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, attributes it assigns, its slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def _reaches(tree: ast.Module) -> list[str]:
    """``obj._name`` uses in ``tree`` (obj not self/cls) of private names it does not define."""
    own = _own_names(tree)
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__") and node.attr not in own
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            bad.append(f"line {node.lineno}: .{node.attr}")
    return bad


def test_the_core_has_no_import_circle() -> None:
    """Imports among mqhub/core modules (type-only and function-local ones included) form no
    circle."""
    graph = _graph()
    assert graph[f"{PACKAGE}.queue"], "the import graph was not read"
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph) or [])}"


def test_the_cycle_finder_finds_a_circle() -> None:
    """The checker itself: a graph with a circle is reported."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_core_module_imports_or_uses_another_modules_private_names() -> None:
    """No ``from mqhub.core.x import _y``, and no ``obj._y`` on another object than self/cls
    unless the module defines ``_y`` itself (its own class's attributes on another instance)."""
    problems = []
    for name, tree in _modules().items():
        for module, names in _imports(tree):
            if module.startswith("mqhub."):
                problems += [f"{name}: imports {module}.{n}" for n in names
                             if n.startswith("_") and not n.startswith("__")]
        problems += [f"{name}: {r}" for r in _reaches(tree)]
    assert not problems, "\n".join(problems)


def test_the_private_name_checker_catches_a_reach_in() -> None:
    """The checker itself: a use of a name defined elsewhere is reported, an own one is not."""
    tree = ast.parse("class A:\n    def f(self, q):\n        self._x = 1\n"
                     "        return q._x + q._other\n")
    assert _reaches(tree) == ["line 4: ._other"]


def test_no_core_module_is_much_over_600_lines() -> None:
    """Small files named for what they hold."""
    long = {p.name: n for p in CORE.glob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def _seam_user_files() -> list[Path]:
    """Every Python file of the protocol packages, the plugins and the admin surfaces."""
    out: list[Path] = []
    for where in SEAM_USERS:
        path = ROOT / where
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def test_protocol_adapters_import_only_the_seam() -> None:
    """Protocol packages, plugins and admin surfaces import the core seam (mqhub.interfaces),
    the records (mqhub.records) and mqhub.errors, never a module of mqhub.core or mqhub.store
    (type-only and function-local imports included): a second backend of the seam serves them
    unchanged."""
    files = _seam_user_files()
    assert len(files) > 50, "the protocol packages were not found"
    problems = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for module, _ in _imports(tree):
            if any(module == p or module.startswith(p + ".") for p in BEHIND_THE_SEAM):
                problems.append(f"{path.relative_to(ROOT)}: imports {module}")
    assert not problems, "\n".join(problems)
