"""The decoder in PyTorch and in JAX against a float64 NumPy forward
(llama_reference.py): the same weights and tokens give the reference's
logits within bf16's precision in both frameworks, and within FP8's with a
recipe; the bf16 model holds no fp8kit layer and makes no fp8kit call, the
FP8 model fuses each norm with the projections after it."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.extend.core import jaxprs_in_params

import fp8kit.torch as ft
from fp8kit.models import llama_jax, llama_torch
from fp8kit.models.config import CONFIGS, LlamaConfig, ffn_width
from fp8kit.models.init import PROJECTIONS, init_params
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

import llama_reference as ref
from small_config import SMALL

# A larger init than training's 0.02, so that the logits vary (by ~1) and
# a wrong rotation, mask or head grouping changes them visibly.
CFG = dataclasses.replace(SMALL, init_std=0.1)
RECIPES = {"bf16": None, "delayed": DelayedScaling(), "current": CurrentScaling(),
           "block": BlockScaling()}


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=3)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(4).integers(0, 256, size=(2, CFG.seq_len)).astype(np.int32)


@pytest.fixture(scope="module")
def reference(params, tokens):
    return ref.logits(params, tokens, CFG)


def torch_logits(params, tokens, recipe):
    model = llama_torch.Llama(CFG, recipe)
    llama_torch.load_params(model, params)
    with torch.no_grad():
        return model(torch.from_numpy(tokens).long()).numpy().astype(np.float64)


def jax_logits(params, tokens, recipe):
    states = llama_jax.create_fp8_states(CFG, recipe)
    params = jax.tree.map(jnp.asarray, llama_jax.model_params(params, recipe))
    out = llama_jax.forward(params, states, jnp.asarray(tokens), CFG, recipe)
    return np.asarray(out, np.float64)


LOGITS = {"torch": torch_logits, "jax": jax_logits}


def _relative_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean((want - want.mean()) ** 2)))


@pytest.mark.parametrize("framework", LOGITS)
def test_bf16_logits_match_the_float64_reference(framework, params, tokens, reference):
    got = LOGITS[framework](params, tokens, None)
    assert reference.std() > 0.5  # the comparison below is not between near-zeros
    # bf16 keeps 8 bits: each rounding costs up to 0.4%, a few dozen
    # roundings in a row land near 1% of the logits' spread.
    assert _relative_rms(got, reference) < 0.02
    assert np.abs(got - reference).max() < 0.1


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
@pytest.mark.parametrize("framework", LOGITS)
def test_fp8_logits_track_the_reference(framework, recipe, params, tokens, reference):
    got = LOGITS[framework](params, tokens, RECIPES[recipe])
    bf16 = LOGITS[framework](params, tokens, None)
    # E4M3 keeps 4 bits (6% per rounding): several times bf16's error, far
    # below what a wrong scale or a transposed kernel gives (~100%).
    err = _relative_rms(got, reference)
    assert 2 * _relative_rms(bf16, reference) < err < 0.2


def test_torch_and_jax_give_the_same_bf16_loss(params, tokens, reference):
    targets = tokens[:, 1:]
    want = ref.cross_entropy(reference[:, :-1], targets)
    losses = {}
    for name, fn in LOGITS.items():
        logits = fn(params, tokens, None)[:, :-1]
        losses[name] = ref.cross_entropy(logits, targets)
    assert abs(want - np.log(256)) > 0.1  # the weights, not a uniform guess, set the loss
    for name, loss in losses.items():
        assert abs(loss - want) < 0.01, (name, loss, want)
    assert abs(losses["torch"] - losses["jax"]) < 0.01


def _count(model, cls):
    return sum(type(m) is cls for m in model.modules())


def test_torch_fp8_model_fuses_the_norms_and_bf16_has_no_fp8kit_layer():
    bf16 = llama_torch.Llama(SMALL, None)
    fp8 = llama_torch.Llama(SMALL, DelayedScaling())
    fp8kit_layers = (ft.Linear, ft.LayerNormLinear, ft.LayerNormMLP)
    assert not any(isinstance(m, fp8kit_layers) for m in bf16.modules())
    assert _count(bf16, torch.nn.Linear) == len(PROJECTIONS) * SMALL.layers + 1
    # FP8: per layer one LayerNormLinear (norm + q, k, v), one Linear (o),
    # one LayerNormMLP (norm + gate, up, down); the only RMSNorm left is the
    # final one and the only torch.nn.Linear the bf16 head.
    for cls, per_layer in ((ft.LayerNormLinear, 1), (ft.Linear, 1), (ft.LayerNormMLP, 1)):
        assert _count(fp8, cls) == per_layer * SMALL.layers, cls
    assert _count(fp8, llama_torch.RMSNorm) == 1 and fp8.final_norm in set(fp8.modules())
    assert _count(fp8, torch.nn.Linear) == 1 and type(fp8.lm_head) is torch.nn.Linear
    for layer in fp8.layers:
        qkv, mlp = layer.attention.qkv.layer, layer.mlp.layer
        assert (qkv.normalization, qkv.bias, qkv.out_features) == (
            "RMSNorm", None, SMALL.hidden + 2 * SMALL.kv_width)
        assert (mlp.normalization, mlp.activation, mlp.fc1_bias, mlp.ffn_hidden_size) == (
            "RMSNorm", "swiglu", None, SMALL.ffn)
        assert qkv.eps == mlp.eps == SMALL.norm_eps


@pytest.mark.parametrize("float32_seams", [False, True], ids=["bf16_default", "float32"])
def test_torch_fused_seams_match_the_unfused_layers(params, float32_seams):
    """Under the model's torch.autocast the fused layers give bf16 by
    default, as the unfused layers do; with float32 seams (the opt-in) they
    read the float32 stream and weights and the MLP gives float32. Either
    way their outputs are the unfused layers' (bf16 model, same weights) up
    to FP8 rounding, and the float32 stream gets a float32 gradient."""
    assert llama_torch.FP8KIT_LAYERS.float32_seams is False
    layers = dataclasses.replace(llama_torch.FP8KIT_LAYERS, float32_seams=float32_seams)
    fused = llama_torch.Llama(CFG, DelayedScaling(), layers=layers)
    unfused = llama_torch.Llama(CFG, None)
    for model in (fused, unfused):
        llama_torch.load_params(model, params)
    x = torch.from_numpy(np.random.default_rng(5).normal(size=(2, 8, CFG.hidden))
                         .astype(np.float32)).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16), ft.autocast(recipe=DelayedScaling()):
        got = [*fused.layers[0].attention.qkv(x), fused.layers[0].mlp(x)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = [*unfused.layers[0].attention.qkv(x), unfused.layers[0].mlp(x)]
    mlp_dtype = torch.float32 if float32_seams else torch.bfloat16
    assert [t.dtype for t in got] == [torch.bfloat16] * 3 + [mlp_dtype]
    for g, w in zip(got, want):
        g, w = g.detach().double().numpy(), w.detach().double().numpy()
        assert 0 < _relative_rms(g, w) < 0.1   # E4M3's rounding, not a wrong weight
    sum(t.float().sum() for t in got).backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


def test_torch_model_builds_from_the_given_fp8_layer_classes(params, tokens):
    """Another library's layers (the benchmark's TransformerEngine peer)
    swap in through FP8Layers: every FP8 projection is built from its
    classes, the forward runs under its autocast with the model's recipe,
    and the logits are fp8kit's own when the classes are fp8kit's."""
    class Linear(ft.Linear):
        pass

    class LayerNormLinear(ft.LayerNormLinear):
        pass

    class LayerNormMLP(ft.LayerNormMLP):
        pass

    entered = []

    def autocast(recipe):
        entered.append(recipe)
        return ft.autocast(recipe=recipe)

    recipe = DelayedScaling()
    layers = llama_torch.FP8Layers(Linear, LayerNormLinear, LayerNormMLP, autocast)
    model = llama_torch.Llama(CFG, recipe, layers=layers)
    llama_torch.load_params(model, params)
    kinds = collections.Counter(type(m) for m in model.modules())
    assert (kinds[Linear], kinds[LayerNormLinear], kinds[LayerNormMLP]) == (CFG.layers,) * 3
    with torch.no_grad():
        got = model(torch.from_numpy(tokens).long()).numpy()
    assert entered == [recipe]
    np.testing.assert_array_equal(got, torch_logits(params, tokens, recipe).astype(np.float32))


def test_load_params_concatenates_the_fused_kernels(params):
    model = llama_torch.Llama(CFG, DelayedScaling())
    llama_torch.load_params(model, params)
    p, layer = params["layers"][1], model.layers[1]
    np.testing.assert_array_equal(layer.attention.qkv.layer.weight.detach().numpy(),
                                  np.concatenate([p["wq"], p["wk"], p["wv"]], axis=1).T)
    np.testing.assert_array_equal(layer.mlp.layer.fc1_weight.detach().numpy(),
                                  np.concatenate([p["w_gate"], p["w_up"]], axis=1).T)
    np.testing.assert_array_equal(layer.mlp.layer.fc2_weight.detach().numpy(), p["w_down"].T)
    np.testing.assert_array_equal(layer.mlp.layer.layer_norm_weight.detach().numpy(),
                                  p["mlp_norm"])
    jax_layer = llama_jax.model_params(params, DelayedScaling())["layers"][1]
    np.testing.assert_array_equal(jax_layer["wqkv"], layer.attention.qkv.layer.weight.numpy(
        force=True).T)
    np.testing.assert_array_equal(jax_layer["w_gate_up"], layer.mlp.layer.fc1_weight.numpy(
        force=True).T)
    assert not {"wq", "wk", "wv", "w_gate", "w_up"} & set(jax_layer)
    assert llama_jax.model_params(params, None) is params


def _trace(recipe):
    """(primitive counts, FFI target counts) of the JAX forward."""
    states = llama_jax.create_fp8_states(SMALL, recipe)
    params = jax.tree.map(jnp.asarray, llama_jax.model_params(init_params(SMALL, 0), recipe))
    tokens = jnp.zeros((1, SMALL.seq_len), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda p, s: llama_jax.forward(p, s, tokens, SMALL, recipe))(
        params, states)
    counts, targets = collections.Counter(), collections.Counter()

    def walk(j):
        for eqn in j.eqns:
            counts[eqn.primitive.name] += 1
            if eqn.primitive.name == "ffi_call":
                targets[eqn.params["target_name"]] += 1
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)
    walk(jaxpr.jaxpr)
    return counts, targets


def test_jax_fp8_model_fuses_the_norms_and_bf16_makes_no_fp8kit_call():
    (bf16, _), (fp8, targets) = _trace(None), _trace(DelayedScaling())
    assert bf16["ffi_call"] == 0 and bf16["custom_vjp_call"] == 0
    # Per layer: layernorm_dense (norm + q, k, v), dense (o), layernorm_mlp
    # (norm + gate, up, down), each a custom_vjp over FFI calls; the head and
    # attention's two products per layer stay dots.
    assert fp8["custom_vjp_call"] == 3 * SMALL.layers
    assert fp8["dot_general"] == 1 + 2 * SMALL.layers
    assert bf16["dot_general"] == fp8["dot_general"] + len(PROJECTIONS) * SMALL.layers
    # The norms are fp8kit's fused norm kernels (two per layer; the final
    # norm stays jnp) and SwiGLU fp8kit's activation kernel.
    norm = [t for t in targets if "norm" in t]
    act = [t for t in targets if "activation" in t]
    assert len(norm) == 1 and targets[norm[0]] == 2 * SMALL.layers, targets
    assert len(act) == 1 and targets[act[0]] == SMALL.layers, targets
    assert fp8["rsqrt"] == 1 and bf16["rsqrt"] == 1 + 2 * SMALL.layers


def test_load_params_transposes_kernels_into_weights(params):
    model = llama_torch.Llama(CFG)
    llama_torch.load_params(model, params)
    layer = model.layers[1]
    np.testing.assert_array_equal(layer.attention.qkv.wk.weight.detach().numpy(),
                                  params["layers"][1]["wk"].T)
    np.testing.assert_array_equal(layer.mlp.w_down.weight.detach().numpy(),
                                  params["layers"][1]["w_down"].T)
    np.testing.assert_array_equal(model.lm_head.weight.detach().numpy(), params["lm_head"].T)
    other = init_params(dataclasses.replace(CFG, ffn=64), seed=0)
    with pytest.raises(ValueError, match="does not fit parameter of shape"):
        llama_torch.load_params(model, other)


def test_init_is_seeded_and_scales_residual_outputs():
    cfg = LlamaConfig(hidden=256, layers=8, heads=4, ffn=512, seq_len=16)
    a, b, c = init_params(cfg, 1), init_params(cfg, 1), init_params(cfg, 2)
    np.testing.assert_array_equal(a["layers"][3]["wq"], b["layers"][3]["wq"])
    assert not np.array_equal(a["layers"][3]["wq"], c["layers"][3]["wq"])
    layer = a["layers"][0]
    for name in PROJECTIONS:
        assert layer[name].dtype == np.float32
        want = cfg.init_std / (4.0 if name in ("wo", "w_down") else 1.0)  # sqrt(2 * 8) = 4
        assert abs(layer[name].std() / want - 1) < 0.02, name
    assert np.all(layer["attn_norm"] == 1)


def test_init_draws_what_one_normal_call_draws(monkeypatch):
    """init's chunked draws give the bits (and leave the generator where)
    rng.normal(0, std, size).astype(float32) does, across chunk edges: the
    initial weights are those of every earlier version."""
    from fp8kit.models import init
    monkeypatch.setattr(init, "_CHUNK", 1000)
    for shape in [(7, 333), (3, 4, 1000), (5,), (2, 0)]:
        want_rng, got_rng = np.random.default_rng(3), np.random.default_rng(3)
        want = want_rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        got = init.normal_float32(got_rng, shape, 0.02)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), shape
        assert got_rng.bit_generator.state == want_rng.bit_generator.state


def test_sequences_longer_than_the_config_are_refused():
    long = np.zeros((1, SMALL.seq_len + 1), np.int32)
    model = llama_torch.Llama(SMALL)
    with pytest.raises(ValueError, match="longer than the config's seq_len=32"):
        model(torch.from_numpy(long).long())
    with pytest.raises(ValueError, match="longer than the config's seq_len=32"):
        llama_jax.forward(jax.tree.map(jnp.asarray, init_params(SMALL, 0)), None,
                          jnp.asarray(long), SMALL, None)


@pytest.mark.parametrize("kwargs,message", [
    (dict(hidden=104, heads=4), "hidden=104 must be a multiple of 16"),
    (dict(hidden=96, heads=5), "must be a multiple of heads=5"),
    (dict(hidden=48, heads=16), "head_dim = hidden / heads = 3 must be even"),
    (dict(heads=4, kv_heads=3), "kv_heads=3 must divide heads=4"),
    (dict(ffn=100), "ffn=100 must be a multiple of 16"),
    (dict(hidden=64, heads=8, kv_heads=1), "kv_width=8 must be a multiple of 16"),
    (dict(layers=0), "layers must be an int >= 1"),
    (dict(seq_len=True), "seq_len must be an int >= 1"),
])
def test_bad_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**kwargs)


def test_named_configs():
    one_b, slice_8b = CONFIGS["1b"], CONFIGS["8b_slice"]
    assert ffn_width(2048) == 5632 and one_b.ffn == 5632
    assert (one_b.hidden, one_b.layers, one_b.heads, one_b.seq_len) == (2048, 16, 16, 2048)
    assert (slice_8b.hidden, slice_8b.ffn, slice_8b.heads, slice_8b.num_kv_heads,
            slice_8b.layers, slice_8b.seq_len) == (4096, 14336, 32, 8, 4, 4096)
