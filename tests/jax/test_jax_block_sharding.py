"""Block-scaled custom calls sharded on 8 CPU devices (a 2x4 ("dp", "tp")
mesh) against the unsharded result, and the shardings that would split a
block, refused by name (on 2 GPUs too when there are).

As in test_jax_sharding.py, the cases run in a child process started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (this file run as a
script); each parametrized test asserts one case. Quantization and the
GEMMs whose reduction is not split come out bit for bit; a split K (or the
dense layer's wgrad, summed over sharded tokens) to float32 rounding.
"""

import sys

import pytest

from sharding_child import assert_case_ok, assert_matches, run_cases, sum_atol

CASES = ["quantize_1x128_dp_tp", "quantize_128x128_tp", "quantize_rank3_dp",
         "refused_auto_axes", "refused_explicit_axes", "refused_128x128_padding",
         "gemm_dp", "gemm_tp_n", "gemm_tp_k", "dense_dp", "dense_tp_n", "dense_dp_explicit"]


# ------------------------------------------------------------------ child side --

def _child(platform: str, mesh_shape: tuple[int, int]):  # noqa: C901
    # One function, so that the parent module imports no jax.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    import fp8kit.jax as fj
    from fp8kit.recipe import BlockScaling

    devices = jax.devices(platform)[:mesh_shape[0] * mesh_shape[1]]
    mesh = Mesh(np.array(devices).reshape(mesh_shape), ("dp", "tp"))  # Auto axes
    explicit_mesh = jax.make_mesh(mesh_shape, ("dp", "tp"), devices=devices,
                                  axis_types=(AxisType.Explicit,) * 2)
    jax.config.update("jax_default_device", devices[0])
    exact_gemm = platform == "cpu"  # as in test_jax_sharding.py
    rng = np.random.default_rng(0)
    bits = lambda a: np.asarray(a).view(np.uint8)  # noqa: E731

    def put(a, spec, on=mesh):
        return jax.device_put(a, NamedSharding(on, spec))

    def sharded(f, *args, on=mesh):
        with jax.set_mesh(on):
            return f(*args)

    def same_bits(got, want):
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want),
                        strict=True):
            np.testing.assert_array_equal(bits(a), bits(b))

    def data_spec(a):
        keep = lambda s: s if s is not None and mesh.shape[s] > 1 else None  # noqa: E731
        return tuple(keep(s) for s in a.sharding.spec)

    def quantize(shape, spec, mode):
        x = rng.standard_normal(shape).astype(np.float32)
        x.reshape(-1)[::1000] *= 500  # outliers in many blocks
        f = jax.jit(lambda x: fj.quantize_block_scaling(x, "e4m3", True, True, mode))
        want = f(x)
        got = sharded(f, put(x, spec))
        same_bits(got, want)
        return got

    def case_quantize_1x128_dp_tp():
        got = quantize((256, 512), P("dp", "tp"), "block_1x128")
        assert data_spec(got.data) == data_spec(jax.device_put(
            np.zeros((8, 8)), NamedSharding(mesh, P("dp", "tp"))))

    def case_quantize_128x128_tp():
        quantize((256, 2048), P(None, "tp"), "block_128x128")

    def case_quantize_rank3_dp():
        quantize((2, 128, 256), P("dp", None, None), "block_1x128")

    def refused(x, spec, on, mode="block_1x128"):
        f = jax.jit(lambda x: fj.quantize_block_scaling(x, "e4m3", True, True, mode))
        try:
            sharded(f, put(x, spec, on), on=on)
        except Exception as e:  # noqa: BLE001 - the message is the check
            return e
        raise AssertionError("a block-splitting sharding was not refused")

    def case_refused_auto_axes():
        # 64 tokens over "dp": 32 rows per device split the columnwise copy's
        # 128-row tiles.
        e = refused(np.ones((64, 512), np.float32), P("dp", None), mesh)
        assert "sharded over mesh axes ('dp',)" in str(e) and "multiple of 128 rows" in str(e), e

    def case_refused_explicit_axes():
        e = refused(np.ones((64, 512), np.float32), P("dp", None), explicit_mesh)
        assert isinstance(e, ValueError), e  # raised while tracing
        assert "pad the rows to a multiple of 256" in str(e), e

    def case_refused_128x128_padding():
        # 512 columns over the 2 devices of "dp": 256 each, two blocks; the
        # scale layout pads its inner dimension to 4 blocks, so 512 are needed.
        e = refused(np.ones((128, 512), np.float32), P(None, "dp"), mesh, "block_128x128")
        assert "multiple of 512 columns" in str(e) and "'dp'" in str(e), e

    def operands(m, k, n, a_mode="block_1x128", b_mode="block_128x128"):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        qa = fj.quantize_block_scaling(a, "e4m3", True, True, a_mode)
        qb = fj.quantize_block_scaling(b, "e4m3", True, True, b_mode)
        return qa, qb

    def gemm(m, k, n, a_spec, b_spec, exact):
        qa, qb = operands(m, k, n)
        f = jax.jit(lambda a, b: fj.gemm(a, b, out_dtype=jnp.float32))
        want = np.asarray(f(qa, qb))
        # The operands laid out sharded as a quantization of sharded inputs
        # would leave them.
        spec_of = lambda st, spec: jax.tree_util.tree_map(  # noqa: E731
            lambda a: put(a, P(*spec[::-1]) if a.shape == st.columnwise_data.shape
                          and a.dtype == st.dtype else spec if a.dtype == st.dtype else P()), st)
        got = np.asarray(sharded(f, spec_of(qa, a_spec), spec_of(qb, b_spec)))
        if exact and exact_gemm:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=sum_atol(platform, want, 1e-4))

    def case_gemm_dp():
        gemm(256, 256, 128, P("dp", None), P(None, None), exact=True)

    def case_gemm_tp_n():
        gemm(64, 256, 1024, P(None, None), P(None, "tp"), exact=True)

    def case_gemm_tp_k():
        gemm(64, 2048, 128, P(None, "tp"), P("tp", None), exact=False)

    def dense(x_spec, w_spec, b_spec, y_spec, exact, on=mesh, n=256):
        x = jnp.asarray(rng.standard_normal((256, 256)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((256, n)) * 0.05, jnp.float32)
        b = jnp.asarray(rng.standard_normal(n) * 0.1, jnp.float32)
        dy = jnp.asarray(rng.standard_normal((256, n)), jnp.bfloat16)

        @jax.jit
        def fwd_bwd(x, w, b, dy):
            y, vjp = jax.vjp(lambda x, w, b: fj.dense(x, w, b, recipe=BlockScaling()), x, w, b)
            return y, vjp(dy)

        want = fwd_bwd(x, w, b, dy)
        y, g = sharded(fwd_bwd, put(x, x_spec, on), put(w, w_spec, on), put(b, b_spec, on),
                       put(dy, y_spec, on), on=on)
        for name, a, ref, bit_exact in zip(("y", "dx", "dk", "db"), (y, *g), (want[0], *want[1]),
                                           exact):
            assert_matches(name, a, ref, platform, bit_exact and exact_gemm)
        return y, g

    def case_dense_dp():
        # 128 tokens per device: whole 128-row tiles of the columnwise copies.
        dense(P("dp", None), P(None, None), P(None), P("dp", None), (True, True, False, False))

    def case_dense_tp_n():
        # 512 kernel columns per device: whole 128x128 blocks and scale padding.
        dense(P(None, None), P(None, "tp"), P("tp"), P(None, "tp"), (True, False, True, True),
              n=2048)

    def case_dense_dp_explicit():
        y, (dx, dw, db) = dense(P("dp", None), P(None, None), P(None), P("dp", None),
                                (True, True, False, False), on=explicit_mesh)
        assert jax.typeof(y).sharding.spec == P("dp", None), jax.typeof(y)
        assert jax.typeof(dx).sharding.spec == P("dp", None), jax.typeof(dx)

    cases = {k[len("case_"):]: f for k, f in locals().items() if k.startswith("case_")}
    run_cases(CASES, lambda name: cases[name]())


# ----------------------------------------------------------------- parent side --

@pytest.mark.parametrize("case", CASES)
def test_block_sharded_matches_unsharded(case):
    assert_case_ok(__file__, case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_block_sharded_on_gpus(case):
    assert_case_ok(__file__, case, "gpu", "2x1")


if __name__ == "__main__":
    _child(sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")))
