"""fp8kit.jax's import graph, read from the sources: no cycles, no
function-local imports of fp8kit.jax modules (which would hide one), and
the layers of the package docstring (the sharding rules import the FFI
wrappers, never the public modules)."""

import pathlib

import pytest

import import_graph  # tests/import_graph.py (tests/conftest.py puts tests/ on the path)

PACKAGE = "fp8kit.jax"
ROOT = pathlib.Path(__file__).resolve().parents[2] / "fp8kit" / "jax"
# What each private layer may import from the package (besides nothing).
ALLOWED = {
    "_checks": set(),
    "_state_values": set(),
    "scaled_tensor": {"_checks"},
    "_ffi": {"_checks", "scaled_tensor"},
    "_ffi_fused": {"_ffi"},
    "_ffi_grouped": {"_checks", "_ffi"},
    "_sharding": set(),
    "_sharding_quantize": {"_ffi", "_sharding"},
    "_sharding_block": {"_ffi", "_sharding", "_sharding_quantize"},
    "_sharding_gemm": {"_ffi", "_sharding", "_sharding_block"},
    "_sharding_fused": {"_ffi", "_ffi_fused", "_sharding"},
    "_sharding_grouped": {"_ffi_grouped", "_sharding"},
    "_batching": {"_ffi", "_sharding_quantize"},
}


def _graph():
    return import_graph.read(PACKAGE, ROOT)


def test_the_graph_is_read():
    graph, _ = _graph()
    assert "_ffi" in graph["quantization"] and "_sharding_quantize" in graph["quantization"]


def test_no_import_cycles():
    import_graph.assert_no_cycle(*_graph())


def test_cycle_finder_finds_a_cycle():
    assert import_graph.cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_graph.cycle({"a": {"b"}, "b": set()}) is None


def test_no_function_local_package_imports():
    _, local = _graph()
    assert {m: s for m, s in local.items() if s} == {}


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_layers(module):
    graph, _ = _graph()
    assert graph[module] <= ALLOWED[module], f"{module} imports {graph[module] - ALLOWED[module]}"
