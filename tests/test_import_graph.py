"""The import graph of `xlstm_data` and `trainer_hooks` is a DAG in the data-flow direction.

A circle of imports works only while every module in it happens to import the
others lazily or late enough; the next top-level import added turns it into a
partly initialised module at import time. So every import counts here, the
ones inside functions and under `TYPE_CHECKING` too, and relative imports are
resolved. Packages are checked as well as modules: `plan` must not need
`config`, `sources` must not need `prepare`, no subpackage may import the
root package (whose `__init__` names them all), and the command line must
not need the training hooks built on top of the library.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_PACKAGES = ("xlstm_data", "trainer_hooks")


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the checked packages."""
    modules = {}
    for package in _PACKAGES:
        for path in sorted((_ROOT / package).rglob("*.py")):
            parts = path.relative_to(_ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterable[str]:
    """Every module name an import statement in `path` names, relative ones resolved.

    `from a.b import c` takes `c` from the package `a.b`, whose `__init__`
    must have run (or be running, in a circle), so it counts as an import of
    `a.b`, and of `a.b.c` when that is a module. `import a.b.c` counts as an
    import of `a.b.c` only: naming the submodule is how a subpackage avoids
    depending on its package's `__init__`.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the checked modules it imports (itself excluded)."""
    files = _module_files()
    return {
        module: {name for name in _imported_names(module, path) if name in files and name != module}
        for module, path in files.items()
    }


def _package_of(module: str) -> str:
    """The node a module belongs to: `xlstm_data.<sub>` (a subpackage or a top-level
    module), the root package `xlstm_data` itself, or `trainer_hooks` as a whole."""
    parts = module.split(".")
    if parts[0] == "xlstm_data":
        return ".".join(parts[:2])
    return parts[0]


def _package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to `_package_of` nodes, without edges inside a node."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        node = packages.setdefault(_package_of(module), set())
        node.update(_package_of(t) for t in targets if _package_of(t) != _package_of(module))
    return packages


def _find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a closed path of nodes, or None for a DAG (iterative DFS)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        children = [iter(sorted(graph[start]))]
        while children:
            child = next(children[-1], None)
            if child is None:
                children.pop()
                done.add(path.pop())
            elif child in path:
                return path[path.index(child) :] + [child]
            elif child not in done:
                path.append(child)
                children.append(iter(sorted(graph.get(child, ()))))
    return None


def test_find_cycle_finds_a_cycle_and_accepts_a_dag() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"b"}}) is None
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert _find_cycle({"a": {"a"}}) == ["a", "a"]


def test_graph_sees_imports_inside_functions_and_relative_ones() -> None:
    graph = _module_graph()
    assert "xlstm_data.sources.base" in graph["xlstm_data.sources.text_files"]
    assert "xlstm_data.prepare.beam" in graph["xlstm_data.prepare.corpus"]  # in a function


def test_no_module_cycles() -> None:
    cycle = _find_cycle(_module_graph())
    assert cycle is None, "modules import each other in a circle: " + " -> ".join(cycle)


def test_no_package_cycles() -> None:
    cycle = _find_cycle(_package_graph(_module_graph()))
    assert cycle is None, "packages import each other in a circle: " + " -> ".join(cycle)


#: The bottom of the data flow and all it may import: the plan is a pure
#: function of lengths and settings, sources read documents, prepare writes
#: what sources read, and the config is validated into plan and sources.
_LOWER_LAYERS = {
    "xlstm_data.errors": set(),
    "xlstm_data.checks": {"xlstm_data.errors"},
    "xlstm_data.lazy_names": set(),
    "xlstm_data.plan": {"xlstm_data.errors", "xlstm_data.checks"},
    "xlstm_data.sources": {"xlstm_data.errors", "xlstm_data.checks", "xlstm_data.lazy_names"},
    "xlstm_data.prepare": {
        "xlstm_data.errors",
        "xlstm_data.checks",
        "xlstm_data.plan",
        "xlstm_data.sources",
    },
    "xlstm_data.config": {
        "xlstm_data.errors",
        "xlstm_data.checks",
        "xlstm_data.plan",
        "xlstm_data.sources",
    },
}


def test_lower_layers_import_only_what_lies_below_them() -> None:
    packages = _package_graph(_module_graph())
    extra = {
        package: sorted(packages[package] - allowed)
        for package, allowed in _LOWER_LAYERS.items()
        if packages[package] - allowed
    }
    assert not extra, f"imports against the data flow: {extra}"


def test_nothing_in_the_library_imports_the_root_package() -> None:
    importers = sorted(
        module
        for module, targets in _module_graph().items()
        if module.startswith("xlstm_data.") and "xlstm_data" in targets
    )
    assert not importers, f"import the submodule itself, not `xlstm_data`, in: {importers}"


def test_the_library_and_its_command_line_do_not_import_trainer_hooks() -> None:
    importers = sorted(
        f"{module} -> {target}"
        for module, targets in _module_graph().items()
        if _package_of(module) != "trainer_hooks"
        for target in targets
        if _package_of(target) == "trainer_hooks"
    )
    assert not importers, f"trainer_hooks is built on xlstm_data, not under it: {importers}"
