"""fp8kit.jax.amax against NumPy, on CPU (and on a GPU when there is one)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8kit.jax as fj
from jax_gpus import gpus
from fp8kit.jax._ffi import amax_call


def _np_amax(x) -> np.float32:
    x = np.asarray(x, dtype=np.float32)
    return np.float32(np.max(np.abs(x))) if x.size else np.float32(0)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 17), (4, 1, 2, 33)])
def test_matches_numpy(dtype, shape):
    rng = np.random.default_rng(hash((str(dtype), shape)) % 2**32)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    got = jax.jit(fj.amax)(x)
    assert got.dtype == jnp.float32 and got.shape == ()
    assert np.float32(got) == _np_amax(x)  # exact: max of exactly converted values


def test_eager_and_jit_agree_and_use_the_custom_call():
    x = jnp.linspace(-5.0, 3.0, 100, dtype=jnp.float32)
    assert float(fj.amax(x)) == 5.0
    assert float(jax.jit(fj.amax)(x)) == 5.0
    hlo = jax.jit(fj.amax).lower(x).as_text()
    assert "fp8kit_amax" in hlo


def test_special_values():
    x = np.array([1.0, -2.0, np.inf, 0.5], np.float32)
    assert np.isposinf(fj.amax(x))
    x = np.array([1.0, np.nan, -np.inf], np.float32)
    assert np.isnan(fj.amax(x))
    x = np.array([-0.0, 0.0], ml_dtypes.bfloat16)
    assert float(fj.amax(x)) == 0.0
    tiny = np.array([np.float32(1e-40), -np.float32(3e-41)], np.float32)  # denormals
    assert np.float32(fj.amax(tiny)) == np.float32(1e-40)


def test_empty_is_zero():
    assert float(fj.amax(np.zeros((0, 4), np.float32))) == 0.0
    assert float(jax.jit(fj.amax)(jnp.zeros((3, 0), jnp.bfloat16))) == 0.0


def test_vmap_is_per_example():
    x = np.random.default_rng(1).standard_normal((4, 8, 16)).astype(np.float32)
    got = jax.vmap(fj.amax)(x)
    np.testing.assert_array_equal(np.asarray(got), np.abs(x).max(axis=(1, 2)))


def test_abstract_evaluation_needs_no_data():
    out = jax.eval_shape(fj.amax, jax.ShapeDtypeStruct((128, 64), jnp.bfloat16))
    assert out.shape == () and out.dtype == jnp.float32


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.float64, np.bool_, np.complex64,
                                   ml_dtypes.float8_e4m3fn])
def test_unsupported_dtype_is_a_clear_python_error(dtype):
    x = np.zeros((4, 4), dtype)
    with pytest.raises(TypeError, match=r"fp8kit.jax.amax: x has dtype .*float32, bfloat16 or "
                                        r"float16.*astype"):
        fj.amax(x)
    with pytest.raises(TypeError, match="fp8kit.jax.amax: x has dtype"):
        jax.jit(fj.amax)(jnp.zeros((4, 4), jnp.int32))


def test_rank_above_eight_is_a_clear_python_error():
    with pytest.raises(ValueError, match="rank 9"):
        fj.amax(np.zeros((1,) * 9, np.float32))


def test_handler_reports_core_errors_instead_of_crashing():
    # Bypass the Python checks: the FFI handler itself must refuse an int32
    # buffer with an error (not a crash), naming the operand and its type.
    with pytest.raises(Exception, match=r"x has element type int32"):
        jax.block_until_ready(amax_call(jnp.zeros((3,), jnp.int32)))


@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_gpu_matches_numpy(dtype):
    gpu = gpus()[0]
    x = (np.random.default_rng(2).standard_normal((1000, 257)) * 7).astype(np.float32)
    x[5, 3] = -1000.0
    xg = jax.device_put(jnp.asarray(x, dtype), gpu)
    got = jax.jit(fj.amax)(xg)
    assert got.devices() == {gpu}
    assert np.float32(got) == _np_amax(np.asarray(jnp.asarray(x, dtype), np.float32))
    xn = xg.at[7, 7].set(jnp.nan)
    assert np.isnan(np.float32(jax.jit(fj.amax)(xn)))
    assert float(jax.jit(fj.amax)(jax.device_put(jnp.zeros((0,), dtype), gpu))) == 0.0
