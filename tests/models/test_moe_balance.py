"""The mixture-of-experts decoder's load-balancing loss (Switch
Transformer's E * sum_e f_e * P_e, per MoE layer, summed over the layers):
each framework's against a float64 NumPy reference (values and gradients,
on crafted router scores with known f and P and on random ones), the two
models' against the float64 model, the trainers adding it to the loss they
differentiate times the config's coefficient while reporting the
cross-entropy, a dense model left without one, and training with it
spreading the tokens over the experts more evenly than training without."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import llama_reference as ref
from fp8kit.models import data, llama_jax, llama_torch, moe_jax, moe_torch, train_jax
from fp8kit.models.config import CONFIGS
from fp8kit.models.init import init_params
from fp8kit.models.schedule import TrainConfig
from fp8kit.models.train_jax import JaxTrainer
from fp8kit.models.train_torch import TorchTrainer
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from small_config import SMALL, SMALL_TRAIN

MOE = dataclasses.replace(SMALL, experts=4, top_k=2, init_std=0.1)
TRAINERS = {"torch": TorchTrainer, "jax": JaxTrainer}


def torch_loss(scores, top_k):
    scores = torch.tensor(scores, dtype=torch.float32, requires_grad=True)
    counts = moe_torch.route(scores.detach(), top_k)[3]
    loss = moe_torch.load_balancing_loss(scores, counts, top_k)
    loss.backward()
    return loss.item(), scores.grad.numpy()


def jax_loss(scores, top_k):
    def loss(scores):
        return moe_jax.load_balancing_loss(scores, moe_jax.route(scores, top_k)[3], top_k)
    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(scores, jnp.float32))
    return float(value), np.asarray(grad)


LOSSES = {"torch": torch_loss, "jax": jax_loss}

# Each token's router probabilities, chosen so that its top 2 are plain:
# experts 0, 1, 2, 3 get 3, 1, 2, 2 of the 8 choices (f = 3/8, 1/8, 2/8,
# 2/8), and the mean probabilities are P = .425, .175, .2125, .1875, so the
# loss is 4 * (3 * .425 + .175 + 2 * .2125 + 2 * .1875) / 8 = 1.125.
PROBS = np.array([[0.5, 0.3, 0.15, 0.05],
                  [0.4, 0.1, 0.35, 0.15],
                  [0.1, 0.2, 0.3, 0.4],
                  [0.7, 0.1, 0.05, 0.15]])


def _reference_grad(scores, top_k):
    """d loss / d scores[t, j] = E / T * p[t, j] * (f_j - sum_e f_e p[t, e])."""
    tokens, experts = scores.shape
    top = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    f = np.bincount(top.reshape(-1), minlength=experts) / (tokens * top_k)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return experts / tokens * p * (f - (p * f).sum(-1, keepdims=True))


def test_reference_on_crafted_scores():
    # Scores are the probabilities' logs, each row shifted (softmax ignores it).
    scores = np.log(PROBS) + np.array([[0.0], [3.0], [-2.0], [7.5]])
    assert ref.load_balancing_loss(scores, 2) == pytest.approx(1.125, rel=1e-12)
    # Every expert with as many choices as the others: 1, whatever P is.
    even = np.log(np.array([[0.6, 0.3, 0.06, 0.04], [0.04, 0.06, 0.3, 0.6]]))
    assert ref.load_balancing_loss(even, 2) == pytest.approx(1.0, rel=1e-12)
    # Top-1, every token on expert 0: E * P_0.
    crowded = np.log(np.array([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1]]))
    assert ref.load_balancing_loss(crowded, 1) == pytest.approx(3 * 0.75, rel=1e-12)


@pytest.mark.parametrize("framework", LOSSES)
def test_each_framework_matches_the_reference_on_crafted_scores(framework):
    scores = np.log(PROBS)
    value, grad = LOSSES[framework](scores, 2)
    assert value == pytest.approx(1.125, rel=1e-6)
    np.testing.assert_allclose(grad, _reference_grad(scores, 2), rtol=1e-5, atol=1e-7)
    # The gradient pulls probability away from the crowded expert 0.
    assert np.all(grad[:, 0] > 0)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_both_frameworks_match_the_reference_on_random_scores(top_k):
    scores = np.random.default_rng(top_k).standard_normal((96, 8)) * 2
    scores = scores.astype(np.float32).astype(np.float64)   # what float32 holds
    want = ref.load_balancing_loss(scores, top_k)
    got = {name: fn(scores, top_k) for name, fn in LOSSES.items()}
    for name, (value, grad) in got.items():
        assert value == pytest.approx(want, rel=1e-6), name
        np.testing.assert_allclose(grad, _reference_grad(scores, top_k), rtol=1e-4,
                                   atol=1e-8, err_msg=name)
    assert got["torch"][0] == pytest.approx(got["jax"][0], rel=2e-7)


@pytest.fixture(scope="module")
def params():
    return init_params(MOE, seed=5)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(6).integers(0, 256, size=(2, MOE.seq_len))


def _model_aux(framework, params, tokens, recipe):
    if framework == "torch":
        model = llama_torch.Llama(MOE, recipe)
        llama_torch.load_params(model, params)
        with torch.no_grad():
            return float(model(torch.from_numpy(tokens).long(), return_aux_loss=True)[1])
    jparams = jax.tree.map(jnp.asarray, llama_jax.model_params(params, recipe))
    states = llama_jax.create_fp8_states(MOE, recipe)
    return float(llama_jax.forward_and_aux(jparams, states, jnp.asarray(tokens, jnp.int32),
                                           MOE, recipe)[1])


@pytest.mark.parametrize("recipe", [None, CurrentScaling(), DelayedScaling(), BlockScaling()])
def test_both_models_give_the_reference_aux_loss(params, tokens, recipe):
    """The sum over the layers, within the frameworks' bf16 (FP8) rounding
    of the router's input, which can move a token to another expert (the
    bounds of test_moe_models' loss comparison)."""
    want = ref.aux_loss(params, tokens, MOE)
    assert MOE.layers <= want < 1.5 * MOE.layers
    got = {fw: _model_aux(fw, params, tokens, recipe) for fw in TRAINERS}
    bound = 0.01 if recipe is None else 0.03
    for fw, value in got.items():
        assert abs(value - want) < 2 * bound, (fw, value, want)
    assert abs(got["torch"] - got["jax"]) < bound, got


def test_a_dense_model_has_no_aux_loss():
    tokens = np.zeros((1, 8), np.int64)
    model = llama_torch.Llama(SMALL)
    assert model(torch.from_numpy(tokens), return_aux_loss=True)[1] is None
    jparams = jax.tree.map(jnp.asarray, init_params(SMALL, 0))
    assert llama_jax.forward_and_aux(jparams, None, jnp.asarray(tokens, jnp.int32), SMALL,
                                     None)[1] is None
    for cls in TRAINERS.values():
        trainer = cls(SMALL, SMALL_TRAIN)
        trainer.train_steps(1)
        assert trainer.aux_losses == []


@pytest.mark.parametrize("framework", TRAINERS)
def test_the_trainers_add_the_aux_loss_and_report_the_cross_entropy(framework):
    """The first step's loss is the cross-entropy of the untrained model
    whatever the coefficient; the coefficient changes the update, so the
    next steps' losses; the aux losses are reported apart, one per step."""
    cfg = dataclasses.replace(SMALL, experts=4, top_k=2)
    runs = {}
    for coef in (0.0, 0.5):
        trainer = TRAINERS[framework](dataclasses.replace(cfg, router_aux_loss_coef=coef),
                                      SMALL_TRAIN)
        runs[coef] = (trainer.train_steps(3), trainer.aux_losses)
    (plain, plain_aux), (balanced, balanced_aux) = runs[0.0], runs[0.5]
    assert plain[0] == balanced[0] and plain_aux[0] == balanced_aux[0]
    assert plain[1:] != balanced[1:]
    assert len(balanced_aux) == 3
    assert all(0.9 * cfg.layers < a < 2 * cfg.layers for a in balanced_aux), balanced_aux


def test_both_frameworks_differentiate_the_same_aux_loss(params, tokens):
    """The gradient of the aux loss (the objective at coefficient 1 minus at
    0) for each router: the same in both frameworks, within bf16 rounding."""
    batch = np.concatenate([tokens, tokens[:, :1]], axis=1)
    grads = {}
    for coef in (0.0, 1.0):
        cfg = dataclasses.replace(MOE, router_aux_loss_coef=coef)
        trainer = TorchTrainer(cfg, SMALL_TRAIN, params=params)
        trainer.objective(torch.from_numpy(batch).long())[0].backward()
        grads["torch", coef] = [layer.mlp.router.weight.grad.numpy().T
                                for layer in trainer.model.layers]
        jparams = jax.tree.map(jnp.asarray, params)
        grad = jax.grad(lambda p: train_jax._step_loss(
            p, None, None, jnp.asarray(batch, jnp.int32), cfg, None, llama_jax.FP8KIT_LAYERS,
            None)[0])(jparams)
        grads["jax", coef] = [np.asarray(layer["router"]) for layer in grad["layers"]]
    for i in range(MOE.layers):
        aux = {fw: grads[fw, 1.0][i] - grads[fw, 0.0][i] for fw in TRAINERS}
        assert np.abs(aux["torch"]).max() > 1e-4
        np.testing.assert_allclose(aux["jax"], aux["torch"], rtol=0,
                                   atol=0.05 * np.abs(aux["torch"]).max())


def _expert_loads(trainer, batch) -> np.ndarray:
    """[layers, E]: each expert's share of the batch's (token, slot) choices."""
    inputs = []
    hooks = [layer.mlp.norm.register_forward_hook(lambda m, i, out: inputs.append(out))
             for layer in trainer.model.layers]
    with torch.no_grad():
        trainer.model(torch.from_numpy(batch[:, :-1]).long())
    for hook in hooks:
        hook.remove()
    loads = []
    for layer, h in zip(trainer.model.layers, inputs):
        scores = h.reshape(-1, h.shape[-1]).float() @ layer.mlp.router.weight.float().T
        counts = moe_torch.route(scores, trainer.model_cfg.top_k)[3].numpy()
        loads.append(counts / counts.sum())
    return np.array(loads)


def test_the_aux_loss_spreads_the_tokens_over_the_experts():
    """moe_tiny, 60 bf16 steps: without the loss the most loaded expert of
    a layer takes about 40% of the held-out batch's choices (balanced: 25%,
    the most: 50%, every token), with the default coefficient about 33%.
    (Over seeds 0-3 the two ran at 1.69-1.85 and 1.26-1.44 times E * 25%.)"""
    _, held_out = data.split(data.corpus())
    batch = data.BatchSampler(held_out, 8, CONFIGS["moe_tiny"].seq_len, 123).next()
    crowding = {}
    for coef in (0.0, CONFIGS["moe_tiny"].router_aux_loss_coef):
        cfg = dataclasses.replace(CONFIGS["moe_tiny"], router_aux_loss_coef=coef)
        trainer = TorchTrainer(cfg, TrainConfig(steps=60), device="cpu")
        trainer.train_steps(60)
        # The most loaded expert's share, times E: 1 when balanced.
        crowding[coef] = float(np.mean(_expert_loads(trainer, batch).max(axis=1)) * cfg.experts)
    plain, balanced = crowding.values()
    assert balanced < plain - 0.2, crowding
