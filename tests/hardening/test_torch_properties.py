"""Property-based tests of fp8kit.torch's public functions, quantizers,
Float8Tensor construction, Linear and the fused layers under autocast
(props_torch_*.py), each run in a child process."""

import pytest

from child_process import DEVICES, functions

MODULES = ("props_torch_ops", "props_torch_tensors", "props_torch_inplace", "props_torch_layers",
           "props_torch_fused")
CASES = [(m, f) for m in MODULES for f in functions(m)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module,function", CASES, ids=[f for _, f in CASES])
def test_property(child, module, function, device):
    child.run(module, function, device=device)
