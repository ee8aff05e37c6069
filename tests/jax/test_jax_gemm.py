"""fp8kit.jax.gemm against a float64 NumPy product of the dequantized
operands. The FP8 operands are built with ml_dtypes (independent of
fp8kit's quantizer), their columnwise data by NumPy transposes."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8kit.jax as fj
from jax_gpus import gpus
from fp8kit.jax._ffi import GemmLayout, gemm_call

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def _operand(rng, shape, fmt, scale_inv, columnwise=True):
    """A ScaledTensor of random FP8 values (both layouts) and its float64 value."""
    q = (rng.standard_normal(shape) * 4).astype(FP8[fmt])
    st = fj.ScaledTensor(data=jnp.asarray(q), scale_inv=jnp.float32(scale_inv),
                         columnwise_data=jnp.asarray(q.T.copy()) if columnwise else None,
                         fp8_dtype=fmt)
    return st, q.astype(np.float64) * scale_inv


def _tolerance(a64, b64, out_dtype):
    # fp32 accumulation error bound ~ K * eps32 * sum|a||b|, plus one rounding
    # of the output.
    k = a64.shape[1]
    mag = np.abs(a64) @ np.abs(b64)
    eps_out = {jnp.float32: 2.0**-24, jnp.bfloat16: 2.0**-8, jnp.float16: 2.0**-11}[out_dtype]
    return k * 2.0**-24 * mag + eps_out * mag + 1e-30


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("fmts", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_layouts_and_formats(trans_a, trans_b, fmts):
    rng = np.random.default_rng(0)
    m, k, n = 24, 48, 40
    a, a64 = _operand(rng, (k, m) if trans_a else (m, k), fmts[0], 0.25)
    b, b64 = _operand(rng, (n, k) if trans_b else (k, n), fmts[1], 3.0)
    d = jax.jit(lambda a, b: fj.gemm(a, b, trans_a, trans_b, out_dtype=jnp.float32))(a, b)
    ref = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    assert d.shape == (m, n) and d.dtype == jnp.float32
    np.testing.assert_array_less(np.abs(np.asarray(d, np.float64) - ref),
                                 _tolerance(a64.T if trans_a else a64, b64.T if trans_b else b64,
                                            jnp.float32))


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_output_dtypes_and_bias(out_dtype):
    rng = np.random.default_rng(1)
    m, k, n = 16, 32, 64
    a, a64 = _operand(rng, (m, k), "e4m3", 0.5)
    b, b64 = _operand(rng, (n, k), "e4m3", 0.125)
    bias_dtype = jnp.float16 if out_dtype == jnp.float16 else jnp.bfloat16
    bias = jnp.asarray(rng.standard_normal(n), bias_dtype)
    d = jax.jit(lambda a, b, c: fj.gemm(a, b, trans_b=True, out_dtype=out_dtype, bias=c))(
        a, b, bias)
    assert d.dtype == out_dtype
    ref = a64 @ b64.T + np.asarray(bias, np.float64)
    tol = _tolerance(a64, b64.T, out_dtype) + np.abs(ref) * 2.0**-8
    np.testing.assert_array_less(np.abs(np.asarray(d, np.float64) - ref), tol)


def test_leading_dims_of_a_are_kept():
    rng = np.random.default_rng(2)
    q = (rng.standard_normal((2, 3, 32)) * 2).astype(ml_dtypes.float8_e4m3fn)
    a = fj.ScaledTensor(data=jnp.asarray(q), scale_inv=jnp.float32(1.0), fp8_dtype="e4m3")
    b, b64 = _operand(rng, (16, 32), "e4m3", 1.0)
    d = fj.gemm(a, b, trans_b=True, out_dtype=jnp.float32)
    assert d.shape == (2, 3, 16)
    np.testing.assert_allclose(np.asarray(d), q.astype(np.float64) @ b64.T, rtol=1e-6, atol=1e-6)


def test_hlo_is_one_fp8kit_custom_call_without_dot():
    rng = np.random.default_rng(3)
    a, _ = _operand(rng, (16, 32), "e4m3", 1.0)
    b, _ = _operand(rng, (32, 16), "e4m3", 1.0)
    hlo = jax.jit(lambda a, b: fj.gemm(a, b)).lower(a, b).as_text()
    assert "fp8kit_gemm" in hlo
    assert "dot_general" not in hlo and "stablehlo.dot" not in hlo


def test_cpu_is_tn_only_and_missing_layout_is_named():
    assert fj.supports_non_tn_fp8_gemm(jax.devices("cpu")[0]) is False
    rng = np.random.default_rng(4)
    a, _ = _operand(rng, (16, 32), "e4m3", 1.0, columnwise=False)
    b, _ = _operand(rng, (32, 16), "e4m3", 1.0, columnwise=False)
    # B [K,N] with trans_b=False is read from its columnwise copy on a TN-only device.
    with pytest.raises(ValueError, match=r"operand b .*columnwise=True"):
        fj.gemm(a, b)
    # A [K,M] with trans_a=True likewise.
    with pytest.raises(ValueError, match=r"operand a .*columnwise=True"):
        fj.gemm(a.rowwise_only(), b.rowwise_only(), trans_a=True, trans_b=True)
    # A columnwise-only operand that is read rowwise is named too.
    a_col_only = fj.ScaledTensor(None, a.scale_inv, a.data.T, fp8_dtype="e4m3")
    bt, _ = _operand(rng, (16, 32), "e4m3", 1.0, columnwise=False)
    with pytest.raises(ValueError, match=r"operand a .*rowwise=True"):
        fj.gemm(a_col_only, bt, trans_b=True)


def test_core_refuses_a_non_tn_layout_with_an_error_not_a_crash():
    # Force the non-TN path past the Python layer: the core's CPU reference
    # must refuse it with its own message, through the FFI error path.
    rng = np.random.default_rng(5)
    a, _ = _operand(rng, (16, 32), "e4m3", 1.0, columnwise=False)
    b, _ = _operand(rng, (32, 16), "e4m3", 1.0, columnwise=False)
    # B [K,N] passed rowwise with trans_b=False: a non-TN read, which the CPU refuses.
    layout = GemmLayout(trans_a=False, trans_b=False, a_rowwise=True, b_rowwise=True,
                        out_dtype=jnp.dtype(jnp.bfloat16), has_bias=False,
                        use_split_accumulator=True)
    with pytest.raises(Exception, match=r"(?i)columnwise"):
        jax.block_until_ready(gemm_call(layout, a.data, a.scale_inv, b.data, b.scale_inv))


def test_argument_errors():
    rng = np.random.default_rng(6)
    a, _ = _operand(rng, (16, 32), "e4m3", 1.0)
    b, _ = _operand(rng, (32, 16), "e4m3", 1.0)
    with pytest.raises(TypeError, match="must be an fp8kit.jax.ScaledTensor"):
        fj.gemm(jnp.zeros((16, 32)), b)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        fj.gemm(a, b, trans_b=True)
    a20, _ = _operand(rng, (16, 24), "e4m3", 1.0)
    b20, _ = _operand(rng, (24, 16), "e4m3", 1.0)
    with pytest.raises(ValueError, match="K=24 must be a positive multiple of 16"):
        fj.gemm(a20, b20)
    b_n4, _ = _operand(rng, (32, 4), "e4m3", 1.0)
    with pytest.raises(ValueError, match="N=4 .*multiple of 16 bytes"):
        fj.gemm(a, b_n4)
    a5, _ = _operand(rng, (16, 32), "e5m2", 1.0)
    b5, _ = _operand(rng, (32, 16), "e5m2", 1.0)
    with pytest.raises(TypeError, match="both e5m2"):
        fj.gemm(a5, b5)
    with pytest.raises(TypeError, match="out_dtype"):
        fj.gemm(a, b, out_dtype=jnp.int32)
    with pytest.raises(ValueError, match="bias must be bfloat16 of shape"):
        fj.gemm(a, b, bias=jnp.zeros((16,), jnp.float32))
    with pytest.raises(ValueError, match="bias must be bfloat16 of shape"):
        fj.gemm(a, b, bias=jnp.zeros((8,), jnp.bfloat16))


def test_abstract_evaluation():
    st = lambda shape, fmt: fj.ScaledTensor(  # noqa: E731
        jax.ShapeDtypeStruct(shape, FP8[fmt]), jax.ShapeDtypeStruct((), jnp.float32),
        jax.ShapeDtypeStruct(shape[::-1], FP8[fmt]), fp8_dtype=fmt)
    out = jax.eval_shape(lambda a, b: fj.gemm(a, b), st((256, 128), "e4m3"),
                         st((128, 64), "e5m2"))
    assert out.shape == (256, 64) and out.dtype == jnp.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False)])
@pytest.mark.parametrize("split", [True, False])
def test_gpu_matches_float64(trans_a, trans_b, split):
    gpu = gpus()[0]
    rng = np.random.default_rng(7)
    m, k, n = 256, 512, 384
    a, a64 = _operand(rng, (k, m) if trans_a else (m, k), "e4m3", 0.5)
    b, b64 = _operand(rng, (n, k) if trans_b else (k, n), "e5m2", 0.25)
    a, b = jax.device_put((a, b), gpu)
    d = jax.jit(lambda a, b: fj.gemm(a, b, trans_a, trans_b, out_dtype=jnp.float32,
                                     use_split_accumulator=split))(a, b)
    assert d.devices() == {gpu}
    a64 = a64.T if trans_a else a64
    b64 = b64.T if trans_b else b64
    ref = a64 @ b64
    # Hopper's FP8 tensor cores sum partial products in a ~13-bit
    # accumulator; the split accumulator promotes to fp32 only every few K
    # blocks (measured on an H200: errors up to ~2^-14 * sum |a||b| with
    # it), fast accumulation less often. A layout or scale bug gives errors
    # of order 1, far outside these bounds.
    scale = 2.0**-11 if split else 2.0**-8
    tol = scale * (np.abs(a64) @ np.abs(b64)) + 1e-6
    np.testing.assert_array_less(np.abs(np.asarray(d, np.float64) - ref), tol)
