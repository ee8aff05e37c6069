"""What the torch.compile tests share: the devices they run on, a fresh
dynamo around each test (no compiled graph or counter leaks into the
next), and the bit-for-bit comparison of compiled and eager results."""

import pytest
import torch

from torch_reference import DEVICES, device_of  # noqa: F401  (shared with the compile tests)

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Autouse in every module that imports it."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor):
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
    as_int = _INT_OF_SIZE[got.element_size()]
    assert torch.equal(got.contiguous().view(as_int), want.contiguous().view(as_int))
