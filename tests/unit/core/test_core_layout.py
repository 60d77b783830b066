"""The layout rules of the core and of mqhub (issues 10 and 23), checked from the source so a
commit that breaks one fails rather than waits for review:

- the core's modules form no import circle and use no private name of another module;
- ``mqhub/core`` has no ``NotImplementedError`` hook;
- no class in ``mqhub/`` stands on a chain of more than two project classes (itself included),
  and no base class uses an attribute that only a subclass sets: parts are composed, not
  stacked (exception classes are exempt: their hierarchy is a taxonomy for ``except``);
- protocol packages, plugins and admin surfaces import only the core seam;
- entries are read by field name, never as ``e[4]``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mqhub.core

CORE = Path(mqhub.core.__file__).parent
MQHUB = CORE.parent
PACKAGE = "mqhub.core"
ROOT = CORE.parent.parent
#: what calls the core through its seam (mqhub.interfaces ICore...), never its internals
SEAM_USERS = ("mqhub/protocols", "plugins", "mqhub/web", "mqhub/introspect.py",
              "mqhub/manhole.py")
#: what a seam user may not import: the core's modules and the embedded store's
BEHIND_THE_SEAM = ("mqhub.core", "mqhub.store")


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
        elif isinstance(node, ast.Assign):
            names |= _slot_names(node)
    return names


def _slot_names(node: ast.Assign) -> set[str]:
    """The names a ``__slots__ = (...)`` assignment declares (none for another assignment)."""
    if not any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
        return set()
    return {c.value for c in ast.walk(node.value)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)}


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


# -- no NotImplementedError hooks ---------------------------------------------------------------

def test_the_core_has_no_not_implemented_hooks() -> None:
    """A part calls what it owns or what it was handed, never a hook a subclass must fill."""
    hooks = [f"{name}: line {node.lineno}" for name, tree in _modules().items()
             for node in ast.walk(tree)
             if isinstance(node, ast.Name) and node.id == "NotImplementedError"]
    assert not hooks, hooks


# -- composition: class chains and what a base class uses ---------------------------------------

Key = tuple[str, str]


def _project() -> dict[str, ast.Module]:
    """Every module of mqhub, parsed, by dotted name (a package by its own name)."""
    out = {}
    for p in sorted(MQHUB.rglob("*.py")):
        parts = p.relative_to(MQHUB.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(p.read_text(), str(p))
    return out


def _classes(mods: dict[str, ast.Module]) -> dict[Key, ast.ClassDef]:
    """Top-level classes by (module, name)."""
    return {(m, n.name): n for m, tree in mods.items() for n in tree.body
            if isinstance(n, ast.ClassDef)}


def _bases(mods: dict[str, ast.Module], classes: dict[Key, ast.ClassDef]) -> dict[Key, list[Key]]:
    """Each class's base classes that are project classes (by name, through its imports)."""
    imported: dict[str, dict[str, Key]] = {}
    for m, tree in mods.items():
        names: dict[str, Key] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if (node.module, a.name) in classes:
                        names[a.asname or a.name] = (node.module, a.name)
        imported[m] = names
    out: dict[Key, list[Key]] = {}
    for (m, name), cdef in classes.items():
        found = []
        for b in cdef.bases:
            if isinstance(b, ast.Name):
                key = (m, b.id) if (m, b.id) in classes else imported[m].get(b.id)
                if key is not None:
                    found.append(key)
        out[(m, name)] = found
    return out


def _chain(key: Key, bases: dict[Key, list[Key]]) -> int:
    """Project classes on the longest chain from ``key`` up (itself included)."""
    return 1 + max((_chain(b, bases) for b in bases[key]), default=0)


def _is_exception(key: Key, bases: dict[Key, list[Key]], classes: dict[Key, ast.ClassDef]) -> bool:
    """True for an exception class (a project base chain ending on a builtin exception)."""
    cdef = classes[key]
    if any(isinstance(b, ast.Name) and b.id.endswith(("Exception", "Error")) and
           (key[0], b.id) not in classes and b.id not in ("Protocol",) for b in cdef.bases):
        return True
    return any(_is_exception(b, bases, classes) for b in bases[key])


def _own(cdef: ast.ClassDef) -> set[str]:
    """Names a class defines itself: methods, class attributes, slots, ``self.x = ...``."""
    names: set[str] = set()
    for node in cdef.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            names.add(node.target.id)
    for node in ast.walk(cdef):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
        elif isinstance(node, ast.Assign):
            names |= _slot_names(node)
    return names


def _used(cdef: ast.ClassDef) -> set[str]:
    """Names a class reads off ``self``."""
    return {n.attr for n in ast.walk(cdef) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
            and n.value.id == "self"}


def _subclass_attributes(classes: dict[Key, ast.ClassDef],
                         bases: dict[Key, list[Key]]) -> list[str]:
    """``base.name`` for every name a base class uses that only one of its subclasses sets."""
    subs: dict[Key, list[Key]] = {}
    for key, bs in bases.items():
        for b in bs:
            subs.setdefault(b, []).append(key)

    def inherited(key: Key) -> set[str]:
        names = _own(classes[key])
        for b in bases[key]:
            names |= inherited(b)
        return names

    def below(key: Key) -> list[Key]:
        out = []
        for s in subs.get(key, []):
            out += [s, *below(s)]
        return out

    found = []
    for base in subs:
        for name in sorted(_used(classes[base]) - inherited(base)):
            if any(name in _own(classes[s]) for s in below(base)):
                found.append(f"{base[0]}.{base[1]}.{name}")
    return found


def test_no_class_stands_on_a_chain_of_more_than_two_project_classes() -> None:
    """In all of mqhub/: a class and its project bases form a chain of at most two classes
    (exception classes excepted: their hierarchy serves ``except`` clauses)."""
    mods = _project()
    classes = _classes(mods)
    bases = _bases(mods, classes)
    assert len(classes) > 200, "the project's classes were not read"
    deep = [f"{m}.{n}: {_chain((m, n), bases)}" for (m, n) in classes
            if _chain((m, n), bases) > 2 and not _is_exception((m, n), bases, classes)]
    assert not deep, deep


def test_no_base_class_uses_an_attribute_only_a_subclass_sets() -> None:
    """In all of mqhub/: a base class never reads ``self.x`` where only a subclass defines or
    sets ``x`` (a mixin living on its host's attributes, a hook a subclass fills)."""
    mods = _project()
    classes = _classes(mods)
    found = _subclass_attributes(classes, _bases(mods, classes))
    assert not found, found


def test_the_composition_checkers_catch_a_stack_and_a_mixin() -> None:
    """The checkers themselves: a three-class chain and a mixin using its host's attribute."""
    tree = ast.parse("class A:\n    def f(self):\n        return self.host\n"
                     "class B(A):\n    def __init__(self):\n        self.host = 1\n"
                     "class C(B):\n    pass\n")
    mods = {"m": tree}
    classes = _classes(mods)
    bases = _bases(mods, classes)
    assert _chain(("m", "C"), bases) == 3 and _chain(("m", "B"), bases) == 2
    assert _subclass_attributes(classes, bases) == ["m.A.host"]


# -- records by name ---------------------------------------------------------------------------

def test_entries_are_read_by_field_name() -> None:
    """No ``e[4]`` or ``entry[7]`` in the core or the protocol packages: ``e[EXPIRES_AT]``,
    unpacking by name, or a column reader (``mqhub.records.get_body``)."""
    raw = []
    for path in sorted(CORE.glob("*.py")) + sorted((MQHUB / "protocols").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id in ("e", "entry") and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, int)):
                raw.append(f"{path.relative_to(MQHUB.parent)}: line {node.lineno}")
    assert not raw, raw
