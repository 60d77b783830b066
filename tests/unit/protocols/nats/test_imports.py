"""The NATS package has no import circle, counting imports made only for type checking."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import mqhub.protocols.nats as nats_pkg

PKG = "mqhub.protocols.nats"


def _imports(path: Path) -> set[str]:
    """Modules of the NATS package that ``path`` imports anywhere (TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PKG):
            if node.module == PKG:
                found.update(f"{PKG}.{a.name}" for a in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PKG + "."))
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> package modules it imports."""
    root = Path(nats_pkg.__file__).parent
    return {f"{PKG}.{p.stem}": _imports(p) for p in sorted(root.glob("*.py"))}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (stdlib ``graphlib`` finds it), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return None


def test_finder_sees_a_circle() -> None:
    """The check itself: a made-up graph with a type-checking back arrow is a circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert set(_cycle(graph) or ()) == {"a", "b", "c"}
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_nats_package_has_no_import_circle() -> None:
    """connection -> host (a typing Protocol), server -> connection: nothing imports back."""
    graph = _graph()
    assert _cycle(graph) is None
    assert f"{PKG}.host" in graph[f"{PKG}.connection"]
