"""fp8kit.torch.LayerNormLinear and LayerNormMLP with GEMM weights that are
already FP8 (Float8Tensor parameters, what FSDP2's FP8 all-gather gives the
layers): the GEMMs read their FP8 copies, the gradients reach the
parameters, the weights' scaling slots record nothing, and FP8 weights the
layer cannot read are refused by name."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from torch_reference import cuda_or_skip

KINDS = ["lnl", "gelu", "swiglu"]
# The GEMM weights of each layer, in its GEMMs' order.
GEMM_WEIGHTS = {"lnl": ["weight"], "gelu": ["fc1_weight", "fc2_weight"],
                "swiglu": ["fc1_weight", "fc2_weight"]}


def _layer(kind):
    if kind == "lnl":
        return ft.LayerNormLinear(32, 48)
    return ft.LayerNormMLP(32, 48, normalization="RMSNorm", activation=kind)


def _pair(kind, fp8_dtype="e4m3", device="cpu"):
    """A layer and its twin whose GEMM weights are the Float8Tensors of the
    same weights under current scaling (the scale the layer computes)."""
    torch.manual_seed(0)
    plain = _layer(kind).to(device)
    fp8 = _layer(kind).to(device)
    fp8.load_state_dict(plain.state_dict())
    quantizer = ft.Float8CurrentScalingQuantizer(fp8_dtype, True, True)
    for name in GEMM_WEIGHTS[kind]:
        setattr(fp8, name, torch.nn.Parameter(quantizer(getattr(plain, name).detach())))
    return plain, fp8


def _run(layer, x, recipe):
    x = x.clone().requires_grad_()
    with ft.autocast(recipe=recipe):
        y = layer(x)
    y.backward(torch.linspace(-1, 1, y.numel(), device=y.device).view_as(y))
    return [y, x.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_weights_give_the_bits_of_casting_them(kind, device):
    device = cuda_or_skip() if device == "cuda" else torch.device("cpu")
    plain, fp8 = _pair(kind, device=device)
    x = torch.randn(20, 32, device=device)
    got, want = _run(fp8, x, CurrentScaling()), _run(plain, x, CurrentScaling())
    assert len(got) == len(want) == 2 + len(list(plain.parameters()))
    for g, w in zip(got, want):
        assert type(g) is torch.Tensor and torch.equal(g, w)


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_weight_slots_record_nothing(kind):
    _, fp8 = _pair(kind)
    _run(fp8, torch.randn(20, 32), DelayedScaling())
    for state in fp8.fp8_state_for(DelayedScaling()):
        history = state.amax_history
        assert history[0, 0] > 0 and history[2, 0] > 0  # input and grad_output recorded
        assert not history[1].any()                    # the weight's owner records it


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_weights_without_grad(kind):
    plain, fp8 = _pair(kind)
    x = torch.randn(5, 32)
    with torch.no_grad(), ft.autocast(recipe=CurrentScaling()):
        assert torch.equal(fp8(x), plain(x))


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_weights_the_layer_cannot_read_are_refused(kind):
    _, fp8 = _pair(kind, fp8_dtype="e5m2")
    layer = type(fp8).__name__
    first = GEMM_WEIGHTS[kind][0]
    with pytest.raises(TypeError, match=rf"fp8kit.torch.{layer} \({first}\): the FP8 weight's "
                                        "rowwise data is torch.float8_e5m2 but the recipe's "
                                        "forward format is torch.float8_e4m3fn"):
        _run(fp8, torch.randn(4, 32), CurrentScaling())
    # BlockScaling casts each weight per 128x128 block itself.
    with pytest.raises(TypeError, match=f"fp8kit.torch.{layer}: the weight is an fp8kit "
                                        "Float8Tensor .* but BlockScaling quantizes the weight"):
        _run(fp8, torch.randn(4, 32), BlockScaling())
    # A Float8Tensor that owns its buffers holds only the copies it was made
    # with (a parameter is a view of one, whose copies are read through it).
    _, fp8 = _pair(kind)
    quantizer = ft.Float8CurrentScalingQuantizer("e4m3", True, False)
    fp8._parameters[first] = quantizer(getattr(fp8, first).dequantize())
    with pytest.raises(ValueError, match=rf"fp8kit.torch.{layer} \({first}\): the FP8 weight "
                                         "has no columnwise data, which this call's GEMMs read "
                                         r"on cpu; make it with weight.update_usage\(columnwise"):
        _run(fp8, torch.randn(4, 32), CurrentScaling())


def test_fp8_weights_do_not_trace():
    _, fp8 = _pair("gelu")
    with ft.autocast(recipe=CurrentScaling()), \
            pytest.raises(NotImplementedError, match="fp8kit.torch.LayerNormMLP: a Float8Tensor "
                                                     "weight .* does not trace under "
                                                     "torch.compile or torch.export"):
        torch.export.export(fp8, (torch.randn(4, 32),))
