"""What the torch.compile tests share: the devices they run on, a fresh
dynamo around each test (no compiled graph or counter leaks into the
next), and the bit-for-bit comparison of compiled and eager results."""

import pytest
import torch

from torch_reference import cuda_or_skip

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def device_of(name: str) -> torch.device:
    return cuda_or_skip() if name == "cuda" else torch.device("cpu")


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
