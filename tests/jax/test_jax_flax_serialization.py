"""Saving and restoring fp8kit.jax.flax variables, the "fp8_state"
collection's DelayedScalingState included: Flax's serialization (to_bytes /
from_bytes, msgpack, state dicts) round-trips them bit for bit and the
restored variables train on as the saved ones do; a restore checks the
state (shapes of the target, values) and names the variable; Orbax saves
and restores the state as the pytree it is."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8kit.recipe import DelayedScaling

HIDDEN, FFN = 32, 48


@pytest.fixture(scope="module")
def ff():
    pytest.importorskip("flax")
    return importlib.import_module("fp8kit.jax.flax")


@pytest.fixture(scope="module")
def serialization(ff):
    return importlib.import_module("flax.serialization")


def _model(ff, history=3):
    return ff.LayerNormMLP(FFN, activation="swiglu", recipe=DelayedScaling(
        amax_history_len=history))


X = jnp.asarray(np.random.default_rng(0).standard_normal((16, HIDDEN)), jnp.bfloat16)


def _step(model):
    """One jitted differentiated step on the variables: (new variables, loss)."""
    def loss_fn(params, fp8_state):
        y = model.apply({"params": params, "fp8_state": fp8_state}, X)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    @jax.jit
    def step(variables):
        loss, (grads, fp8_state) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            variables["params"], variables["fp8_state"])
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, variables["params"], grads)
        return {"params": params, "fp8_state": fp8_state}, loss

    return step


def _bits(tree):
    return [np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(tree)]


def _trained(ff):
    """A model and its variables after one step (a seeded, recorded state)."""
    model = _model(ff)
    variables, _ = _step(model)(model.init(jax.random.key(1), X))
    assert float(variables["fp8_state"]["scaling"].seeded[0]) == 1.0
    return model, variables


def test_to_bytes_and_from_bytes_round_trip_and_train_on(ff, serialization):
    model, variables = _trained(ff)
    fresh = model.init(jax.random.key(2), X)
    restored = serialization.from_bytes(fresh, serialization.to_bytes(variables))
    assert type(restored["fp8_state"]["scaling"]).__name__ == "DelayedScalingState"
    assert _bits(restored) == _bits(variables)
    step = _step(model)
    (after_saved, loss_saved), (after_restored, loss_restored) = step(variables), step(restored)
    assert float(loss_saved) == float(loss_restored)
    assert _bits(after_restored) == _bits(after_saved)


def test_msgpack_and_state_dicts_round_trip(ff, serialization):
    _, variables = _trained(ff)
    state_dict = serialization.to_state_dict(variables)
    assert sorted(state_dict["fp8_state"]["scaling"]) == ["amax_history", "scale", "seeded"]
    restored = serialization.from_state_dict(
        variables, serialization.msgpack_restore(serialization.msgpack_serialize(state_dict)))
    assert _bits(restored) == _bits(variables)


@pytest.mark.parametrize("field,value,match", [
    ("scale", np.nan, r"scale holds nan \(flat index 1\); scale values must be finite and > 0: "
                      "the checkpoint is corrupt"),
    ("scale", 0.0, "scale holds 0 "),
    ("seeded", 2.0, "seeded holds 2 .* call it once per step"),
], ids=["scale-nan", "scale-0", "seeded-2"])
def test_a_restore_refuses_a_corrupt_state_and_names_the_variable(ff, serialization, field,
                                                                  value, match):
    _, variables = _trained(ff)
    state_dict = serialization.to_state_dict(variables)
    saved = state_dict["fp8_state"]["scaling"]
    saved[field] = np.array(saved[field])
    saved[field][1] = value
    with pytest.raises(ValueError, match="restoring ./fp8_state/scaling: "
                                         f"DelayedScalingState.from_state_dict: {match}"):
        serialization.from_bytes(variables, serialization.msgpack_serialize(state_dict))


def test_a_restore_into_another_history_length_is_refused(ff, serialization):
    _, variables = _trained(ff)
    other = _model(ff, history=5).init(jax.random.key(1), X)
    with pytest.raises(ValueError, match=r"from_state_dict: saved amax_history has shape "
                                         r"\(6, 3\), this state's \(6, 5\)"):
        serialization.from_bytes(other, serialization.to_bytes(variables))


def test_orbax_saves_and_restores_the_state(ff, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    model, variables = _trained(ff)
    checkpointer = ocp.StandardCheckpointer()
    try:
        checkpointer.save(tmp_path / "ckpt", variables)
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(tmp_path / "ckpt", model.init(jax.random.key(2), X))
    finally:
        checkpointer.close()
    assert type(restored["fp8_state"]["scaling"]).__name__ == "DelayedScalingState"
    assert _bits(restored) == _bits(variables)
