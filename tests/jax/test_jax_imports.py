"""fp8kit.jax's import graph, read from the sources: no cycles, no
function-local imports of fp8kit.jax modules (which would hide one), and
the layers of the package docstring (the sharding rules import the FFI
wrappers, never the public modules)."""

import ast
import pathlib

import pytest

PACKAGE = "fp8kit.jax"
ROOT = pathlib.Path(__file__).resolve().parents[2] / "fp8kit" / "jax"
MODULES = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
# What each private layer may import from the package (besides nothing).
ALLOWED = {
    "_checks": set(),
    "_state_values": set(),
    "scaled_tensor": {"_checks"},
    "_ffi": {"_checks", "scaled_tensor"},
    "_ffi_fused": {"_ffi"},
    "_sharding": set(),
    "_sharding_quantize": {"_ffi", "_sharding"},
    "_sharding_block": {"_ffi", "_sharding", "_sharding_quantize"},
    "_sharding_gemm": {"_ffi", "_sharding", "_sharding_block"},
    "_sharding_fused": {"_ffi", "_ffi_fused", "_sharding"},
    "_batching": {"_ffi", "_sharding_quantize"},
}


def _package_imports(node) -> set[str]:
    """Modules of fp8kit.jax that an import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module == PACKAGE:
            names = [f"{PACKAGE}.{a.name}" for a in node.names]
        else:
            names = [node.module]
    else:
        return set()
    return {n.split(".")[2] for n in names if n.startswith(PACKAGE + ".")}


def _graph():
    graph, local = {}, {}
    for name in MODULES:
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        graph[name] = set().union(*(_package_imports(n) for n in tree.body), set())
        funcs = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        local[name] = set().union(*(_package_imports(n) for f in funcs for n in ast.walk(f)), set())
    return graph, local


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
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


def test_the_graph_is_read():
    graph, _ = _graph()
    assert "_ffi" in graph["quantization"] and "_sharding_quantize" in graph["quantization"]


def test_no_import_cycles():
    graph, local = _graph()
    everything = {m: graph[m] | local[m] for m in graph}
    assert _cycle(everything) is None, " -> ".join(_cycle(everything))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_function_local_package_imports():
    _, local = _graph()
    assert {m: s for m, s in local.items() if s} == {}


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_layers(module):
    graph, _ = _graph()
    assert graph[module] <= ALLOWED[module], f"{module} imports {graph[module] - ALLOWED[module]}"
