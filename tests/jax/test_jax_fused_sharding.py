"""layernorm_mlp and layernorm_dense sharded over the tokens on 8 CPU
devices against the unsharded call (and on 2 GPUs when there are).

As in test_jax_sharding.py, the cases run in a child process started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (this file, run as a
script), which reports per case. Checks: y and dx bit for bit on the CPU
(every row is computed whole on one device, each cast with the global
amax); the weight, bias, gamma and beta gradients (sums over the tokens,
split across devices) to float32 rounding; the delayed-scaling state bit
for bit; and no all-gather of an operand in the compiled program.
"""

import sys

import pytest

from sharding_child import assert_case_ok, assert_matches, run_cases

MLP_CASES = [f"mlp_{norm}_{act}_{recipe}_{axes}"
             for norm, act in (("layernorm", "gelu"), ("rmsnorm", "swiglu"))
             for recipe in ("current", "delayed") for axes in ("auto", "explicit")]
CASES = [*MLP_CASES, "mlp_tokens_on_one_axis", "layernorm_dense_delayed",
         "layernorm_dense_current"]


# ------------------------------------------------------------------ child side --

def _child(platform: str, mesh_shape: tuple[int, int]):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    import fp8kit.jax as fj
    from fp8kit.recipe import CurrentScaling, DelayedScaling

    devices = jax.devices(platform)[:mesh_shape[0] * mesh_shape[1]]
    assert len(devices) == mesh_shape[0] * mesh_shape[1], jax.devices()
    meshes = {"auto": Mesh(np.array(devices).reshape(mesh_shape), ("dp", "tp")),
              "explicit": jax.make_mesh(mesh_shape, ("dp", "tp"), devices=devices,
                                        axis_types=(AxisType.Explicit,) * 2)}
    jax.config.update("jax_default_device", devices[0])
    exact = platform == "cpu"  # cuBLASLt may sum another M differently
    rng = np.random.default_rng(0)
    hidden, ffn, n = 64, 48, 32

    def recipe_of(name):
        return CurrentScaling() if name == "current" else DelayedScaling(amax_history_len=4)

    def run(layer, recipe_name, tokens_spec, axes, lead=(8, 16), **kw):
        """fwd + bwd of `layer` ("mlp" or "dense") with x's tokens sharded
        as tokens_spec, against the unsharded call."""
        mesh = meshes[axes]
        recipe = recipe_of(recipe_name)
        norm, act = kw.get("normalization", "layernorm"), kw.get("activation", "gelu")
        n1 = 2 * ffn if act == "swiglu" else ffn
        x = jnp.asarray(rng.standard_normal((*lead, hidden)), jnp.bfloat16)
        gamma = jnp.asarray(1 + 0.1 * rng.standard_normal(hidden), jnp.bfloat16)
        beta = jnp.asarray(0.1 * rng.standard_normal(hidden), jnp.bfloat16) \
            if norm == "layernorm" else None
        k1 = jnp.asarray(rng.standard_normal((hidden, n1)) * 0.2, jnp.float32)
        k2 = jnp.asarray(rng.standard_normal((ffn, n)) * 0.2, jnp.float32)
        b1 = jnp.asarray(rng.standard_normal(n1) * 0.1, jnp.float32)
        b2 = jnp.asarray(rng.standard_normal(n) * 0.1, jnp.float32)
        out_n = n if layer == "mlp" else n1
        dy = jnp.asarray(rng.standard_normal((*lead, out_n)) * 1e-2, jnp.bfloat16)
        delayed = isinstance(recipe, DelayedScaling)
        state = fj.DelayedScalingState.create(recipe, num_linears=2 if layer == "mlp" else 1) \
            if delayed else None
        if layer == "mlp":
            params = (gamma, beta, k1, k2, b1, b2)
            call = lambda x, p, s: fj.layernorm_mlp(x, *p, state=s, recipe=recipe, **kw)  # noqa: E731
        else:
            params = (gamma, beta, k1, b1)
            call = lambda x, p, s: fj.layernorm_dense(x, *p, state=s, recipe=recipe,  # noqa: E731
                                                      normalization=norm)

        @jax.jit
        def fwd_bwd(x, p, s, dy):
            y, vjp = jax.vjp(call, x, p, s)
            return y, vjp(dy)

        ref = fwd_bwd(x, params, state, dy)
        with jax.set_mesh(mesh):
            put = lambda a, spec: None if a is None else jax.device_put(  # noqa: E731
                a, NamedSharding(mesh, spec))
            rep = lambda a: put(a, P(*([None] * a.ndim))) if a is not None else None  # noqa: E731
            args = (put(x, P(tokens_spec, None, None)), tuple(rep(a) for a in params),
                    jax.tree_util.tree_map(rep, state), put(dy, P(tokens_spec, None, None)))
            got = fwd_bwd(*args)
            txt = fwd_bwd.lower(*args).compile().as_text()
        assert "all-gather" not in txt, "the compiled program gathers an operand"
        (y, (dx, dp, ds)), (ref_y, (ref_dx, ref_dp, ref_ds)) = got, ref
        for name, a, want in (("y", y, ref_y), ("dx", dx, ref_dx)):
            assert_matches(name, a, want, platform, exact)
        for i, (a, want) in enumerate(zip(dp, ref_dp)):
            if want is not None:
                assert_matches(f"param grad {i}", a, want, platform, False, 1e-5)
        if delayed:
            for a, want in zip(jax.tree_util.tree_leaves(ds), jax.tree_util.tree_leaves(ref_ds)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(want))
        if axes == "explicit":
            assert jax.typeof(y).sharding.spec[0] == tokens_spec, jax.typeof(y)
            assert jax.typeof(dx).sharding.spec[0] == tokens_spec, jax.typeof(dx)

    both = ("dp", "tp")

    def run_case(name):
        if name in MLP_CASES:
            _, norm, act, recipe_name, axes = name.split("_")
            run("mlp", recipe_name, both, axes, normalization=norm, activation=act)
        elif name == "mlp_tokens_on_one_axis":  # 10 rows per shard, 16 padded for wgrad
            run("mlp", "delayed", "dp", "auto", lead=(2, 10), activation="swiglu",
                normalization="rmsnorm")
        else:
            run("dense", name.rsplit("_", 1)[1], both, "auto")

    run_cases(CASES, run_case)


# ----------------------------------------------------------------- parent side --

@pytest.mark.parametrize("case", CASES)
def test_sharded_matches_unsharded(case):
    assert_case_ok(__file__, case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_sharded_on_gpus(case):
    assert_case_ok(__file__, case, "gpu", "2x1")


if __name__ == "__main__":
    _child(sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")))
