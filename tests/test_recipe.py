"""fp8kit.recipe validates every field at construction, and its bounds are
the core's.

Each bad value raises TypeError (wrong type) or ValueError (out of range)
with the class and field named; each good value, the bounds included, is
accepted and kept. The bounds are compared with the core's public header
(read as text, when the source tree is at hand) and with what the compiled
extensions export (when they import).
"""

import dataclasses
import importlib
import math
import pathlib
import re

import numpy as np
import pytest

from fp8kit.recipe import (AMAX_EPSILON_MAX, AMAX_HISTORY_LEN_MAX, BLOCK_LEN, MARGIN_MAX,
                           AmaxReduction, BlockScaling, CurrentScaling, DelayedScaling, Format)

HEADERS = pathlib.Path(__file__).resolve().parents[1] / "common/include/fp8kit"
HEADER = HEADERS / "delayed_scaling.h"


class _IntLike:
    """Has __index__ (so operator.index accepts it) but is not an int."""

    def __index__(self):
        return 4

    # The test ids (_case_id) show it: the same in every process, which
    # pytest-xdist needs (the default repr holds the object's address).
    def __repr__(self):
        return "_IntLike()"


# (field, bad value, exception) per recipe class. Types first, then ranges.
DELAYED_BAD = [
    ("fp8_format", "hybrid", TypeError),
    ("fp8_format", None, TypeError),
    ("fp8_format", AmaxReduction.MAX, TypeError),
    ("amax_history_len", True, TypeError),
    ("amax_history_len", 4.0, TypeError),
    ("amax_history_len", "4", TypeError),
    ("amax_history_len", np.int64(4), TypeError),
    ("amax_history_len", _IntLike(), TypeError),
    ("amax_history_len", None, TypeError),
    ("amax_history_len", 0, ValueError),
    ("amax_history_len", -1, ValueError),
    ("amax_history_len", AMAX_HISTORY_LEN_MAX + 1, ValueError),
    ("amax_history_len", 2 ** 70, ValueError),
    ("margin", False, TypeError),
    ("margin", True, TypeError),
    ("margin", 1.0, TypeError),
    ("margin", "1", TypeError),
    ("margin", np.int32(1), TypeError),
    ("margin", -1, ValueError),
    ("margin", MARGIN_MAX + 1, ValueError),
    ("margin", -(2 ** 70), ValueError),
    ("amax_reduction", "max", TypeError),
    ("amax_reduction", 0, TypeError),
    ("amax_reduction", Format.E4M3, TypeError),
    ("forward_fast_accumulation", 1, TypeError),
    ("forward_fast_accumulation", 0, TypeError),
    ("forward_fast_accumulation", "False", TypeError),
    ("forward_fast_accumulation", None, TypeError),
    ("forward_fast_accumulation", np.bool_(True), TypeError),
]

CURRENT_BAD = [
    ("fp8_format", "e4m3", TypeError),
    ("fp8_format", None, TypeError),
    ("amax_epsilon", True, TypeError),
    ("amax_epsilon", False, TypeError),
    ("amax_epsilon", "0.1", TypeError),
    ("amax_epsilon", None, TypeError),
    ("amax_epsilon", [0.1], TypeError),
    ("amax_epsilon", complex(0.1, 0), TypeError),
    ("amax_epsilon", np.float32(0.1), TypeError),
    ("amax_epsilon", -1e-30, ValueError),
    ("amax_epsilon", -1, ValueError),
    ("amax_epsilon", math.nan, ValueError),
    ("amax_epsilon", math.inf, ValueError),
    ("amax_epsilon", -math.inf, ValueError),
    ("amax_epsilon", 1e39, ValueError),           # finite as a double, inf as a float32
    ("amax_epsilon", 10 ** 400, ValueError),      # beyond any float
    ("power_2_scale", 1, TypeError),
    ("power_2_scale", "True", TypeError),
    ("power_2_scale", None, TypeError),
    ("forward_fast_accumulation", 1, TypeError),
    ("forward_fast_accumulation", np.bool_(False), TypeError),
]


BLOCK_BAD = [
    ("fp8_format", "e4m3", TypeError),
    ("fp8_format", Format, TypeError),
    ("amax_epsilon", True, TypeError),
    ("amax_epsilon", "0", TypeError),
    ("amax_epsilon", np.float32(0.1), TypeError),
    ("amax_epsilon", -1e-30, ValueError),
    ("amax_epsilon", math.nan, ValueError),
    ("amax_epsilon", 1e39, ValueError),
    ("power_2_scale", 1, TypeError),
    ("power_2_scale", np.bool_(True), TypeError),
    ("power_2_scale", None, TypeError),
]


def _case_id(case):
    field, value, exc = case
    return f"{field}={value!r}-{exc.__name__}"


@pytest.mark.parametrize("case", DELAYED_BAD, ids=_case_id)
def test_delayed_scaling_refuses_bad_fields(case):
    field, value, exc = case
    with pytest.raises(exc) as info:
        DelayedScaling(**{field: value})
    assert type(info.value) is exc  # not a subclass standing in for the other kind
    assert f"DelayedScaling.{field} must be " in str(info.value)  # names it and says the fix


@pytest.mark.parametrize("case", CURRENT_BAD, ids=_case_id)
def test_current_scaling_refuses_bad_fields(case):
    field, value, exc = case
    with pytest.raises(exc) as info:
        CurrentScaling(**{field: value})
    assert type(info.value) is exc
    assert f"CurrentScaling.{field} must be " in str(info.value)


def test_messages_give_the_range():
    with pytest.raises(ValueError, match=rf"^DelayedScaling.margin must be an int in "
                                         rf"\[0, {MARGIN_MAX}\], got 127 \(int\)$"):
        DelayedScaling(margin=127)
    with pytest.raises(TypeError, match=r"^DelayedScaling.amax_history_len must be an int in "
                                        rf"\[1, {AMAX_HISTORY_LEN_MAX}\], got True \(bool\)$"):
        DelayedScaling(amax_history_len=True)
    with pytest.raises(TypeError, match=r"^CurrentScaling.fp8_format must be an "
                                        r"fp8kit.recipe.Format \(Format.E4M3, Format.HYBRID\), "
                                        r"got 'e4m3' \(str\)$"):
        CurrentScaling(fp8_format="e4m3")
    with pytest.raises(ValueError, match=r"^CurrentScaling.amax_epsilon must be a finite float "
                                         r">= 0 .*, got nan \(float\)$"):
        CurrentScaling(amax_epsilon=math.nan)
    with pytest.raises(TypeError, match=r"^CurrentScaling.power_2_scale must be a bool "
                                        r"\(True or False\), got 1 \(int\)$"):
        CurrentScaling(power_2_scale=1)


@pytest.mark.parametrize("case", BLOCK_BAD, ids=_case_id)
def test_block_scaling_refuses_bad_fields(case):
    field, value, exc = case
    with pytest.raises(exc) as info:
        BlockScaling(**{field: value})
    assert f"BlockScaling.{field} must be " in str(info.value)


@pytest.mark.parametrize("kwargs", [
    {},
    {"fp8_format": Format.HYBRID},
    {"amax_epsilon": 1e-12},
    {"amax_epsilon": AMAX_EPSILON_MAX},
    {"power_2_scale": False},
], ids=repr)
def test_block_scaling_accepts_good_fields(kwargs):
    r = BlockScaling(**kwargs)
    for field, value in kwargs.items():
        assert getattr(r, field) is value or getattr(r, field) == value
    assert dataclasses.replace(r) == r


def test_block_scaling_defaults():
    # E4M3 for every tensor and power-of-two scales, as the docstring says.
    r = BlockScaling()
    assert r.fp8_format is Format.E4M3
    assert r.power_2_scale is True
    assert r.amax_epsilon == 0.0
    assert hash(r) == hash(BlockScaling())
    # Read like the per-tensor recipes' field, but fixed: no fast mode exists.
    assert r.forward_fast_accumulation is False
    with pytest.raises(TypeError):
        BlockScaling(forward_fast_accumulation=True)


@pytest.mark.parametrize("kwargs", [
    {},
    {"fp8_format": Format.E4M3},
    {"amax_history_len": 1},
    {"amax_history_len": AMAX_HISTORY_LEN_MAX},
    {"margin": 0},
    {"margin": MARGIN_MAX},
    {"amax_reduction": AmaxReduction.MOST_RECENT},
    {"forward_fast_accumulation": True},
], ids=repr)
def test_delayed_scaling_accepts_good_fields(kwargs):
    r = DelayedScaling(**kwargs)
    for field, value in kwargs.items():
        assert getattr(r, field) is value or getattr(r, field) == value
    assert dataclasses.replace(r) == r  # replace validates and keeps it


@pytest.mark.parametrize("kwargs", [
    {},
    {"fp8_format": Format.E4M3},
    {"amax_epsilon": 0},
    {"amax_epsilon": 0.0},
    {"amax_epsilon": -0.0},
    {"amax_epsilon": 5e-324},                  # a denormal double: 0 as a float32, still valid
    {"amax_epsilon": 1e-3},
    {"amax_epsilon": 3},
    {"amax_epsilon": AMAX_EPSILON_MAX},
    {"amax_epsilon": np.float64(0.5)},         # a float subclass
    {"power_2_scale": True},
    {"forward_fast_accumulation": True},
], ids=repr)
def test_current_scaling_accepts_good_fields(kwargs):
    r = CurrentScaling(**kwargs)
    for field, value in kwargs.items():
        assert getattr(r, field) is value or getattr(r, field) == value


def test_replace_validates_too():
    with pytest.raises(ValueError, match="DelayedScaling.margin"):
        dataclasses.replace(DelayedScaling(), margin=-1)
    with pytest.raises(TypeError, match="CurrentScaling.power_2_scale"):
        dataclasses.replace(CurrentScaling(), power_2_scale=1)


def test_epsilon_bound_is_the_largest_float32():
    # The core holds amax_epsilon in a float32; any larger value is refused
    # here rather than overflowing there.
    assert AMAX_EPSILON_MAX == float(np.finfo(np.float32).max)


def _header_define(name, header="delayed_scaling.h"):
    path = HEADERS / header
    m = re.search(rf"^#define {name} (\d+)$", path.read_text(), re.MULTILINE)
    assert m, f"{path.name} no longer defines {name} as a plain integer"
    return int(m.group(1))


def test_bounds_equal_the_core_header():
    if not HEADER.is_file():
        pytest.skip("the core's headers are not beside this test (not run from the source tree)")
    assert _header_define("FP8KIT_MARGIN_MAX") == MARGIN_MAX
    assert _header_define("FP8KIT_AMAX_HISTORY_LEN_MAX") == AMAX_HISTORY_LEN_MAX
    assert _header_define("FP8KIT_BLOCK_LEN", "block_scaling.h") == BLOCK_LEN


@pytest.mark.parametrize("framework, module", [("torch", "fp8kit._torch_ext"),
                                               ("jax", "fp8kit._jax_ext")])
def test_bounds_equal_the_extension_exports(framework, module):
    try:
        importlib.import_module(framework)  # the torch extension needs torch loaded first
        ext = importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{module} does not import here ({e})")
    for name, want in (("MARGIN_MAX", MARGIN_MAX), ("AMAX_HISTORY_LEN_MAX", AMAX_HISTORY_LEN_MAX)):
        assert hasattr(ext, name), f"{module} must export {name} (the core's FP8KIT_{name})"
        assert getattr(ext, name) == want, f"{module}.{name}"


@pytest.mark.parametrize("module", ["fp8kit._torch_ext", "fp8kit._jax_ext"])
def test_layout_and_gemm_multiples_are_the_core_headers(module):
    """What the front ends read instead of re-typing the core's rules."""
    if not HEADER.is_file():
        pytest.skip("the core's headers are not beside this test (not run from the source tree)")
    try:
        importlib.import_module(module.split("_")[1])  # torch / jax loaded first
        ext = importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{module} does not import here ({e})")
    for name, header in (("GEMM_DIM_MULTIPLE", "linear.h"), ("GEMM_ROW_BYTES_MULTIPLE", "gemm.h"),
                         ("BLOCK_GEMM_MN_MULTIPLE", "gemm.h"),
                         ("BLOCK_SCALE_INNER_MULTIPLE", "block_scaling.h")):
        assert getattr(ext, name) == _header_define(f"FP8KIT_{name}", header), (module, name)
    if module == "fp8kit._jax_ext":  # an FFI result's size (torch allocates it in C++)
        assert ext.CAST_STATISTICS_WORKSPACE_BYTES == _header_define(
            "FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES", "statistics.h")
