"""fp8kit.torch.Linear, LayerNormLinear and LayerNormMLP under
autocast(recipe=BlockScaling()): forward, dgrad, wgrad and the bias
gradient against an emulation that quantizes with block_reference's NumPy
model and multiplies in float64 (tight), and against float64 without
quantization (FP8 tolerance); token counts that are not a multiple of 16,
no tokens, frozen inputs or weights; checkpoints; torch.compile (one graph,
the eager bits); clear errors."""

import io

import pytest
import torch
import torch.nn.functional as F

import fp8kit.torch as ft
from block_reference import fake_quantize
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format
from torch_reference import cuda_or_skip

ROW, BLOCK = "block_1x128", "block_128x128"


class EmuLinear(torch.autograd.Function):
    """y = x @ w^T + b with the block-scaled layer's quantization (NumPy
    model) and float64 GEMMs, in the inputs' dtype."""

    @staticmethod
    def forward(ctx, x, w, b, recipe):
        ctx.save_for_backward(x, w)
        ctx.recipe, ctx.has_bias = recipe, b is not None
        q = _fake_quantizer(recipe, backward=False)
        y = q(x.reshape(-1, x.shape[-1]), ROW) @ q(w, BLOCK).T
        if b is not None:
            y = y + b.double().numpy()
        return torch.from_numpy(y).to(x.dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        fq, bq = _fake_quantizer(ctx.recipe, False), _fake_quantizer(ctx.recipe, True)
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dx = bq(dy2, ROW) @ fq(w, BLOCK, columnwise=True)
        dw = bq(dy2, ROW, columnwise=True).T @ fq(x2, ROW, columnwise=True)
        db = dy2.double().sum(0).to(dy.dtype) if ctx.has_bias else None
        return (torch.from_numpy(dx).to(x.dtype).reshape(x.shape),
                torch.from_numpy(dw).to(w.dtype), db, None)


def _fake_quantizer(recipe, backward):
    """fake_quantize(x, mode, columnwise) with the recipe's format, epsilon
    and power-of-two setting for a forward tensor or a gradient."""
    fmt = recipe.fp8_format
    fp8 = fmt.backward_dtype if backward else fmt.forward_dtype

    def q(x, mode, columnwise=False):
        return fake_quantize(x, fp8, mode, columnwise, recipe.amax_epsilon, recipe.power_2_scale)
    return q


def run(module, x, dy, recipe=None):
    """(y, {name: grad}) of module(x) with dy, under fp8kit autocast when
    recipe is given."""
    x = x.detach().requires_grad_()
    for p in module.parameters():
        p.grad = None
    if recipe is None:
        y = module(x)
    else:
        with ft.autocast(recipe=recipe):
            y = module(x)
    y.backward(dy)
    # (A torch.compile'd module names its parameters "_orig_mod.<name>".)
    grads = {"x": x.grad, **{n.removeprefix("_orig_mod."): p.grad
                             for n, p in module.named_parameters()}}
    return y.detach(), grads


def close(got, want, rtol, what):
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol,
                               atol=rtol * want.abs().max().item(), msg=lambda m: f"{what}: {m}")


def rel_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def inputs(shape, out_features, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    x[..., 5] *= 50  # an outlier feature: the 1x128 tiles holding it get their own scales
    dy = torch.randn(*shape[:-1], out_features, generator=g).to(dtype)
    return x, dy


@pytest.mark.parametrize("fmt", [Format.E4M3, Format.HYBRID])
@pytest.mark.parametrize("tokens", [37, 64])  # 37: padded to 48 inside
def test_linear_matches_the_block_scaled_emulation(fmt, tokens):
    recipe = BlockScaling(fp8_format=fmt, power_2_scale=fmt is Format.E4M3,
                          amax_epsilon=0.0 if fmt is Format.E4M3 else 2.0)
    layer = ft.Linear(256, 144)  # 144: edge 128x128 blocks of the weight
    x, dy = inputs((tokens, 256), 144, torch.float32, seed=1)
    y, g = run(layer, x, dy, recipe)
    xe = x.detach().requires_grad_()
    w, b = (layer.weight.detach().requires_grad_(), layer.bias.detach().requires_grad_())
    ye = EmuLinear.apply(xe, w, b, recipe)
    ye.backward(dy)
    close(y, ye, 1e-6, "y")
    close(g["x"], xe.grad, 1e-6, "dx")
    close(g["weight"], w.grad, 1e-6, "dw")
    close(g["bias"], b.grad, 1e-6, "db")


def test_linear_bf16_is_within_fp8_tolerance_of_float64():
    torch.manual_seed(0)
    layer = ft.Linear(384, 256, dtype=torch.bfloat16)
    x, dy = inputs((2, 24, 384), 256, torch.bfloat16, seed=2)
    y, g = run(layer, x, dy, BlockScaling())
    ref = torch.nn.Linear(384, 256, dtype=torch.float64)
    ref.load_state_dict(layer.state_dict(), strict=False)
    yr, gr = run(ref, x.double(), dy.double())
    assert y.dtype == g["x"].dtype == g["weight"].dtype == torch.bfloat16
    # E4M3 keeps 3 mantissa bits: ~4% rms error per operand element.
    for what, a, b in (("y", y, yr), ("dx", g["x"], gr["x"]), ("dw", g["weight"], gr["weight"])):
        assert rel_error(a, b) < 0.06, what
    close(g["bias"], gr["bias"], 2 ** -7, "db")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_outlier_token_costs_per_tensor_scaling_the_others(seed):
    """A token 2^15 times larger than the rest: its per-tensor scale puts
    the other tokens' values among E4M3's subnormals (a few bits left),
    while 1x128 tiles give each token its own scale. (An outlier of 50x,
    as in inputs(), costs per-tensor scaling nothing: E4M3's normal range
    spans 2^15.)"""
    torch.manual_seed(seed)
    layer = ft.Linear(384, 256, dtype=torch.bfloat16)
    ref = torch.nn.Linear(384, 256, dtype=torch.float64)
    ref.load_state_dict(layer.state_dict(), strict=False)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(48, 384, generator=g).to(torch.bfloat16)
    x[0] *= 2 ** 15
    dy = torch.randn(48, 256, generator=g).to(torch.bfloat16)
    yr, _ = run(ref, x.double(), dy.double())
    errors = {}
    for name, recipe in (("block", BlockScaling()), ("current", CurrentScaling())):
        y, _ = run(layer, x, dy, recipe)
        errors[name] = rel_error(y[1:], yr[1:])
    assert errors["block"] < 0.06, errors
    assert errors["current"] > 3 * errors["block"], errors


def test_forward_without_grad_frozen_parts_and_other_dtypes():
    layer = ft.Linear(128, 32)
    x, dy = inputs((20, 128), 32, torch.float32, seed=3)
    y, _ = run(layer, x, dy, BlockScaling())
    with torch.no_grad(), ft.autocast(recipe=BlockScaling()):
        assert torch.equal(layer(x), y)
    layer.weight.requires_grad_(False)
    _, g = run(layer, x, dy, BlockScaling())
    assert g["x"] is not None and g["bias"] is not None and layer.weight.grad is None
    layer.weight.requires_grad_(True)
    with ft.autocast(recipe=BlockScaling()):
        out = layer(x)  # x needs no gradient: wgrad and bgrad only
    out.backward(dy)
    assert layer.weight.grad is not None
    half = ft.Linear(128, 32, dtype=torch.float16)
    with ft.autocast(recipe=BlockScaling()):
        y16 = half(x.half())
    assert y16.dtype == torch.float16
    assert rel_error(y16, F.linear(x.double(), half.weight.double(), half.bias.double())) < 0.06
    with ft.autocast(recipe=BlockScaling()), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    empty, _ = run(layer, torch.zeros(0, 128), torch.zeros(0, 32), BlockScaling())
    assert empty.shape == (0, 32)


def test_errors_name_the_layer_and_the_fix():
    with ft.autocast(recipe=BlockScaling()):
        with pytest.raises(ValueError, match="Linear: in_features is 120, .* multiples of 16"):
            ft.Linear(120, 32)(torch.zeros(4, 120))
        with pytest.raises(ValueError, match="out_features is 40"):
            ft.Linear(128, 40)(torch.zeros(4, 128))
        with pytest.raises(RuntimeError, match="input has dtype torch.bfloat16 but weight"):
            ft.Linear(128, 32)(torch.zeros(4, 128, dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="torch.float64; FP8 layers take"):
            ft.Linear(128, 32, dtype=torch.float64)(torch.zeros(4, 128, dtype=torch.float64))
        with pytest.raises(ValueError, match="the last dimension of input"):
            ft.Linear(128, 32)(torch.zeros(4, 64))
        layer = ft.Linear(128, 32)
        q = ft.Float8CurrentScalingQuantizer("e4m3")
        layer.weight = torch.nn.Parameter(q(layer.weight.detach()))
        with pytest.raises(TypeError, match="per-tensor FP8 weight.*DelayedScaling or "
                                            "CurrentScaling"):
            layer(torch.zeros(4, 128))
        with pytest.raises(ValueError, match="LayerNormMLP: out_features is 24"):
            ft.LayerNormMLP(128, 24)(torch.zeros(4, 128))


def test_checkpoints_keep_every_recipe_and_block_scaling_adds_no_state():
    layer = ft.Linear(128, 64)
    x, dy = inputs((16, 128), 64, torch.float32, seed=4)
    run(layer, x, dy, DelayedScaling())
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for _ in range(2):
        run(layer, x, dy, BlockScaling())
        opt.step()
    assert layer.fp8_state_for(BlockScaling()) is None
    saved = layer.state_dict()
    assert len(saved["_extra_state"]["states"]) == 1  # the DelayedScaling one
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    fresh = ft.Linear(128, 64)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    for recipe in (BlockScaling(), DelayedScaling()):
        with torch.no_grad(), ft.autocast(recipe=recipe):
            assert torch.equal(fresh(x), layer(x))


def emulated_norm_linear(layer, x, recipe):
    h = F.layer_norm(x, (x.shape[-1],), layer.layer_norm_weight, layer.layer_norm_bias,
                     layer.eps)
    return EmuLinear.apply(h, layer.weight, layer.bias, recipe)


def emulated_mlp(layer, x, recipe):
    h = F.rms_norm(x, (x.shape[-1],), layer.layer_norm_weight, layer.eps)
    h = EmuLinear.apply(h, layer.fc1_weight, layer.fc1_bias, recipe)
    if layer.activation == "gelu":
        a = F.gelu(h, approximate="tanh")
    else:
        gate, up = h.chunk(2, dim=-1)
        a = F.silu(gate) * up
    return EmuLinear.apply(a, layer.fc2_weight, layer.fc2_bias, recipe)


@pytest.mark.parametrize("kind", ["LayerNormLinear", "LayerNormMLP gelu", "LayerNormMLP swiglu"])
def test_fused_layers_match_the_emulation(kind):
    recipe = BlockScaling()
    if kind == "LayerNormLinear":
        layer, emulate, out = ft.LayerNormLinear(256, 144), emulated_norm_linear, 144
    else:
        layer = ft.LayerNormMLP(256, 160, normalization="RMSNorm", activation=kind.split()[1])
        emulate, out = emulated_mlp, 256
    x, dy = inputs((3, 13, 256), out, torch.float32, seed=5)
    y, g = run(layer, x, dy, recipe)
    ye, ge = run(_Emulated(layer, emulate, recipe), x, dy)
    close(y, ye, 1e-5, "y")
    for name, grad in g.items():
        close(grad, ge[name], 1e-5, f"d{name}")
    assert all(s == () for s in layer.fp8_states.values())
    assert layer.fp8_state_for(recipe) is None


class _Emulated(torch.nn.Module):
    """Runs `emulate(layer, x, recipe)` with layer's parameters as its own."""

    def __init__(self, layer, emulate, recipe):
        super().__init__()
        self.layer, self.emulate, self.recipe = layer, emulate, recipe

    def forward(self, x):
        return self.emulate(self.layer, x, self.recipe)

    def named_parameters(self, *args, **kwargs):
        return self.layer.named_parameters(*args, **kwargs)


@pytest.mark.gpu
def test_cuda_layers_match_the_cpu():
    dev = cuda_or_skip()
    if not ft.supports_block_scaled_fp8_gemm(dev):
        pytest.skip("no block-scaled FP8 GEMM on this device")
    for layer, shape, out in ((ft.Linear(512, 384), (300, 512), 384),
                              (ft.LayerNormMLP(256, 512, activation="swiglu"), (4, 70, 256), 256)):
        x, dy = inputs(shape, out, torch.float32, seed=6)
        y, g = run(layer, x, dy, BlockScaling())
        yc, gc = run(layer.to(dev), x.to(dev), dy.to(dev), BlockScaling())
        # Not bit for bit: Hopper sums each 128-deep block of a GEMM in less
        # than float32's precision (~2^-12 of sum |a b|), and a GEMM output
        # that differs lets a later cast round an element to the next FP8
        # value. Both stay far below FP8's own error against bf16 (~3%,
        # the 0.06 above), while a wrong scale, layout or block is O(1).
        for name, got, want in (("y", yc, y), *((f"d{n}", gc[n], g[n]) for n in g)):
            assert rel_error(got.cpu(), want.cpu()) < 2.0 ** -7, (type(layer).__name__, name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_linear_is_one_graph_with_the_eager_bits(device):
    if device == "cuda":
        device = cuda_or_skip()
        if not ft.supports_block_scaled_fp8_gemm(device):
            pytest.skip("no block-scaled FP8 GEMM on this device")
    layer = ft.Linear(256, 128, device=device)
    x, dy = inputs((40, 256), 128, torch.float32, seed=7)
    x, dy = x.to(device), dy.to(device)
    y, g = run(layer, x, dy, BlockScaling())
    yc, gc = run(torch.compile(layer, fullgraph=True), x, dy, BlockScaling())
    assert torch.equal(yc, y)
    for name in ("x", "weight"):  # the FP8 ops' results
        assert torch.equal(gc[name], g[name]), name
    close(gc["bias"], g["bias"], 1e-6, "db")  # a float32 sum inductor may reorder


# ---------------------------------------------------------------- the ops
_FP8_INPUT_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("tokens,min_rows", [(37, 0), (64, 0), (20, 144)])
def test_block_linear_ops_opcheck_and_pad_inside(tokens, min_rows):
    """The two ops' fake kernels agree with the real ones (opcheck, also
    with a dynamic token count), and the token padding they do inside
    changes no result: min_rows' extra zero rows give the same bits."""
    torch.manual_seed(4)
    ops = torch.ops.fp8kit
    x, w, b = torch.randn(tokens, 64), torch.randn(32, 64), torch.randn(32)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    fwd = (x, w, b, e4m3, 0.0, True, True, True, min_rows)
    # opcheck's test_schema compares FP8 outputs with allclose, which has
    # no FP8 kernel.
    torch.library.opcheck(ops.block_linear_forward.default, fwd, test_utils=_FP8_INPUT_UTILS)
    y, *kept = ops.block_linear_forward(*fwd)
    dy = torch.randn(tokens, 32)
    bwd = (dy, *kept, e5m2, 0.0, True, 64, True, True, True, min_rows)
    torch.library.opcheck(ops.block_linear_backward.default, bwd, test_utils=_FP8_INPUT_UTILS)
    grads = ops.block_linear_backward(*bwd)
    y0, *kept0 = ops.block_linear_forward(*fwd[:-1], 0)
    grads0 = ops.block_linear_backward(dy, *kept0, *bwd[5:-1], 0)
    for got, want in zip((y, *grads), (y0, *grads0)):
        assert torch.equal(got, want)
    assert torch.equal(grads[2], dy.sum(0))


def test_block_linear_ops_name_a_bad_argument():
    ops = torch.ops.fp8kit
    x, w = torch.randn(16, 64), torch.randn(32, 64)
    with pytest.raises(TypeError, match="fp8kit::block_linear_forward: forward_dtype is "
                                        "torch.float32; use torch.float8_e4m3fn"):
        ops.block_linear_forward(x, w, None, torch.float32, 0.0, True, True, True, 0)
    with pytest.raises(ValueError, match=r"fp8kit::block_linear_forward: x has shape \[16, 48\] "
                                         r"and weight \[32, 64\]; they must be \[M, K\]"):
        ops.block_linear_forward(x[:, :48], w, None, torch.float8_e4m3fn, 0.0, True, True,
                                 True, 0)
    with pytest.raises(ValueError, match="fp8kit::block_linear_backward: grad_output has shape "
                                         r"\[16\] and in_features is 64"):
        empty = torch.empty(0)
        ops.block_linear_backward(torch.randn(16), empty, empty, empty, empty,
                                  torch.float8_e5m2, 0.0, True, 64, False, False, True, 0)
