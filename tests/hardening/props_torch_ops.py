"""Properties of fp8kit.torch's functional API (amax, quantize,
quantize_current_scaling, dequantize, columnwise_from_rowwise,
delayed_scaling_update, gemm): on
any dtype, shape (0-size included), memory layout and value (NaN, inf,
extreme scales), the result is the reference's - bit for bit where the
contract is exact - or the call raises a clear error naming the function.
Run in a child process by test_torch_properties.py."""

import numpy as np
import torch
from hypothesis import strategies as st

import fp8_reference as ref
from clear_errors import expect_clear_error
import fp8kit.torch as ft
from fp8_strategies import (any_scale, arrays, delayed_states, fp8_names, gemm_problems,
                            hp_names, laid_out, prop, shapes)
from torch_support import (HP, check_quantized, device_or_skip, fp8_tensor, laid_out_tensor,
                           scalar, values)

BAD_DTYPES = [torch.float64, torch.int32, torch.int64, torch.bool, torch.uint8,
              torch.float8_e4m3fn, torch.complex64]


# ------------------------------------------------------------------ amax ---

@prop(x=laid_out(), dtype=hp_names)
def check_amax(device, x, dtype):
    dev = device_or_skip(device)
    shape, layout, src = x
    t = laid_out_tensor(src, layout, shape, dtype, dev)
    got = ft.amax(t)
    assert got.dtype == torch.float32 and got.device == t.device and got.dim() == 0
    ref.assert_floats_equal(scalar(got), ref.amax(values(t)), "amax")


@prop(max_examples=15, bad=st.sampled_from(BAD_DTYPES), shape=shapes(max_dims=2))
def check_amax_rejects_other_dtypes(device, bad, shape):
    dev = device_or_skip(device)
    expect_clear_error("fp8kit.torch.amax", ft.amax, torch.zeros(shape, dtype=bad, device=dev))


def check_amax_rejects_non_tensors(device):
    device_or_skip(device)
    for v in ([1.0, 2.0], np.ones(3, np.float32), 3.0, None):
        expect_clear_error("fp8kit.torch.amax", ft.amax, v)


# -------------------------------------------------------------- quantize ---

scale_forms = st.sampled_from(["python", "tensor[1]", "tensor[]", "tensor[1,1]"])


def _scale_arg(scale: float, form: str, device):
    if form == "python":
        return scale
    shape = {"tensor[1]": (1,), "tensor[]": (), "tensor[1,1]": (1, 1)}[form]
    return torch.full(shape, scale, dtype=torch.float32, device=device)


@prop(max_examples=80, x=laid_out(), dtype=hp_names, fmt=fp8_names, scale=any_scale,
      form=scale_forms, copies=st.sampled_from([(True, False), (False, True), (True, True)]),
      with_amax=st.booleans())
def check_quantize(device, x, dtype, fmt, scale, form, copies, with_amax):
    dev = device_or_skip(device)
    shape, layout, src = x
    t = laid_out_tensor(src, layout, shape, dtype, dev)
    before = t.clone()
    amax_out = torch.full((1,), -1.0, device=dev) if with_amax else None
    rowwise, columnwise = copies
    data, columnwise_data, scale_inv = ft.quantize(t, _scale_arg(scale, form, dev), fmt,
                                                   rowwise, columnwise, amax_out)
    xv = values(t)
    check_quantized(data, columnwise_data, xv, scale, fmt, rowwise, columnwise, "quantize")
    ref.assert_floats_equal(scalar(scale_inv), ref.scale_inv_for_given(scale), "scale_inv")
    if with_amax:
        ref.assert_floats_equal(scalar(amax_out), ref.amax(xv), "amax_out")
    assert torch.equal(t.isnan(), before.isnan()) and torch.equal(
        t.nan_to_num(), before.nan_to_num()), "quantize modified its input"


@prop(max_examples=30, shape=shapes(max_dims=2), case=st.sampled_from(
    ["fp8_dtype", "fp8_dtype_none", "no_copy", "x_dtype", "scale_dtype", "scale_numel0",
     "scale_numel2", "scale_str", "amax_dtype", "amax_numel", "x_list"]))
def check_quantize_rejects(device, shape, case):
    dev = device_or_skip(device)
    x = torch.ones(shape, device=dev)
    one = torch.ones(1, device=dev)
    args = dict(x=x, scale=one, fp8_dtype="e4m3", rowwise=True, columnwise=False, amax_out=None)
    args.update({
        "fp8_dtype": dict(fp8_dtype="e4m3fn"),
        "fp8_dtype_none": dict(fp8_dtype=None),
        "no_copy": dict(rowwise=False, columnwise=False),
        "x_dtype": dict(x=x.double()),
        "scale_dtype": dict(scale=one.double()),
        "scale_numel0": dict(scale=one[:0]),
        "scale_numel2": dict(scale=torch.ones(2, device=dev)),
        "scale_str": dict(scale="1.0"),
        "amax_dtype": dict(amax_out=one.double()),
        "amax_numel": dict(amax_out=torch.zeros(2, device=dev)),
        "x_list": dict(x=[1.0]),
    }[case])
    expect_clear_error("fp8kit.torch.quantize", ft.quantize, **args)


# ------------------------------------------------------ current scaling ---

epsilons = st.one_of(st.sampled_from([0.0, 1e-45, 1e-12, 1.0, 448.0, 1e30]),
                     st.floats(0.0, 1e3, width=32))


@prop(max_examples=60, x=laid_out(), dtype=hp_names, fmt=fp8_names, eps=epsilons,
      pow2=st.booleans(), copies=st.sampled_from([(True, False), (False, True), (True, True)]))
def check_quantize_current_scaling(device, x, dtype, fmt, eps, pow2, copies):
    dev = device_or_skip(device)
    shape, layout, src = x
    t = laid_out_tensor(src, layout, shape, dtype, dev)
    rowwise, columnwise = copies
    data, columnwise_data, scale, scale_inv, amax = ft.quantize_current_scaling(
        t, fmt, rowwise, columnwise, eps, pow2)
    xv = values(t)
    want_amax = ref.amax(xv)
    want_scale = ref.current_scale(want_amax, fmt, eps, pow2)
    ref.assert_floats_equal(scalar(amax), want_amax, "amax")
    ref.assert_floats_equal(scalar(scale), want_scale, "scale")
    ref.assert_floats_equal(scalar(scale_inv), ref.reciprocal(want_scale), "scale_inv")
    check_quantized(data, columnwise_data, xv, want_scale, fmt, rowwise, columnwise,
                    "quantize_current_scaling")


@prop(max_examples=10, eps=st.sampled_from([-1.0, -1e-30, float("nan"), float("inf"),
                                            float("-inf")]))
def check_quantize_current_scaling_rejects_bad_epsilon(device, eps):
    dev = device_or_skip(device)
    expect_clear_error("fp8kit.torch.quantize_current_scaling", ft.quantize_current_scaling,
                       torch.ones(4, 4, device=dev), "e4m3", True, False, eps, False)


# ------------------------------------------------------------ dequantize ---

@st.composite
def fp8_arrays(draw, shape_strategy=None):
    shape = draw(shape_strategy if shape_strategy is not None else shapes())
    return draw(arrays(shape, st.integers(0, 255)).map(lambda a: a.astype(np.uint8)))


@prop(max_examples=60, b=fp8_arrays(), fmt=fp8_names, scale_inv=any_scale, out=hp_names,
      from_columnwise=st.booleans(), transposed_view=st.booleans())
def check_dequantize(device, b, fmt, scale_inv, out, from_columnwise, transposed_view):
    dev = device_or_skip(device)
    want = ref.dequantize(b, fmt, scale_inv, out)
    sinv = torch.tensor([scale_inv], dtype=torch.float32, device=dev)
    if from_columnwise:
        data = fp8_tensor(ref.columnwise_bits(b), fmt, dev)
        got = ft.dequantize(data, sinv, HP[out], True, b.shape)
    elif transposed_view and b.ndim >= 2:
        # A non-contiguous FP8 input: the transpose of a contiguous one.
        data = fp8_tensor(np.swapaxes(b, -1, -2), fmt, dev).transpose(-1, -2)
        got = ft.dequantize(data, sinv, HP[out])
    else:
        got = ft.dequantize(fp8_tensor(b, fmt, dev), sinv, HP[out])
    assert got.dtype == HP[out] and tuple(got.shape) == b.shape
    ref.assert_floats_equal(values(got), want.astype(np.float32), "dequantize")


@prop(max_examples=20, case=st.sampled_from(
    ["out_dtype_fp64", "out_dtype_str", "data_fp32", "data_uint8", "sinv_f64", "sinv_numel2",
     "columnwise_shape"]))
def check_dequantize_rejects(device, case):
    dev = device_or_skip(device)
    data = torch.zeros(4, 8, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    sinv = torch.ones(1, device=dev)
    args = dict(data=data, scale_inv=sinv, out_dtype=torch.float32, from_columnwise=False,
                shape=None)
    args.update({
        "out_dtype_fp64": dict(out_dtype=torch.float64),
        "out_dtype_str": dict(out_dtype="bfloat16"),
        "data_fp32": dict(data=torch.zeros(4, 8, device=dev)),
        "data_uint8": dict(data=torch.zeros(4, 8, dtype=torch.uint8, device=dev)),
        "sinv_f64": dict(scale_inv=sinv.double()),
        "sinv_numel2": dict(scale_inv=torch.ones(2, device=dev)),
        "columnwise_shape": dict(from_columnwise=True, shape=(3, 5)),
    }[case])
    expect_clear_error("fp8kit.torch.dequantize", ft.dequantize, **args)


# ----------------------------------------------- columnwise_from_rowwise ---

@prop(max_examples=40, b=fp8_arrays(), fmt=fp8_names, transposed_view=st.booleans())
def check_columnwise_from_rowwise(device, b, fmt, transposed_view):
    dev = device_or_skip(device)
    if transposed_view and b.ndim >= 2:
        data = fp8_tensor(np.swapaxes(b, -1, -2), fmt, dev).transpose(-1, -2)
    else:
        data = fp8_tensor(b, fmt, dev)
    got = ft.columnwise_from_rowwise(data)
    want = ref.columnwise_bits(b)
    assert got.dtype == data.dtype and got.device == data.device
    assert tuple(got.shape) == want.shape, (tuple(got.shape), want.shape)
    np.testing.assert_array_equal(got.view(torch.uint8).cpu().numpy(), want)


@prop(max_examples=10, case=st.sampled_from(["fp32", "uint8", "list", "none"]))
def check_columnwise_from_rowwise_rejects(device, case):
    dev = device_or_skip(device)
    data = {"fp32": lambda: torch.zeros(4, 8, device=dev),
            "uint8": lambda: torch.zeros(4, 8, dtype=torch.uint8, device=dev),
            "list": lambda: [1, 2], "none": lambda: None}[case]()
    expect_clear_error("fp8kit.torch.columnwise_from_rowwise", ft.columnwise_from_rowwise, data)


# ------------------------------------------------ delayed_scaling_update ---

@prop(max_examples=60, s=delayed_states(), margin=st.integers(0, 20),
      reduction=st.sampled_from(["max", "most_recent"]))
def check_delayed_scaling_update(device, s, margin, reduction):
    dev = device_or_skip(device)
    hist, new_amax, scale, fmts = s
    tt = (lambda a: torch.tensor(a, dtype=torch.float32, device=dev))
    histories = [tt(h) for h in hist]
    amaxes = [tt([a]) for a in new_amax]
    scales = [tt([v]) for v in scale]
    scale_invs = [torch.full((1,), -7.0, device=dev) for _ in scale]
    ft.delayed_scaling_update(histories, amaxes, scales, scale_invs, fmts, margin, reduction)
    want_h, want_s, want_si = ref.delayed_update(hist, new_amax, scale, fmts, margin, reduction)
    for i in range(len(fmts)):
        ref.assert_floats_equal(values(histories[i]), want_h[i], f"history[{i}]")
        ref.assert_floats_equal(scalar(scales[i]), want_s[i], f"scale[{i}]")
        ref.assert_floats_equal(scalar(scale_invs[i]), want_si[i], f"scale_inv[{i}]")


@prop(max_examples=30, case=st.sampled_from(
    ["margin_negative", "margin_bool", "margin_float", "reduction", "lengths", "history_dtype",
     "amax_numel", "fmt", "not_a_list"]))
def check_delayed_scaling_update_rejects(device, case):
    dev = device_or_skip(device)
    args = dict(amax_histories=[torch.zeros(4, device=dev)], amaxes=[torch.ones(1, device=dev)],
                scales=[torch.ones(1, device=dev)], scale_invs=[torch.ones(1, device=dev)],
                fp8_dtypes=["e4m3"], margin=0, amax_reduction="max")
    args.update({
        "margin_negative": dict(margin=-1),
        "margin_bool": dict(margin=True),
        "margin_float": dict(margin=1.5),
        "reduction": dict(amax_reduction="mean"),
        "lengths": dict(scales=[]),
        "history_dtype": dict(amax_histories=[torch.zeros(4, dtype=torch.float64, device=dev)]),
        "amax_numel": dict(amaxes=[torch.ones(2, device=dev)]),
        "fmt": dict(fp8_dtypes=["e3m4"]),
        "not_a_list": dict(amaxes=torch.ones(1, device=dev)),
    }[case])
    expect_clear_error("fp8kit.torch.delayed_scaling_update", ft.delayed_scaling_update, **args)


# ------------------------------------------------------------------ gemm ---

@prop(max_examples=60, p=gemm_problems())
def check_gemm(device, p):
    dev = device_or_skip(device)
    out = HP[p["out"]]
    a, b = fp8_tensor(p["a"], p["fa"], dev), fp8_tensor(p["b"], p["fb"], dev)
    a_cw = fp8_tensor(ref.columnwise_bits(p["a"]), p["fa"], dev)
    b_cw = fp8_tensor(ref.columnwise_bits(p["b"]), p["fb"], dev)
    sa = torch.tensor([p["sa"]], dtype=torch.float32, device=dev)
    sb = torch.tensor([p["sb"]], dtype=torch.float32, device=dev)
    bias = None
    if p["bias"] is not None:
        bias_dtype = torch.float16 if out == torch.float16 else torch.bfloat16
        bias = torch.from_numpy(p["bias"]).to(bias_dtype).to(dev)
    want, bound = ref.gemm_reference(p, device,
                                     None if bias is None else values(bias).astype(np.float64))
    d = ft.gemm(a, sa, a_cw, b, sb, b_cw, p["trans_a"], p["trans_b"], out, bias=bias)
    assert d.dtype == out and tuple(d.shape) == (p["m"], p["n"]), (d.dtype, tuple(d.shape))
    got = values(d).astype(np.float64)
    # Past the output type's range the result is +-inf, as a rounding gives.
    ref.assert_result_close(got, want, bound, p["out"], "gemm")


@prop(max_examples=40, case=st.sampled_from(
    ["k_not_multiple", "k_mismatch", "n_bytes", "both_e5m2", "hp_operand", "out_dtype_none",
     "out_dtype_str", "bias_list", "bias_shape", "sinv_dtype", "sinv_numel", "no_operand",
     "missing_columnwise", "accumulate_without_out", "rank3_b"]))
def check_gemm_rejects(device, case):
    dev = device_or_skip(device)
    e4 = (lambda *s: torch.zeros(s, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn))
    e5 = (lambda *s: torch.zeros(s, dtype=torch.uint8, device=dev).view(torch.float8_e5m2))
    one = torch.ones(1, device=dev)
    args = dict(a=e4(16, 32), a_scale_inv=one, a_columnwise=None, b=e4(16, 32), b_scale_inv=one,
                b_columnwise=None, trans_a=False, trans_b=True, out_dtype=torch.bfloat16)
    args.update({
        "k_not_multiple": dict(a=e4(16, 24), b=e4(16, 24)),
        "k_mismatch": dict(b=e4(16, 48)),
        "n_bytes": dict(b=e4(12, 32)),
        "both_e5m2": dict(a=e5(16, 32), b=e5(16, 32)),
        "hp_operand": dict(a=torch.zeros(16, 32, device=dev)),
        "out_dtype_none": dict(out_dtype=None),
        "out_dtype_str": dict(out_dtype="bf16"),
        "bias_list": dict(bias=[0.0] * 16),
        "bias_shape": dict(bias=torch.zeros(3, dtype=torch.bfloat16, device=dev)),
        "sinv_dtype": dict(a_scale_inv=one.double()),
        "sinv_numel": dict(a_scale_inv=torch.ones(2, device=dev)),
        "no_operand": dict(a=None),
        "missing_columnwise": dict(trans_a=True, a=e4(32, 16)),
        "accumulate_without_out": dict(accumulate=True),
        "rank3_b": dict(b=e4(2, 16, 32)),
    }[case])
    expect_clear_error("fp8kit.torch.gemm", ft.gemm, **args)
