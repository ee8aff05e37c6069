"""fp8kit.jax quantize / dequantize / current scaling / compute_scale against
independent NumPy + ml_dtypes references, bit for bit.

Reference quantization (fp8kit's documented contract, tests/fp8_reference.py):
y = x * scale as one float32 multiply, clipped to +-fp8_max where x is
finite (an infinite x gives NaN in E4M3, inf in E5M2), converted by
ml_dtypes (round to nearest even). NaN inputs give the canonical NaN byte
0x7F in both formats (the core's policy, what Hopper's cvt.satfinite
produces): non-NaN lanes are compared bit for bit, NaN lanes must be 0x7F.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8_reference as ref
import fp8kit.jax as fj
from jax_gpus import gpus

FP8, FP8_MAX = ref.ML_FP8, ref.FP8_MAX
F32 = np.float32


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def _assert_quantized_equal(got_bits, x, scale, fmt):
    want = ref.quantize_bits(x, scale, fmt)
    nan = np.isnan(np.asarray(x, np.float32))
    # NaN lanes: exactly 0x7F; the rest: bit for bit.
    assert np.all(got_bits[nan] == 0x7F), "NaN inputs must give the canonical 0x7F"
    mismatch = np.flatnonzero(got_bits.ravel() != want.ravel())
    assert mismatch.size == 0, (
        f"{mismatch.size} mismatches, first at x={np.asarray(x, np.float32).ravel()[mismatch[:5]]}"
        f" got {got_bits.ravel()[mismatch[:5]]} want {want.ravel()[mismatch[:5]]}")


_quantize_jit = jax.jit(fj.quantize, static_argnames=("fp8_dtype", "rowwise", "columnwise"))


# --- bit-exactness --------------------------------------------------------

ALL_BF16 = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 0.5, 3.0, 2.0**-10, 2.0**20, 1.0 / 3.0])
def test_every_bf16_bit_pattern(fmt, scale):
    x = ALL_BF16.reshape(256, 256)
    st = _quantize_jit(x, F32(scale), fp8_dtype=fmt, rowwise=True, columnwise=True)
    _assert_quantized_equal(_bits(st.data), x, scale, fmt)
    # The transposed copy is the same bytes, transposed.
    np.testing.assert_array_equal(_bits(st.columnwise_data), _bits(st.data).T)
    assert np.isnan(np.float32(st.amax))        # the patterns include NaN
    assert np.float32(st.scale_inv) == F32(1) / F32(scale)


def _random_f32(rng, n):
    mags = rng.uniform(-45, 20, n)                       # 2^-45 .. 2^20: denormals to overflow
    x = (rng.choice([-1.0, 1.0], n) * 2.0 ** mags).astype(np.float32)
    x[:64] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448.0, -448.0, 57344.0, 464.0,
              480.0, 61440.0, 1e-45, -1e-45, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17, 1.5 * 2.0**-9,
              3 * 2.0**-10, 2.0**-6, 2.0**-14, 0.0625, 0.09375, 240.0, 232.0, 248.0,
              *rng.standard_normal(37).astype(np.float32)]
    return x


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 2.0**-8, 0.37, 7.25, 2.0**12, 1e-30])
def test_random_float32(fmt, scale):
    x = _random_f32(np.random.default_rng(int(scale * 1000) % 997), 1 << 14).reshape(128, 128)
    st = _quantize_jit(x, F32(scale), fp8_dtype=fmt, rowwise=True, columnwise=True)
    _assert_quantized_equal(_bits(st.data), x, scale, fmt)
    np.testing.assert_array_equal(_bits(st.columnwise_data), _bits(st.data).T)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_float16_bit_pattern(fmt):
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(512, 128)
    st = _quantize_jit(x, F32(0.75), fp8_dtype=fmt, rowwise=True, columnwise=False)
    _assert_quantized_equal(_bits(st.data), x, 0.75, fmt)
    assert st.columnwise_data is None


def test_inf_is_not_saturated_zero_and_denormals_keep_sign():
    x = np.array([np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 2.0**-10, -(2.0**-10)], np.float32)
    for fmt in FP8:
        bits = _bits(fj.quantize(x, F32(1.0), fmt).data)
        mx = _bits(np.array([FP8_MAX[fmt]], FP8[fmt]))[0]
        assert list(bits[:2]) == ([0x7F, 0x7F] if fmt == "e4m3" else [0x7C, 0xFC])  # not mx
        assert bits[2] == 0x00 and bits[3] == 0x80
        assert bits[4] == 0x00 and bits[5] == 0x80       # float32 denormals round to +-0
    # +-2^-10: half of E4M3's smallest denormal step (a tie, to even: +-0), exact in E5M2.
    _assert_quantized_equal(_bits(fj.quantize(x, F32(1.0), "e4m3").data), x, 1.0, "e4m3")
    _assert_quantized_equal(_bits(fj.quantize(x, F32(1.0), "e5m2").data), x, 1.0, "e5m2")


# --- layouts, shapes, outputs --------------------------------------------------

@pytest.mark.parametrize("shape", [(), (5,), (3, 7), (2, 3, 5), (2, 1, 3, 4)])
def test_shapes_and_columnwise_layout(shape):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    st = fj.quantize(x, F32(2.0), "e4m3", rowwise=True, columnwise=True)
    assert st.shape == shape and st.data.shape == shape and st.data.dtype == jnp.float8_e4m3fn
    _assert_quantized_equal(_bits(st.data), x, 2.0, "e4m3")
    # The columnwise copy: the 2-D view [prod(leading), last], transposed.
    rows = _bits(st.data).reshape(-1, shape[-1] if shape else 1)
    assert st.columnwise_data.shape == rows.shape[::-1]
    np.testing.assert_array_equal(_bits(st.columnwise_data), rows.T)
    col_only = fj.quantize(x, F32(2.0), "e4m3", rowwise=False, columnwise=True)
    # Without the rowwise data only the 2-D view is known.
    assert col_only.data is None and col_only.shape == rows.shape
    np.testing.assert_array_equal(_bits(col_only.columnwise_data), _bits(st.columnwise_data))


@pytest.mark.parametrize("shape", [(0,), (0, 16), (4, 0), (2, 0, 3)])
def test_empty_tensors(shape):
    x = np.zeros(shape, np.float32)
    st = fj.quantize(x, F32(4.0), "e5m2", rowwise=True, columnwise=True)
    assert st.data.shape == shape and st.columnwise_data.size == 0
    assert float(st.amax) == 0.0 and float(st.scale_inv) == 0.25
    assert fj.dequantize(st, jnp.float32).shape == shape
    cur, scale = fj.quantize_current_scaling(x, "e4m3")
    assert float(scale) == 1.0 and float(cur.amax) == 0.0 and cur.data.shape == shape


def test_amax_and_scale_inv_outputs():
    x = np.array([[1.0, -7.5], [np.float32(3.0), 0.25]], np.float32)
    st = fj.quantize(x, np.array([3.0], np.float32), "e4m3")
    assert np.float32(st.amax) == F32(7.5)
    assert np.float32(st.scale_inv) == F32(1.0) / F32(3.0)
    x[0, 0] = np.nan
    assert np.isnan(np.float32(fj.quantize(x, F32(1.0), "e4m3").amax))


def test_fp8_dtype_spellings():
    x = np.ones((2, 16), np.float32)
    a = fj.quantize(x, F32(1), jnp.float8_e5m2)
    b = fj.quantize(x, F32(1), "e5m2")
    assert a.fp8_dtype == b.fp8_dtype == "e5m2" and a.data.dtype == jnp.float8_e5m2


# --- dequantize -----------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("out", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_dequantize_is_exact(fmt, out):
    # Every FP8 code (NaNs included) times a scale_inv, in float32, rounded once.
    codes = np.arange(256, dtype=np.uint8).view(FP8[fmt]).reshape(16, 16)
    for scale_inv in [1.0, 0.125, 1.0 / 3.0, 2.0**-20]:
        st = fj.ScaledTensor(data=jnp.asarray(codes), scale_inv=jnp.float32(scale_inv),
                             columnwise_data=jnp.asarray(codes.T.copy()), fp8_dtype=fmt)
        want = codes.astype(np.float32) * F32(scale_inv)
        want = want.astype(ml_dtypes.bfloat16 if out == jnp.bfloat16 else out)
        for from_col in (False, True):
            got = np.asarray(jax.jit(fj.dequantize, static_argnums=(1, 2))(st, out, from_col))
            assert got.dtype == want.dtype and got.shape == (16, 16)
            nan = np.isnan(want.astype(np.float32))
            assert np.all(np.isnan(got.astype(np.float32)[nan]))
            uint = {2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
            np.testing.assert_array_equal(got.view(uint)[~nan], want.view(uint)[~nan])


def test_dequantize_rank3_from_columnwise():
    x = np.random.default_rng(3).standard_normal((2, 3, 16)).astype(np.float32)
    st = fj.quantize(x, F32(8.0), "e4m3", rowwise=True, columnwise=True)
    a = fj.dequantize(st, jnp.float32)
    b = fj.dequantize(st, jnp.float32, from_columnwise=True)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(
        np.asarray(a), np.asarray(st.data).astype(np.float32) * F32(0.125))


# --- current scaling ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("eps,pow2", [(0.0, False), (0.0, True), (100.0, False), (1e-3, True)])
def test_current_scaling(fmt, eps, pow2):
    x = (np.random.default_rng(11).standard_normal((64, 48)) * 3).astype(ml_dtypes.bfloat16)
    st, scale = jax.jit(fj.quantize_current_scaling, static_argnums=(1, 2, 3, 4, 5))(
        x, fmt, True, True, eps, pow2)
    amax = np.abs(x.astype(np.float32)).max()
    assert np.float32(st.amax) == amax
    want_scale = ref.current_scale(amax, fmt, eps, pow2)
    assert np.float32(scale) == want_scale
    assert np.float32(st.scale_inv) == F32(1) / want_scale
    _assert_quantized_equal(_bits(st.data), x, want_scale, fmt)
    np.testing.assert_array_equal(_bits(st.columnwise_data), _bits(st.data).T)


@pytest.mark.parametrize("amax", [0.0, np.inf, np.nan, 1e-30, 5.0, 1e30, 3.0e-39])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_compute_scale_rule(amax, fmt):
    for eps, pow2 in [(0.0, False), (0.0, True), (1.0, False)]:
        scale, scale_inv = fj.compute_scale(F32(amax), fmt, eps, pow2)
        want = ref.current_scale(amax, fmt, eps, pow2)
        assert np.float32(scale) == want, (amax, eps, pow2)
        assert np.float32(scale_inv) == F32(1) / want


def test_current_scaling_of_zeros_and_nan():
    st, scale = fj.quantize_current_scaling(np.zeros((4, 16), np.float32), "e4m3")
    assert float(scale) == 1.0 and not np.asarray(st.data).view(np.uint8).any()
    x = np.ones((4, 16), np.float32)
    x[1, 1] = np.nan
    st, scale = fj.quantize_current_scaling(x, "e4m3")
    assert float(scale) == 1.0 and np.isnan(np.float32(st.amax))
    assert _bits(st.data)[1, 1] == 0x7F


# --- transformations ----------------------------------------------------------------

def test_vmap_is_per_example_and_eval_shape_needs_no_device():
    x = np.random.default_rng(5).standard_normal((3, 8, 16)).astype(np.float32)
    x[1] *= 100
    st, scale = jax.vmap(lambda t: fj.quantize_current_scaling(t, "e4m3", columnwise=True))(x)
    assert st.data.shape == (3, 8, 16) and st.columnwise_data.shape == (3, 16, 8)
    for i in range(3):
        one, s1 = fj.quantize_current_scaling(x[i], "e4m3", columnwise=True)
        assert np.float32(scale[i]) == np.float32(s1)
        np.testing.assert_array_equal(_bits(st.data[i]), _bits(one.data))
        np.testing.assert_array_equal(_bits(st.columnwise_data[i]), _bits(one.columnwise_data))
    shapes = jax.eval_shape(lambda t: fj.quantize(t, F32(1), "e5m2", columnwise=True),
                            jax.ShapeDtypeStruct((4, 6, 32), jnp.bfloat16))
    assert shapes.data.shape == (4, 6, 32) and shapes.data.dtype == jnp.float8_e5m2
    assert shapes.columnwise_data.shape == (32, 24) and shapes.scale_inv.shape == ()


def test_hlo_shows_the_fp8kit_custom_calls():
    f = jax.jit(lambda x: fj.dequantize(fj.quantize(x, F32(2.0), "e4m3"), jnp.bfloat16))
    hlo = f.lower(jnp.ones((16, 16), jnp.bfloat16)).as_text()
    assert "fp8kit_quantize" in hlo and "fp8kit_dequantize" in hlo


# --- errors -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint8, ml_dtypes.float8_e4m3fn])
def test_bad_input_dtype(dtype):
    with pytest.raises(TypeError, match=r"fp8kit.jax.quantize: x has dtype .*astype"):
        fj.quantize(np.zeros((2, 2), dtype), F32(1.0), "e4m3")
    with pytest.raises(TypeError, match=r"fp8kit.jax.quantize_current_scaling: x has dtype"):
        fj.quantize_current_scaling(np.zeros((2, 2), dtype), "e4m3")


def test_other_argument_errors():
    x = np.ones((4, 16), np.float32)
    with pytest.raises(TypeError, match="fp8_dtype='e3m4' is not an FP8 format"):
        fj.quantize(x, F32(1.0), "e3m4")
    with pytest.raises(TypeError, match="not an FP8 format"):
        fj.quantize(x, F32(1.0), jnp.bfloat16)
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        fj.quantize(x, F32(1.0), "e4m3", rowwise=False, columnwise=False)
    with pytest.raises(TypeError, match="scale has dtype float64"):
        fj.quantize(x, np.float64(1.0), "e4m3")
    with pytest.raises(ValueError, match=r"scale has shape \(2,\)"):
        fj.quantize(x, np.ones(2, np.float32), "e4m3")
    with pytest.raises(ValueError, match="amax_epsilon must be >= 0"):
        fj.quantize_current_scaling(x, "e4m3", amax_epsilon=-1.0)
    st = fj.quantize(x, F32(1.0), "e4m3")
    with pytest.raises(ValueError, match="holds no columnwise data.*columnwise=True"):
        fj.dequantize(st, jnp.float32, from_columnwise=True)
    with pytest.raises(TypeError, match="dtype=.*int32.* is not supported"):
        fj.dequantize(st, jnp.int32)
    with pytest.raises(TypeError, match="must be an fp8kit.jax.ScaledTensor"):
        fj.dequantize(np.ones(3), jnp.float32)
    with pytest.raises(ValueError, match="fp8_dtype must be 'e4m3' or 'e5m2'"):
        fj.ScaledTensor(data=None, scale_inv=F32(1), fp8_dtype="int8")


def test_scaled_tensor_format_follows_its_data():
    e5 = jnp.zeros((2, 16), jnp.float8_e5m2)
    assert fj.ScaledTensor(data=e5, scale_inv=F32(1)).fp8_dtype == "e5m2"
    with pytest.raises(ValueError, match="fp8_dtype='e4m3' but the data is e5m2"):
        fj.ScaledTensor(data=e5, scale_inv=F32(1), fp8_dtype="e4m3")
    with pytest.raises(ValueError, match="different FP8 dtypes"):
        fj.ScaledTensor(data=e5, scale_inv=F32(1),
                        columnwise_data=jnp.zeros((16, 2), jnp.float8_e4m3fn))
    with pytest.raises(ValueError, match="pass fp8_dtype"):
        fj.ScaledTensor(data=None, scale_inv=F32(1))
    st = fj.quantize(np.ones((4, 16), np.float32), F32(1), "e5m2", columnwise=True)
    leaves, tree = jax.tree_util.tree_flatten(st)
    assert len(leaves) == 4 and jax.tree_util.tree_unflatten(tree, leaves).fp8_dtype == "e5m2"


# --- GPU: bit-identical to the CPU ----------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_bit_identical_to_cpu(fmt):
    gpu, cpu = gpus()[0], jax.devices("cpu")[0]
    cases = [ALL_BF16.reshape(256, 256),
             _random_f32(np.random.default_rng(9), 1 << 16).reshape(64, 1024),
             np.random.default_rng(10).standard_normal((3, 37, 129)).astype(np.float16)]
    for x in cases:
        for scale in [F32(1.0), F32(0.37), F32(2.0**-10)]:
            outs = []
            for dev in (cpu, gpu):
                xd, sd = jax.device_put((x, scale), dev)
                st = jax.jit(lambda a, s: fj.quantize(a, s, fmt, True, True))(xd, sd)
                cur, cscale = jax.jit(
                    lambda a: fj.quantize_current_scaling(a, fmt, True, True))(xd)
                deq = jax.jit(lambda s: fj.dequantize(s, jnp.bfloat16, True))(st)
                outs.append([np.atleast_1d(np.asarray(v)).view(np.uint8) for v in
                             (st.data, st.columnwise_data, st.amax, cur.data,
                              cur.columnwise_data, cscale, deq)])
            for c, g in zip(*outs):
                np.testing.assert_array_equal(c, g)


def test_the_extension_exports_the_core_constants():
    from fp8kit.jax import _ffi
    from fp8kit.recipe import AmaxReduction

    assert _ffi.FP8_MAX == {k: float(ml_dtypes.finfo(v).max) for k, v in FP8.items()}
    assert _ffi.GEMM_DIM_MULTIPLE == 16
    assert set(_ffi.AMAX_REDUCTION_CODES) == {r.value for r in AmaxReduction}
    assert set(_ffi.FP8_DTYPE_CODES) == set(FP8)
