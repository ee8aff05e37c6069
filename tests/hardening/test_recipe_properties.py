"""Property-based tests of fp8kit.recipe's validation (props_recipe.py),
in a child process like the rest of the suite."""

import pytest

from child_process import functions


@pytest.mark.parametrize("function", functions("props_recipe"))
def test_property(child, function):
    child.run("props_recipe", function, device="cpu")
