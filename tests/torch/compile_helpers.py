"""What the torch.compile tests share: a fresh dynamo around each test (no
compiled graph or counter leaks into the next)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Autouse in every module that imports it."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
