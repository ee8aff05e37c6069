"""The statistics rows of the casts fused into layernorm_dense's norm and
layernorm_mlp's norm and activation (the norm output, the activation and
its gradient dh) under the three recipes. Each row is the statistics
(tests/fp8_reference.py) of the values the layer recorded and of the FP8
copy its GEMM reads; that copy is the recipe's cast of those values, and
they are the layer's intermediates (the float64 models', but for FP8
rounding flips). The fused calls' optional high-precision result is the
value their cast read, and asking for it changes no other result. Under
vmap and on two CPU devices the rows are the unbatched, unsharded ones."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_cpu_devices

import block_fused_layers_model as block_model
import fp8_reference as ref
import fp8kit.jax as fj
import fused_layers_float64 as model
from fp8kit.jax import _ffi_fused as fused
from fp8kit.jax import _statistics_rows as stats_rows
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = [DelayedScaling(), CurrentScaling(), BlockScaling()]
HIDDEN, F, N = 128, 96, 64
# The state rows each layer's fused kernels cast (fused_mlp_layer.py).
FUSED_ROWS = {"dense": (0,), "gelu": (0, 2, 4), "swiglu": (0, 2, 4), "paired": (0, 2, 4)}


def _params(case, seed=0):
    rng = np.random.default_rng(seed)
    n1 = F if case == "gelu" else 2 * F
    p = dict(gamma=1 + 0.2 * rng.standard_normal(HIDDEN), beta=0.2 * rng.standard_normal(HIDDEN),
             kernel_1=rng.standard_normal((HIDDEN, n1)) / 8, bias_1=0.1 * rng.standard_normal(n1),
             kernel_2=rng.standard_normal((F, N)) / 8, kernel=rng.standard_normal((HIDDEN, N)) / 8)
    return {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}


def _layer(case, recipe, p, state):
    """The layer of `case` as f(x, rows) (float32 parameters)."""
    if case == "dense":
        return lambda x, rows: fj.layernorm_dense(x, p["gamma"], p["beta"], p["kernel"],
                                                  state=state, recipe=recipe, statistics=rows)
    k1, b1 = p["kernel_1"], p["bias_1"]
    if case == "paired":
        k1, b1 = k1.reshape(HIDDEN, 2, F), b1.reshape(2, F)
    return lambda x, rows: fj.layernorm_mlp(
        x, p["gamma"], p["beta"], k1, p["kernel_2"], b1, activation="gelu" if case == "gelu"
        else "swiglu", state=state, recipe=recipe, statistics=rows)


def _state(recipe, case):
    if not isinstance(recipe, DelayedScaling):
        return None
    return fj.DelayedScalingState.create(recipe, num_linears=1 if case == "dense" else 2)


@pytest.fixture
def recorded(monkeypatch):
    """{row: (x, bits, scales, fmt, mode, columnwise, numel)}: what each
    _statistics_rows.record call of a layer was given, on the host."""
    seen = {}
    original = stats_rows.record

    def record(rows, row, x, scaled, numel):
        if rows is not None:
            columnwise = scaled.data is None
            data = scaled.columnwise_data if columnwise else scaled.data
            scales = scaled.scale_inv
            if scaled.block_scaled:
                scales = (scaled.columnwise_block_scale_inv if columnwise
                          else scaled.block_scale_inv)

            def keep(x, data, scales):
                seen[row] = (np.asarray(x), np.asarray(data).view(np.uint8), np.asarray(scales),
                             scaled.fp8_dtype, scaled.scaling_mode, columnwise, numel)

            jax.debug.callback(keep, x, data, scales)
        return original(rows, row, x, scaled, numel)

    monkeypatch.setattr(stats_rows, "record", record)
    return seen


def _model_values(case, recipe, p, x, dy):
    """The float64 model's value of each fused row's cast: {row: [tokens, cols]}."""
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    x, dy = f64(x), f64(dy)
    if isinstance(recipe, BlockScaling):
        values = []

        class Keep(block_model.Quantizer):
            def tiles(self, v, fmt):
                values.append(np.asarray(v, np.float64))
                return super().tiles(v, fmt)

        q = Keep(recipe)
        if case == "dense":
            block_model.layernorm_dense(x, f64(p["gamma"]), f64(p["beta"]), f64(p["kernel"]), None,
                                        dy, "layernorm", 1e-5, q, jnp.float32, jnp.float32)
            return {0: values[0]}
        block_model.layernorm_mlp(x, f64(p["gamma"]), f64(p["beta"]), f64(p["kernel_1"]),
                                  f64(p["bias_1"]), f64(p["kernel_2"]), None, dy, "layernorm",
                                  "gelu" if case == "gelu" else "swiglu", 1e-5, q, jnp.float32,
                                  jnp.float32)
        return {0: values[0], 2: values[1], 4: values[3]}  # tiles: ln, a, dy, dh

    values = {}

    class Keep(model.Scales):
        def __call__(self, slot, v):
            values[slot] = np.asarray(v, np.float64)
            return super().__call__(slot, v)

    linears = 1 if case == "dense" else 2
    fmts = ("e4m3",) * (2 * linears) + ("e5m2",) * linears
    scales = Keep(isinstance(recipe, DelayedScaling), fmts, 0, np.ones(3 * linears),
                  np.zeros(3 * linears))
    if case == "dense":
        model.dense(x, f64(p["gamma"]), f64(p["beta"]), f64(p["kernel"]), None, dy, "layernorm",
                    1e-5, scales, jnp.float32, False)
    else:
        model.mlp(x, f64(p["gamma"]), f64(p["beta"]), f64(p["kernel_1"]), f64(p["bias_1"]),
                  f64(p["kernel_2"]), None, dy, "layernorm", "gelu" if case == "gelu" else "swiglu",
                  1e-5, scales, jnp.float32, False)
    return {row: values[row] for row in FUSED_ROWS[case]}


def _the_recipes_cast(recipe, v, fmt, mode):
    """The FP8 codes of the recipe's cast of v (a fresh delayed slot seeds
    its scale from v's amax, as current scaling does)."""
    kw = ({} if isinstance(recipe, DelayedScaling)
          else dict(amax_epsilon=recipe.amax_epsilon, power_2_scale=recipe.power_2_scale))
    if mode == "per_tensor":
        st, _ = fj.quantize_current_scaling(v, fmt, **kw)
    else:
        st = fj.quantize_block_scaling(v, fmt, scaling_mode=mode, **kw)
    return np.asarray(st.data).view(np.uint8)


@pytest.mark.parametrize("tokens", [40, 1])
@pytest.mark.parametrize("case", ["dense", "gelu", "swiglu", "paired"])
@pytest.mark.parametrize("recipe", RECIPES, ids=["delayed", "current", "block"])
def test_fused_rows_are_the_statistics_of_the_layers_casts(recipe, case, tokens, recorded):
    rng = np.random.default_rng(tokens)
    p = _params(case)
    x = jnp.asarray(rng.standard_normal((tokens, HIDDEN)), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((tokens, N)), jnp.float32)
    layer = _layer(case, recipe, p, _state(recipe, case))
    _, vjp = jax.vjp(jax.jit(layer), x, fj.statistics_rows(1 if case == "dense" else 2))
    rows = stats_rows.read(vjp(dy)[1])
    want_values = _model_values(case, recipe, p, x, dy)
    block = isinstance(recipe, BlockScaling)
    for row in FUSED_ROWS[case]:
        if block and case == "paired" and row == 4:  # dh cast half by half
            assert rows[row] is None and row not in recorded
            continue
        v, bits, scales, fmt, mode, columnwise, numel = recorded[row]
        got = rows[row]
        what = f"row {row}"
        # The statistics of the layer's own copy, by the NumPy reference.
        shape = v.shape
        want = ref.cast_statistics(v, ref.logical_bits(bits, shape, columnwise), fmt,
                                   ref.element_scale_inv(scales, mode, shape, columnwise))
        ref.assert_cast_statistics(got, want, what)
        cols = v.shape[-1] * (2 if v.ndim == 3 else 1)
        assert got["numel"] == numel == tokens * cols, what
        assert got["scale"] == (None if block else float(np.float32(1) / scales.reshape(()))), \
            what
        # That copy is the recipe's cast of the values recorded (padded
        # with zero token rows under BlockScaling) ...
        v2 = v.reshape(v.shape[0], cols)
        np.testing.assert_array_equal(_the_recipes_cast(recipe, v2, fmt, mode),
                                      bits.reshape(v2.shape), err_msg=what)
        assert not np.any(v2[tokens:]), what
        # ... and those are the layer's values: the model's, but for FP8
        # rounding flips upstream (h and d_a come from FP8 GEMMs).
        v2, w = v2[:tokens].astype(np.float64), want_values[row]
        err = np.linalg.norm(v2 - w) / np.linalg.norm(w)
        assert err < 1e-2, f"{what}: relative error {err:.3g} from the model's"


def test_rows_under_vmap_are_each_examples_rows():
    recipe = CurrentScaling()
    p = _params("swiglu")
    xs = jnp.asarray(np.random.default_rng(5).standard_normal((3, 24, HIDDEN)), jnp.bfloat16)
    layer = _layer("swiglu", recipe, p, None)

    def rows(x, rows):
        return jax.grad(lambda r: jnp.sum(layer(x, r).astype(jnp.float32) ** 2))(rows)

    batched = jax.jit(jax.vmap(rows, in_axes=(0, None)))(xs, fj.statistics_rows(2))
    for i in range(xs.shape[0]):
        one = jax.jit(rows)(xs[i], fj.statistics_rows(2))
        assert all(r is not None for r in stats_rows.read(one))
        np.testing.assert_array_equal(batched[i], one)


# --- the fused calls' high-precision result ----------------------------------------------

SCALE = 8.0  # a seeded delayed slot's


def _run(op, kind, dtype, high_precision):
    """(CastResult, the op's other results) of one fused call on inputs of
    `dtype` (bfloat16 values whatever the dtype)."""
    rng = np.random.default_rng(7)

    def rnd(*shape, offset=0.0):
        values = offset + rng.standard_normal(shape) / 4
        return jnp.asarray(jnp.asarray(values, jnp.bfloat16), dtype)

    fmt = "e5m2" if op == "backward" else "e4m3"
    if kind == "current":
        cast, state = fused.FusedCast(fmt=fmt, copies=(True, True), delayed=False), None
    else:
        cast = fused.FusedCast(fmt=fmt, copies=(True, True), delayed=True,
                               record=kind == "delayed_update", slot=1)
        state = fused.DelayedState(jnp.ones((2, 4), jnp.float32),
                                   jnp.full((2,), SCALE, jnp.float32), jnp.ones((2,), jnp.float32))
    cast = dataclasses.replace(cast, high_precision=high_precision)
    if op in ("layernorm", "rmsnorm"):
        x, gamma, beta = rnd(24, 64), rnd(64, offset=1.0), rnd(64)
        result, mean, rsigma = fused.norm_forward_call(cast, state, x, gamma, beta, op, 1e-5)
        return result, (mean, rsigma)
    if op == "forward":
        return fused.activation_forward_call(cast, state, rnd(24, 96), "swiglu"), ()
    return fused.activation_backward_call(cast, state, rnd(24, 48), rnd(24, 96), "swiglu"), ()


def _leaves(result, others):
    return [np.asarray(a, np.float32)
            for a in jax.tree.leaves((dataclasses.astuple(result), others))]


# Every target; the activation backward always records (no read-only one).
@pytest.mark.parametrize("op,kind", [
    (op, kind) for op in ("layernorm", "rmsnorm", "forward", "backward")
    for kind in ("current", "delayed_update", "delayed") if (op, kind) != ("backward", "delayed")])
def test_the_high_precision_result_is_the_value_cast(op, kind):
    plain = _run(op, kind, jnp.float32, False)
    result, others = _run(op, kind, jnp.float32, True)
    assert plain[0].high_precision is None
    hp = np.asarray(result.high_precision)
    assert hp.dtype == np.float32 and hp.shape == result.data.shape
    # Asking for it changes no other result.
    for a, b in zip(_leaves(dataclasses.replace(result, high_precision=None), others),
                    _leaves(*plain), strict=True):
        np.testing.assert_array_equal(a, b)
    # The FP8 copy is its cast: with the current scale of its amax, or the
    # seeded slot's.
    fmt = "e5m2" if op == "backward" else "e4m3"
    scale = ref.current_scale(ref.amax(hp), fmt) if kind == "current" else np.float32(SCALE)
    np.testing.assert_array_equal(np.asarray(result.data).view(np.uint8),
                                  ref.quantize_bits(hp, scale, fmt))
    # In bfloat16 it is the same float32 value, rounded (and cast alike).
    result16, _ = _run(op, kind, jnp.bfloat16, True)
    assert result16.high_precision.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(result16.high_precision, np.float32),
                                  np.asarray(jnp.asarray(hp, jnp.bfloat16), np.float32))
    np.testing.assert_array_equal(np.asarray(result16.data).view(np.uint8),
                                  np.asarray(result.data).view(np.uint8))


# --- two CPU devices ---------------------------------------------------------------------

def test_rows_of_sharded_calls_are_the_unsharded_calls():
    # Tokens split over two devices, and layernorm_mlp's F split over them
    # (its paired SwiGLU kernel_1 and kernel_2's rows): each fused cast's
    # row is that of the whole tensor. A fixed dy keeps the backward's
    # inputs the same bits (y's psum over F may round apart).
    script = """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        import fp8kit.jax as fj
        from fp8kit.jax import _statistics_rows as stats_rows
        from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
        rng = np.random.default_rng(0)
        bf16 = lambda *s: jnp.asarray(rng.standard_normal(s) / 4, jnp.bfloat16)
        x, g, dy = bf16(256, 128), 1 + bf16(128), bf16(256, 64)
        k1, k2, k = bf16(128, 2, 128), bf16(128, 64), bf16(128, 64)
        mesh = jax.make_mesh((2,), ("d",))
        put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
        same = lambda a, b: np.array_equal(a, b, equal_nan=True)  # BlockScaling's NaN scale
        def rows(layer, recipe, n, *args):
            state = (fj.DelayedScalingState.create(recipe, num_linears=n)
                     if isinstance(recipe, DelayedScaling) else None)
            def f(rows, *args):
                _, vjp = jax.vjp(lambda r: layer(*args, state=state, recipe=recipe,
                                                 statistics=r), rows)
                return vjp(dy)[0]
            return np.asarray(jax.jit(f)(fj.statistics_rows(n), *args))
        dense = lambda x, **kw: fj.layernorm_dense(x, g, None, k, normalization="rmsnorm", **kw)
        mlp = lambda x, k1, k2, **kw: fj.layernorm_mlp(x, g, None, k1, k2,
                                                      normalization="rmsnorm",
                                                      activation="swiglu", **kw)
        for recipe in (CurrentScaling(), DelayedScaling(), BlockScaling()):
            whole = rows(dense, recipe, 1, x)
            print(same(rows(dense, recipe, 1, put(x, "d")), whole),
                  all(r is not None for r in stats_rows.read(whole)))
            whole = rows(mlp, recipe, 2, x, k1, k2)
            print(same(rows(mlp, recipe, 2, put(x, "d"), k1, k2), whole),
                  all(stats_rows.read(whole)[r] is not None for r in (0, 2, 3)))
        for recipe in (CurrentScaling(), DelayedScaling()):
            whole = rows(mlp, recipe, 2, x, k1, k2)
            print(same(rows(mlp, recipe, 2, x, put(k1, None, None, "d"),
                                      put(k2, "d", None)), whole),
                  all(r is not None for r in stats_rows.read(whole)))
        """
    stdout = two_cpu_devices.run(script)
    assert stdout.split() == ["True"] * 16
