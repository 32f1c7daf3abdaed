"""The layering rules of DESIGN.md that a reader can check without running anything.

* No import cycle among the modules' top-level imports (imports inside functions are the
  way a lower layer reaches a higher one lazily, and are left out). Importing a module
  runs its packages' ``__init__`` first, so an import of ``a.b.c`` also counts as one of
  ``a`` and ``a.b``: a cycle through a package's ``__init__`` is found too.
* ``transports/`` never imports ``pycomm`` (not even inside a function).
* No package binds a name to something other than its submodule of that name (``from
  .run import run`` would make ``import pkg.run`` hand out a function to ``getattr``).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("pycomm", "transports")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name: str | None) -> str | None:
    """The nearest module of ours that ``name`` (a module or a module's attribute) is in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: pathlib.Path, top_level: bool) -> set[str]:
    """Our modules that ``module`` imports (at its top level only, if ``top_level``; an
    ``if TYPE_CHECKING:`` block never runs), each with the packages above it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if top_level and inner:
                continue
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                names = [base] + [f"{base}.{a.name}" for a in child.names]
            for name in names:
                target = _known(name)
                while target:
                    if not module.startswith(target + ".") and target != module:
                        found.add(target)
                    target = target.rpartition(".")[0] or None
            visit(child, inner)
    visit(tree, False)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_no_import_cycle_among_top_level_imports():
    graph = {m: _imports(m, p, top_level=True) for m, p in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_package_init():
    # (the shape of the cost model <-> algorithms cycle this test was written for)
    graph = {"p": {"p.alg"}, "p.alg": {"q.cost"}, "q.cost": {"p.topo", "p"},
             "p.topo": set()}
    assert _cycles(graph) == [["p", "p.alg", "q.cost"]]


def test_transports_never_import_pycomm():
    offenders = {m: sorted(i for i in _imports(m, p, top_level=False) if i.startswith("pycomm"))
                 for m, p in MODULES.items() if m.startswith("transports")}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_no_package_attribute_shadows_its_submodule():
    shadowed = []
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name.startswith("pycomm.MPI._alias"):
            continue
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules([str(path.parent)]):
            value = getattr(package, info.name, None)
            if value is not None and getattr(value, "__name__", None) != f"{name}.{info.name}":
                shadowed.append(f"{name}.{info.name} is {value!r}")
    assert shadowed == []
