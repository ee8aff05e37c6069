"""Property-based tests of fp8kit.jax's public functions, ScaledTensor,
dense, and the fused and block-scaled layers (props_jax_*.py), each run in
a child process."""

import pytest

from child_process import DEVICES, functions

MODULES = ("props_jax_ops", "props_jax_dense", "props_jax_layers")
CASES = [(m, f) for m in MODULES for f in functions(m)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module,function", CASES, ids=[f for _, f in CASES])
def test_property(child, module, function, device):
    child.run(module, function, device=device)
