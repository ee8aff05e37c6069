"""fp8kit.jax.quantize_block_scaling and dequantize of block-scaled tensors
on the CPU, bit for bit against the NumPy model of the documented rule
(block_scaling_model.py): every bf16 bit pattern inside blocks, random
data with an outlier per block, zero and non-finite blocks, edge blocks,
epsilon, ranks; and the arguments it refuses."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import block_scaling_model as model
import fp8kit.jax as fj
from fp8kit import recipe
from fp8kit.jax import _checks, _ffi

MODES = ("block_1x128", "block_128x128")
bits = lambda a: np.asarray(a).view(np.uint8)  # noqa: E731


def _assert_matches_model(x, mode, fmt="e4m3", eps=0.0, power_2_scale=True):
    st = jax.jit(lambda x: fj.quantize_block_scaling(
        x, fmt, rowwise=True, columnwise=True, scaling_mode=mode, amax_epsilon=eps,
        power_2_scale=power_2_scale))(x)
    q, s, qc, sc = model.quantize(np.asarray(x, np.float32), mode, fmt, eps, power_2_scale)
    assert st.scaling_mode == mode and st.scale_inv is None and st.fp8_dtype == fmt
    np.testing.assert_array_equal(bits(st.data), q)
    np.testing.assert_array_equal(np.asarray(st.block_scale_inv).view(np.uint32),
                                  s.view(np.uint32))
    np.testing.assert_array_equal(bits(st.columnwise_data), qc)
    np.testing.assert_array_equal(np.asarray(st.columnwise_block_scale_inv).view(np.uint32),
                                  sc.view(np.uint32))
    return st


def _all_bf16_patterns(shuffle_seed=None):
    patterns = np.arange(1 << 16, dtype=np.uint16)
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(patterns)
    return patterns.view(ml_dtypes.bfloat16).reshape(512, 128)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shuffle_seed", [None, 1])
def test_every_bf16_pattern_inside_blocks(mode, fmt, shuffle_seed):
    # In order, each 1x128 tile is a run of neighbouring patterns (tiny,
    # huge, NaN and inf tiles); shuffled, every block mixes magnitudes.
    _assert_matches_model(_all_bf16_patterns(shuffle_seed), mode, fmt)


@pytest.mark.parametrize("mode", MODES)
def test_every_bf16_pattern_without_power_2_scale(mode):
    _assert_matches_model(_all_bf16_patterns(2), mode, "e4m3", power_2_scale=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_random_data_with_an_outlier_per_block(mode, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 260)).astype(np.float32)  # edge blocks on both sides
    for i in range(0, 300, 128 if mode == "block_128x128" else 1):
        for j in range(0, 260, 128):
            x[i + rng.integers(0, min(128, 300 - i)) if mode == "block_128x128" else i,
              j + rng.integers(0, min(128, 260 - j))] *= 1000.0
    x = x.astype(dtype)
    if dtype == np.float16:
        x = np.clip(x, -60000, 60000)
    _assert_matches_model(x, mode, "e4m3", power_2_scale=False)
    _assert_matches_model(x, mode, "e5m2", power_2_scale=True)


@pytest.mark.parametrize("mode", MODES)
def test_zero_nan_and_inf_blocks_are_cast_unscaled(mode):
    x = np.random.default_rng(4).standard_normal((256, 384)).astype(np.float32) * 1000
    x[:128, :128] = 0.0         # a zero block
    x[0, 200] = np.nan          # a NaN in row 0's second tile
    x[130, 300] = np.inf        # an inf
    x[255, 10] = -np.inf
    st = _assert_matches_model(x, mode)
    # Spelled out for one case: the zero block has q = 0 and scale_inv = 1;
    # the NaN's tile is cast unscaled, its finite values saturating.
    assert not bits(st.data)[:128, :128].any()
    assert np.asarray(st.block_scale_inv)[0, 0] == 1.0
    assert bits(st.data)[0, 200] == 0x7F


@pytest.mark.parametrize("mode", MODES)
def test_amax_epsilon(mode):
    x = np.full((128, 128), 1e-6, np.float32)
    x[3, 3] = 2e-6
    _assert_matches_model(x, mode, eps=1e-3, power_2_scale=False)
    _assert_matches_model(x, mode, eps=1e-3, power_2_scale=True)


@pytest.mark.parametrize("shape", [(), (5,), (3, 5, 136), (2, 130, 4, 16)])
@pytest.mark.parametrize("mode", MODES)
def test_ranks_use_the_2d_view(shape, mode):
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    st = _assert_matches_model(x, mode)
    assert st.data.shape == shape


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_dequantize_each_copy(mode, dtype):
    x = np.random.default_rng(6).standard_normal((200, 264)).astype(np.float32) * 30
    st = fj.quantize_block_scaling(x, "e4m3", True, True, mode)
    q, s, qc, sc = model.quantize(x, mode, "e4m3")
    want = model.dequantize_copy(q, s, mode, "e4m3").astype(np.float32)
    want_c = model.dequantize_copy(qc, sc, mode, "e4m3").astype(np.float32).T
    got = fj.dequantize(st, dtype)
    got_c = fj.dequantize(st, dtype, from_columnwise=True)
    assert got.dtype == dtype and got_c.shape == x.shape
    # One float32 multiply (exact here: power-of-two scales), rounded once.
    np.testing.assert_array_equal(np.asarray(got), want.astype(dtype))
    np.testing.assert_array_equal(np.asarray(got_c), want_c.astype(dtype))


def test_single_copies_and_their_scales():
    x = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
    row = fj.quantize_block_scaling(x, rowwise=True, columnwise=False)
    col = fj.quantize_block_scaling(x, rowwise=False, columnwise=True)
    assert row.columnwise_data is None and row.columnwise_block_scale_inv is None
    assert col.data is None and col.block_scale_inv is None and col.shape == (64, 256)
    q, s, qc, sc = model.quantize(x, "block_1x128")
    np.testing.assert_array_equal(bits(row.data), q)
    np.testing.assert_array_equal(bits(col.columnwise_data), qc)
    np.testing.assert_array_equal(np.asarray(fj.dequantize(col, from_columnwise=True)),
                                  model.dequantize_copy(qc, sc, "block_1x128", "e4m3").T)


def test_under_vmap_each_example_has_its_blocks():
    x = np.random.default_rng(8).standard_normal((3, 16, 128)).astype(np.float32)
    x[1] *= 100
    st = jax.vmap(lambda x: fj.quantize_block_scaling(x, rowwise=True, columnwise=True))(x)
    for i in range(3):
        q, s, qc, sc = model.quantize(x[i], "block_1x128")
        np.testing.assert_array_equal(bits(st.data[i]), q)
        np.testing.assert_array_equal(np.asarray(st.columnwise_block_scale_inv[i]), sc)


# --- refused arguments ---------------------------------------------------------------------

X = np.ones((16, 128), np.float32)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(scaling_mode="block_1x32"), ValueError, "scaling_mode='block_1x32'"),
    (dict(scaling_mode="per_tensor"), ValueError, "block_1x128"),
    (dict(rowwise=False, columnwise=False), ValueError, "at least one"),
    (dict(rowwise=1), TypeError, "rowwise=1"),
    (dict(fp8_dtype="e3m4"), TypeError, "fp8_dtype"),
    (dict(amax_epsilon=-1.0), ValueError, "amax_epsilon"),
    (dict(power_2_scale=None), TypeError, "power_2_scale"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error, match=words):
        fj.quantize_block_scaling(X, **kwargs)


def test_bad_input_dtype_is_named():
    with pytest.raises(TypeError, match="x has dtype int32"):
        fj.quantize_block_scaling(X.astype(np.int32))


def test_dequantize_refuses_scales_of_the_wrong_shape():
    st = fj.quantize_block_scaling(X, rowwise=True, columnwise=True)
    bad = st.__class__(data=st.data, scale_inv=None, scaling_mode="block_1x128",
                       block_scale_inv=st.block_scale_inv[:, :4])
    with pytest.raises(ValueError, match=r"block_scale_inv has shape \(1, 4\).*\(1, 16\)"):
        fj.dequantize(bad)


def test_a_block_tensor_without_its_scales_is_refused():
    st = fj.quantize_block_scaling(X, rowwise=True, columnwise=True)
    bad = st.__class__(data=st.data, scale_inv=None, scaling_mode="block_1x128")
    with pytest.raises(ValueError, match="block_scale_inv is None"):
        fj.dequantize(bad)
    with pytest.raises(ValueError, match="scaling_mode must be one of"):
        st.__class__(data=st.data, scale_inv=None, scaling_mode="block")
    with pytest.raises(ValueError, match="per-tensor scale_inv"):
        fj.dequantize(st.__class__(data=st.data, scale_inv=jnp.float32(1),
                                   scaling_mode="block_1x128",
                                   block_scale_inv=st.block_scale_inv))


def test_the_extension_and_python_name_the_same_modes_and_block():
    assert set(_ffi.SCALING_MODE_CODES) == set(_checks.SCALING_MODES)
    assert _ffi.BLOCK_LEN == recipe.BLOCK_LEN == model.BLOCK
