"""Properties of fp8kit.recipe (shared by both front ends): a recipe is
validated at construction - every field of the wrong type (a bool where
an int or float is expected, a string where a float is) or out of range
(negative margin or history length, an amax_epsilon that is negative or
not finite) raises a TypeError or ValueError naming the field - and a
valid recipe is a hashable value. Run in a child process by
test_recipe_properties.py."""

import math

from hypothesis import strategies as st

from fp8_strategies import prop
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format

# (field, bad value)
BAD_DELAYED = [("margin", True), ("margin", 1.0), ("margin", "1"), ("margin", -1),
               ("amax_history_len", True), ("amax_history_len", 2.0), ("amax_history_len", 0),
               ("amax_history_len", -3), ("fp8_format", "hybrid"), ("amax_reduction", "max"),
               ("forward_fast_accumulation", 1)]
BAD_CURRENT = [("amax_epsilon", "1e-3"), ("amax_epsilon", True), ("amax_epsilon", None),
               ("amax_epsilon", -1e-3), ("amax_epsilon", math.nan), ("amax_epsilon", math.inf),
               ("power_2_scale", 1), ("fp8_format", None), ("forward_fast_accumulation", "yes")]


def _expect(cls, field, value):
    try:
        cls(**{field: value})
    except (TypeError, ValueError) as e:
        assert field in str(e), f"{cls.__name__}({field}={value!r}): the error does not name " \
                                f"{field}: {e}"
        return
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{cls.__name__}({field}={value!r}) raised {type(e).__name__} "
                             f"({e}), expected TypeError or ValueError") from e
    raise AssertionError(f"{cls.__name__}({field}={value!r}) was accepted")


@prop(max_examples=len(BAD_DELAYED) + len(BAD_CURRENT),
      case=st.sampled_from([(DelayedScaling,) + c for c in BAD_DELAYED]
                           + [(CurrentScaling,) + c for c in BAD_CURRENT]))
def check_bad_fields_rejected(device, case):
    del device  # pure Python
    _expect(*case)


@prop(max_examples=30, fmt=st.sampled_from(list(Format)), length=st.integers(1, 64),
      margin=st.integers(0, 16), reduction=st.sampled_from(list(AmaxReduction)),
      eps=st.sampled_from([0.0, 1e-12, 1e-3, 1.0]), pow2=st.booleans(), fast=st.booleans())
def check_valid_recipes_are_values(device, fmt, length, margin, reduction, eps, pow2, fast):
    del device
    d = DelayedScaling(fp8_format=fmt, amax_history_len=length, margin=margin,
                       amax_reduction=reduction, forward_fast_accumulation=fast)
    c = CurrentScaling(fp8_format=fmt, amax_epsilon=eps, power_2_scale=pow2,
                       forward_fast_accumulation=fast)
    for r in (d, c):
        twin = type(r)(**{f: getattr(r, f) for f in r.__dataclass_fields__})
        assert r == twin and hash(r) == hash(twin)
