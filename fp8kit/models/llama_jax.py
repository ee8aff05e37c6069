"""The Llama-style decoder in JAX: pure functions over a params pytree
(model_params's layout) and, under delayed scaling, a pytree of
fp8kit.jax.DelayedScalingStates, one per FP8 layer.

The same model as fp8kit/models/llama_torch.py, computed the same way:
float32 master weights cast to bf16 where a projection reads them, a
float32 residual stream, norms and rotary rotation in float32, causal
attention in bf16 (jax.nn.dot_product_attention, cuDNN's fused attention
on a GPU: attention_implementation), the output head in bf16.
With recipe=None every projection is a plain bf16 dot (no fp8kit call at
all). With a recipe each layer makes three FP8 calls:
    norm_qkv  fp8kit.jax.layernorm_dense: the attention's input RMSNorm
              and its q, k, v projections, kernel "wqkv" = [wq | wk | wv]
    wo        fp8kit.jax.dense
    norm_mlp  fp8kit.jax.layernorm_mlp: the MLP's input RMSNorm and the
              whole SwiGLU MLP, kernel_1 "w_gate_up" = [w_gate | w_up]
By default the two fused calls take a bf16 copy of the float32 residual
stream and return bf16, as the bf16 model's layers and TransformerEngine's
do (same speed as float32 seams, less memory); JaxLayers.float32_seams=True,
the opt-in, has them read the float32 stream as it is (as the PyTorch
model's fused layers then do) and return float32. Either way the kernels
are the float32 master weights and q, k, v then go to bf16.

Delayed scaling's state leaves as its "gradient" (fp8kit.jax.dense's
convention): differentiate the loss with respect to (params, fp8_states)
and take the states' cotangent as the next states.

The three calls come from a JaxLayers (fp8kit.jax's by default): a peer
library's layers with the same signatures and the same state convention
run the same model (fp8kit/bench/te_peer.py builds TransformerEngine's).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import fp8kit.jax as fj
from fp8kit.checkpoint import STATE_FIELDS
from fp8kit.models.config import LlamaConfig
from fp8kit.models.init import fuse_kernels, rope_tables, unfuse_kernels
from fp8kit.models.moe_jax import moe_mlp
from fp8kit.recipe import DelayedScaling

BF16, F32 = jnp.bfloat16, jnp.float32


def model_params(params: dict, recipe) -> dict:
    """The model's params from fp8kit/models/init.py's (NumPy, as
    init_params makes them): the same with recipe=None; with a recipe each
    layer's kernels concatenated for the fused calls (init.fuse_kernels:
    "wqkv", "w_gate_up" in place of wq, wk, wv, w_gate, w_up). The one
    place where the JAX model's weight layout differs from init's."""
    if recipe is None:
        return params
    return {**params, "layers": [fuse_kernels(layer) for layer in params["layers"]]}


def init_layout(params: dict, cfg: LlamaConfig, recipe) -> dict:
    """model_params' inverse (for the params or a pytree shaped like them,
    an optimizer moment): NumPy arrays in init's layout."""
    params = jax.tree.map(np.asarray, params)
    if recipe is None:
        return params
    return {**params, "layers": [unfuse_kernels(layer, cfg) for layer in params["layers"]]}


# The rows of layernorm_mlp's state (fp8kit.jax.layernorm_mlp) that are
# each Linear's input, weight and grad_output slots.
_MLP_ROWS = {"mlp.fc1": [0, 1, 4], "mlp.fc2": [2, 3, 5]}


def fp8_state_arrays(states) -> dict:
    """{FP8 Linear name (fp8kit.models.checkpoint.FP8_LINEARS): its state as
    fp8kit.checkpoint's arrays} of create_fp8_states' pytree."""
    out = {}
    for i, layer in enumerate(states["layers"]):
        for name, state in layer.items():
            if name == "experts":  # each grouped layer's state, every expert's
                for sub, grouped in state.items():
                    out[f"layers.{i}.experts.{sub}"] = {
                        f: np.ascontiguousarray(getattr(grouped, f)) for f in STATE_FIELDS}
                continue
            fields = {f: np.asarray(getattr(state, f)) for f in STATE_FIELDS}
            rows = _MLP_ROWS if name == "mlp" else {name: [0, 1, 2]}
            for linear, r in rows.items():
                out[f"layers.{i}.{linear}"] = {f: np.ascontiguousarray(a[r])
                                               for f, a in fields.items()}
    return out


def fp8_states_from_arrays(arrays: dict, cfg: LlamaConfig):
    """fp8_state_arrays' inverse, checked as DelayedScalingState.from_arrays checks."""
    layers = []
    for i in range(cfg.layers):
        layer = {}
        for name in ("qkv", "wo"):
            layer[name] = fj.DelayedScalingState.from_arrays(
                **arrays[f"layers.{i}.{name}"])
        if cfg.experts:
            layer["experts"] = {sub: fj.GroupedDelayedScalingState.from_arrays(
                **arrays[f"layers.{i}.experts.{sub}"]) for sub in _EXPERT_LAYERS}
            layers.append(layer)
            continue
        mlp = {f: np.empty((6,) + arrays[f"layers.{i}.mlp.fc1"][f].shape[1:], np.float32)
               for f in STATE_FIELDS}
        for linear, rows in _MLP_ROWS.items():
            for f in STATE_FIELDS:
                mlp[f][rows] = arrays[f"layers.{i}.{linear}"][f]
        layer["mlp"] = fj.DelayedScalingState.from_arrays(**mlp)
        layers.append(layer)
    return {"layers": layers}


def _fp8kit_states(cfg: LlamaConfig, recipe):
    """{"layers": [{"qkv", "wo", "mlp": DelayedScalingState}]} under
    DelayedScaling ("mlp" holds layernorm_mlp's two Linears; a
    mixture-of-experts layer has "experts": {"gate_up", "down":
    GroupedDelayedScalingState} instead); None under CurrentScaling or
    BlockScaling (stateless)."""
    if not isinstance(recipe, DelayedScaling):
        return None
    create = fj.DelayedScalingState.create

    def mlp():
        if cfg.experts:
            return {"experts": {sub: fj.GroupedDelayedScalingState.create(recipe, cfg.experts)
                                for sub in _EXPERT_LAYERS}}
        return {"mlp": create(recipe, num_linears=2)}
    return {"layers": [{"qkv": create(recipe), "wo": create(recipe), **mlp()}
                       for _ in range(cfg.layers)]}


# A mixture-of-experts layer's grouped layers ("experts" in its states).
_EXPERT_LAYERS = ("gate_up", "down")


@dataclasses.dataclass(frozen=True)
class JaxLayers:
    """The FP8 calls of a decoder layer, each with fp8kit.jax's signature
    (layernorm_dense, dense, layernorm_mlp: the keyword arguments state and
    recipe included), and create_states(cfg, recipe): the states pytree
    {"layers": [{"qkv", "wo", "mlp": state}]} or None. A state's cotangent
    is its next value. float32_seams: False (the default) hands the fused
    calls a bf16 copy of the stream and takes bf16 back, as the bf16
    model's layers and TE's run (same speed, less memory); True, the
    opt-in, has them read the float32 stream and return float32, keeping
    SwiGLU's input for backward in float32. The kernels are the float32
    master weights either way."""

    layernorm_dense: Callable
    dense: Callable
    layernorm_mlp: Callable
    create_states: Callable
    float32_seams: bool = False


FP8KIT_LAYERS = JaxLayers(fj.layernorm_dense, fj.dense, fj.layernorm_mlp, _fp8kit_states)


def create_fp8_states(cfg: LlamaConfig, recipe, layers: JaxLayers = FP8KIT_LAYERS):
    """The FP8 states of every layer (layers.create_states), None with
    recipe=None."""
    return None if recipe is None else layers.create_states(cfg, recipe)


def project(x, kernel, fp8_kwargs, recipe, layers: JaxLayers = FP8KIT_LAYERS):
    """x bf16 [..., in] @ kernel [in, out]: in bf16 with recipe=None, the
    float32 kernel cast to bf16 first (as torch.autocast does); else FP8
    through layers.dense (fp8_kwargs: its state and statistics keyword
    arguments), which takes the float32 kernel as it is, as the fused
    layers take theirs: one rounding to FP8, no bf16 copy of the kernel
    each step, and its gradient float32 from the GEMM."""
    if recipe is None:
        return jnp.dot(x, kernel.astype(BF16))
    return layers.dense(x, kernel, recipe=recipe, **fp8_kwargs)


def rms_norm(x, weight, eps: float):
    x = x.astype(F32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * weight).astype(BF16)


def apply_rope(x, cos, sin):
    """x [batch, seq, heads, head_dim]; cos, sin [seq, head_dim // 2]."""
    x1, x2 = jnp.split(x.astype(F32), 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(BF16)


def _seam(x, layers: JaxLayers):
    """The float32 stream as a fused call takes it (JaxLayers.float32_seams)."""
    return x if layers.float32_seams else x.astype(BF16)


def _state(states, name):
    return None if states is None else states[name]


def _fp8_kwargs(states, statistics, name):
    """The keyword arguments of FP8 call `name`: its state, and its
    statistics rows when they are collected (the argument stays unset
    otherwise, so layers without it - TE-JAX's - still fit)."""
    kwargs = {"state": _state(states, name)}
    if statistics is not None:
        kwargs["statistics"] = statistics[name]
    return kwargs


# The FP8 calls of a decoder layer and their Linears, in the layout of
# fp8kit.models.checkpoint.FP8_LINEARS ("mlp" is layernorm_mlp's two).
_FP8_CALLS = {"qkv": 1, "wo": 1, "mlp": 2}
# A mixture-of-experts layer's: its MLP is two grouped calls, named as its
# checkpoint names them (checkpoint.MOE_FP8_LINEARS).
_MOE_FP8_CALLS = {"qkv": 1, "wo": 1, "experts.gate_up": 1, "experts.down": 1}


def records_statistics(layers: JaxLayers) -> bool:
    """Whether `layers` are fp8kit.jax's, which take statistics rows."""
    return (layers.layernorm_dense is fj.layernorm_dense and layers.dense is fj.dense
            and layers.layernorm_mlp is fj.layernorm_mlp)


def create_statistics_rows(cfg: LlamaConfig):
    """Zeroed statistics rows of every FP8 call (fp8kit.jax.statistics_rows),
    {"layers": [{"qkv", "wo", "mlp": rows}]} ("experts.gate_up" and
    "experts.down" for "mlp" in a mixture-of-experts config): pass them to
    forward and differentiate with respect to them to collect the casts'
    statistics."""
    calls = _MOE_FP8_CALLS if cfg.experts else _FP8_CALLS
    return {"layers": [{name: fj.statistics_rows(n) for name, n in calls.items()}
                       for _ in range(cfg.layers)]}


def tensor_statistics(statistics) -> list:
    """The filled rows of create_statistics_rows' pytree as fp8kit.inspect
    TensorStats named as the checkpoint names the Linears (layers.<i>.qkv,
    layers.<i>.mlp.fc1, ...); reads the device."""
    order = list({**_FP8_CALLS, **_MOE_FP8_CALLS})  # the model's order, not sorted keys
    return [s for i, layer in enumerate(statistics["layers"]) for name in order if name in layer
            for s in fj.tensor_statistics(layer[name], f"layers.{i}.{name}")]


def norm_qkv(p, states, x, cfg: LlamaConfig, recipe, layers: JaxLayers, statistics=None):
    """RMSNorm and the q, k, v projections of x (the float32 stream): q, k, v in bf16."""
    if recipe is None:
        h = rms_norm(x, p["attn_norm"], cfg.norm_eps)
        return tuple(project(h, p[n], {}, None) for n in ("wq", "wk", "wv"))
    qkv = layers.layernorm_dense(_seam(x, layers), p["attn_norm"], None, p["wqkv"],
                                 normalization="rmsnorm", epsilon=cfg.norm_eps, recipe=recipe,
                                 **_fp8_kwargs(states, statistics, "qkv"))
    q, k, v = jnp.split(qkv, [cfg.hidden, cfg.hidden + cfg.kv_width], axis=-1)
    return q.astype(BF16), k.astype(BF16), v.astype(BF16)


def attention_implementation(device) -> str | None:
    """jax.nn.dot_product_attention's implementation for a model on
    `device`: "cudnn" on a GPU, cuDNN's fused attention, which never
    materializes the [heads, seq, seq] scores (PyTorch's decoder gets the
    same from scaled_dot_product_attention's flash kernel); None elsewhere:
    JAX's default, XLA's attention, which does."""
    return "cudnn" if device.platform == "gpu" else None


def causal_attention(q, k, v, implementation: str | None):
    """Causal attention of bf16 q [b, s, heads, d] over k, v [b, s, kv_heads, d]."""
    try:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                            implementation=implementation)
    except NotImplementedError:
        # cuDNN refuses the shape (JAX checks it while tracing, e.g. a head
        # dim above 256): XLA's attention computes the same thing.
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def attention(p, states, x, cos, sin, cfg: LlamaConfig, recipe, layers: JaxLayers,
              implementation: str | None = None, statistics=None):
    b, s, _ = x.shape
    q, k, v = norm_qkv(p, states, x, cfg, recipe, layers, statistics)
    q = apply_rope(q.reshape(b, s, cfg.heads, cfg.head_dim), cos, sin)
    k = apply_rope(k.reshape(b, s, cfg.num_kv_heads, cfg.head_dim), cos, sin)
    v = v.reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
    o = causal_attention(q, k, v, implementation)
    return project(o.reshape(b, s, cfg.hidden), p["wo"], _fp8_kwargs(states, statistics, "wo"),
                   recipe, layers)


def norm_mlp(p, states, x, cfg: LlamaConfig, recipe, layers: JaxLayers, statistics=None):
    """RMSNorm and the SwiGLU MLP of x (the float32 stream): bf16 with
    recipe=None; from the fused FP8 call bf16, float32 with float32 seams.
    A mixture-of-experts config: RMSNorm, then moe_jax.moe_mlp, which
    returns (bf16 output, load-balancing loss)."""
    if cfg.experts:
        rows = None if statistics is None else {
            "gate_up": statistics["experts.gate_up"], "down": statistics["experts.down"]}
        return moe_mlp(p, rms_norm(x, p["mlp_norm"], cfg.norm_eps), cfg, recipe,
                       _state(states, "experts"), statistics=rows)
    if recipe is None:
        h = rms_norm(x, p["mlp_norm"], cfg.norm_eps)
        gate, up = project(h, p["w_gate"], {}, None), project(h, p["w_up"], {}, None)
        g = jax.nn.silu(gate.astype(F32)) * up.astype(F32)
        return project(g.astype(BF16), p["w_down"], {}, None)
    return layers.layernorm_mlp(_seam(x, layers), p["mlp_norm"], None, p["w_gate_up"],
                                p["w_down"],
                                normalization="rmsnorm", activation="swiglu",
                                epsilon=cfg.norm_eps, recipe=recipe,
                                **_fp8_kwargs(states, statistics, "mlp"))


def forward(params, fp8_states, tokens, cfg: LlamaConfig, recipe,
            layers: JaxLayers = FP8KIT_LAYERS, attention_impl: str | None = None,
            statistics=None):
    """tokens int32 [batch, seq] -> float32 logits [batch, seq, vocab];
    params in model_params(..., recipe)'s layout, fp8_states from
    create_fp8_states(cfg, recipe, layers); attention_impl:
    jax.nn.dot_product_attention's implementation (attention_implementation
    picks one for a device); statistics: None, or create_statistics_rows'
    pytree, whose cotangent is then the FP8 casts' statistics."""
    return forward_and_aux(params, fp8_states, tokens, cfg, recipe, layers, attention_impl,
                           statistics)[0]


def forward_and_aux(params, fp8_states, tokens, cfg: LlamaConfig, recipe,
                    layers: JaxLayers = FP8KIT_LAYERS, attention_impl: str | None = None,
                    statistics=None):
    """(forward's logits, aux): aux the sum over the layers of each MoE
    block's load-balancing loss (moe_jax.load_balancing_loss, float32),
    None for a dense model."""
    s = tokens.shape[1]
    if s > cfg.seq_len:
        raise ValueError(f"llama_jax.forward: sequence of {s} tokens is longer than the "
                         f"config's seq_len={cfg.seq_len}")
    cos, sin = (jnp.asarray(t[:s]) for t in rope_tables(cfg))
    x = params["embed"][tokens]                       # the float32 residual stream
    aux = None
    for i, p in enumerate(params["layers"]):
        states = None if fp8_states is None else fp8_states["layers"][i]
        rows = None if statistics is None else statistics["layers"][i]
        x = x + attention(p, states, x, cos, sin, cfg, recipe, layers, attention_impl, rows)
        y = norm_mlp(p, states, x, cfg, recipe, layers, rows)
        if cfg.experts:
            y, layer_aux = y
            aux = layer_aux if aux is None else aux + layer_aux
        x = x + y
    h = rms_norm(x, params["final_norm"], cfg.norm_eps)
    # The output head stays in bf16 whatever the recipe, as FP8 training
    # recipes usually keep it: FP8 logits measurably hurt the loss.
    return jnp.dot(h, params["lm_head"].astype(BF16)).astype(F32), aux


def cross_entropy(logits, targets):
    """Mean next-token loss (nats) over every position."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
