"""fp8kit.jax.gemm on block-scaled operands: the CPU reference against a
float64 GEMM of the dequantized operands (each operand dequantized by the
NumPy model from the copy the GEMM reads) for every transpose layout and
block-mode pair, bf16 and fp32 outputs, bias; the refusals. GPU variants
(marked gpu) run the same on cuBLASLt where the device has it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import block_scaling_model as model
import fp8kit.jax as fj

PAIRS = [("block_1x128", "block_128x128"), ("block_1x128", "block_1x128"),
         ("block_128x128", "block_1x128")]


def _operand(rng, shape, mode, fmt="e4m3"):
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp(rng.uniform(-4, 4, size=(shape[0], 1))).astype(np.float32)  # per-row ranges
    return fj.quantize_block_scaling(x, fmt, rowwise=True, columnwise=True, scaling_mode=mode)


def _values(st, columnwise: bool):
    """float64 logical values of one copy of st, from the model."""
    if columnwise:
        return model.dequantize_copy(np.asarray(st.columnwise_data).view(np.uint8),
                                     st.columnwise_block_scale_inv, st.scaling_mode,
                                     st.fp8_dtype).T
    return model.dequantize_copy(np.asarray(st.data).view(np.uint8), st.block_scale_inv,
                                 st.scaling_mode, st.fp8_dtype)


def _reference(a, b, trans_a, trans_b, bias):
    # The K-contiguous copies (TN): a's rowwise unless transposed, b's
    # columnwise unless transposed.
    av, bv = _values(a, trans_a), _values(b, not trans_b)
    op_a, op_b = (av.T if trans_a else av), (bv.T if trans_b else bv)
    d = op_a @ op_b
    magnitude = np.abs(op_a) @ np.abs(op_b)
    if bias is not None:
        d = d + np.asarray(bias, np.float64)
    return d, magnitude


def _check(a, b, trans_a, trans_b, out_dtype, bias=None, device=None):
    d = jax.jit(lambda a, b, c: fj.gemm(a, b, trans_a, trans_b, out_dtype, c, device=device))(
        a, b, bias)
    want, magnitude = _reference(a, b, trans_a, trans_b, bias)
    assert d.dtype == out_dtype and d.shape == want.shape
    got = np.asarray(d, np.float64)
    # The output's rounding plus the accumulation: float32 on the CPU; on
    # Hopper the FP8 tensor cores keep about 14 bits of a block's running sum
    # (an H200 was off by up to 1.5 * 2^-10 of sum |a b|), so a 128-deep
    # block may be off by 128 * 2^-14 = 2^-7 of its sum |a b|.
    eps = 2.0 ** -8 if out_dtype == jnp.bfloat16 else 2.0 ** -20
    acc = 2.0 ** -7 if device is not None and device.platform == "gpu" else 2.0 ** -20
    tol = eps * np.abs(want) + acc * magnitude + 1e-30
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) / tol)


@pytest.mark.parametrize("a_mode, b_mode", PAIRS)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_every_layout_against_float64(a_mode, b_mode, trans_a, trans_b, out_dtype):
    m, k, n = 136, 272, 264  # edge blocks along every dimension
    rng = np.random.default_rng(hash((a_mode, b_mode, trans_a, trans_b)) % 2**32)
    a = _operand(rng, (k, m) if trans_a else (m, k), a_mode)
    b = _operand(rng, (n, k) if trans_b else (k, n), b_mode)
    _check(a, b, trans_a, trans_b, out_dtype)


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_bias_and_e5m2_and_leading_dims(out_dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 64, 256)).astype(np.float32)
    a = fj.quantize_block_scaling(x, "e5m2", True, True, "block_1x128")
    b = _operand(rng, (256, 128), "block_128x128")
    bias = jnp.asarray(rng.standard_normal(128), jnp.bfloat16)
    d = fj.gemm(a, b, out_dtype=out_dtype, bias=bias)
    assert d.shape == (2, 64, 128)
    want, magnitude = _reference(a.as_2d(), b, False, False, bias)
    eps = 2.0 ** -8 if out_dtype == jnp.bfloat16 else 2.0 ** -20
    err = np.abs(np.asarray(d, np.float64).reshape(128, 128) - want)
    assert np.all(err <= eps * np.abs(want) + 2.0 ** -20 * magnitude)


def test_block_scales_localise_an_outlier():
    # One huge value per operand: per-tensor scaling flushes the rest of the
    # tensor towards zero, block scaling only its own tile.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal((256, 64)).astype(np.float32)
    x[0, 0] = 1e6
    exact = x.astype(np.float64) @ w.astype(np.float64)
    blocked = fj.gemm(fj.quantize_block_scaling(x), fj.quantize_block_scaling(
        w, rowwise=False, columnwise=True, scaling_mode="block_128x128"), out_dtype=jnp.float32)
    per_tensor = fj.gemm(fj.quantize_current_scaling(x)[0],
                         fj.quantize_current_scaling(w, columnwise=True)[0],
                         out_dtype=jnp.float32)
    rest = slice(1, None)  # the rows without the outlier

    def err(d):
        return np.linalg.norm(np.asarray(d)[rest] - exact[rest]) / np.linalg.norm(exact[rest])

    assert err(blocked) < 0.05 < err(per_tensor)


def test_supports_block_scaled_fp8_gemm_on_the_cpu():
    assert fj.supports_block_scaled_fp8_gemm(jax.devices("cpu")[0]) is True


# --- refusals ------------------------------------------------------------------------------

def _pair(m=64, k=128, n=64):
    rng = np.random.default_rng(3)
    return _operand(rng, (m, k), "block_1x128"), _operand(rng, (k, n), "block_128x128")


def test_a_per_tensor_operand_is_refused():
    a, b = _pair()
    per_tensor = fj.quantize_current_scaling(np.ones((128, 64), np.float32), columnwise=True)[0]
    with pytest.raises(ValueError, match="Quantize b with fp8kit.jax.quantize_block_scaling"):
        fj.gemm(a, per_tensor)


def test_two_128x128_operands_are_refused():
    a, b = _pair(m=128)
    a = fj.quantize_block_scaling(np.ones((128, 128), np.float32), scaling_mode="block_128x128")
    with pytest.raises(ValueError, match="both block_128x128"):
        fj.gemm(a, b)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(out_dtype=jnp.float16), TypeError, "bfloat16 or float32"),
    (dict(use_split_accumulator=False), ValueError, "no fast-accumulation"),
])
def test_what_the_block_gemm_cannot_do_is_refused(kwargs, error, words):
    a, b = _pair()
    with pytest.raises(error, match=words):
        fj.gemm(a, b, **kwargs)


def test_m_not_a_multiple_of_8_is_refused():
    a, b = _pair(m=20)
    with pytest.raises(ValueError, match="M=20"):
        fj.gemm(a, b)


def test_a_missing_copy_is_named():
    a, b = _pair()
    with pytest.raises(ValueError, match="b's columnwise data"):
        fj.gemm(a, b.rowwise_only())


def test_scales_of_another_tensor_are_refused():
    a, b = _pair()
    other = _operand(np.random.default_rng(4), (128, 64), "block_1x128")
    bad = type(a)(data=a.data, scale_inv=None, scaling_mode="block_1x128",
                  block_scale_inv=other.block_scale_inv)
    with pytest.raises(ValueError, match="a.block_scale_inv has shape"):
        fj.gemm(bad, b)


# --- GPU -----------------------------------------------------------------------------------

def _gpu():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus or not fj.BUILT_WITH_CUDA:
        pytest.skip("needs a GPU and a CUDA build of fp8kit")
    return gpus[0]


@pytest.mark.gpu
@pytest.mark.parametrize("a_mode, b_mode", PAIRS)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False)])
def test_gpu_every_layout_against_float64(a_mode, b_mode, trans_a, trans_b):
    gpu = _gpu()
    if not fj.supports_block_scaled_fp8_gemm(gpu):
        a, b = _pair()
        with jax.default_device(gpu), pytest.raises(Exception, match="block-scaled"):
            fj.gemm(jax.device_put(a, gpu), jax.device_put(b, gpu), device=gpu)
        return
    with jax.default_device(gpu):
        rng = np.random.default_rng(5)
        m, k, n = 256, 512, 384
        a = _operand(rng, (k, m) if trans_a else (m, k), a_mode)
        b = _operand(rng, (n, k) if trans_b else (k, n), b_mode)
        _check(a, b, trans_a, trans_b, jnp.float32, device=gpu)
        _check(a, b, trans_a, trans_b, jnp.bfloat16, device=gpu)
