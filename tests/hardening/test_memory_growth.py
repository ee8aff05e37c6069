"""Resident memory after 50,000 quantizer calls and 5,000 Linear steps
(memory_growth.py), each measured in a fresh child process."""

import pytest

from child_process import DEVICES, functions

FUNCTIONS = functions("memory_growth")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("function", FUNCTIONS)
def test_memory_growth(child, function, device):
    child.run("memory_growth", function, fresh=True, device=device)
