"""Hypothesis strategies and settings shared by the property tests.

Settings: derandomize=True (the same examples on every run, so CI is
repeatable and a failure reproduces), no example database (nothing is
written next to the tests), a bounded number of examples per property
(FP8KIT_HARDENING_EXAMPLES scales them: more for a longer local run, fewer
under compute-sanitizer), and a generous deadline: it catches an example
that takes seconds, not a slow machine (a real hang is the child process's
timeout, child_process.py). FP8KIT_HARDENING_DEADLINE_MS=none turns it off
(compute-sanitizer slows every kernel many times).

Examples are drawn as plain values (shapes, NumPy arrays, names), never
as framework tensors, so that the logged reproducer of a crashing example
is complete: `prop` writes it to FP8KIT_HARDENING_EXAMPLE_LOG before the
example runs.
"""

from __future__ import annotations

import functools
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import layer_reference as lref
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format

SCALE = float(os.environ.get("FP8KIT_HARDENING_EXAMPLES", "1"))
_DEADLINE = os.environ.get("FP8KIT_HARDENING_DEADLINE_MS", "10000")
DEADLINE_MS = None if _DEADLINE == "none" else int(_DEADLINE)
_LOG = os.environ.get("FP8KIT_HARDENING_EXAMPLE_LOG")
_LOG_FD = os.open(_LOG, os.O_WRONLY | os.O_CREAT) if _LOG else None


def log_example(name: str, kwargs: dict) -> None:
    """Records what is about to run, for the parent to report if the
    process dies (a no-op outside the hardening child)."""
    if _LOG_FD is None:
        return
    with np.printoptions(threshold=64, floatmode="unique"):
        text = f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})\n"
    data = text.encode(errors="replace")
    os.ftruncate(_LOG_FD, 0)
    os.pwrite(_LOG_FD, data, 0)


def prop(max_examples: int = 40, **strategies):
    """@given(**strategies) with the suite's settings; logs each example."""
    def decorate(fn):
        @functools.wraps(fn)
        def logged(**kwargs):
            log_example(fn.__name__, kwargs)
            return fn(**kwargs)
        configured = settings(
            max_examples=max(1, int(max_examples * SCALE)), derandomize=True, database=None,
            deadline=DEADLINE_MS, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        return configured(given(**strategies)(logged))
    return decorate


# --------------------------------------------------------------- values ---

def float32_values(values) -> list:
    """The values as the nearest float32s (array elements must be exact)."""
    return [float(np.float32(v)) for v in values]


# Values an FP8 path must get right: zeros of both signs, the formats'
# edges (448, 57344 and the values that round across them), FP8 and
# float32 denormals, float16/bfloat16 extremes, and the non-finite ones.
SPECIAL = float32_values([
    0.0, -0.0, 1.0, -1.0, 448.0, -448.0, 464.0, 480.0, 57344.0, 61440.0, -61440.0, 2.0 ** -6,
    2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.0 ** -14, 2.0 ** -16, 2.0 ** -17, 1e-45, -1e-45,
    1.2e-38, 65504.0, -65504.0, 3.0e38, -3.4e38, float("inf"), float("-inf"), float("nan")])

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any_f32 = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32), finite_f32)
# Moderate values: no overflow in products and sums (GEMM, layer inputs).
moderate_f32 = st.floats(-8.0, 8.0, width=32)

# Scales a user can pass: ordinary, extreme (denormal, huge) and invalid.
valid_scales = st.one_of(
    st.sampled_from(float32_values([1.0, 0.5, 3.0, 1 / 3, 2.0 ** -20, 2.0 ** 20, 1e-45, 1.2e-38,
                                    3.0e38])),
    st.floats(2.0 ** -20, 2.0 ** 20, width=32))
invalid_scales = st.sampled_from([0.0, -0.0, -1.0, -2.0 ** -20, float("inf"), float("-inf"),
                                  float("nan")])
any_scale = st.one_of(valid_scales, invalid_scales)
scales_near_1 = st.floats(2.0 ** -10, 2.0 ** 10, width=32)

fp8_names = st.sampled_from(["e4m3", "e5m2"])
hp_names = st.sampled_from(["float32", "bfloat16", "float16"])


def shapes(min_dims: int = 0, max_dims: int = 4, max_side: int = 9, max_size: int = 512):
    """Shapes with 0-size dimensions among them, bounded in element count."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0,
                            max_side=max_side).filter(lambda s: int(np.prod(s)) <= max_size)


def arrays(shape, elements=any_f32):
    return hnp.arrays(np.float32, shape, elements=elements)


# How an input tensor is laid out in memory (torch); JAX gets the same
# logical values through the matching array operation.
LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]
layouts = st.sampled_from(LAYOUTS)


def source_shape(shape, layout: str):
    """The shape of the array a layout is built from (see torch_layout)."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        return shape[:-2] + (shape[-1], shape[-2])
    if layout == "strided" and shape:
        return shape[:-1] + (2 * shape[-1],)
    if layout == "expanded" and shape:
        return (1,) + shape[1:]
    return shape


@st.composite
def laid_out(draw, shape_strategy=None, elements=any_f32):
    """(shape, layout, source values): the values of the logical tensor are
    layout_view(source, layout, shape)."""
    shape = draw(shape_strategy if shape_strategy is not None else shapes())
    layout = draw(layouts)
    src = draw(arrays(source_shape(shape, layout), elements))
    return tuple(shape), layout, src


def layout_view_numpy(src: np.ndarray, layout: str, shape) -> np.ndarray:
    """The logical values, in NumPy (the reference's view)."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        return np.swapaxes(src, -1, -2)
    if layout == "strided" and shape:
        return src[..., ::2]
    if layout == "expanded" and shape:
        return np.broadcast_to(src, shape)
    return src


@st.composite
def recipes(draw):
    """(layer_reference.Recipe, the fp8kit recipe it models): both kinds,
    both formats, the ranges a layer step exercises."""
    hybrid = draw(st.booleans())
    fmt = Format.HYBRID if hybrid else Format.E4M3
    if draw(st.booleans()):
        r = lref.Recipe(delayed=True, hybrid=hybrid, margin=draw(st.integers(0, 3)),
                        amax_history_len=draw(st.integers(1, 4)),
                        reduction=draw(st.sampled_from(["max", "most_recent"])))
        return r, DelayedScaling(fp8_format=fmt, amax_history_len=r.amax_history_len,
                                 margin=r.margin, amax_reduction=AmaxReduction(r.reduction))
    r = lref.Recipe(delayed=False, hybrid=hybrid, epsilon=draw(st.sampled_from([0.0, 1e-3])),
                    pow2=draw(st.booleans()))
    return r, CurrentScaling(fp8_format=fmt, amax_epsilon=r.epsilon, power_2_scale=r.pow2)


# ------------------------------------------------ delayed_scaling_update ---

amax_values = st.one_of(st.sampled_from(float32_values([0.0, -1.0, 1e-45, 1e-30, 448.0, 3e38,
                                                        float("inf"), float("nan")])),
                        st.floats(0.0, 1e4, width=32))


@st.composite
def delayed_states(draw):
    """(amax histories [n, L], new amaxes [n], scales [n], formats): the
    arguments of a delayed-scaling update, edge amaxes and scales included."""
    n = draw(st.integers(1, 4))
    length = draw(st.integers(1, 5))
    hist = draw(arrays((n, length), amax_values))
    new_amax = draw(arrays((n,), amax_values))
    scale = draw(arrays((n,), st.one_of(any_scale, scales_near_1)))
    fmts = draw(st.lists(fp8_names, min_size=n, max_size=n))
    return hist, new_amax, scale, fmts


# ------------------------------------------------------------------ gemm ---

# The output's N alignment (16 bytes) for each output type.
OUT_N_MULTIPLE = {"float32": 4, "bfloat16": 8, "float16": 8}
gemm_scale_invs = st.one_of(st.sampled_from([1.0, 2.0 ** -10, 2.0 ** 10, 0.0, float("nan")]),
                            st.floats(2.0 ** -13, 2.0 ** 13, width=32))


@st.composite
def gemm_problems(draw, token_counts=(0, 1, 2, 5, 16, 33)):
    """A GEMM problem both front ends' gemm properties draw: FP8 operand
    bytes (a [M,K] or transposed, b [K,N] or transposed), their scale_invs,
    the output type and an optional bias (fp8_reference.gemm_reference)."""
    out = draw(hp_names)
    m = draw(st.sampled_from(token_counts))
    k = 16 * draw(st.integers(1, 4))
    n = OUT_N_MULTIPLE[out] * draw(st.integers(1, 6))
    fa, fb = draw(st.sampled_from([("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]))
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    codes = st.integers(0, 255)
    a = draw(arrays((k, m) if trans_a else (m, k), codes)).astype(np.uint8)
    b = draw(arrays((n, k) if trans_b else (k, n), codes)).astype(np.uint8)
    sa, sb = draw(gemm_scale_invs), draw(gemm_scale_invs)
    bias = draw(st.one_of(st.none(), arrays((n,), moderate_f32)))
    return dict(out=out, m=m, k=k, n=n, fa=fa, fb=fb, trans_a=trans_a, trans_b=trans_b, a=a,
                b=b, sa=sa, sb=sb, bias=bias)
