"""Test placement for tests/jax: tests not marked `gpu` run on the CPU
backend even on a machine with a GPU (their tolerances are the CPU
reference's); `gpu` tests place their data on the GPU themselves."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _cpu_unless_gpu_test(request):
    if request.node.get_closest_marker("gpu") is not None:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield
