"""fp8kit.jax.flax: Dense, LayerNormDense and LayerNormMLP against the
functions they call (output, every gradient and the delayed-scaling
state's cotangent bit for bit, the three recipes), the state carried
across jitted training steps as the functional loop carries it, a jitted
training step with optax (plain SGD without it) that fits a batch, and
the errors: apply without the state, paired GELU and the other
attributes (checked at construction), a module called twice in one
differentiated step, and the import without Flax (that one runs with or
without Flax).
"""

import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

try:
    import optax
except ImportError:  # the training step falls back to plain SGD
    optax = None

HIDDEN, FFN = 32, 48


@pytest.fixture(scope="module")
def ff():
    pytest.importorskip("flax")
    return importlib.import_module("fp8kit.jax.flax")


def _layer(ff, kind, recipe, **kw):
    """(module, the function it calls on (params, state, x))."""
    if kind == "dense":
        return ff.Dense(FFN, recipe=recipe, **kw), lambda p, s, x: fj.dense(
            x, p["kernel"], p["bias"], state=s, recipe=recipe)
    if kind == "layernorm_dense":
        return ff.LayerNormDense(FFN, normalization="rmsnorm", recipe=recipe, **kw), \
            lambda p, s, x: fj.layernorm_dense(x, p["gamma"], None, p["kernel"], p["bias"],
                                               normalization="rmsnorm", state=s, recipe=recipe)
    act, norm = kw.pop("activation", "gelu"), kw.get("normalization", "layernorm")
    return ff.LayerNormMLP(FFN, activation=act, recipe=recipe, **kw), \
        lambda p, s, x: fj.layernorm_mlp(x, p["gamma"], p.get("beta"), p["kernel_1"],
                                         p["kernel_2"], p["bias_1"], p["bias_2"],
                                         normalization=norm, activation=act, state=s,
                                         recipe=recipe)


def _state(variables):
    return variables.get("fp8_state", {}).get("scaling")


def _bits_equal(got, want, what):
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want),
                            jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8),
                                      err_msg=f"{what}{jax.tree_util.keystr(path)}")


RECIPES = [DelayedScaling(amax_history_len=4), CurrentScaling(), BlockScaling()]


@pytest.mark.parametrize("recipe", RECIPES, ids=["delayed", "current", "block"])
@pytest.mark.parametrize("kind,kw", [("dense", {}), ("layernorm_dense", {}),
                                     ("mlp", {}), ("mlp", dict(activation="swiglu")),
                                     ("mlp", dict(activation="swiglu", paired=True))],
                         ids=["dense", "layernorm_dense", "mlp_gelu", "mlp_swiglu",
                              "mlp_swiglu_paired"])
def test_module_equals_the_function(ff, kind, kw, recipe):
    if isinstance(recipe, BlockScaling) and kind != "mlp":
        pytest.skip("one block-scaled module is enough: the wiring is the recipe's")
    module, function = _layer(ff, kind, recipe, **kw)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 24, HIDDEN)), jnp.bfloat16)
    variables = module.init(jax.random.key(1), x)
    params, state = variables["params"], _state(variables)
    assert (state is not None) == isinstance(recipe, DelayedScaling)
    y_module, vjp_module = jax.vjp(
        jax.jit(lambda p, s, x: module.apply(
            {"params": p, **({"fp8_state": {"scaling": s}} if s is not None else {})}, x)),
        params, state, x)
    y_function, vjp_function = jax.vjp(jax.jit(function), params, state, x)
    _bits_equal(y_module, y_function, "y")
    dy = jnp.asarray(rng.standard_normal(y_function.shape), jnp.bfloat16)
    _bits_equal(vjp_module(dy), vjp_function(dy), "grads")


def test_paired_and_concatenated_modules_are_one_layer(ff):
    x = jnp.asarray(np.random.default_rng(2).standard_normal((16, HIDDEN)), jnp.bfloat16)
    ys = []
    for paired in (False, True):
        m = ff.LayerNormMLP(FFN, activation="swiglu", paired=paired, recipe=CurrentScaling(),
                            bias_init=jax.nn.initializers.normal(0.1))
        v = m.init(jax.random.key(3), x)
        assert v["params"]["kernel_1"].shape == ((HIDDEN, 2, FFN) if paired else
                                                 (HIDDEN, 2 * FFN))
        ys.append(m.apply(v, x))
    _bits_equal(ys[1], ys[0], "y")


def _regression(rng, steps):
    """Batches of x and the targets of a fixed random linear map."""
    w = rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)
    xs = [rng.standard_normal((32, HIDDEN)) for _ in range(steps)]
    return [(jnp.asarray(x, jnp.bfloat16), jnp.asarray(x @ w, jnp.float32)) for x in xs]


def _mse(y, target):
    return jnp.mean((y.astype(jnp.float32) - target) ** 2)


def test_state_is_carried_across_jitted_steps_as_the_functional_loop_does(ff):
    recipe = DelayedScaling(amax_history_len=3)
    module, function = _layer(ff, "mlp", recipe, activation="swiglu", normalization="rmsnorm")
    batches = _regression(np.random.default_rng(4), 4)
    variables = module.init(jax.random.key(5), batches[0][0])

    def sgd(loss_fn):
        @jax.jit
        def step(params, state, x, target):
            grads, state = jax.grad(loss_fn, argnums=(0, 1))(params, state, x, target)
            return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), state
        return step

    module_step = sgd(lambda p, s, x, t: _mse(
        module.apply({"params": p, "fp8_state": {"scaling": s}}, x), t))
    function_step = sgd(lambda p, s, x, t: _mse(function(p, s, x), t))
    runs = {}
    for name, step in (("module", module_step), ("function", function_step)):
        params, state = variables["params"], _state(variables)
        histories = []
        for x, target in batches:
            params, state = step(params, state, x, target)
            histories.append(np.asarray(state.amax_history))
        runs[name] = (params, state, histories)
    _bits_equal(runs["module"][:2], runs["function"][:2], "after 4 steps")
    histories = runs["module"][2]
    assert np.all(np.asarray(runs["module"][1].seeded) == 1)
    for i in range(1, len(histories)):  # each step rolls its amaxes in
        np.testing.assert_array_equal(histories[i][:, 1], histories[i - 1][:, 0])
        assert not np.array_equal(histories[i][:, 0], histories[i - 1][:, 0]), f"step {i}"


def test_a_training_step_fits_a_batch(ff):
    recipe = DelayedScaling()
    model = ff.LayerNormMLP(FFN, activation="swiglu", normalization="rmsnorm", paired=True,
                            recipe=recipe)
    batches = _regression(np.random.default_rng(6), 1) * 60  # fit one batch
    variables = model.init(jax.random.key(7), batches[0][0])
    params, fp8_state = variables["params"], variables["fp8_state"]

    def loss_fn(params, fp8_state, x, target):
        return _mse(model.apply({"params": params, "fp8_state": fp8_state}, x), target)

    if optax is not None:
        optimizer = optax.adam(3e-3)
        update = lambda g, o, p: optimizer.update(g, o, p)  # noqa: E731
        apply_updates = optax.apply_updates
        opt_state = optimizer.init(params)
    else:
        update = lambda g, o, p: (jax.tree_util.tree_map(lambda x: -0.5 * x, g), o)  # noqa: E731
        apply_updates = lambda p, u: jax.tree_util.tree_map(jnp.add, p, u)  # noqa: E731
        opt_state = None

    @jax.jit
    def train_step(params, fp8_state, opt_state, x, target):
        loss, (grads, fp8_state) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            params, fp8_state, x, target)
        updates, opt_state = update(grads, opt_state, params)
        return apply_updates(params, updates), fp8_state, opt_state, loss

    losses = []
    for x, target in batches:
        params, fp8_state, opt_state, loss = train_step(params, fp8_state, opt_state, x, target)
        losses.append(float(loss))
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.3 * losses[0], losses[::10]


def test_apply_without_the_state_says_what_to_pass(ff):
    module = ff.Dense(16, recipe=DelayedScaling())
    x = jnp.ones((4, HIDDEN), jnp.bfloat16)
    params = module.init(jax.random.key(0), x)["params"]
    with pytest.raises(ValueError, match="'fp8_state' collection, which apply was not given"):
        module.apply({"params": params}, x)


def test_paired_gelu_is_refused(ff):
    with pytest.raises(ValueError, match="paired=True is SwiGLU's kernel_1 layout"):
        ff.LayerNormMLP(FFN, activation="gelu", paired=True, recipe=CurrentScaling())


BAD_ATTRIBUTES = [
    ("LayerNormMLP", dict(ffn_features=0), ValueError,
     "ffn_features=0; it must be a positive multiple of 16 .* use e.g. ffn_features=16"),
    ("LayerNormMLP", dict(ffn_features=-16), ValueError, "ffn_features=-16; it must be a positive"),
    ("LayerNormMLP", dict(ffn_features=40), ValueError, "ffn_features=40; .* ffn_features=48"),
    ("LayerNormMLP", dict(ffn_features=True), TypeError,
     r"ffn_features must be an int, a positive multiple of 16, got True \(bool\)"),
    ("LayerNormMLP", dict(ffn_features=FFN, out_features=8), ValueError, "out_features=8"),
    ("LayerNormMLP", dict(ffn_features=FFN, activation="relu"), ValueError,
     "activation='relu'; use one of"),
    ("LayerNormMLP", dict(ffn_features=FFN, paired=1), TypeError, "paired=1 must be True or False"),
    ("Dense", dict(features=0), ValueError, "features=0; it must be a positive multiple of 16"),
    ("Dense", dict(features=16.0), TypeError, r"features must be an int.*got 16.0 \(float\)"),
    ("Dense", dict(features=16, use_bias="yes"), TypeError, "use_bias='yes' must be True or False"),
    ("Dense", dict(features=16, recipe=None), TypeError, "recipe must be an fp8kit.recipe"),
    ("LayerNormDense", dict(features=24), ValueError, "features=24; .* features=32"),
    ("LayerNormDense", dict(features=16, normalization="batchnorm"), ValueError,
     "normalization='batchnorm'; use one of"),
    ("LayerNormDense", dict(features=16, epsilon=-1.0), ValueError, "epsilon must be >= 0"),
]


@pytest.mark.parametrize("module,kwargs,exc,match", BAD_ATTRIBUTES, ids=[
    f"{m}-" + "-".join(f"{k}={v!r}" for k, v in kw.items()) for m, kw, _, _ in BAD_ATTRIBUTES])
def test_module_attributes_are_checked_at_construction(ff, module, kwargs, exc, match):
    with pytest.raises(exc, match=f"fp8kit.jax.flax.{module}: {match}"):
        getattr(ff, module)(**kwargs)


def _calling_one_mlp_twice(ff, recipe):
    """A parent module calling one LayerNormMLP twice (shared weights and
    state); defined here, where Flax is known to be there."""
    class Twice(ff.nn.Module):
        @ff.nn.compact
        def __call__(self, x):
            mlp = ff.LayerNormMLP(HIDDEN, recipe=recipe)
            return mlp(mlp(x))
    return Twice()


def test_a_module_called_twice_per_step_is_refused_while_tracing(ff):
    model = _calling_one_mlp_twice(ff, DelayedScaling())
    x = jnp.ones((4, HIDDEN), jnp.bfloat16)
    variables = model.init(jax.random.key(0), x)

    def loss_fn(params, fp8_state):
        y = model.apply({"params": params, "fp8_state": fp8_state}, x)
        return jnp.sum(y.astype(jnp.float32))

    step = jax.jit(jax.grad(loss_fn, argnums=(0, 1)))
    with pytest.raises(ValueError, match="layernorm_mlp: this DelayedScalingState is already used "
                                         "by another call.*call it once per step, or make one "
                                         "module per use"):
        step(variables["params"], variables["fp8_state"])
    # Read, not updated (no state gradient): calling it twice is allowed.
    y = jax.jit(model.apply)(variables, x)
    assert y.shape == x.shape and np.isfinite(np.asarray(y, np.float32)).all()


def test_import_without_flax_says_pip_install_flax(monkeypatch):
    monkeypatch.delitem(sys.modules, "fp8kit.jax.flax", raising=False)
    for name in ("flax", "flax.linen"):
        monkeypatch.setitem(sys.modules, name, None)  # import flax now raises ImportError
    with pytest.raises(ImportError, match="pip install flax"):
        importlib.import_module("fp8kit.jax.flax")
