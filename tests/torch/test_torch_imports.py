"""fp8kit.torch's import graph (fp8kit.torch.distributed included), read
from the sources: no cycles, no function-local imports of fp8kit.torch
modules but the few listed with their reason, and the layers of the
quantized tensors: QuantizedTensor at the bottom, then the argument checks,
Float8Tensor, and its op table, which the package imports to register it."""

import pathlib

import pytest

import import_graph  # tests/import_graph.py (tests/conftest.py puts tests/ on the path)

PACKAGE = "fp8kit.torch"
ROOT = pathlib.Path(__file__).resolve().parents[2] / "fp8kit" / "torch"

# The function-local imports of package modules that stay, and why. (The
# cycle test counts them too.)
LOCAL_IMPORTS = {
    # Run once at import; keeps the unpickling helpers out of the namespace.
    "__init__": {"float8_block_tensor", "float8_tensor"},
    # The layer classes, for isinstance checks while walking a model.
    "distributed.amax_sync": {"_fused_module", "linear"},
    "distributed.fsdp": {"_fused_module", "linear"},
}

# What each module of the tensor layers may import from the package.
ALLOWED = {
    "_ext": set(),
    "quantized_tensor": set(),
    "_checks": {"quantized_tensor"},
    "_float8_tracing": {"_checks", "_ext"},
    # Not its op table: float8_tensor_ops imports float8_tensor.
    "float8_tensor": {"_checks", "_ext", "_float8_tracing", "quantized_tensor"},
    "float8_tensor_ops": {"_checks", "float8_tensor", "quantized_tensor"},
}


def _graph():
    return import_graph.read(PACKAGE, ROOT)


def test_the_graph_is_read():
    graph, local = _graph()
    assert {"float8_tensor", "quantized_tensor"} <= graph["linear"]
    assert "distributed._group" in graph["distributed.fsdp"]
    assert "distributed.amax_sync" in graph["distributed.__init__"]
    assert "float8_tensor" in local["__init__"]


def test_reader_resolves_relative_and_package_imports(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "__init__.py").write_text("from pkg.a import x\n")
    (tmp_path / "a.py").write_text("from pkg import NAME\n\ndef f():\n    from . import sub\n")
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "b.py").write_text("from ..a import x\nfrom . import c\nimport os\n")
    (tmp_path / "sub" / "c.py").write_text("import pkg.sub\n")
    graph, local = import_graph.read("pkg", tmp_path)
    assert graph == {"__init__": {"a"}, "a": {"__init__"}, "sub.__init__": set(),
                     "sub.b": {"a", "sub.c"}, "sub.c": {"sub.__init__"}}
    assert local["a"] == {"sub.__init__"}


def test_no_import_cycles():
    import_graph.assert_no_cycle(*_graph())


def test_function_local_package_imports_are_the_listed_ones():
    _, local = _graph()
    assert {m: s for m, s in local.items() if s} == LOCAL_IMPORTS


def test_the_package_registers_the_op_table():
    # float8_tensor cannot import its op table (which imports it), so the
    # package does: Python runs it before any module of the package.
    graph, _ = _graph()
    assert "float8_tensor_ops" in graph["__init__"]


def test_only_distributed_imports_distributed():
    # fp8kit.torch.distributed is imported on its own: the rest of the package
    # never loads it (nor, through it, torch.distributed's engines).
    graph, local = _graph()
    users = {m for m in graph if not m.startswith("distributed.")
             and any(d.startswith("distributed.") for d in graph[m] | local[m])}
    assert users == set()


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_layers(module):
    graph, _ = _graph()
    assert graph[module] <= ALLOWED[module], f"{module} imports {graph[module] - ALLOWED[module]}"
