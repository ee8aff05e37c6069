"""fp8kit.jax.cast_statistics against the float64 NumPy reference of
tests/fp8_reference.py, on the FP8 copies fp8kit.jax's quantize functions
make: crafted arrays whose underflow and saturation counts are known by
construction (far below and either side of half the smallest subnormal,
exact zeros, clipped and exact fp8_max values, inf and NaN left out) under
a delayed-style per-tensor scale and under 1x128 and 128x128 block
scaling; random arrays of every input dtype in both formats, every mode,
rowwise and columnwise; under jit and vmap; empty and 0-d arrays, a bad
scale; the errors. GPU: CUDA against the CPU."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8_reference as ref
import two_cpu_devices
import fp8kit.jax as fj
from fp8kit.jax import _ffi
from jax_gpus import gpus

FORMATS = ("e4m3", "e5m2")
BLOCK_MODES = ("block_1x128", "block_128x128")
FIELDS = ("amax", "underflow", "saturated", "error_sq", "norm_sq")
DTYPES = {"amax": jnp.float32, "underflow": jnp.uint32, "saturated": jnp.uint32,
          "error_sq": jnp.float32, "norm_sq": jnp.float32}
FN = "fp8kit.jax.cast_statistics"


def quantize(x, fmt, mode, scale=None, rowwise=True, columnwise=True):
    """x's FP8 copy: per-tensor with a given scale (delayed style) or, with
    scale None, current scaling; or block-scaled (power-of-two scales)."""
    if mode == "per_tensor" and scale is not None:
        return fj.quantize(x, np.float32(scale), fmt, rowwise, columnwise)
    if mode == "per_tensor":
        return fj.quantize_current_scaling(x, fmt, rowwise, columnwise)[0]
    return fj.quantize_block_scaling(x, fmt, rowwise, columnwise, scaling_mode=mode)


def reference(x, st, columnwise: bool) -> dict:
    """fp8_reference.cast_statistics of the copy of st that is read."""
    if st.block_scaled:
        scales = st.columnwise_block_scale_inv if columnwise else st.block_scale_inv
    else:
        scales = st.scale_inv
    data = st.columnwise_data if columnwise else st.data
    shape = tuple(x.shape)
    bits = ref.logical_bits(np.asarray(data).view(np.uint8), shape, columnwise)
    scale_inv = ref.element_scale_inv(np.asarray(scales), st.scaling_mode, shape, columnwise)
    return ref.cast_statistics(np.asarray(x, np.float32), bits, st.fp8_dtype, scale_inv)


def values(stats: fj.CastStatistics) -> dict:
    return {name: getattr(stats, name).item() for name in FIELDS}


def check(x, st, columnwise: bool, what: str) -> fj.CastStatistics:
    """cast_statistics under jit against the reference; every field a
    scalar of its dtype."""
    got = jax.jit(fj.cast_statistics, static_argnums=2)(x, st, columnwise)
    assert isinstance(got, fj.CastStatistics)
    for name in FIELDS:
        a = getattr(got, name)
        assert (a.shape, a.dtype) == ((), DTYPES[name]), name
    ref.assert_cast_statistics(values(got), reference(x, st, columnwise), what)
    return got


# ------------------------------------------------------------- crafted ----
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("specials", ["", "inf", "nan"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_crafted_per_tensor_counts(fmt, dtype, specials, columnwise):
    # A delayed-style scale of 4: the values past fp8_max / 4 saturate.
    x, underflow, saturated = ref.crafted_per_tensor(fmt, 4.0, specials)
    x = jnp.asarray(x, dtype)
    got = check(x, quantize(x, fmt, "per_tensor", scale=4.0), columnwise, f"{fmt} {dtype}")
    assert (got.underflow.item(), got.saturated.item()) == (underflow, saturated)
    amax = got.amax.item()
    if specials == "nan":  # the canonical quiet NaN, as fp8kit_amax writes it
        assert np.asarray(got.amax).view(np.uint32) == 0x7FC00000
    elif specials == "inf":
        assert amax == math.inf
    else:
        assert amax == float(jnp.max(jnp.abs(x)))
    assert math.isfinite(got.error_sq.item()) and math.isfinite(got.norm_sq.item())


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("mode", BLOCK_MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_crafted_block_counts(fmt, mode, dtype, columnwise):
    x, underflow, saturated = ref.crafted_blocks(fmt)
    x = jnp.asarray(x, dtype)
    got = check(x, quantize(x, fmt, mode), columnwise, f"{fmt} {mode} {dtype}")
    assert (got.underflow.item(), got.saturated.item()) == (underflow, saturated)
    assert np.asarray(got.amax).view(np.uint32) == 0x7FC00000


# -------------------------------------------------------------- random ----
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("shape", [(300, 264), (3, 5, 130)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("mode", ["delayed", "current", *BLOCK_MODES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_random_arrays_match_the_reference(fmt, mode, dtype, shape, columnwise):
    x = jnp.asarray(ref.mixed_magnitudes(shape, seed=len(shape)), dtype)
    if mode == "delayed":  # a stale scale: the top values saturate
        st = quantize(x, fmt, "per_tensor", scale=ref.FP8_MAX[fmt] / (0.5 * float(jnp.max(
            jnp.abs(x)))))
    else:
        st = quantize(x, fmt, "per_tensor" if mode == "current" else mode)
    got = check(x, st, columnwise, f"{fmt} {mode} {dtype} {shape}")
    assert got.underflow.item() > 0
    assert mode not in ("delayed", "current") or got.saturated.item() > 0


def test_eager_equals_jit():
    x = jnp.asarray(ref.mixed_magnitudes((64, 200), seed=1), jnp.bfloat16)
    st = quantize(x, "e5m2", "block_1x128")
    eager = fj.cast_statistics(x, st, columnwise=True)
    jitted = jax.jit(fj.cast_statistics, static_argnums=2)(x, st, True)
    assert values(eager) == values(jitted)


@pytest.mark.parametrize("mode", ["per_tensor", *BLOCK_MODES])
def test_vmap_gives_each_example_its_statistics(mode):
    xs = jnp.asarray(ref.mixed_magnitudes((3, 40, 130), seed=2))

    def stats(x):
        return fj.cast_statistics(x, quantize(x, "e4m3", mode), columnwise=True)

    batched = jax.vmap(stats)(xs)
    assert isinstance(batched, fj.CastStatistics)
    for i in range(xs.shape[0]):
        one = values(stats(xs[i]))
        for name in FIELDS:
            assert getattr(batched, name)[i].item() == one[name], (i, name)


def test_under_grad_as_an_aux_output():
    x = jnp.asarray(ref.mixed_magnitudes((16, 32), seed=9))
    st = quantize(x, "e4m3", "per_tensor")
    grad, stats = jax.grad(lambda x: (jnp.sum(x * x), fj.cast_statistics(x, st)),
                           has_aux=True)(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(2 * x))
    assert values(stats) == values(fj.cast_statistics(x, st))


def test_a_copy_that_holds_one_layout():
    # A columnwise-only ScaledTensor knows its 2-D view, not x's rank.
    x = jnp.asarray(ref.mixed_magnitudes((2, 32, 48), seed=3))
    check(x, quantize(x, "e4m3", "per_tensor", columnwise=False), False, "rowwise only")
    for mode in ("per_tensor", *BLOCK_MODES):
        check(x, quantize(x, "e4m3", mode, rowwise=False), True, f"{mode} columnwise only")


def test_a_python_float_scale_inv():
    x = jnp.asarray(ref.mixed_magnitudes((8, 16), seed=4))
    st = quantize(x, "e4m3", "per_tensor", scale=4.0)
    check(x, fj.ScaledTensor(st.data, 0.25, st.columnwise_data), False, "scale_inv 0.25")


@pytest.mark.parametrize("shape", [(0, 16), (4, 0), ()])
@pytest.mark.parametrize("mode", ["per_tensor", *BLOCK_MODES])
def test_empty_and_0d_arrays(shape, mode):
    x = jnp.full(shape, 3.0, jnp.float32)
    for columnwise in (False, True):
        got = check(x, quantize(x, "e4m3", mode), columnwise, f"{shape}")
        if x.size == 0:
            assert values(got) == dict.fromkeys(FIELDS, 0)


def test_a_bad_scale_makes_error_sq_nan():
    # Every code NaN (fp8kit/quantize.h): the cast lost every element.
    x = jnp.asarray(ref.mixed_magnitudes((8, 16), seed=5))
    got = check(x, quantize(x, "e4m3", "per_tensor", scale=0.0), False, "scale 0")
    assert math.isnan(got.error_sq.item()) and math.isfinite(got.norm_sq.item())
    assert (got.underflow.item(), got.saturated.item()) == (0, 0)


def test_derived_values():
    x = jnp.asarray(ref.mixed_magnitudes((40, 50), seed=6))
    st = quantize(x, "e4m3", "block_128x128")
    got, want = fj.cast_statistics(x, st), reference(x, st, False)
    assert float(got.relative_error) == pytest.approx(
        math.sqrt(want["error_sq"] / want["norm_sq"]), rel=1e-5)
    assert float(got.underflow_rate(x.size)) == pytest.approx(want["underflow"] / x.size)
    assert float(got.saturation_rate(x.size)) == pytest.approx(want["saturated"] / x.size)


# -------------------------------------------------------------- errors ----
def _raises(exc, match, f):
    """f() raises exc matching `match`, and so does tracing it under jit."""
    with pytest.raises(exc, match=match):
        f()
    with pytest.raises(exc, match=match):
        jax.jit(lambda: f()).lower()


def test_bad_arguments_name_the_argument_and_the_fix():
    x = jnp.asarray(ref.mixed_magnitudes((8, 256), seed=7))
    st = quantize(x, "e4m3", "per_tensor", columnwise=False)
    block = quantize(x, "e4m3", "block_1x128")
    _raises(TypeError, f"{FN}: x must be a jax or NumPy array, got list",
            lambda: fj.cast_statistics([1.0], st))
    _raises(TypeError, f"{FN}: x has dtype int32; fp8kit takes float32",
            lambda: fj.cast_statistics(x.astype(jnp.int32), st))
    _raises(TypeError, rf"{FN}: scaled must be an fp8kit.jax.ScaledTensor \(the FP8 copy of x, "
            r"e.g. fp8kit.jax.quantize_current_scaling\(x\)\[0\]\), got ArrayImpl",
            lambda: fj.cast_statistics(x, st.data))
    _raises(TypeError, r"columnwise=1 must be True or False",
            lambda: fj.cast_statistics(x, st, 1))
    _raises(ValueError, rf"{FN}: x has shape \(8, 128\) but scaled.data has shape \(8, 256\) "
            r"\(a copy of x's is \(8, 128\)\); pass the FP8 copy of x itself",
            lambda: fj.cast_statistics(x[:, :128], st))
    _raises(ValueError, rf"{FN}: x has shape \(8, 256\) but scaled.columnwise_data has shape "
            r"\(128, 8\) \(a copy of x's is \(256, 8\)\)",
            lambda: fj.cast_statistics(x, quantize(x[:, :128], "e4m3", "per_tensor",
                                                   rowwise=False), True))
    _raises(ValueError, rf"{FN}: scaled holds no columnwise copy; read its rowwise one "
            r"\(columnwise=False\) or quantize x with columnwise=True",
            lambda: fj.cast_statistics(x, st, columnwise=True))
    wrong_scales = fj.ScaledTensor(block.data, None, fp8_dtype="e4m3", scaling_mode="block_1x128",
                                   block_scale_inv=block.columnwise_block_scale_inv)
    _raises(ValueError, rf"{FN}: scaled.block_scale_inv has shape \(1, 256\) but block_1x128 "
            r"scales of a \(8, 256\) tensor's data are \(2, 8\)",
            lambda: fj.cast_statistics(x, wrong_scales))


def test_the_handler_checks_what_it_is_given():
    # Past the Python checks: the custom call refuses a copy of another
    # shape (the core would read it with x's).
    x = jnp.asarray(ref.mixed_magnitudes((8, 16), seed=10))
    st = quantize(x, "e4m3", "per_tensor")
    with pytest.raises(Exception, match="fp8kit_cast_statistics: data does not have the shape "
                                        r"of x's columnwise copy \[last, prod\(leading\)\]"):
        jax.block_until_ready(_ffi.cast_statistics_call(x, st.data, st.scale_inv, True,
                                                        "per_tensor"))
    with pytest.raises(Exception, match="fp8kit_cast_statistics: scale_inv must hold exactly "
                                        "one float32"):
        jax.block_until_ready(_ffi.cast_statistics_call(x, st.data, jnp.ones(2), False,
                                                        "per_tensor"))


def test_two_devices():
    # Arrays committed to different devices are refused; a sharded x (no
    # sharding rule: XLA gathers it) gives the unsharded x's statistics. XLA's
    # host device count is fixed when jax starts: a child process.
    script = """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        import fp8kit.jax as fj
        d0, d1 = jax.devices()[:2]
        x = jnp.asarray(np.linspace(-3, 3, 256 * 256, dtype=np.float32).reshape(256, 256))
        st = fj.quantize_current_scaling(jax.device_put(x, d1))[0]
        try:
            fj.cast_statistics(jax.device_put(x, d0), st)
        except ValueError as e:
            print(e)
        xs = jax.device_put(x, NamedSharding(jax.make_mesh((2,), ("d",)), P("d")))
        for quantize in (fj.quantize_current_scaling, fj.quantize_block_scaling):
            def stats(x):
                st = quantize(x, "e4m3", True, True)
                return fj.cast_statistics(x, st[0] if isinstance(st, tuple) else st, True)
            print([a.item() == b.item() for a, b in zip(stats(xs), stats(x))])
        """
    stdout = two_cpu_devices.run(script)
    assert stdout.strip().splitlines() == [
        f"{FN}: x is on cpu:0 but scaled.data is on cpu:1; put them on one device, e.g. "
        "jax.device_put(x, scaled.data.sharding)", str([True] * 5), str([True] * 5)]


# ----------------------------------------------------------------- GPU ----
@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("mode", ["delayed", "current", *BLOCK_MODES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_matches_the_cpu(fmt, mode):
    # amax and the counts bit for bit, the sums within the header's 1e-5.
    gpu, cpu = gpus()[0], jax.devices("cpu")[0]
    cases = [ref.mixed_magnitudes((1000, 520), seed=8), ref.crafted_blocks(fmt)[0],
             ref.crafted_per_tensor(fmt, 4.0, "nan")[0]]
    for x in cases:
        for dtype in (jnp.float32, jnp.bfloat16):
            for columnwise in (False, True):
                results = []
                for device in (cpu, gpu):
                    xd = jax.device_put(jnp.asarray(x, dtype), device)
                    if mode == "delayed":
                        st = quantize(xd, fmt, "per_tensor", scale=4.0)
                    else:
                        st = quantize(xd, fmt, "per_tensor" if mode == "current" else mode)
                    stats = fj.cast_statistics(xd, st, columnwise)
                    assert stats.amax.devices() == {device}
                    results.append(values(stats))
                want, got = results
                what = f"{fmt} {mode} {dtype} {x.shape} columnwise={columnwise}"
                assert np.float32(got["amax"]).view(np.uint32) == \
                    np.float32(want["amax"]).view(np.uint32), what
                assert (got["underflow"], got["saturated"]) == \
                    (want["underflow"], want["saturated"]), what
                for total in ("error_sq", "norm_sq"):
                    assert got[total] == pytest.approx(want[total], rel=ref.SUM_RTOL,
                                                       nan_ok=True), what
