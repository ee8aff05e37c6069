"""Properties of fp8kit.torch.Linear inside fp8kit.torch.autocast: a few
training steps on drawn shapes (0 tokens included), dtypes, recipes and
values give the forward output and the three gradients of the layer
protocol's float64 reference (layer_reference.py), step after step; under
BlockScaling, whose per-block scales that reference does not model, the
output is within FP8's error bound of the unquantized float64 product
(fp8_gemm_bound, which props_torch_fused.py uses too) and the gradients
are finite; bad inputs get a clear error. Run in a child process by
test_torch_properties.py."""

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

import fp8_reference as ref
import fp8kit.torch as ft
import layer_reference as lref
from fp8_strategies import SPECIAL, arrays, moderate_f32, prop, recipes
from fp8kit.recipe import BlockScaling, DelayedScaling, Format
from clear_errors import expect_clear_error
from torch_support import HP, device_or_skip, values

STEPS = 3
# FP8 rounding (forward format E4M3; E5M2 only for a backward format):
# half an ulp relative in the normal range, half the smallest subnormal
# below it, and the largest value.
FP8_HALF_ULP = {"e4m3": 2.0 ** -4, "e5m2": 2.0 ** -3}
FP8_HALF_SUBNORMAL = {"e4m3": 2.0 ** -10, "e5m2": 2.0 ** -17}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
# How far below fp8_max / amax a scale may be: 2**margin (margin <= 3),
# and 2 more for a power-of-2 rounding.
SCALE_SLACK = 2.0 ** 4


def quantization_error(v: np.ndarray, err: np.ndarray, eps: float = 0.0,
                       fmt: str = "e4m3") -> np.ndarray:
    """Bound on |Q(v') - v| for any v' within `err` of v (elementwise,
    float64), Q an FP8 cast whose scale comes from an amax of v' (the
    whole tensor's, or a block's, which is no larger) or amax_epsilon `eps`."""
    mag = np.abs(v) + err
    amax = max(float(mag.max(initial=0.0)), eps, 1e-30)
    floor = amax * SCALE_SLACK / FP8_MAX[fmt] * FP8_HALF_SUBNORMAL[fmt]
    return err + FP8_HALF_ULP[fmt] * mag + floor


def fp8_gemm_bound(a, ea, b, eb, out: str, device: str, bias=None, eps: float = 0.0):
    """(want, bound): a @ b.T (+ bias) in float64 and the error allowed for
    the FP8 GEMM of a and b (each [rows, K], known within ea and eb) with
    FP32 accumulation on `device`, the bias added in float32, the result
    rounded to `out`."""
    qa, qb = quantization_error(a, ea, eps), quantization_error(b, eb, eps)
    ma, mb = np.abs(a) + qa, np.abs(b) + qb
    want = a @ b.T
    bound = qa @ np.abs(b).T + np.abs(a) @ qb.T + qa @ qb.T + ref.accumulation_bound(ma, mb.T,
                                                                                     device)
    if bias is not None:
        want = want + bias
        bound = bound + (np.abs(want) + bound + np.abs(bias)) * 2.0 ** -23
    return want, bound + ref.rounding_bound(np.abs(want) + bound, out)


@st.composite
def block_recipes(draw):
    return BlockScaling(fp8_format=draw(st.sampled_from([Format.E4M3, Format.HYBRID])),
                        amax_epsilon=draw(st.sampled_from([0.0, 1e-3])),
                        power_2_scale=draw(st.booleans()))


@st.composite
def layer_problems(draw):
    k = 16 * draw(st.integers(1, 3))
    n = 16 * draw(st.integers(1, 3))
    lead = draw(st.sampled_from([(0,), (1,), (3,), (17,), (2, 5), (0, 4)]))
    m = int(np.prod(lead))
    steps = []
    for _ in range(STEPS):
        gain = np.float32(2.0 ** draw(st.integers(-6, 6)))
        x = draw(arrays((m, k), moderate_f32)) * gain
        if m and draw(st.integers(0, 4)) == 0:  # now and then a value at an edge
            x.reshape(-1)[draw(st.integers(0, m * k - 1))] = draw(st.sampled_from(SPECIAL))
        w = draw(arrays((n, k), moderate_f32)) / gain
        b = draw(arrays((n,), moderate_f32))
        dy = draw(arrays((m, n), moderate_f32)) * np.float32(2.0 ** draw(st.integers(-12, 0)))
        steps.append((x, w, b, dy))
    return dict(k=k, n=n, lead=lead, steps=steps)


def _close(got: torch.Tensor, want_bound, out: str, what: str):
    want, bound = want_bound
    ref.assert_result_close(values(got), want, bound, out, what)


@prop(max_examples=40, p=layer_problems(), r=recipes(),
      dtype=st.sampled_from(["float32", "bfloat16"]), with_bias=st.booleans())
def check_linear_training_steps(device, p, r, dtype, with_bias):
    dev = device_or_skip(device)
    model, recipe = r
    k, n, lead = p["k"], p["n"], p["lead"]
    layer = ft.Linear(k, n, bias=with_bias, device=dev, dtype=HP[dtype])
    state = lref.fresh_state(model)
    as_t = (lambda a: torch.from_numpy(a).to(HP[dtype]).to(dev))
    for step, (x, w, b, dy) in enumerate(p["steps"]):
        with torch.no_grad():
            layer.weight.copy_(as_t(w))
            if with_bias:
                layer.bias.copy_(as_t(b))
        layer.zero_grad(set_to_none=True)
        xt = as_t(x).reshape(*lead, k).requires_grad_()
        with ft.autocast(recipe=recipe):
            y = layer(xt)
        # The reference reads the values the layer got (rounded to dtype).
        xv, wv = values(xt).reshape(-1, k), values(layer.weight)
        bv = values(layer.bias) if with_bias else None
        want_y, bound, saved = lref.forward(model, state, xv, wv, bv, dtype, True, device)
        assert y.shape == (*lead, n) and y.dtype == HP[dtype]
        _close(y, (want_y, bound), dtype, f"step {step} y")
        dyt = as_t(dy).reshape(*lead, n)
        y.backward(dyt)
        dx, dw, db = lref.backward(model, state, saved, values(dyt).reshape(-1, n), dtype,
                                   dtype, device)
        _close(xt.grad, dx, dtype, f"step {step} dx")
        _close(layer.weight.grad, dw, dtype, f"step {step} dweight")
        if with_bias:
            _close(layer.bias.grad, db, dtype, f"step {step} dbias")


def finite_problem(p: dict) -> dict:
    """A layer problem's steps with its edge values made finite and
    moderate (no product or sum overflows): what a layer must turn into a
    finite output."""
    return dict(p, steps=[tuple(np.clip(np.nan_to_num(a), -1e4, 1e4) for a in step)
                          for step in p["steps"]])


def assert_finite(t: torch.Tensor, what: str):
    v = values(t)
    assert np.isfinite(v).all(), f"{what}: {np.size(v) - np.isfinite(v).sum()} non-finite"


@prop(max_examples=30, p=layer_problems(), recipe=block_recipes(),
      dtype=st.sampled_from(["float32", "bfloat16"]), with_bias=st.booleans())
def check_linear_block_scaling(device, p, recipe, dtype, with_bias):
    """BlockScaling: a scale per 1x128 tile of x and per 128x128 block of
    the weight; the output within FP8's bound of the float64 product of
    the values the layer got, the gradients finite."""
    dev = device_or_skip(device)
    p = finite_problem(p)
    k, n, lead = p["k"], p["n"], p["lead"]
    layer = ft.Linear(k, n, bias=with_bias, device=dev, dtype=HP[dtype])
    x, w, b, dy = p["steps"][0]
    as_t = (lambda a: torch.from_numpy(a).to(HP[dtype]).to(dev))
    with torch.no_grad():
        layer.weight.copy_(as_t(w))
        if with_bias:
            layer.bias.copy_(as_t(b))
    xt = as_t(x).reshape(*lead, k).requires_grad_()
    with ft.autocast(recipe=recipe):
        y = layer(xt)
    assert y.shape == (*lead, n) and y.dtype == HP[dtype]
    xv, wv = values(xt).reshape(-1, k).astype(np.float64), values(layer.weight).astype(np.float64)
    bv = values(layer.bias).astype(np.float64) if with_bias else None
    zero = np.zeros_like
    want, bound = fp8_gemm_bound(xv, zero(xv), wv, zero(wv), dtype, device, bv,
                                 recipe.amax_epsilon)
    assert_finite(y, "y")
    ref.assert_result_close(values(y).reshape(-1, n), want, bound, dtype, "y")
    y.backward(as_t(dy).reshape(*lead, n))
    for name, t in (("dx", xt.grad), ("dweight", layer.weight.grad),
                    ("dbias", layer.bias.grad if with_bias else None)):
        if t is not None:
            assert_finite(t, name)


@prop(max_examples=20, p=layer_problems(), r=recipes())
def check_linear_no_grad_records_nothing(device, p, r):
    """Under torch.no_grad a delayed-scaling layer casts with its current
    scales (a fresh slot seeded from the tensor) and records nothing: the
    same input twice gives the same bits."""
    dev = device_or_skip(device)
    model, recipe = r
    k, n, lead = p["k"], p["n"], p["lead"]
    layer = ft.Linear(k, n, device=dev)
    x, w, b, _ = p["steps"][0]
    state = lref.fresh_state(model)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
        layer.bias.copy_(torch.from_numpy(b))
        xt = torch.from_numpy(x).to(dev).reshape(*lead, k)
        with ft.autocast(recipe=recipe):
            y1, y2 = layer(xt), layer(xt)
    assert torch.equal(y1.nan_to_num(), y2.nan_to_num())
    want, bound, _ = lref.forward(model, state, x, w, b, "float32", False, device)
    _close(y1, (want, bound), "float32", "no_grad y")


@prop(max_examples=30, case=st.sampled_from(
    ["mixed_dtype", "features", "fp64_input", "int_input", "recipe_type", "k_not_multiple"]))
def check_linear_rejects(device, case):
    dev = device_or_skip(device)
    recipe = DelayedScaling()
    layer = ft.Linear(32, 16, device=dev)
    x = torch.randn(4, 32, device=dev)
    if case == "recipe_type":
        expect_clear_error("fp8kit.torch.autocast", lambda: ft.autocast(recipe="fp8").__enter__())
        return
    if case == "k_not_multiple":
        layer, x = ft.Linear(24, 16, device=dev), torch.randn(4, 24, device=dev)
    if case == "mixed_dtype":  # refused as torch.nn.Linear refuses it: RuntimeError
        with ft.autocast(recipe=recipe), pytest.raises(RuntimeError, match="fp8kit.torch.Linear"
                                                       ".*torch.bfloat16.*torch.float32"):
            layer(x.bfloat16())
        with pytest.raises(RuntimeError):  # (what nn.Linear does, for comparison)
            torch.nn.functional.linear(x.bfloat16(), layer.weight)
        return
    x = {"features": x[:, :16], "fp64_input": x.double(), "int_input": x.int()}.get(case, x)
    with ft.autocast(recipe=recipe):
        expect_clear_error("fp8kit.torch.Linear", layer, x)
