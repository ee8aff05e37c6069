"""The training loops: exact resume from a checkpoint (bit-identical losses
and weights, FP8 scaling state included), FP8 tracking bf16, the JAX
optimizer against torch.optim.AdamW, the schedule and the batches."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fp8kit.models import data
from fp8kit.models.init import init_params
from fp8kit.models.schedule import TrainConfig, learning_rate
from fp8kit.models.train_jax import JaxTrainer, _adamw, _clip_by_global_norm
from fp8kit.models.train_torch import TorchTrainer
from fp8kit.recipe import BlockScaling, DelayedScaling

from jax_gpu import jax_gpu
from small_config import SMALL, SMALL_TRAIN
from snapshots import assert_identical, snapshot

TRAINERS = {"torch": TorchTrainer, "jax": JaxTrainer}
DELAYED = DelayedScaling(amax_history_len=4)


@pytest.mark.parametrize("framework", TRAINERS)
def test_resume_is_bit_exact(framework, tmp_path):
    """4 steps straight == 2 steps, save, load into a new trainer, 2 steps."""
    cls, steps = TRAINERS[framework], 4
    straight = cls(SMALL, SMALL_TRAIN, DELAYED)
    want = [straight.train_step() for _ in range(steps)]

    first = cls(SMALL, SMALL_TRAIN, DELAYED)
    got = [first.train_step() for _ in range(steps // 2)]
    path = tmp_path / "ckpt"
    first.save(path)
    resumed = cls(SMALL, SMALL_TRAIN, DELAYED)
    resumed.load(path)
    assert resumed.step == steps // 2 and resumed.sampler.position == steps // 2
    got += [resumed.train_step() for _ in range(steps - steps // 2)]

    assert got == want  # float equality: the same bits
    assert len(set(want)) == steps  # the steps did change something
    assert_identical(snapshot(resumed), snapshot(straight))


@pytest.mark.parametrize("framework", TRAINERS)
def test_steps_waited_for_at_the_end_train_as_steps_waited_for_each(framework):
    """train_steps(n) (the host waits once) == n x train_step, bit for bit:
    the losses, the weights, the FP8 state and the optimizer's."""
    cls = TRAINERS[framework]
    each, together = cls(SMALL, SMALL_TRAIN, DELAYED), cls(SMALL, SMALL_TRAIN, DELAYED)
    want = [each.train_step() for _ in range(3)]
    got = together.train_steps(3)
    assert got == want and all(type(x) is float for x in got)
    assert together.step == 3 and together.train_steps(0) == []
    assert_identical(snapshot(together), snapshot(each))


@pytest.mark.parametrize("framework", TRAINERS)
def test_a_checkpoint_of_another_run_is_refused(framework, tmp_path):
    cls = TRAINERS[framework]
    cls(SMALL, SMALL_TRAIN, DELAYED).save(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"recipe: saved .*DelayedScaling.*now None"):
        cls(SMALL, SMALL_TRAIN, None).load(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"train.batch: saved 2, now 3"):
        cls(SMALL, dataclasses.replace(SMALL_TRAIN, batch=3), DELAYED).load(tmp_path / "ckpt")


@pytest.mark.parametrize("framework", TRAINERS)
def test_fp8_training_tracks_bf16(framework):
    cls, steps = TRAINERS[framework], 6
    fp8, bf16 = cls(SMALL, SMALL_TRAIN, DELAYED), cls(SMALL, SMALL_TRAIN, None)
    fp8_losses = [fp8.train_step() for _ in range(steps)]
    bf16_losses = [bf16.train_step() for _ in range(steps)]
    assert abs(fp8_losses[0] - math.log(256)) < 0.1   # starts as a uniform guess
    assert fp8_losses[-1] < fp8_losses[0] - 0.5        # and learns
    # Same weights, same batches: a wrong scale or transpose in the FP8
    # path is off by far more.
    for a, b in zip(fp8_losses, bf16_losses):
        assert abs(a - b) < 0.03, (fp8_losses, bf16_losses)
    # Evaluation reads the FP8 state without recording into it.
    before = snapshot(fp8)
    held_out = data.eval_batches(data.split(data.corpus())[1], 1, 2, SMALL.seq_len)
    assert abs(fp8.evaluate(held_out) - bf16.evaluate(held_out)) < 0.03
    assert_identical(snapshot(fp8), before)


@pytest.mark.parametrize("framework", TRAINERS)
def test_block_scaled_training_tracks_bf16(framework):
    """The decoder under BlockScaling (1x128 activations and gradients,
    128x128 weights, through the fused layers too) learns as bf16 does,
    and keeps no FP8 state."""
    cls, steps = TRAINERS[framework], 6
    block, bf16 = cls(SMALL, SMALL_TRAIN, BlockScaling()), cls(SMALL, SMALL_TRAIN)
    if framework == "jax":
        assert block.fp8_states is None
    block_losses = [block.train_step() for _ in range(steps)]
    bf16_losses = [bf16.train_step() for _ in range(steps)]
    assert block_losses[-1] < block_losses[0] - 0.5
    for a, b in zip(block_losses, bf16_losses):
        assert abs(a - b) < 0.03, (block_losses, bf16_losses)


def test_jax_step_writes_the_new_state_over_the_old():
    """The JAX step donates the state it replaces, as PyTorch's optimizers
    update in place: after a step the previous params, FP8 states and
    optimizer moments are gone (XLA reused their buffers), not held beside
    the new ones; a caller's initial params are copied, not donated."""
    params = init_params(SMALL, SMALL_TRAIN.seed)
    trainer = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, params=params)
    before = jax.tree.leaves((trainer.params, trainer.fp8_states, trainer.opt_state))
    trainer.train_step()
    assert all(leaf.is_deleted() for leaf in before)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(trainer.params))
    trainer.train_step()   # and the next step takes the new state
    assert_identical(params, init_params(SMALL, SMALL_TRAIN.seed))


def test_jax_attention_is_cudnns_on_a_gpu_and_xlas_elsewhere():
    from fp8kit.models import llama_jax
    assert JaxTrainer(SMALL, SMALL_TRAIN).attention_impl is None   # the CPU: XLA's
    gpu, cpu = (type("Device", (), {"platform": p})() for p in ("gpu", "cpu"))
    assert llama_jax.attention_implementation(gpu) == "cudnn"
    assert llama_jax.attention_implementation(cpu) is None


@pytest.mark.gpu
def test_jax_decoder_on_a_gpu_runs_cudnns_attention_and_trains_as_with_xlas():
    """On a GPU the step's attention is cuDNN's fused kernel (no [heads,
    seq, seq] scores in memory), and training follows XLA's attention."""
    gpu = jax_gpu()
    if gpu is None:
        pytest.skip("needs a CUDA build of fp8kit and a GPU")
    from fp8kit.models import train_jax
    cudnn = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, device=gpu)
    xla = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, device=gpu)
    xla.attention_impl = None
    batch = jax.device_put(data.BatchSampler(data.split(data.corpus())[0], SMALL_TRAIN.batch,
                                             SMALL.seq_len, 0).next(), gpu)
    program = train_jax._loss.lower(cudnn.params, cudnn.fp8_states, batch, model_cfg=SMALL,
                                    recipe=DELAYED, layers=cudnn.layers,
                                    attention_impl=cudnn.attention_impl).as_text()
    assert "__cudnn$fmha" in program
    with_cudnn = [cudnn.train_step() for _ in range(6)]
    with_xla = [xla.train_step() for _ in range(6)]
    assert with_cudnn[-1] < with_cudnn[0] - 0.5
    for a, b in zip(with_cudnn, with_xla):
        assert abs(a - b) < 0.02, (with_cudnn, with_xla)


def test_jax_adamw_matches_torch_adamw():
    """_adamw and _clip_by_global_norm against torch.optim.AdamW and
    clip_grad_norm_ (the PyTorch trainer's), in float32, over 5 steps."""
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1, clip_norm=0.5)
    rng = np.random.default_rng(0)
    p0 = {"w": rng.normal(size=(4, 3)).astype(np.float32),
          "g": rng.normal(size=(3,)).astype(np.float32)}
    grads = [{k: (3 * rng.normal(size=v.shape)).astype(np.float32) for k, v in p0.items()}
             for _ in range(5)]
    tp = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in p0.items()}
    opt = torch.optim.AdamW([{"params": [tp["w"]], "weight_decay": cfg.weight_decay},
                             {"params": [tp["g"]], "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    jp = jax.tree.map(jnp.asarray, p0)
    jopt = {"count": jnp.zeros((), jnp.int32), "m": jax.tree.map(jnp.zeros_like, jp),
            "v": jax.tree.map(jnp.zeros_like, jp)}
    for g in grads:
        for k in tp:
            tp[k].grad = torch.from_numpy(g[k].copy())
        torch.nn.utils.clip_grad_norm_(tp.values(), cfg.clip_norm)
        opt.step()
        jg = _clip_by_global_norm(jax.tree.map(jnp.asarray, g), cfg.clip_norm)
        jp, jopt = _adamw(jp, jg, jopt, cfg.lr, cfg)
    for k in p0:
        assert not np.allclose(p0[k], tp[k].detach().numpy(), atol=1e-2)  # it moved
        np.testing.assert_allclose(np.asarray(jp[k]), tp[k].detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=101, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(0, cfg) == pytest.approx(0.1)      # warmup: 1/10 of the peak
    assert learning_rate(4, cfg) == pytest.approx(0.5)
    assert learning_rate(9, cfg) == pytest.approx(1.0)      # the peak
    assert learning_rate(10, cfg) == pytest.approx(1.0)     # cosine starts at the peak,
    assert learning_rate(55, cfg) == pytest.approx(0.55)    # is halfway at mid-decay,
    assert learning_rate(100, cfg) == pytest.approx(0.1)    # ends at lr * min_lr_ratio
    rates = [learning_rate(s, cfg) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_batches_are_seeded_windows_of_the_corpus():
    tokens = data.corpus()
    assert tokens.dtype == np.int32 and len(tokens) > 500_000
    assert tokens.min() >= 0 and tokens.max() < data.VOCAB
    assert data.decode(data.encode("def f():  # ü")) == "def f():  # ü"
    a = data.BatchSampler(tokens, 3, 16, seed=5)
    b = data.BatchSampler(tokens, 3, 16, seed=5)
    first = a.next()
    assert first.shape == (3, 17)
    np.testing.assert_array_equal(first, b.next())
    # Each row is a contiguous window of the corpus.
    text = tokens.tobytes()
    for row in first:
        assert row.tobytes() in text
    # The state round-trips: a sampler restored from it continues identically.
    state = a.state_dict()
    c = data.BatchSampler(tokens, 3, 16, seed=99)
    c.load_state_dict(state)
    assert c.position == 1
    np.testing.assert_array_equal(c.next(), a.next())
    with pytest.raises(ValueError, match="not a sampler state"):
        c.load_state_dict({"position": 1})


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=0), "steps must be an int >= 1"),
    (dict(batch=2.0), "batch must be an int >= 1"),
    (dict(warmup_steps=-1), "warmup_steps must be an int >= 0"),
    (dict(min_lr_ratio=2.0), "min_lr_ratio=2.0 in \\[0, 1\\]"),
    (dict(clip_norm=0.0), "clip_norm=0.0 must be > 0"),
])
def test_bad_train_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_jax_decoder_runs_a_peers_layers():
    """JaxTrainer(layers=...) routes every FP8 call of the decoder through
    the given JaxLayers (as TransformerEngine's are plugged in) and threads
    their states: layers that wrap fp8kit.jax's own calls train exactly as
    the default ones, and the wrappers saw every call and state."""
    import fp8kit.jax as fj
    from fp8kit.models import llama_jax
    seen = {"layernorm_dense": 0, "dense": 0, "layernorm_mlp": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            seen[name] += 1   # once per layer each time the step is traced
            assert isinstance(kwargs["state"], fj.DelayedScalingState)
            return fn(*args, **kwargs)
        return call

    states = []

    def create_states(cfg, recipe):
        states.append(recipe)
        return llama_jax.FP8KIT_LAYERS.create_states(cfg, recipe)

    layers = llama_jax.JaxLayers(counted("layernorm_dense", fj.layernorm_dense),
                                 counted("dense", fj.dense),
                                 counted("layernorm_mlp", fj.layernorm_mlp), create_states)
    peer = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, layers=layers)
    own = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED)
    assert states == [DELAYED]
    for _ in range(3):
        assert peer.train_step() == own.train_step()
    assert_identical(snapshot(peer), snapshot(own))
    assert seen == {k: SMALL.layers for k in seen}   # one trace of the step


def test_jax_decoder_seams_are_bf16_by_default_and_float32_on_request():
    """By default JaxLayers hands the fused calls a bf16 copy of the float32
    stream (as TE's layers run); float32_seams=True hands them the float32
    stream itself. The decoder learns and the two runs track each other."""
    import fp8kit.jax as fj
    from fp8kit.models import llama_jax

    def spied(**kwargs):
        dtypes = set()

        def seen(fn):
            def call(x, *args, **kw):
                dtypes.add(x.dtype)
                return fn(x, *args, **kw)
            return call

        layers = llama_jax.JaxLayers(seen(fj.layernorm_dense), fj.dense,
                                     seen(fj.layernorm_mlp),
                                     llama_jax.FP8KIT_LAYERS.create_states, **kwargs)
        return layers, dtypes

    bf16_layers, bf16_dtypes = spied()
    float32_layers, float32_dtypes = spied(float32_seams=True)
    assert llama_jax.FP8KIT_LAYERS.float32_seams is False
    bf16 = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, layers=bf16_layers)
    float32 = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, layers=float32_layers)
    a = [bf16.train_step() for _ in range(4)]
    b = [float32.train_step() for _ in range(4)]
    assert bf16_dtypes == {jnp.dtype(jnp.bfloat16)}
    assert float32_dtypes == {jnp.dtype(jnp.float32)}
    assert a[-1] < a[0] - 0.3 and b[-1] < b[0] - 0.3
    assert a != b   # the seams change the computation
    for x, y in zip(a, b):
        assert abs(x - y) < 0.03, (a, b)


def _stand_in_te_flax():
    """Flax modules with TransformerEngine-JAX's names, constructor fields,
    parameter names and shapes, and a non-param collection as TE keeps its
    scaling metadata in, computing in float32 without FP8: what
    fp8kit.bench.te_peer.jax_layers builds the decoder's TE-JAX peer from."""
    import types
    from typing import Any

    import flax.linen as nn

    def rms_norm(module, x):
        scale = module.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x = x.astype(jnp.float32)
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + module.epsilon) * scale

    def metadata(module, x):
        """A stand-in for TE's scaling metadata: read (through a zero), so
        that its cotangent, the decoder's next state, is defined."""
        amax = module.variable("fp8_metas", "amax", jnp.zeros, (1,), jnp.float32)
        return x + 0.0 * amax.value[0]

    class LayerNormDenseGeneral(nn.Module):
        features: int
        layernorm_type: str
        epsilon: float
        use_bias: bool
        return_layernorm_output: bool
        dtype: Any

        @nn.compact
        def __call__(self, x):
            assert (self.layernorm_type, self.use_bias) == ("rmsnorm", False)
            h = rms_norm(self, x)
            kernel = self.param("kernel", nn.initializers.lecun_normal(),
                                (x.shape[-1], self.features), jnp.float32)
            return metadata(self, h @ kernel), None   # (out, norm output), as TE returns

    class DenseGeneral(nn.Module):
        features: int
        use_bias: bool
        dtype: Any

        @nn.compact
        def __call__(self, x):
            kernel = self.param("kernel", nn.initializers.lecun_normal(),
                                (x.shape[-1], self.features), jnp.float32)
            return metadata(self, x.astype(jnp.float32) @ kernel)

    class LayerNormMLP(nn.Module):
        intermediate_dim: int
        activations: tuple
        layernorm_type: str
        epsilon: float
        use_bias: bool
        intermediate_dropout_rate: float
        return_layernorm_output: bool
        dtype: Any

        @nn.compact
        def __call__(self, x):
            assert self.activations == ("silu", "linear")
            h = rms_norm(self, x)
            wi = self.param("wi_kernel", nn.initializers.lecun_normal(),
                            (x.shape[-1], 2, self.intermediate_dim), jnp.float32)
            wo = self.param("wo_kernel", nn.initializers.lecun_normal(),
                            (self.intermediate_dim, x.shape[-1]), jnp.float32)
            g = jax.nn.silu(h @ wi[:, 0]) * (h @ wi[:, 1])
            return metadata(self, g @ wo), None

    return types.SimpleNamespace(flax=types.SimpleNamespace(
        LayerNormDenseGeneral=LayerNormDenseGeneral, DenseGeneral=DenseGeneral,
        LayerNormMLP=LayerNormMLP))


def test_te_jax_peer_layers_map_the_decoder_weights(monkeypatch):
    """The JAX decoder's TransformerEngine peer (te_peer.jax_layers), run
    with stand-ins for TE's flax modules where TE is not installed: the
    model's weights reach TE's parameters in TE's layout (the fused q, k, v
    kernel; gate and up as wi_kernel's [hidden, 2, ffn]; the down kernel),
    its scaling collections are created per layer and threaded through the
    step, and without FP8 the peer's loss is the bf16 model's."""
    import contextlib

    from fp8kit.bench import te_peer
    monkeypatch.setattr(te_peer, "jax_autocast", lambda tej, name: contextlib.nullcontext())
    layers = te_peer.jax_layers(_stand_in_te_flax(), "delayed")
    peer = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED, layers=layers)
    bf16 = JaxTrainer(SMALL, SMALL_TRAIN, None)
    assert [sorted(s) for s in peer.fp8_states["layers"]] == [["mlp", "qkv", "wo"]] * SMALL.layers
    assert peer.fp8_states["layers"][0]["mlp"] == {"fp8_metas": {"amax": jnp.zeros(1)}}
    a = [peer.train_step() for _ in range(3)]
    b = [bf16.train_step() for _ in range(3)]
    for x, y in zip(a, b):   # float32 against bf16 projections
        assert abs(x - y) < 0.02 * y, (a, b)
    assert jax.tree.structure(peer.fp8_states) == jax.tree.structure(
        layers.create_states(SMALL, DELAYED))

    # Each call against the decoder's own math on the same weights.
    hidden, ffn, out = 64, 96, 80
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    x = jax.random.normal(keys[0], (2, 8, hidden), jnp.bfloat16)
    gamma = 1 + 0.1 * jax.random.normal(keys[1], (hidden,))
    k1 = jax.random.normal(keys[2], (hidden, 2 * ffn)) / hidden ** 0.5   # [gate | up]
    k2 = jax.random.normal(keys[3], (ffn, hidden)) / ffn ** 0.5
    kq = jax.random.normal(keys[4], (hidden, out)) / hidden ** 0.5
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5) * gamma
    states = {name: {"fp8_metas": {"amax": jnp.zeros(1)}} for name in ("qkv", "wo", "mlp")}
    want_mlp = (jax.nn.silu(h @ k1[:, :ffn]) * (h @ k1[:, ffn:])) @ k2
    got_mlp = layers.layernorm_mlp(x, gamma, None, k1, k2, normalization="rmsnorm",
                                   activation="swiglu", epsilon=1e-5, state=states["mlp"],
                                   recipe=DELAYED)
    got_qkv = layers.layernorm_dense(x, gamma, None, kq, normalization="rmsnorm", epsilon=1e-5,
                                     state=states["qkv"], recipe=DELAYED)
    got_wo = layers.dense(x, kq, state=states["wo"], recipe=DELAYED)
    for got, want in ((got_mlp, want_mlp), (got_qkv, h @ kq),
                      (got_wo, x.astype(jnp.float32) @ kq)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
