"""8 threads at once against one thread's results, bit for bit
(stress_threads.py), in a child process."""

import pytest

from child_process import DEVICES, functions

FUNCTIONS = functions("stress_threads")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("function", FUNCTIONS)
def test_thread_stress(child, function, device):
    child.run("stress_threads", function, device=device)
