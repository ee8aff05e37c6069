"""layernorm_mlp and layernorm_dense under BlockScaling with the tokens
sharded on 8 CPU devices (a 2x4 ("dp", "tp") mesh, tokens over "dp")
against the unsharded call, and a token sharding that would split a
128-token tile of the wgrad's columnwise copies, refused by name (on 2
GPUs too when there are).

As in test_jax_block_sharding.py, the cases run in a child process started
with XLA_FLAGS=--xla_force_host_platform_device_count=8 (this file run as
a script); each parametrized test asserts one case. y and dx come out bit
for bit on the CPU (every token row is normalized, quantized and
multiplied whole on one device); the weight, bias and norm parameter
gradients, summed over tokens split across devices, to float32 rounding.
"""

import sys

import pytest

from sharding_child import assert_case_ok, assert_matches, run_cases

CASES = ["mlp_rmsnorm_swiglu_auto", "mlp_layernorm_gelu_explicit", "layernorm_dense_auto",
         "refused_auto_axes", "refused_explicit_axes"]


# ------------------------------------------------------------------ child side --

def _child(platform: str, mesh_shape: tuple[int, int]):
    # One function, so that the parent module imports no jax.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    import fp8kit.jax as fj
    from fp8kit.recipe import BlockScaling

    devices = jax.devices(platform)[:mesh_shape[0] * mesh_shape[1]]
    meshes = {"auto": Mesh(np.array(devices).reshape(mesh_shape), ("dp", "tp")),
              "explicit": jax.make_mesh(mesh_shape, ("dp", "tp"), devices=devices,
                                        axis_types=(AxisType.Explicit,) * 2)}
    jax.config.update("jax_default_device", devices[0])
    exact = platform == "cpu"  # cuBLASLt may sum another M differently
    rng = np.random.default_rng(0)
    hidden, ffn, n = 256, 176, 144

    def run(layer, axes, lead=(2, 128), normalization="rmsnorm", activation="swiglu"):
        """fwd + bwd of `layer` ("mlp" or "dense") with x's tokens sharded
        over "dp", against the unsharded call."""
        mesh = meshes[axes]
        n1 = 2 * ffn if activation == "swiglu" else ffn
        x = jnp.asarray(rng.standard_normal((*lead, hidden)), jnp.bfloat16)
        gamma = jnp.asarray(1 + 0.1 * rng.standard_normal(hidden), jnp.bfloat16)
        beta = jnp.asarray(0.1 * rng.standard_normal(hidden), jnp.bfloat16) \
            if normalization == "layernorm" else None
        k1 = jnp.asarray(rng.standard_normal((hidden, n1)) / 16, jnp.float32)
        k2 = jnp.asarray(rng.standard_normal((ffn, n)) / 12, jnp.float32)
        b1 = jnp.asarray(rng.standard_normal(n1) * 0.1, jnp.float32)
        b2 = jnp.asarray(rng.standard_normal(n) * 0.1, jnp.float32)
        recipe = BlockScaling()
        if layer == "mlp":
            params, out_n = (gamma, beta, k1, k2, b1, b2), n
            call = lambda x, p: fj.layernorm_mlp(  # noqa: E731
                x, *p, normalization=normalization, activation=activation, recipe=recipe)
        else:
            params, out_n = (gamma, beta, k1, b1), n1
            call = lambda x, p: fj.layernorm_dense(  # noqa: E731
                x, *p, normalization=normalization, recipe=recipe)
        dy = jnp.asarray(rng.standard_normal((*lead, out_n)), jnp.bfloat16)

        @jax.jit
        def fwd_bwd(x, p, dy):
            y, vjp = jax.vjp(call, x, p)
            return y, vjp(dy)

        ref = fwd_bwd(x, params, dy)
        with jax.set_mesh(mesh):
            put = lambda a, spec: None if a is None else jax.device_put(  # noqa: E731
                a, NamedSharding(mesh, spec))
            rep = lambda a: put(a, P(*([None] * a.ndim))) if a is not None else None  # noqa: E731
            got = fwd_bwd(put(x, P("dp", None, None)), tuple(rep(a) for a in params),
                          put(dy, P("dp", None, None)))
        (y, (dx, dp)), (ref_y, (ref_dx, ref_dp)) = got, ref
        for name, a, want in (("y", y, ref_y), ("dx", dx, ref_dx)):
            assert_matches(name, a, want, platform, exact)
        for i, (a, want) in enumerate(zip(dp, ref_dp)):
            if want is not None:
                assert_matches(f"param grad {i}", a, want, platform, False, 1e-4)
        if axes == "explicit":
            assert jax.typeof(y).sharding.spec[0] == "dp", jax.typeof(y)
            assert jax.typeof(dx).sharding.spec[0] == "dp", jax.typeof(dx)

    def case_mlp_rmsnorm_swiglu_auto():
        run("mlp", "auto")

    def case_mlp_layernorm_gelu_explicit():
        run("mlp", "explicit", normalization="layernorm", activation="gelu")

    def case_layernorm_dense_auto():
        run("dense", "auto", normalization="layernorm")

    def refused(axes):
        # 32 tokens per device: the wgrad's columnwise copies need whole
        # 128-token tiles on each.
        try:
            run("mlp", axes, lead=(2, 32))
        except Exception as e:  # noqa: BLE001 - the message is the check
            assert "sharded over mesh axes ('dp',)" in str(e), e
            assert "multiple of 128 rows" in str(e), e
            return e
        raise AssertionError("a tile-splitting token sharding was not refused")

    def case_refused_auto_axes():
        refused("auto")  # by the partitioner, inside XLA's error

    def case_refused_explicit_axes():
        e = refused("explicit")
        assert isinstance(e, ValueError), e  # raised while tracing
        assert str(e).startswith("fp8kit.jax.layernorm_mlp: the norm output has shape"), e

    cases = {k[len("case_"):]: f for k, f in locals().items() if k.startswith("case_")}
    run_cases(CASES, lambda name: cases[name]())


# ----------------------------------------------------------------- parent side --

@pytest.mark.parametrize("case", CASES)
def test_block_fused_sharded_matches_unsharded(case):
    assert_case_ok(__file__, case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_block_fused_sharded_on_gpus(case):
    assert_case_ok(__file__, case, "gpu", "2x1")


if __name__ == "__main__":
    _child(sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")))
