"""The Llama-style decoder in PyTorch.

    tokens -> embed -> layers x [x + attention(x), x + mlp(x)] -> RMSNorm -> lm_head

Precision: parameters are float32 (the optimizer's master weights); the
forward computes in bf16 under torch.autocast, which casts each weight to
bf16 as a projection reads it (fp8kit's per-tensor FP8 layers cast a
float32 weight straight to FP8 instead: fp8kit/torch/linear.py). The
residual stream, the norms' statistics and the rotary rotation stay in
float32; attention runs in bf16 (scaled_dot_product_attention, causal).
fp8kit/models/llama_jax.py is the same model in JAX.

With recipe=None every projection is a torch.nn.Linear and the model
contains no fp8kit layer. With a recipe the model runs under
fp8kit.torch.autocast(recipe) and each layer holds three FP8 layers (the
classes of an FP8Layers, fp8kit's by default; the models benchmark passes
TransformerEngine's, whose modules take the same arguments):
    FusedNormQKV  the attention's input RMSNorm and its q, k, v
                  projections: one fp8kit.torch.LayerNormLinear with
                  hidden + 2 * kv_width outputs, split into q, k, v
    wo            fp8kit.torch.Linear
    FusedNormMLP  the MLP's input RMSNorm and the whole SwiGLU MLP: one
                  fp8kit.torch.LayerNormMLP
By default the two fused layers take bf16 at their seams, as the bf16
model's layers and TransformerEngine's do: they run under torch.autocast
like the other projections (as fast as float32 seams, with less memory).
FP8Layers(float32_seams=True), the opt-in, runs them outside
torch.autocast on the float32 residual stream and master weights: their
norm reads the stream itself and their outputs are float32 (q, k, v then
go to bf16), at the cost of SwiGLU's input kept for backward in float32.
(Both ways the FP8 layers cast the float32 weights to FP8 as they are.)

A mixture-of-experts config (experts > 0) replaces each MLP with
moe_torch.MoEMLP: its RMSNorm, a float32 router and the experts as two
fp8kit.torch.GroupedLinear layers (FP8 under every recipe, bf16 with
no recipe), whatever FP8Layers says (the benchmark's TE peer swaps in
TransformerEngine's experts afterwards: moe_te.convert).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

import fp8kit.torch as ft
from fp8kit.models.config import LlamaConfig
from fp8kit.models.checkpoint import flatten
from fp8kit.models.init import FUSED_KERNELS, rope_tables, split_kernel
from fp8kit.models.moe_torch import MoEMLP

BF16 = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class FP8Layers:
    """The FP8 layer classes the model is built from and the autocast they
    run under (autocast(recipe) -> a context manager). float32_seams:
    False (the default) keeps the fused layers under torch.autocast like
    the other projections, bf16 at their seams as the bf16 model's layers
    and TransformerEngine's have it (same speed, less memory); True, the
    opt-in for fp8kit's layers (which cast float32 straight to FP8), runs
    them outside torch.autocast on the float32 stream and weights, keeping
    SwiGLU's input for backward in float32."""

    linear: type
    layernorm_linear: type
    layernorm_mlp: type
    autocast: Callable
    float32_seams: bool = False


FP8KIT_LAYERS = FP8Layers(ft.Linear, ft.LayerNormLinear, ft.LayerNormMLP,
                          lambda recipe: ft.autocast(recipe=recipe))


def _linear(in_features: int, out_features: int, fp8: FP8Layers | None,
            device) -> torch.nn.Linear:
    cls = fp8.linear if fp8 is not None else torch.nn.Linear
    return cls(in_features, out_features, bias=False, device=device)


class RMSNorm(torch.nn.Module):
    """x / rms(x) * weight in float32, returned in bf16 (the projections' input)."""

    def __init__(self, dim: int, eps: float, device=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight).to(BF16)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [batch, heads, seq, head_dim] ("rotate half"
    form, fp8kit/models/init.py), computed in float32, returned in bf16."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(BF16)


class NormQKV(torch.nn.Module):
    """RMSNorm, then the q, k and v projections of the normed input (bf16)."""

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device)
        self.wq = torch.nn.Linear(cfg.hidden, cfg.hidden, bias=False, device=device)
        self.wk = torch.nn.Linear(cfg.hidden, cfg.kv_width, bias=False, device=device)
        self.wv = torch.nn.Linear(cfg.hidden, cfg.kv_width, bias=False, device=device)

    def forward(self, x):
        h = self.norm(x)
        return self.wq(h), self.wk(h), self.wv(h)


def _fused_context(x: torch.Tensor, fp8: FP8Layers):
    """The fused layers' context: with float32 seams their inputs and
    weights keep their float32 (outside torch.autocast)."""
    if fp8.float32_seams:
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


class FusedNormQKV(torch.nn.Module):
    """NormQKV as one fp8kit.torch.LayerNormLinear (RMSNorm, no bias) whose
    output features are [q | k | v]; returns q, k, v in bf16."""

    def __init__(self, cfg: LlamaConfig, fp8: FP8Layers, device=None):
        super().__init__()
        self.widths, self.fp8 = (cfg.hidden, cfg.kv_width, cfg.kv_width), fp8
        self.layer = fp8.layernorm_linear(cfg.hidden, sum(self.widths), bias=False,
                                          normalization="RMSNorm", eps=cfg.norm_eps,
                                          device=device)

    def forward(self, x):
        with _fused_context(x, self.fp8):
            qkv = self.layer(x)
        return tuple(t.to(BF16) for t in qkv.split(self.widths, dim=-1))


class Attention(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig, fp8: FP8Layers | None, device=None):
        super().__init__()
        self.cfg = cfg
        self.qkv = FusedNormQKV(cfg, fp8, device) if fp8 else NormQKV(cfg, device)
        self.wo = _linear(cfg.hidden, cfg.hidden, fp8, device)

    def forward(self, x, cos, sin):
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv(x)
        q = q.view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = k.view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=cfg.num_kv_heads != cfg.heads)
        return self.wo(o.transpose(1, 2).reshape(b, s, cfg.hidden))


class NormMLP(torch.nn.Module):
    """RMSNorm, then the SwiGLU MLP: down(silu(gate(h)) * up(h)) (bf16)."""

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device)
        self.w_gate = torch.nn.Linear(cfg.hidden, cfg.ffn, bias=False, device=device)
        self.w_up = torch.nn.Linear(cfg.hidden, cfg.ffn, bias=False, device=device)
        self.w_down = torch.nn.Linear(cfg.ffn, cfg.hidden, bias=False, device=device)

    def forward(self, x):
        h = self.norm(x)
        g = F.silu(self.w_gate(h).float()) * self.w_up(h).float()
        return self.w_down(g.to(BF16))


class FusedNormMLP(torch.nn.Module):
    """NormMLP as one fp8kit.torch.LayerNormMLP (RMSNorm, SwiGLU, no bias;
    fc1's rows are [gate; up]); returns bf16, float32 with float32 seams."""

    def __init__(self, cfg: LlamaConfig, fp8: FP8Layers, device=None):
        super().__init__()
        self.fp8 = fp8
        self.layer = fp8.layernorm_mlp(cfg.hidden, cfg.ffn, bias=False, normalization="RMSNorm",
                                       activation="swiglu", eps=cfg.norm_eps, device=device)

    def forward(self, x):
        with _fused_context(x, self.fp8):
            return self.layer(x)


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig, fp8: FP8Layers | None, device=None):
        super().__init__()
        self.attention = Attention(cfg, fp8, device)
        self.moe = bool(cfg.experts)
        if self.moe:
            self.mlp = MoEMLP(cfg, RMSNorm(cfg.hidden, cfg.norm_eps, device), device)
        else:
            self.mlp = FusedNormMLP(cfg, fp8, device) if fp8 else NormMLP(cfg, device)

    def forward(self, x, cos, sin):
        """(the new stream, the MoE block's load-balancing loss or None)."""
        x = x + self.attention(x, cos, sin)   # float32 + bf16: the stream stays float32
        if self.moe:
            y, aux = self.mlp(x)
            return x + y, aux
        return x + self.mlp(x), None


class Llama(torch.nn.Module):
    """recipe: an fp8kit.recipe (FP8 projections, fused at the norms) or None
    (all bf16); layers: the FP8 layers' classes (a recipe of their library)."""

    def __init__(self, cfg: LlamaConfig, recipe=None, device=None,
                 layers: FP8Layers = FP8KIT_LAYERS):
        super().__init__()
        self.cfg, self.recipe = cfg, recipe
        fp8 = layers if recipe is not None else None
        self.fp8_autocast = layers.autocast
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.hidden, device=device)
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg, fp8, device)
                                          for _ in range(cfg.layers))
        self.final_norm = RMSNorm(cfg.hidden, cfg.norm_eps, device)
        # The output head stays in bf16 (a torch.nn.Linear even with a
        # recipe), as FP8 training recipes usually keep it: its outputs are
        # the logits of a softmax over the whole vocabulary, and FP8 there
        # measurably hurts the loss.
        self.lm_head = torch.nn.Linear(cfg.hidden, cfg.vocab, bias=False, device=device)
        cos, sin = (torch.from_numpy(t) for t in rope_tables(cfg))
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)

    def forward(self, tokens: torch.Tensor, return_aux_loss: bool = False):
        """tokens int64 [batch, seq] -> float32 logits [batch, seq, vocab];
        with return_aux_loss, (logits, aux): aux the sum over the layers of
        each MoE block's load-balancing loss (moe_torch.load_balancing_loss,
        float32), None for a dense model."""
        s = tokens.shape[1]
        if s > self.cfg.seq_len:
            raise ValueError(f"Llama: sequence of {s} tokens is longer than the config's "
                             f"seq_len={self.cfg.seq_len}")
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]
        fp8 = (self.fp8_autocast(self.recipe) if self.recipe is not None
               else contextlib.nullcontext())
        aux = None
        with torch.autocast(tokens.device.type, dtype=BF16), fp8:
            x = self.embed(tokens)
            for layer in self.layers:
                x, layer_aux = layer(x, cos, sin)
                if layer_aux is not None:
                    aux = layer_aux if aux is None else aux + layer_aux
            logits = self.lm_head(self.final_norm(x)).float()
        return (logits, aux) if return_aux_loss else logits


def weight_layout(model: Llama) -> list[tuple[torch.nn.Parameter, tuple[str, ...], bool]]:
    """Every parameter of `model` with where it is in fp8kit/models/init.py's
    layout: the flat names (checkpoint.flatten's) of the arrays it holds
    (several: a fused layer's kernels, concatenated in fuse_kernels' order)
    and whether it is a kernel, which the model holds transposed ([out, in],
    torch.nn.Linear's weight). The one place where the two layouts meet."""
    out = [(model.embed.weight, ("embed",), False)]
    for i, layer in enumerate(model.layers):
        qkv, mlp = layer.attention.qkv, layer.mlp
        name = lambda n: f"layers.{i}.{n}"  # noqa: E731
        if isinstance(qkv, FusedNormQKV):
            out += [(qkv.layer.layer_norm_weight, (name("attn_norm"),), False),
                    (qkv.layer.weight, tuple(map(name, FUSED_KERNELS["wqkv"])), True)]
        else:
            out += [(qkv.norm.weight, (name("attn_norm"),), False)]
            out += [(getattr(qkv, n).weight, (name(n),), True) for n in ("wq", "wk", "wv")]
        out.append((layer.attention.wo.weight, (name("wo"),), True))
        if isinstance(mlp, MoEMLP):
            out += [(mlp.norm.weight, (name("mlp_norm"),), False),
                    (mlp.router.weight, (name("router"),), True),
                    (mlp.w_gate_up.weight, tuple(map(name, FUSED_KERNELS["w_gate_up"])), True),
                    (mlp.w_down.weight, (name("w_down"),), True)]
        elif isinstance(mlp, FusedNormMLP):
            out += [(mlp.layer.layer_norm_weight, (name("mlp_norm"),), False),
                    (mlp.layer.fc1_weight, tuple(map(name, FUSED_KERNELS["w_gate_up"])), True),
                    (mlp.layer.fc2_weight, (name("w_down"),), True)]
        else:
            out += [(mlp.norm.weight, (name("mlp_norm"),), False)]
            out += [(getattr(mlp, n).weight, (name(n),), True)
                    for n in ("w_gate", "w_up", "w_down")]
    out += [(model.final_norm.weight, ("final_norm",), False),
            (model.lm_head.weight, ("lm_head",), True)]
    placed = {id(p) for p, _, _ in out}
    unplaced = [n for n, p in model.named_parameters() if id(p) not in placed]
    if unplaced:
        raise ValueError(f"weight_layout: parameters {unplaced[:3]} of the model have no place in "
                         "init's layout (a model changed after it was built?)")
    return out


def load_params(model: Llama, params: dict) -> None:
    """Copies NumPy weights in fp8kit/models/init.py's layout (nested, as
    init_params makes them, or flat: checkpoint.flatten's) into `model`."""
    flat = params if "layers" not in params else flatten(params)
    n = sum(k.startswith("layers.") and k.endswith(".wo") for k in flat)
    if n != len(model.layers):
        raise ValueError(f"load_params: {n} layers of weights for a model of "
                         f"{len(model.layers)}")
    for param, names, kernel in weight_layout(model):
        put_layout(param, [flat[n] for n in names], kernel)


def put_layout(tensor: torch.Tensor, values: list, kernel: bool) -> None:
    """Copies arrays of init's layout (weight_layout's names, in order) into
    `tensor`, a parameter or a tensor shaped like one (an optimizer moment).

    Each array goes to tensor's device as it is and is transposed and put
    in its place there: the host only copies. Concatenating and transposing
    on the host (NumPy, one thread) took minutes for mixtral_slice's 2.9B
    parameters, against milliseconds on a GPU."""
    if kernel:
        widths = [v.shape[-1] for v in values]
        outer = {tuple(v.shape[:-1]) for v in values}
        shape = (*values[0].shape[:-2], sum(widths), values[0].shape[-2])
    else:
        shape, outer = tuple(values[0].shape), set()
    if tuple(tensor.shape) != shape or len(outer) > 1:
        got = [tuple(v.shape) for v in values] if len(outer) > 1 else shape
        raise ValueError(f"load_params: weight of shape {got} does not fit "
                         f"parameter of shape {tuple(tensor.shape)}; wrong config?")
    with torch.no_grad():
        if not kernel:
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(values[0])))
            return
        start = 0
        for value, width in zip(values, widths):
            part = torch.from_numpy(np.ascontiguousarray(value)).to(tensor.device)
            tensor[..., start:start + width, :].copy_(part.transpose(-1, -2))
            start += width


def take_layout(tensor: torch.Tensor, names: tuple, kernel: bool, cfg: LlamaConfig) -> dict:
    """put_layout's inverse: {name: float32 NumPy array of init's layout}."""
    value = tensor.detach().float().cpu().numpy()
    if not kernel:
        return {names[0]: value}
    value = value.swapaxes(-1, -2)
    if len(names) == 1:
        return {names[0]: np.ascontiguousarray(value)}
    parts = split_kernel(value, tuple(n.rsplit(".", 1)[1] for n in names), cfg)
    return {n: np.ascontiguousarray(v) for n, v in zip(names, parts.values())}


def _fp8_linears(model: Llama) -> dict:
    """{checkpoint.FP8_LINEARS name: (layer, GEMM)}: where each FP8 Linear's
    scaling state is (the layer's fp8_state_arrays()[GEMM])."""
    out = {}
    for i, layer in enumerate(model.layers):
        out[f"layers.{i}.qkv"] = (layer.attention.qkv.layer, "linear")
        out[f"layers.{i}.wo"] = (layer.attention.wo, "linear")
        if isinstance(layer.mlp, MoEMLP):  # each GroupedLinear's state, all experts
            out[f"layers.{i}.experts.gate_up"] = (layer.mlp.w_gate_up, GROUPED)
            out[f"layers.{i}.experts.down"] = (layer.mlp.w_down, GROUPED)
        else:
            out[f"layers.{i}.mlp.fc1"] = (layer.mlp.layer, "fc1")
            out[f"layers.{i}.mlp.fc2"] = (layer.mlp.layer, "fc2")
    return out


# _fp8_linears' GEMM of a GroupedLinear: the layer's whole state.
GROUPED = "grouped"


def fp8_linear_names(model: Llama) -> dict:
    """{the name fp8kit.torch.inspect gives an FP8 Linear (its module's
    qualified name, ".fc1" / ".fc2" for the MLP's): its checkpoint.FP8_LINEARS
    name (MOE_FP8_LINEARS' for the experts' GroupedLinears)}, which
    fp8kit.jax's statistics use too."""
    qualified = {id(m): n for n, m in model.named_modules()}
    return {qualified[id(layer)] + ("" if gemm in ("linear", GROUPED) else f".{gemm}"): name
            for name, (layer, gemm) in _fp8_linears(model).items()}


def fp8_state_arrays(model: Llama, recipe) -> dict:
    """{FP8 Linear name (checkpoint.FP8_LINEARS): its `recipe` scaling state
    as fp8kit.checkpoint's arrays}, a fresh state's before its first use."""
    out = {}
    for name, (layer, gemm) in _fp8_linears(model).items():
        if gemm == GROUPED:
            out[name] = layer.fp8_state_arrays(recipe)
            continue
        arrays = layer.fp8_state_arrays(recipe)[gemm]
        if arrays is None:
            arrays = {"amax_history": np.zeros((3, recipe.amax_history_len), np.float32),
                      "scale": np.ones(3, np.float32), "seeded": np.zeros(3, np.float32)}
        out[name] = arrays
    return out


def load_fp8_state_arrays(model: Llama, recipe, states: dict) -> None:
    """fp8_state_arrays' inverse: every FP8 Linear's `recipe` state set."""
    by_layer = {}
    for name, (layer, gemm) in _fp8_linears(model).items():
        if gemm == GROUPED:
            layer.load_fp8_state_arrays(recipe, states[name])
            continue
        by_layer.setdefault(layer, {})[gemm] = states[name]
    for layer, arrays in by_layer.items():
        layer.load_fp8_state_arrays(recipe, arrays)
