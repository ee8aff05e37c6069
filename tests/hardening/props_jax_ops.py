"""Properties of fp8kit.jax's functions (amax, quantize,
quantize_current_scaling, compute_scale, dequantize,
delayed_scaling_update, gemm) and of ScaledTensor: eagerly and under jit,
on any dtype, shape (0-size included), layout and value, the result is the
reference's - bit for bit where the contract is exact - or the call raises
a clear error in Python naming the function. Run in a child process by
test_jax_properties.py."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

import fp8_reference as ref
import fp8kit.jax as fj
from fp8_strategies import (any_scale, arrays, delayed_states, fp8_names, gemm_problems,
                            hp_names, laid_out, prop, shapes)
from fp8kit.recipe import AmaxReduction
from jax_support import (FP8, HP, device_or_skip, expect_clear_error, fp8_array, layout_op,
                         logical_values, np_bits, source)



def _apply(fn, x, jit: bool):
    return jax.jit(fn)(x) if jit else fn(x)


def _check_quantized(st_, x, scale, fmt, rowwise, columnwise, what):
    want = ref.quantize_bits(x, scale, fmt)
    if rowwise:
        assert st_.data is not None and st_.data.dtype == FP8[fmt]
        ref.assert_bits_equal(np_bits(st_.data), want, f"{what} rowwise", x)
    else:
        assert st_.data is None, f"{what}: rowwise data returned though not asked for"
    if columnwise:
        assert st_.columnwise_data is not None
        ref.assert_bits_equal(np_bits(st_.columnwise_data), ref.columnwise_bits(want),
                              f"{what} columnwise")
    else:
        assert st_.columnwise_data is None


# ------------------------------------------------------------------ amax ---

@prop(x=laid_out(), dtype=hp_names, jit=st.booleans())
def check_amax(device, x, dtype, jit):
    dev = device_or_skip(device)
    shape, layout, src = x
    view = layout_op(layout, shape)
    got = _apply(lambda a: fj.amax(view(a)), source(src, dtype, dev), jit)
    assert got.dtype == jnp.float32 and got.shape == ()
    ref.assert_floats_equal(np.asarray(got), ref.amax(logical_values(src, layout, shape, dtype)),
                            "amax")


@prop(max_examples=10, dtype=st.sampled_from([jnp.float64, jnp.int32, jnp.bool_, jnp.uint8,
                                              jnp.float8_e4m3fn, jnp.complex64]))
def check_amax_rejects_other_dtypes(device, dtype):
    device_or_skip(device)
    x = np.zeros((4, 4), dtype=jnp.dtype(dtype))
    expect_clear_error("fp8kit.jax.amax", fj.amax, x)


# -------------------------------------------------------------- quantize ---

copies = st.sampled_from([(True, False), (False, True), (True, True)])


@prop(max_examples=50, x=laid_out(), dtype=hp_names, fmt=fp8_names, scale=any_scale,
      usage=copies, scale_shape=st.sampled_from([(), (1,)]), jit=st.booleans())
def check_quantize(device, x, dtype, fmt, scale, usage, scale_shape, jit):
    dev = device_or_skip(device)
    shape, layout, src = x
    view = layout_op(layout, shape)
    s = jax.device_put(jnp.full(scale_shape, scale, jnp.float32), dev)
    st_ = _apply(lambda a: fj.quantize(view(a), s, fmt, *usage), source(src, dtype, dev), jit)
    xv = logical_values(src, layout, shape, dtype)
    _check_quantized(st_, xv, scale, fmt, *usage, "quantize")
    ref.assert_floats_equal(np.asarray(st_.scale_inv), ref.scale_inv_for_given(scale),
                            "scale_inv")
    ref.assert_floats_equal(np.asarray(st_.amax), ref.amax(xv), "amax")


@prop(max_examples=30, case=st.sampled_from(
    ["fp8_dtype", "no_copy", "x_dtype", "scale_f64", "scale_python", "scale_shape", "x_rank9"]))
def check_quantize_rejects(device, case):
    device_or_skip(device)
    args = dict(x=jnp.ones((4, 4)), scale=jnp.float32(1), fp8_dtype="e4m3", rowwise=True,
                columnwise=False)
    args.update({"fp8_dtype": dict(fp8_dtype="e4m3fnuz"),
                 "no_copy": dict(rowwise=False, columnwise=False),
                 "x_dtype": dict(x=np.ones((4, 4), np.float64)),
                 "scale_f64": dict(scale=np.float64(1)),
                 "scale_python": dict(scale=1.0),
                 "scale_shape": dict(scale=jnp.ones(2, jnp.float32)),
                 "x_rank9": dict(x=jnp.ones((1,) * 9))}[case])
    expect_clear_error("fp8kit.jax.quantize", fj.quantize, **args)


epsilons = st.sampled_from([0.0, 1e-45, 1e-12, 1.0, 448.0, 1e30])


@prop(max_examples=60, x=laid_out(), dtype=hp_names, fmt=fp8_names, eps=epsilons,
      pow2=st.booleans(), usage=copies, jit=st.booleans())
def check_quantize_current_scaling(device, x, dtype, fmt, eps, pow2, usage, jit):
    dev = device_or_skip(device)
    shape, layout, src = x
    view = layout_op(layout, shape)
    st_, scale = _apply(lambda a: fj.quantize_current_scaling(view(a), fmt, *usage, eps, pow2),
                        source(src, dtype, dev), jit)
    xv = logical_values(src, layout, shape, dtype)
    want_scale = ref.current_scale(ref.amax(xv), fmt, eps, pow2)
    ref.assert_floats_equal(np.asarray(scale), want_scale, "scale")
    ref.assert_floats_equal(np.asarray(st_.scale_inv), ref.reciprocal(want_scale), "scale_inv")
    ref.assert_floats_equal(np.asarray(st_.amax), ref.amax(xv), "amax")
    _check_quantized(st_, xv, want_scale, fmt, *usage, "quantize_current_scaling")


amaxes = st.one_of(st.sampled_from([0.0, -0.0, -1.0, 1e-45, 1e-40, 1.2e-38, 1e-30, 1.0, 448.0,
                                    3.4e38, float("inf"), float("-inf"), float("nan")]),
                   st.floats(width=32))


@prop(max_examples=60, amax=amaxes, fmt=fp8_names, eps=epsilons, pow2=st.booleans(),
      jit=st.booleans())
def check_compute_scale(device, amax, fmt, eps, pow2, jit):
    dev = device_or_skip(device)
    a = jax.device_put(jnp.float32(amax), dev)
    scale, scale_inv = _apply(lambda v: fj.compute_scale(v, fmt, eps, pow2), a, jit)
    want = ref.current_scale(amax, fmt, eps, pow2)
    ref.assert_floats_equal(np.asarray(scale), want, "scale")
    ref.assert_floats_equal(np.asarray(scale_inv), ref.reciprocal(want), "scale_inv")


@prop(max_examples=20, fn=st.sampled_from(["compute_scale", "quantize_current_scaling"]),
      eps=st.sampled_from([-1.0, float("nan"), float("inf"), "0.1", True]))
def check_bad_epsilon_rejected(device, fn, eps):
    device_or_skip(device)
    if fn == "compute_scale":
        expect_clear_error("fp8kit.jax.compute_scale", fj.compute_scale, jnp.float32(1.0),
                           "e4m3", eps)
    else:
        expect_clear_error("fp8kit.jax.quantize_current_scaling", fj.quantize_current_scaling,
                           jnp.ones((4, 4)), "e4m3", True, False, eps)


# ------------------------------------------------------------ dequantize ---

@prop(max_examples=60, b=arrays(shapes(), st.integers(0, 255)), fmt=fp8_names,
      scale_inv=any_scale, out=hp_names, from_columnwise=st.booleans(), jit=st.booleans())
def check_dequantize(device, b, fmt, scale_inv, out, from_columnwise, jit):
    dev = device_or_skip(device)
    b = b.astype(np.uint8)
    sinv = jax.device_put(jnp.float32(scale_inv), dev)
    if from_columnwise:
        st_ = fj.ScaledTensor(data=None, columnwise_data=fp8_array(ref.columnwise_bits(b), fmt,
                                                                   dev),
                              scale_inv=sinv, fp8_dtype=fmt)
        want = ref.dequantize(b.reshape(ref.view_2d(b.shape)), fmt, scale_inv, out)
    else:
        st_ = fj.ScaledTensor(data=fp8_array(b, fmt, dev), scale_inv=sinv, fp8_dtype=fmt)
        want = ref.dequantize(b, fmt, scale_inv, out)
    got = _apply(lambda t: fj.dequantize(t, HP[out], from_columnwise), st_, jit)
    assert got.dtype == HP[out] and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    ref.assert_floats_equal(np.asarray(got).astype(np.float32), want.astype(np.float32),
                            "dequantize")


@prop(max_examples=30, case=st.sampled_from(
    ["dtype_f64", "dtype_none", "not_scaled", "no_columnwise", "sinv_f16", "sinv_shape"]))
def check_dequantize_rejects(device, case):
    device_or_skip(device)
    data = jnp.zeros((4, 8), jnp.float8_e4m3fn)
    good = fj.ScaledTensor(data=data, scale_inv=jnp.float32(1))
    if case == "sinv_f16":  # refused where it is made, before any dequantize
        expect_clear_error("ScaledTensor", fj.ScaledTensor, data=data, scale_inv=jnp.float16(1))
        return
    args = dict(st=good, dtype=jnp.float32, from_columnwise=False)
    if case == "sinv_shape":  # a ScaledTensor may hold it; dequantize refuses it
        args.update(st=fj.ScaledTensor(data=data, scale_inv=jnp.ones(3, jnp.float32)))
        expect_clear_error("fp8kit.jax.dequantize", fj.dequantize, **args)
        return
    args.update({"dtype_f64": dict(dtype=jnp.float64),
                 "dtype_none": dict(dtype=None),
                 "not_scaled": dict(st=data),
                 "no_columnwise": dict(from_columnwise=True)}[case])
    expect_clear_error("fp8kit.jax.dequantize", fj.dequantize, **args)


# ------------------------------------------------ delayed_scaling_update ---

@prop(max_examples=60, s=delayed_states(), margin=st.integers(0, 20),
      reduction=st.sampled_from(list(AmaxReduction)), jit=st.booleans())
def check_delayed_scaling_update(device, s, margin, reduction, jit):
    dev = device_or_skip(device)
    hist, new_amax, scale, fmts = s
    put = (lambda a: jax.device_put(jnp.asarray(a, jnp.float32), dev))
    call = (lambda h, a, sc: fj.delayed_scaling_update(h, a, sc, fmts, margin, reduction))
    h, sc, si = jax.jit(call)(put(hist), put(new_amax), put(scale)) if jit else call(
        put(hist), put(new_amax), put(scale))
    want_h, want_s, want_si = ref.delayed_update(hist, new_amax, scale, fmts, margin,
                                                 reduction.value)
    ref.assert_floats_equal(np.asarray(h), want_h, "history")
    ref.assert_floats_equal(np.asarray(sc), want_s, "scale")
    ref.assert_floats_equal(np.asarray(si), want_si, "scale_inv")


@prop(max_examples=30, case=st.sampled_from(
    ["margin_negative", "margin_bool", "margin_float", "reduction_str", "history_f16",
     "history_rank", "amax_shape", "fmt", "fmt_count"]))
def check_delayed_scaling_update_rejects(device, case):
    device_or_skip(device)
    args = dict(amax_history=jnp.zeros((2, 4)), amax=jnp.ones(2), scale=jnp.ones(2),
                fp8_dtypes=["e4m3", "e5m2"], margin=0, amax_reduction=AmaxReduction.MAX)
    args.update({"margin_negative": dict(margin=-1), "margin_bool": dict(margin=True),
                 "margin_float": dict(margin=1.0), "reduction_str": dict(amax_reduction="avg"),
                 "history_f16": dict(amax_history=jnp.zeros((2, 4), jnp.float16)),
                 "history_rank": dict(amax_history=jnp.zeros(4)),
                 "amax_shape": dict(amax=jnp.ones(3)), "fmt": dict(fp8_dtypes=["e4m3", "x"]),
                 "fmt_count": dict(fp8_dtypes=["e4m3"])}[case])
    expect_clear_error("fp8kit.jax.delayed_scaling_update", fj.delayed_scaling_update, **args)


# ------------------------------------------------------------------ gemm ---

@prop(max_examples=60, p=gemm_problems(token_counts=(1, 2, 5, 16, 33)), split=st.booleans(),
      jit=st.booleans())
def check_gemm(device, p, split, jit):
    dev = device_or_skip(device)
    operand = (lambda b, fmt, s: fj.ScaledTensor(
        data=fp8_array(b, fmt, dev), columnwise_data=fp8_array(ref.columnwise_bits(b), fmt, dev),
        scale_inv=jax.device_put(jnp.float32(s), dev), fp8_dtype=fmt))
    a, b = operand(p["a"], p["fa"], p["sa"]), operand(p["b"], p["fb"], p["sb"])
    bias = None
    if p["bias"] is not None:
        bias_dtype = jnp.float16 if p["out"] == "float16" else jnp.bfloat16
        bias = jax.device_put(jnp.asarray(p["bias"]).astype(bias_dtype), dev)
    want, bound = ref.gemm_reference(p, device,
                                     None if bias is None else np.asarray(bias, np.float64))
    call = (lambda a_, b_, bias_: fj.gemm(a_, b_, p["trans_a"], p["trans_b"], HP[p["out"]], bias_,
                                          split, device=dev))
    d = jax.jit(call)(a, b, bias) if jit else call(a, b, bias)
    assert d.dtype == HP[p["out"]] and d.shape == (p["m"], p["n"])
    got = np.asarray(d).astype(np.float64)
    # Past the output type's range the result is +-inf, as a rounding gives.
    ref.assert_result_close(got, want, bound, p["out"], "gemm")


@prop(max_examples=40, case=st.sampled_from(
    ["k_not_multiple", "k_mismatch", "n_bytes", "both_e5m2", "not_scaled", "out_dtype_none",
     "out_dtype_str", "out_dtype_f64", "bias_list", "bias_shape", "bias_dtype", "sinv_dtype",
     "sinv_shape", "missing_columnwise", "rank3_b"]))
def check_gemm_rejects(device, case):
    device_or_skip(device)
    st_ = (lambda shape, fmt="e4m3", sinv=jnp.float32(1), cw=False: fj.ScaledTensor(
        data=jnp.zeros(shape, FP8[fmt]), scale_inv=sinv, fp8_dtype=fmt,
        columnwise_data=jnp.zeros(ref.columnwise_shape(shape), FP8[fmt]) if cw else None))
    if case == "sinv_dtype":  # refused where it is made, before any gemm
        expect_clear_error("ScaledTensor", st_, (16, 32), sinv=jnp.float16(1))
        return
    args = dict(a=st_((16, 32)), b=st_((16, 32)), trans_a=False, trans_b=True,
                out_dtype=jnp.bfloat16, bias=None)
    args.update({
        "k_not_multiple": dict(a=st_((16, 24)), b=st_((16, 24))),
        "k_mismatch": dict(b=st_((16, 48))),
        "n_bytes": dict(b=st_((12, 32))),
        "both_e5m2": dict(a=st_((16, 32), "e5m2"), b=st_((16, 32), "e5m2")),
        "not_scaled": dict(a=jnp.zeros((16, 32), jnp.float8_e4m3fn)),
        "out_dtype_none": dict(out_dtype=None),
        "out_dtype_str": dict(out_dtype="bf16"),
        "out_dtype_f64": dict(out_dtype=jnp.float64),
        "bias_list": dict(bias=[0.0] * 16),
        "bias_shape": dict(bias=jnp.zeros(3, jnp.bfloat16)),
        "bias_dtype": dict(bias=jnp.zeros(16, jnp.float64)),
        "missing_columnwise": dict(trans_a=True, a=st_((32, 16))),
        "rank3_b": dict(b=st_((2, 16, 32))),
        "sinv_shape": dict(a=st_((16, 32), sinv=jnp.ones(4, jnp.float32))),
    }[case])
    expect_clear_error("fp8kit.jax.gemm", fj.gemm, **args)


# ---------------------------------------------------------- ScaledTensor ---

@prop(max_examples=30, shape=shapes(min_dims=1), fmt=fp8_names,
      which=st.sampled_from(["data", "columnwise", "both"]))
def check_scaled_tensor(device, shape, fmt, which):
    dev = device_or_skip(device)
    b = np.arange(int(np.prod(shape)), dtype=np.uint8).reshape(shape) & np.uint8(0x77)
    data = fp8_array(b, fmt, dev) if which != "columnwise" else None
    cw = fp8_array(ref.columnwise_bits(b), fmt, dev) if which != "data" else None
    t = fj.ScaledTensor(data=data, scale_inv=jnp.float32(1), columnwise_data=cw)
    assert t.fp8_dtype == fmt and t.dtype == FP8[fmt]
    want_shape = tuple(shape) if data is not None else ref.view_2d(shape)
    assert t.shape == want_shape and t.ndim == len(want_shape)
    two = t.as_2d()
    assert two.shape == ref.view_2d(shape)
    if data is not None:
        ref.assert_bits_equal(np_bits(two.data), b.reshape(ref.view_2d(shape)), "as_2d")
    # A pytree: flattening and rebuilding keeps everything.
    leaves, tree = jax.tree_util.tree_flatten(t)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert again.fp8_dtype == fmt and again.shape == t.shape


@prop(max_examples=20, case=st.sampled_from(
    ["mixed_fp8", "fmt_mismatch", "fmt_unknown", "no_fmt", "hp_data"]))
def check_scaled_tensor_rejects(device, case):
    device_or_skip(device)
    e4 = jnp.zeros((4, 8), jnp.float8_e4m3fn)
    args = dict(data=e4, scale_inv=jnp.float32(1))
    args.update({"mixed_fp8": dict(columnwise_data=jnp.zeros((8, 4), jnp.float8_e5m2)),
                 "fmt_mismatch": dict(fp8_dtype="e5m2"),
                 "fmt_unknown": dict(fp8_dtype="e4m3fnuz"),
                 "no_fmt": dict(data=None, columnwise_data=None),
                 "hp_data": dict(data=jnp.zeros((4, 8)))}[case])
    expect_clear_error("ScaledTensor", fj.ScaledTensor, **args)
