"""Sharded fp8kit custom calls on 8 CPU devices against the unsharded result
(and on 2+ GPUs when there are).

XLA's host device count is fixed when jax starts, so the checks run in a
child process started with XLA_FLAGS=--xla_force_host_platform_device_count=8
(this same file, run as a script). The child runs every case once on a
("dp", "tp") mesh and reports per case; each parametrized test below
asserts one case. On a machine with two or more GPUs the same cases also
run on GPU meshes of 2 devices, once as 2x1 and once as 1x2.

Each case checks the values against the unsharded computation (bit for bit
where no reduction is split across devices, to float32 rounding where a
psum adds partial products) and that the compiled program holds no
all-gather: the operands are never gathered whole.
"""

import sys

import pytest

from sharding_child import assert_case_ok, assert_matches, run_cases

# The dense layer under each layout, recipe and kind of mesh axes. Layouts
# of x [4, 16, 64] (tokens, features) and kernel [64, 128]: "dp" shards the
# tokens, "tp_n" the kernel along N, "tp_k" along K (x's features too), and
# the "dp_tp_*" layouts both. Auto axes run before Explicit ones: an
# Explicit case also checks it matches its Auto twin bit for bit.
DENSE_LAYOUTS = ("dp", "tp_n", "tp_k", "dp_tp_n", "dp_tp_k")
DENSE_CASES = [f"dense_{layout}_{recipe}_{axes}" for axes in ("auto", "explicit")
               for layout in DENSE_LAYOUTS for recipe in ("current", "delayed")]

CASES = ["amax", "quantize_rank2", "quantize_rank3", "quantize_current", "gemm_dp",
         "gemm_tp_n", "gemm_tp_k", "gemm_dp_tp_k", *DENSE_CASES, "dense_dp_tokens_20",
         "legacy_mesh_context", "no_mesh_context_still_correct"]


# ------------------------------------------------------------------ child side --

def _child(platform: str, mesh_shape: tuple[int, int]):  # noqa: C901
    # One function, so that the parent module imports no jax.
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    import fp8kit.jax as fj
    from fp8kit.recipe import CurrentScaling, DelayedScaling

    devices = jax.devices(platform)[:mesh_shape[0] * mesh_shape[1]]
    assert len(devices) == mesh_shape[0] * mesh_shape[1], jax.devices()
    mesh = Mesh(np.array(devices).reshape(mesh_shape), ("dp", "tp"))  # Auto axes
    explicit_mesh = jax.make_mesh(mesh_shape, ("dp", "tp"), devices=devices,
                                  axis_types=(AxisType.Explicit,) * 2)
    jax.config.update("jax_default_device", devices[0])
    # The CPU reference GEMM gives each output element the same sums whatever
    # the shard shape; cuBLASLt may pick another algorithm (and rounding) for
    # another M or N, so on GPUs "exact" means float32-close.
    exact_gemm = platform == "cpu"
    rng = np.random.default_rng(0)
    bits = lambda a: np.asarray(a).view(np.uint8)  # noqa: E731

    def put(a, spec, on=mesh):
        return jax.device_put(a, NamedSharding(on, spec))

    def effective(spec):
        # The spec with axes of one device dropped (None), as JAX reports an
        # output's sharding: P(None, "tp") on a mesh whose "tp" has one device
        # comes back as P(None, None).
        keep = lambda a: a if a is not None and mesh.shape[a] > 1 else None  # noqa: E731
        return tuple(keep(a) for a in spec)

    def compiled_text(f, *args):
        return f.lower(*args).compile().as_text()

    def no_gather(f, *args):
        txt = compiled_text(f, *args)
        assert "all-gather" not in txt, "the compiled program gathers an operand"
        assert "fp8kit_" in txt
        return txt

    def sharded(f, *args, on=mesh):
        with jax.set_mesh(on):
            out = f(*args)
            txt = no_gather(f, *args)
        return out, txt

    def case_amax():
        x = rng.standard_normal((64, 128)).astype(np.float32)
        x[37, 100] = -9.5
        f = jax.jit(fj.amax)
        got, txt = sharded(f, put(x, P("dp", "tp")))
        assert float(got) == 9.5 and "all-reduce" in txt

    def _quantize(shape, spec):
        x = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
        x.reshape(-1)[123] = 77.0
        f = jax.jit(lambda x: fj.quantize(x, jnp.float32(3.0), "e4m3", True, True))
        ref = f(x)
        got, _ = sharded(f, put(x, spec))
        np.testing.assert_array_equal(bits(got.data), bits(ref.data))
        np.testing.assert_array_equal(bits(got.columnwise_data), bits(ref.columnwise_data))
        assert float(got.amax) == float(ref.amax) == 77.0  # the global amax on every device
        col_spec = got.columnwise_data.sharding.spec
        assert effective(col_spec)[:1] == effective(spec)[-1:], \
            f"columnwise data not sharded as x transposed: {col_spec} for x {spec}"

    def case_quantize_rank2():
        _quantize((64, 128), P("dp", "tp"))

    def case_quantize_rank3():
        _quantize((4, 16, 64), P("dp", None, "tp"))

    def case_quantize_current():
        x = rng.standard_normal((64, 128)).astype(np.float32)
        x[5, 5] = 300.0  # only one shard holds the max: the scale must still be global
        f = jax.jit(lambda x: fj.quantize_current_scaling(x, "e5m2", True, True))
        ref, ref_scale = f(x)
        (got, scale), txt = sharded(f, put(x, P("dp", "tp")))
        assert float(scale) == float(ref_scale) and float(got.amax) == 300.0
        np.testing.assert_array_equal(bits(got.data), bits(ref.data))
        np.testing.assert_array_equal(bits(got.columnwise_data), bits(ref.columnwise_data))
        assert "all-reduce" in txt

    def _operands(m, k, n):
        a = (rng.standard_normal((m, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
        b = (rng.standard_normal((k, n)) * 2).astype(ml_dtypes.float8_e4m3fn)
        return a, b

    def _gemm(a_spec, b_spec, bias_spec, exact):
        # exact: no reduction is split across devices (K is not sharded).
        m, k, n = 64, 256, 128
        a, b = _operands(m, k, n)
        bias = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
        A = fj.ScaledTensor(jnp.asarray(a), jnp.float32(0.5), jnp.asarray(a.T.copy()))
        B = fj.ScaledTensor(jnp.asarray(b), jnp.float32(0.25), jnp.asarray(b.T.copy()))
        f = jax.jit(lambda A, B, c: fj.gemm(A, B, out_dtype=jnp.float32, bias=c))
        ref = np.asarray(f(A, B, bias))
        As = fj.ScaledTensor(put(A.data, a_spec), A.scale_inv, put(A.columnwise_data, P(*a_spec[::-1])))
        Bs = fj.ScaledTensor(put(B.data, b_spec), B.scale_inv, put(B.columnwise_data, P(*b_spec[::-1])))
        got, txt = sharded(f, As, Bs, put(bias, bias_spec))
        if exact and exact_gemm:
            np.testing.assert_array_equal(np.asarray(got), ref)
        else:
            np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-4)
        if not exact:
            # K split over "tp" needs a sum across it, unless "tp" has one device.
            assert "all-reduce" in txt or mesh.shape["tp"] == 1
        if not exact_gemm:
            np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-4)
        return got

    def case_gemm_dp():
        got = _gemm(P("dp", None), P(None, None), P(None), exact=True)
        assert effective(got.sharding.spec)[:1] == effective(P("dp"))

    def case_gemm_tp_n():
        got = _gemm(P(None, None), P(None, "tp"), P("tp"), exact=True)
        assert effective(got.sharding.spec) == effective(P(None, "tp"))

    def case_gemm_tp_k():
        _gemm(P(None, "tp"), P("tp", None), P(None), exact=False)

    def case_gemm_dp_tp_k():
        _gemm(P("dp", "tp"), P("tp", None), P(None), exact=False)

    def _dense(recipe, x_spec, w_spec, b_spec, exact, lead=(4, 16), y_spec=None, on=mesh):
        """fwd and bwd of dense sharded as given against the unsharded call.
        exact: which of y, dx, dk, db come out bit for bit (no reduction
        split across devices); the state always does (its amaxes are global).
        Returns the sharded results."""
        x = jnp.asarray(rng.standard_normal((*lead, 64)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((64, 128)) * 0.1, jnp.float32)
        b = jnp.asarray(rng.standard_normal(128) * 0.1, jnp.float32)
        dy = jnp.asarray(rng.standard_normal((*lead, 128)), jnp.bfloat16)
        state = fj.DelayedScalingState.create(recipe) if isinstance(recipe, DelayedScaling) \
            else None

        @jax.jit
        def fwd_bwd(x, w, b, s, dy):
            y, vjp = jax.vjp(lambda x, w, b, s: fj.dense(x, w, b, state=s, recipe=recipe),
                             x, w, b, s)
            return y, vjp(dy)

        ref = fwd_bwd(x, w, b, state, dy)
        y_spec = P(*x_spec[:-1], w_spec[-1]) if y_spec is None else y_spec
        got, _ = sharded(fwd_bwd, put(x, x_spec, on), put(w, w_spec, on), put(b, b_spec, on),
                         state, put(dy, y_spec, on), on=on)
        (y, g), (ref_y, ref_g) = got, ref
        for name, a, want, bit_exact in zip(("y", "dx", "dk", "db"), (y, *g[:3]),
                                            (ref_y, *ref_g[:3]), exact):
            assert_matches(name, a, want, platform, bit_exact and exact_gemm)
        if state is not None:
            for a, want in zip(jax.tree_util.tree_leaves(g[3]),
                               jax.tree_util.tree_leaves(ref_g[3])):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(want))
        return got

    # x, kernel, bias specs and y's sharding type under Explicit axes (as a
    # dot's: rows as x's, columns as the kernel's; K is summed inside).
    layouts = {
        "dp": (P("dp", None, None), P(None, None), P(None), P("dp", None, None)),
        "tp_n": (P(None, None, None), P(None, "tp"), P("tp"), P(None, None, "tp")),
        "tp_k": (P(None, None, "tp"), P("tp", None), P(None), P(None, None, None)),
        "dp_tp_n": (P("dp", None, None), P(None, "tp"), P("tp"), P("dp", None, "tp")),
        "dp_tp_k": (P("dp", None, "tp"), P("tp", None), P(None), P("dp", None, None)),
    }
    auto_twins = {}  # (layout, recipe) -> the Auto case's (rng state, results)

    def dense_case(layout, recipe_name, axes):
        x_spec, w_spec, b_spec, y_spec = layouts[layout]
        recipe = CurrentScaling() if recipe_name == "current" else \
            DelayedScaling(amax_history_len=4)
        # y sums over K, dx over N, dk and db over the tokens.
        exact = ("tp_k" not in layout, "tp_n" not in layout, "dp" not in layout,
                 "dp" not in layout)
        twin = auto_twins.pop((layout, recipe_name), None) if axes == "explicit" else None
        if twin is not None:
            rng.bit_generator.state = twin[0]  # the Auto twin's data, again
        rng_state = rng.bit_generator.state
        got = _dense(recipe, x_spec, w_spec, b_spec, exact, y_spec=y_spec,
                     on=explicit_mesh if axes == "explicit" else mesh)
        if axes == "auto":
            auto_twins[layout, recipe_name] = (rng_state, got)
            return
        y, (dx, dw, db, _) = got
        assert jax.typeof(y).sharding.spec == y_spec, jax.typeof(y)
        for name, a, spec in (("dx", dx, x_spec), ("dk", dw, w_spec), ("db", db, b_spec)):
            assert jax.typeof(a).sharding.spec == spec, (name, jax.typeof(a))
        if twin is not None:  # the same program as under Auto axes: the same bits
            for a, want in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(twin[1])):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(want))

    def case_dense_dp_tokens_20():
        # M = 20 tokens, 10 per shard: wgrad pads the columnwise copies to 32.
        _dense(DelayedScaling(), P("dp", None, None), P(None, None), P(None),
               (True, True, False, False), lead=(4, 5))

    def case_legacy_mesh_context():
        x = rng.standard_normal((64, 128)).astype(np.float32)
        f = jax.jit(fj.amax)
        with mesh:
            xs = put(x, P("dp", "tp"))
            assert float(f(xs)) == float(np.abs(x).max())
            assert "all-gather" not in compiled_text(f, xs)

    def case_no_mesh_context_still_correct():
        # Without a mesh in context the plain custom calls run; XLA gathers
        # what they need, and the answer is still right.
        x = rng.standard_normal((64, 128)).astype(np.float32)
        st = jax.jit(lambda x: fj.quantize_current_scaling(x, "e4m3", True, True))
        ref, ref_scale = st(x)
        got, scale = st(put(x, P("dp", "tp")))
        assert float(scale) == float(ref_scale)
        np.testing.assert_array_equal(bits(got.data), bits(ref.data))

    cases = {k[len("case_"):]: f for k, f in locals().items() if k.startswith("case_")}

    def run(name):
        if name in DENSE_CASES:
            dense_case(*name[len("dense_"):].rsplit("_", 2))
        else:
            cases[name]()

    run_cases(CASES, run)


# ----------------------------------------------------------------- parent side --

@pytest.mark.parametrize("case", CASES)
def test_sharded_matches_unsharded(case):
    assert_case_ok(__file__, case)


@pytest.mark.gpu
@pytest.mark.parametrize("mesh_shape", ["2x1", "1x2"])
@pytest.mark.parametrize("case", CASES)
def test_sharded_on_gpus(case, mesh_shape):
    assert_case_ok(__file__, case, "gpu", mesh_shape)


if __name__ == "__main__":
    _child(sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")))
