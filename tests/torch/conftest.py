"""Shared setup for the fp8kit.torch tests."""

import pytest

torch = pytest.importorskip("torch")

# The tests use small tensors; on the 2-core CI machines, shared with other
# jobs, torch's intra-op thread pool only adds spin-waiting.
torch.set_num_threads(1)
