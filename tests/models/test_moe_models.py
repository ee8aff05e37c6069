"""The mixture-of-experts decoder (experts > 0) in PyTorch and JAX:
routing, the models against the float64 reference (llama_reference.py,
which routes each token itself) and each other, FP8 tracking it, the
weight layout, training, and the PyTorch experts' delayed-scaling state."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import llama_reference as ref
from fp8kit.models import llama_jax, llama_torch, moe_jax
from fp8kit.models.config import CONFIGS, LlamaConfig
from fp8kit.models.init import init_params
from fp8kit.models.moe_torch import route
from fp8kit.models.train_jax import JaxTrainer
from fp8kit.models.train_torch import TorchTrainer
import fp8kit.checkpoint as portable
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch import GroupedLinear
from small_config import SMALL, SMALL_TRAIN

MOE = dataclasses.replace(SMALL, experts=4, top_k=2, init_std=0.1)


@pytest.fixture(scope="module")
def params():
    return init_params(MOE, seed=5)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(6).integers(0, 256, size=(2, MOE.seq_len)).astype(np.int64)


def torch_logits(params, tokens, recipe):
    model = llama_torch.Llama(MOE, recipe)
    llama_torch.load_params(model, params)
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).numpy().astype(np.float64)


def jax_logits(params, tokens, recipe):
    jparams = jax.tree.map(jnp.asarray, llama_jax.model_params(params, recipe))
    states = llama_jax.create_fp8_states(MOE, recipe)
    out = llama_jax.forward(jparams, states, jnp.asarray(tokens, jnp.int32), MOE, recipe)
    return np.asarray(out, np.float64)


LOGITS = {"torch": torch_logits, "jax": jax_logits}


def _relative_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean((want - want.mean()) ** 2)))


SCORES = [[0.0, 3.0, 1.0], [2.0, 0.0, 5.0], [1.0, 1.5, 0.5], [9.0, 8.0, 0.0]]


def test_both_frameworks_route_alike():
    want = route(torch.tensor(SCORES), 2)
    got = moe_jax.route(jnp.asarray(SCORES), 2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6)


def test_balanced_routing_gives_every_expert_the_same_share_in_both_frameworks():
    """LlamaConfig.router_balanced: token t's slot j goes to expert
    (t * top_k + j) mod E whatever the scores, weighed by the softmax of
    its scores there; both frameworks alike."""
    scores = torch.tensor(SCORES)            # 4 tokens, 3 experts, top-2 -> 8 pairs
    expert, token, weight, counts = route(scores, 2, balanced=True)
    assert counts.tolist() == [3, 3, 2]       # as even as 8 pairs over 3 experts go
    for t in range(4):
        mine = token == t
        want = sorted([(2 * t) % 3, (2 * t + 1) % 3])
        assert sorted(expert[mine].tolist()) == want
        torch.testing.assert_close(weight[mine].sum(), torch.tensor(1.0))
        torch.testing.assert_close(
            weight[mine], torch.softmax(scores[t][expert[mine]], dim=0))
    got = moe_jax.route(jnp.asarray(SCORES), 2, balanced=True)
    for g, w in zip(got, (expert, token, weight, counts)):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="router_balanced must be a bool"):
        dataclasses.replace(CONFIGS["moe_tiny"], router_balanced=1)


def test_route_sorts_pairs_by_expert_with_softmax_weights():
    scores = torch.tensor(SCORES)
    expert, token, weight, counts = route(scores, 2)
    assert counts.tolist() == [3, 3, 2]
    assert expert.tolist() == sorted(expert.tolist())
    assert sorted(token.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    for t in range(4):
        mine = token == t
        top = torch.topk(scores[t], 2)
        assert sorted(expert[mine].tolist()) == sorted(top.indices.tolist())
        torch.testing.assert_close(weight[mine].sum(), torch.tensor(1.0))
        want = torch.softmax(top.values, 0)
        got = {int(e): float(w) for e, w in zip(expert[mine], weight[mine])}
        for e, w in zip(top.indices.tolist(), want.tolist()):
            assert got[e] == pytest.approx(w, rel=1e-6)


@pytest.mark.parametrize("framework", LOGITS)
def test_bf16_logits_match_the_float64_reference(framework, params, tokens):
    want = ref.logits(params, tokens, MOE)
    got = LOGITS[framework](params, tokens, None)
    assert want.std() > 0.5
    # As the dense model's bound, with room for a token whose two best
    # router scores are within bf16 rounding and so may swap an expert.
    assert _relative_rms(got, want) < 0.03


@pytest.mark.parametrize("framework", LOGITS)
def test_fp8_logits_track_the_reference(framework, params, tokens):
    want = ref.logits(params, tokens, MOE)
    bf16 = LOGITS[framework](params, tokens, None)
    got = LOGITS[framework](params, tokens, CurrentScaling())
    err = _relative_rms(got, want)
    assert 2 * _relative_rms(bf16, want) < err < 0.25


@pytest.mark.parametrize("recipe", [None, CurrentScaling(), DelayedScaling(), BlockScaling()])
def test_torch_and_jax_give_the_same_loss(params, tokens, recipe):
    """The two frameworks' bf16 attention and softmax round differently;
    in FP8 that difference can flip a cast's rounding and, through a
    router score, a token's expert, so FP8 gets a wider bound (each
    framework's experts are bit-identical to its dense layers, tested
    in the layer suites)."""
    targets = tokens[:, 1:]
    losses = [ref.cross_entropy(fn(params, tokens, recipe)[:, :-1], targets)
              for fn in LOGITS.values()]
    assert abs(losses[0] - losses[1]) < (0.01 if recipe is None else 0.03), losses


def test_weight_layout_round_trips_the_expert_kernels(params):
    model = llama_torch.Llama(MOE, CurrentScaling())
    llama_torch.load_params(model, params)
    mlp = model.layers[1].mlp
    # torch holds each expert's kernel transposed, gate rows before up rows.
    gate_up = mlp.w_gate_up.weight.detach().numpy()
    np.testing.assert_array_equal(gate_up[2, :MOE.ffn], params["layers"][1]["w_gate"][2].T)
    np.testing.assert_array_equal(gate_up[2, MOE.ffn:], params["layers"][1]["w_up"][2].T)
    for param, names, kernel in llama_torch.weight_layout(model):
        back = llama_torch.take_layout(param, names, kernel, MOE)
        for name, value in back.items():
            i, key = name.split(".")[1:] if name.startswith("layers.") else (None, name)
            want = params["layers"][int(i)][key] if i is not None else params[key]
            np.testing.assert_array_equal(value, want, err_msg=name)


@pytest.mark.parametrize("trainer_cls", [TorchTrainer, JaxTrainer])
def test_fp8_moe_model_trains(trainer_cls):
    cfg = dataclasses.replace(SMALL, experts=4, top_k=2)
    trainer = trainer_cls(cfg, dataclasses.replace(SMALL_TRAIN, steps=12), CurrentScaling())
    losses = trainer.train_steps(12)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < losses[0] - 0.3, losses


def test_delayed_scaling_keeps_a_state_per_expert():
    model = llama_torch.Llama(MOE, DelayedScaling())
    model(torch.zeros(1, 8, dtype=torch.long)).float().sum().backward()
    experts = [m for m in model.modules() if isinstance(m, GroupedLinear)]
    assert experts
    for layer in experts:
        assert layer.fp8_amax_history.shape == (3, MOE.experts, 16)
        # Every expert's weight slot is recorded, whatever its tokens.
        assert torch.all(layer.fp8_seeded[1, :, 0] == 1)


@pytest.mark.parametrize("source,target", [(TorchTrainer, JaxTrainer), (JaxTrainer, TorchTrainer)])
def test_delayed_moe_checkpoint_moves_between_frameworks(source, target, tmp_path):
    """Every array, the experts' scaling states included, loads into the
    other framework's trainer and saves back bit for bit."""
    cfg = dataclasses.replace(SMALL, experts=4, top_k=2)
    recipe = DelayedScaling(amax_history_len=4)
    first = source(cfg, SMALL_TRAIN, recipe)
    first.train_steps(2)
    first.save(tmp_path / "first")
    resumed = target(cfg, SMALL_TRAIN, recipe)
    resumed.load(tmp_path / "first")
    resumed.save(tmp_path / "again")
    before, after = (portable.load(tmp_path / n)[0] for n in ("first", "again"))
    assert sorted(before) == sorted(after)
    experts = [k for k in before if k.startswith("fp8.layers.1.experts.gate_up.")]
    assert sorted(experts) == [f"fp8.layers.1.experts.gate_up.{f}"
                               for f in ("amax_history", "scale", "seeded")]
    assert before["fp8.layers.1.experts.gate_up.amax_history"].shape == (4, 3, 4)
    assert before["fp8.layers.1.experts.gate_up.seeded"].any()
    for name in before:
        assert before[name].tobytes() == after[name].tobytes(), name
    assert np.all(np.isfinite(resumed.train_steps(2)))


@pytest.mark.parametrize("kwargs,message", [
    (dict(experts=4, top_k=5), "top_k=5 must be in \\[1, experts=4\\]"),
    (dict(experts=4, top_k=0), "top_k=0 must be in"),
    (dict(experts=-1), "experts must be an int >= 0"),
    *((dict(experts=4, router_aux_loss_coef=v), "router_aux_loss_coef must be a finite float "
       ">= 0") for v in (-0.01, float("nan"), float("inf"), "0.01", True, None)),
])
def test_bad_moe_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**kwargs)


def test_the_aux_loss_coefficient_is_a_float():
    assert LlamaConfig(experts=4).router_aux_loss_coef == 0.01
    off = LlamaConfig(experts=4, router_aux_loss_coef=0)
    assert off.router_aux_loss_coef == 0.0 and type(off.router_aux_loss_coef) is float
    assert CONFIGS["moe_tiny"].router_aux_loss_coef == CONFIGS["mixtral_slice"].router_aux_loss_coef


def test_named_moe_configs():
    mixtral = CONFIGS["mixtral_slice"]
    assert (mixtral.hidden, mixtral.ffn, mixtral.experts, mixtral.top_k) == (4096, 14336, 8, 2)
    dense = dataclasses.replace(mixtral, experts=0)
    assert mixtral.num_params() - dense.num_params() == \
        mixtral.layers * (7 * 3 * 4096 * 14336 + 8 * 4096)
