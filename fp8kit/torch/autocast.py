"""fp8kit.torch.autocast: the context inside which fp8kit.torch.Linear,
LayerNormLinear and LayerNormMLP layers run their GEMMs in FP8 with a
scaling recipe.

    with fp8kit.torch.autocast(recipe=DelayedScaling()):
        y = model(x)
    y.backward(dy)        # backward uses the recipe the forward used

Outside the context (or with enabled=False) the layers compute exactly as
torch.nn.Linear (and torch's norm and activation) do. The state is per
thread; contexts nest.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

DEFAULT_RECIPE = DelayedScaling()


class _State(threading.local):
    def __init__(self) -> None:
        # The active recipe, None when FP8 is off. An instance attribute (set
        # in each thread on its first read), not a class default: dynamo reads
        # a threading.local's attributes through the thread's own dict, and
        # guards on them, only when the class has no attribute of that name.
        self.recipe = None


STATE = _State()


def current_recipe():
    """The recipe of the innermost enabled autocast on this thread, or None."""
    return STATE.recipe


@contextlib.contextmanager
def autocast(enabled: bool = True, recipe: Optional[object] = None):
    """Runs fp8kit.torch.Linear layers in FP8 with `recipe` (default:
    DelayedScaling()) while enabled."""
    if not isinstance(enabled, bool):  # a str such as "no" would be truthy
        raise TypeError(f"fp8kit.torch.autocast: enabled is {enabled!r} "
                        f"({type(enabled).__name__}); it must be a bool")
    if recipe is None:
        recipe = DEFAULT_RECIPE
    if not isinstance(recipe, (DelayedScaling, CurrentScaling, BlockScaling)):
        raise TypeError("fp8kit.torch.autocast: recipe must be an fp8kit.recipe.DelayedScaling, "
                        f"CurrentScaling or BlockScaling, got {type(recipe).__name__}")
    previous = STATE.recipe
    STATE.recipe = recipe if enabled else None
    try:
        yield
    finally:
        STATE.recipe = previous
