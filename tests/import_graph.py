"""A package's import graph, read from its sources with ast (nothing is
imported), for the front ends' import tests (tests/jax/test_jax_imports.py,
tests/torch/test_torch_imports.py).

Modules are named relative to the package: "linear", "distributed.fsdp";
a package's own module is its "__init__" ("__init__",
"distributed.__init__"). Importing a name that is no module of the package
(`from fp8kit.torch import Float8Tensor`) imports the package's __init__.
"""

from __future__ import annotations

import ast
import pathlib


def module_names(root: pathlib.Path) -> list[str]:
    """The modules of the package in directory `root`, subpackages included."""
    return sorted(".".join(p.relative_to(root).with_suffix("").parts)
                  for p in root.rglob("*.py"))


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names, relative imports resolved
    against `package` (the dotted name of the importing module's package)."""
    if node.level == 0:
        return node.module
    base = package.rsplit(".", node.level - 1)[0]  # `from ..x`: one package up
    return f"{base}.{node.module}" if node.module else base


def _resolve(dotted: str, package: str, modules: set) -> str | None:
    """The module of the package that importing `dotted` runs, or None for
    one outside it."""
    if dotted != package and not dotted.startswith(package + "."):
        return None
    parts = dotted[len(package) + 1:].split(".") if dotted != package else []
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        for candidate in (name, name + ".__init__"):
            if candidate in modules:
                return candidate
    return "__init__"


def _imported(statements: list, package: str, own_package: str, modules: set) -> set:
    """The package's modules that import statements run."""
    names = []
    for node in statements:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        else:
            base = _absolute(node, own_package)
            names += [f"{base}.{a.name}" for a in node.names]
    return {m for n in names if (m := _resolve(n, package, modules)) is not None}


def _statements(tree: ast.Module) -> tuple[list, list]:
    """A module's import statements: (those outside any function, in class
    bodies and if and try blocks too; those inside a function)."""
    top, local = [], []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (local if in_function else top).append(child)
            walk(child, in_function or isinstance(child, (ast.FunctionDef,
                                                          ast.AsyncFunctionDef)))

    walk(tree, False)
    return top, local


def read(package: str, root: pathlib.Path) -> tuple[dict, dict]:
    """(graph, local) of the package `package` (dotted name) in directory
    `root`: {module: the package's modules it imports outside functions},
    {module: those it imports inside a function}."""
    modules = set(module_names(root))
    graph, local = {}, {}
    for name in sorted(modules):
        own = ".".join([package] + name.split(".")[:-1])  # the module's package
        tree = ast.parse((root / (name.replace(".", "/") + ".py")).read_text())
        top, inner = _statements(tree)
        graph[name] = _imported(top, package, own, modules)
        local[name] = _imported(inner, package, own, modules)
    return graph, local


def cycle(graph: dict) -> list | None:
    """One import cycle as a list of modules (the first one again at the
    end), or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def assert_no_cycle(graph: dict, local: dict) -> None:
    """No import cycle through the module-level and function-local imports
    together (a function-local import can hide one, not break it)."""
    found = cycle({m: graph[m] | local[m] for m in graph})
    assert found is None, " -> ".join(found)
