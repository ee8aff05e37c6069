"""Properties of fp8kit.torch's quantizers (Float8Quantizer,
Float8CurrentScalingQuantizer, quantizer_for) and of Float8Tensor
construction: a quantizer call gives the reference's bits in a consistent
Float8Tensor (nominal shape, dtype, device; both layouts agree), bad
arguments get a clear error, and an object whose __init__ never ran
raises instead of crashing. Run in a child process by
test_torch_properties.py."""

import copy
import pickle

import numpy as np
import torch
from hypothesis import strategies as st

import fp8_reference as ref
from clear_errors import expect_clear_error
import fp8kit.torch as ft
from fp8_strategies import any_scale, arrays, fp8_names, hp_names, laid_out, prop, shapes
from fp8kit.recipe import CurrentScaling, DelayedScaling, Format
from torch_support import (HP, bits, check_quantized, device_or_skip, fp8_tensor,
                           laid_out_tensor, scalar, values)

copies = st.sampled_from([(True, False), (False, True), (True, True)])


def _check_float8(f8, x: np.ndarray, scale, fmt, rowwise, columnwise, dtype, device, what):
    assert isinstance(f8, ft.Float8Tensor), f"{what}: returned {type(f8).__name__}"
    assert tuple(f8.shape) == x.shape and f8.dtype == HP[dtype] and f8.device == device, (
        f"{what}: nominal {tuple(f8.shape)} {f8.dtype} {f8.device}, expected {x.shape} "
        f"{HP[dtype]} {device}")
    assert f8.fp8_dtype == fmt
    check_quantized(f8.rowwise_data, f8.columnwise_data, x, scale, fmt, rowwise, columnwise,
                    what)
    sinv = ref.scale_inv_for_given(scale)
    ref.assert_floats_equal(scalar(f8.scale_inv), sinv, f"{what} scale_inv")
    want = ref.dequantize(ref.quantize_bits(x, scale, fmt), fmt, sinv, dtype)
    ref.assert_floats_equal(values(f8.dequantize()), want.astype(np.float32),
                            f"{what} dequantize()")


@prop(max_examples=60, x=laid_out(), dtype=hp_names, fmt=fp8_names, scale=any_scale,
      usage=copies, with_amax=st.booleans())
def check_float8_quantizer(device, x, dtype, fmt, scale, usage, with_amax):
    dev = device_or_skip(device)
    shape, layout, src = x
    t = laid_out_tensor(src, layout, shape, dtype, dev)
    scale_t = torch.tensor([scale], dtype=torch.float32, device=dev)
    amax = torch.full((1,), -1.0, device=dev) if with_amax else None
    q = ft.Float8Quantizer(scale_t, fmt, amax, *usage)
    f8 = q(t)
    xv = values(t)
    _check_float8(f8, xv, scale, fmt, *usage, dtype, dev, "Float8Quantizer")
    if with_amax:
        ref.assert_floats_equal(scalar(amax), ref.amax(xv), "Float8Quantizer amax")
    # The scale tensor is read at every call: a new value is used by the next one.
    scale_t.fill_(2.0)
    f8b = q(t)
    check_quantized(f8b.rowwise_data, f8b.columnwise_data, xv, 2.0, fmt, *usage,
                    "Float8Quantizer after the scale changed")


@prop(max_examples=40, x=laid_out(), dtype=hp_names, fmt=fp8_names, usage=copies,
      eps=st.sampled_from([0.0, 1e-6, 10.0]), pow2=st.booleans())
def check_current_scaling_quantizer(device, x, dtype, fmt, usage, eps, pow2):
    dev = device_or_skip(device)
    shape, layout, src = x
    t = laid_out_tensor(src, layout, shape, dtype, dev)
    q = ft.Float8CurrentScalingQuantizer(fmt, *usage, eps, pow2)
    f8 = q(t)
    xv = values(t)
    scale = ref.current_scale(ref.amax(xv), fmt, eps, pow2)
    _check_float8(f8, xv, scale, fmt, *usage, dtype, dev, "Float8CurrentScalingQuantizer")
    # Copies made every supported way quantize the same.
    for other in (q.copy(), copy.deepcopy(q), pickle.loads(pickle.dumps(q)), q.to(dev)):
        assert torch.equal(bits_of(other(t)), bits_of(f8))


def bits_of(f8) -> torch.Tensor:
    d = f8.rowwise_data if f8.rowwise_data is not None else f8.columnwise_data
    return d.view(torch.uint8)


@prop(max_examples=30, x=laid_out(shapes(min_dims=1)), dtype=hp_names, fmt=fp8_names,
      usage=copies, scale=any_scale)
def check_update_quantized(device, x, dtype, fmt, usage, scale):
    dev = device_or_skip(device)
    shape, layout, src = x
    t = laid_out_tensor(src, layout, shape, dtype, dev)
    q = ft.Float8Quantizer(torch.ones(1, device=dev), fmt, None, *usage)
    dst = q(torch.zeros(shape, dtype=HP[dtype], device=dev))
    q.scale.fill_(scale)
    out = q.update_quantized(t, dst)
    assert out is dst
    _check_float8(dst, values(t), scale, fmt, *usage, dtype, dev, "update_quantized")


@prop(max_examples=20, recipe=st.sampled_from(["delayed", "delayed_e4m3", "current"]),
      backward=st.booleans(), usage=copies)
def check_quantizer_for(device, recipe, backward, usage):
    dev = device_or_skip(device)
    r = {"delayed": DelayedScaling(), "delayed_e4m3": DelayedScaling(fp8_format=Format.E4M3),
         "current": CurrentScaling()}[recipe]
    scale = torch.full((1,), 4.0, device=dev)
    q = ft.quantizer_for(r, backward=backward, rowwise=usage[0], columnwise=usage[1],
                         scale=scale)
    want_fmt = r.fp8_format.backward_dtype if backward else r.fp8_format.forward_dtype
    assert q.fp8_dtype == want_fmt and (q.rowwise, q.columnwise) == usage
    x = torch.linspace(-3, 3, 64, device=dev).reshape(4, 16)
    f8 = q(x)
    want_scale = 4.0 if isinstance(r, DelayedScaling) else ref.current_scale(3.0, want_fmt)
    check_quantized(f8.rowwise_data, f8.columnwise_data, values(x), want_scale, want_fmt, *usage,
                    "quantizer_for")


@prop(max_examples=40, case=st.sampled_from(
    ["fp8_dtype", "no_copy", "scale_dtype", "scale_numel", "amax_dtype",
     "scale_list", "eps_negative", "eps_nan", "eps_inf", "cs_no_copy", "cs_fp8_dtype"]))
def check_quantizer_constructors_reject(device, case):
    dev = device_or_skip(device)
    one = torch.ones(1, device=dev)
    if case.startswith(("eps_", "cs_")):
        fn = "fp8kit.torch.Float8CurrentScalingQuantizer"
        args = dict(fp8_dtype="e4m3", rowwise=True, columnwise=True, amax_epsilon=0.0,
                    power_2_scale=False)
        args.update({"eps_negative": dict(amax_epsilon=-1.0),
                     "eps_nan": dict(amax_epsilon=float("nan")),
                     "eps_inf": dict(amax_epsilon=float("inf")),
                     "cs_no_copy": dict(rowwise=False, columnwise=False),
                     "cs_fp8_dtype": dict(fp8_dtype="fp8")}[case])
        expect_clear_error(fn, ft.Float8CurrentScalingQuantizer, **args)
        return
    fn = "fp8kit.torch.Float8Quantizer"
    args = dict(scale=one, fp8_dtype="e4m3", amax=None, rowwise=True, columnwise=True)
    args.update({"fp8_dtype": dict(fp8_dtype="E4M3"),
                 "no_copy": dict(rowwise=False, columnwise=False),
                 "scale_dtype": dict(scale=one.half()),
                 "scale_numel": dict(scale=torch.ones(3, device=dev)),
                 "amax_dtype": dict(amax=one.double()),
                 "scale_list": dict(scale=[1.0])}[case])
    expect_clear_error(fn, ft.Float8Quantizer, **args)


@prop(max_examples=30, dtype=st.sampled_from([torch.float64, torch.int32, torch.bool]),
      current=st.booleans())
def check_quantizer_call_rejects_other_dtypes(device, dtype, current):
    dev = device_or_skip(device)
    q = (ft.Float8CurrentScalingQuantizer() if current
         else ft.Float8Quantizer(torch.ones(1, device=dev)))
    expect_clear_error("Quantizer", q, torch.zeros(4, 4, dtype=dtype, device=dev))


# ------------------------------------------------------ Float8Tensor(...) ---

@prop(max_examples=40, b=arrays(shapes(min_dims=1), st.integers(0, 255)), fmt=fp8_names,
      scale_inv=any_scale, dtype=hp_names, which=st.sampled_from(["data", "columnwise", "both"]))
def check_float8_tensor_construction(device, b, fmt, scale_inv, dtype, which):
    dev = device_or_skip(device)
    b = b.astype(np.uint8)
    sinv = torch.tensor([scale_inv], dtype=torch.float32, device=dev)
    data = fp8_tensor(b, fmt, dev) if which != "columnwise" else None
    cw = fp8_tensor(ref.columnwise_bits(b), fmt, dev) if which != "data" else None
    f8 = ft.Float8Tensor(data, sinv, dtype=HP[dtype], columnwise_data=cw, shape=b.shape)
    assert tuple(f8.shape) == b.shape and f8.dtype == HP[dtype] and f8.fp8_dtype == fmt
    want = ref.dequantize(b, fmt, scale_inv, dtype).astype(np.float32)
    ref.assert_floats_equal(values(f8.dequantize()), want, "Float8Tensor.dequantize()")
    # Asking for the other layout derives it from the held one.
    f8.update_usage(rowwise=True, columnwise=True)
    ref.assert_bits_equal(bits(f8.rowwise_data), b, "derived rowwise data")
    ref.assert_bits_equal(bits(f8.columnwise_data), ref.columnwise_bits(b),
                          "derived columnwise data")


@prop(max_examples=40, case=st.sampled_from(
    ["none", "hp_data", "mixed_fp8", "sinv_dtype", "sinv_numel", "dtype", "shape",
     "columnwise_shape", "non_contiguous", "non_contiguous_columnwise", "list_data"]))
def check_float8_tensor_construction_rejects(device, case):
    dev = device_or_skip(device)
    e4 = (lambda *s: torch.zeros(s, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn))
    sinv = torch.ones(1, device=dev)
    args = dict(data=e4(4, 8), scale_inv=sinv, dtype=torch.float32, columnwise_data=None,
                shape=None)
    args.update({
        "none": dict(data=None),
        "hp_data": dict(data=torch.zeros(4, 8, device=dev)),
        "mixed_fp8": dict(columnwise_data=e4(8, 4).view(torch.uint8).view(torch.float8_e5m2)),
        "sinv_dtype": dict(scale_inv=sinv.double()),
        "sinv_numel": dict(scale_inv=torch.ones(2, device=dev)),
        "dtype": dict(dtype=torch.int32),
        "shape": dict(shape=(8, 4)),
        "columnwise_shape": dict(columnwise_data=e4(4, 8)),
        "non_contiguous": dict(data=e4(8, 4).t()),
        "non_contiguous_columnwise": dict(columnwise_data=e4(4, 8).t()),
        "list_data": dict(data=[[0]]),
    }[case])
    data = args.pop("data")
    sinv_arg = args.pop("scale_inv")
    expect_clear_error("fp8kit.torch.Float8Tensor", ft.Float8Tensor, data, sinv_arg, **args)
