"""Float32 weights under torch.autocast: the per-tensor FP8 layers cast them
to FP8 as they are (one rounding, no bf16 copy of the weight each step),
compute in the autocast dtype, and give float32 weight gradients."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format

RECIPES = [DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=4),
           CurrentScaling(fp8_format=Format.HYBRID), BlockScaling()]
K, N = 256, 128


def _layers():
    return {"Linear": lambda: ft.Linear(K, N),
            "LayerNormLinear": lambda: ft.LayerNormLinear(K, N, normalization="RMSNorm"),
            "LayerNormMLP": lambda: ft.LayerNormMLP(K, N, activation="swiglu",
                                                    normalization="RMSNorm")}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("layer", sorted(_layers()))
def test_dtypes_under_autocast_are_torch_nn_linears(layer, recipe):
    """y in the autocast dtype, every parameter's gradient in float32 (the
    parameters' dtype), the input's gradient in the input's dtype."""
    torch.manual_seed(0)
    m = _layers()[layer]()
    x = torch.randn(64, K, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), ft.autocast(recipe=recipe):
        y = m(x)
    y.float().square().mean().backward()
    assert y.dtype == torch.bfloat16
    assert x.grad.dtype == torch.float32
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name


def _rounding_weight(rows: int) -> torch.Tensor:
    """A float32 weight whose FP8 codes tell one rounding from two: at scale
    1 (amax 448, E4M3's largest value), 1.0625 + 2**-12 rounds to 1.125 in
    E4M3, but to bf16's 1.0625 first, a tie that E4M3 rounds to even: 1.0."""
    w = torch.full((rows, K), 1.0625 + 2.0 ** -12)
    w[:, 0] = 448.0
    return w


@pytest.mark.parametrize("layer", ["Linear", "LayerNormLinear"])
def test_the_weight_is_cast_from_float32_not_from_bf16(layer):
    """Under torch.autocast(bf16) the FP8 weight is the float32 weight's own
    cast: each output is 448 + (K - 1) x 1.125 of a ones input, where a bf16
    copy of the weight would give 448 + (K - 1) x 1.0."""
    m = _layers()[layer]()
    with torch.no_grad():
        m.weight.copy_(_rounding_weight(N))
        if m.bias is not None:
            m.bias.zero_()
    x = torch.ones(16, K)
    with torch.autocast("cpu", dtype=torch.bfloat16), ft.autocast(recipe=CurrentScaling()):
        y = m(x).float()
    one_rounding, two_roundings = 448 + (K - 1) * 1.125, 448 + (K - 1) * 1.0
    assert torch.allclose(y, torch.full_like(y, one_rounding), rtol=1e-2), (y[0, :4], two_roundings)


@pytest.mark.parametrize("recipe", RECIPES[:2], ids=lambda r: type(r).__name__)
def test_under_autocast_it_equals_the_float32_layer_rounded(recipe):
    """The same FP8 operands as the float32 layer's on a bf16-exact input:
    the autocast output is the float32 output rounded to bf16 (no bias,
    whose bf16 cast would differ), and the weight gradient is the float32
    layer's for a bf16-exact output gradient."""
    torch.manual_seed(0)
    a, b = ft.Linear(K, N, bias=False), ft.Linear(K, N, bias=False)
    b.load_state_dict(a.state_dict())
    x = torch.randn(64, K).bfloat16().float()
    dy = torch.randn(64, N).bfloat16()
    xa = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16), ft.autocast(recipe=recipe):
        ya = a(xa)
    ya.backward(dy)
    xb = x.clone().requires_grad_()
    with ft.autocast(recipe=recipe):
        yb = b(xb)
    yb.backward(dy.float())
    assert torch.equal(ya, yb.bfloat16())
    assert a.weight.grad.dtype == torch.float32
    assert torch.equal(a.weight.grad, b.weight.grad)


def test_outside_autocast_mixed_dtypes_stay_refused():
    """A bf16 input into a float32 layer without torch.autocast is refused,
    as torch.nn.Linear refuses it: only autocast makes the weight a master
    weight."""
    m = ft.Linear(K, N)
    with ft.autocast(recipe=CurrentScaling()), pytest.raises(RuntimeError, match=(
            "input has dtype torch.bfloat16 but weight has dtype torch.float32")):
        m(torch.randn(4, K, dtype=torch.bfloat16))


class _CountCopies(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the bf16 copies made of float32 tensors, by their shape."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (src is not None and src.dtype == torch.float32 and isinstance(out, torch.Tensor)
                and out.dtype == torch.bfloat16):
            self.shapes.append(tuple(src.shape))
        return out


@pytest.mark.parametrize("recipe", RECIPES[:2], ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("layer", sorted(_layers()))
def test_autocast_copies_the_input_once_and_no_weight(layer, recipe):
    """Under torch.autocast(bf16) a per-tensor layer's forward makes one
    bf16 copy of a float32 input (as torch.nn.Linear does) and none of its
    float32 weights: an activation-sized copy per parameter cost about a
    millisecond of a 4096-token decoder step on an H100."""
    m = _layers()[layer]()
    x = torch.randn(64, K)
    with torch.autocast("cpu", dtype=torch.bfloat16), ft.autocast(recipe=recipe):
        m(x)  # the first call makes the scaling state
        with _CountCopies() as counted:
            m(x)
    assert counted.shapes.count((64, K)) == 1, counted.shapes
    weights = {tuple(p.shape) for name, p in m.named_parameters() if p.dim() == 2}
    assert not weights & set(counted.shapes), counted.shapes
