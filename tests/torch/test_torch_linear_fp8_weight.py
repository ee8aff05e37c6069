"""fp8kit.torch.Linear with a weight that is already FP8 (a Float8Tensor
parameter, what FSDP2's FP8 all-gather gives the layer): the GEMMs read its
FP8 copies, the gradient reaches the parameter, the weight's scaling slot
records nothing, and malformed FP8 weights are refused by name."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch._ext import ext


def _pair(seed=0):
    """A Linear and its twin whose weight parameter is the Float8Tensor of
    the same weight under current scaling (the scale the Linear computes)."""
    torch.manual_seed(seed)
    plain = ft.Linear(32, 48)
    fp8 = ft.Linear(32, 48)
    fp8.load_state_dict(plain.state_dict())
    quantizer = ft.Float8CurrentScalingQuantizer("e4m3", True, True)
    fp8.weight = torch.nn.Parameter(quantizer(plain.weight.detach()))
    return plain, fp8


def _run(layer, x, recipe):
    x = x.clone().requires_grad_()
    with ft.autocast(recipe=recipe):
        y = layer(x)
    y.backward(torch.linspace(-1, 1, y.numel()).view_as(y))
    return y, x.grad, layer.weight.grad, layer.bias.grad


def test_fp8_weight_gives_the_bits_of_casting_it():
    plain, fp8 = _pair()
    x = torch.randn(20, 32)
    got, want = _run(fp8, x, CurrentScaling()), _run(plain, x, CurrentScaling())
    for g, w in zip(got, want):
        assert type(g) is torch.Tensor and torch.equal(g, w)


def test_fp8_weight_slot_records_nothing():
    _, fp8 = _pair()
    _run(fp8, torch.randn(20, 32), DelayedScaling())
    history = fp8.fp8_state.amax_history
    assert history[0, 0] > 0 and history[2, 0] > 0  # input and grad_output recorded
    assert not history[1].any()                    # the weight's owner records it


def test_fp8_weight_without_grad():
    plain, fp8 = _pair()
    x = torch.randn(5, 32)
    with torch.no_grad(), ft.autocast(recipe=CurrentScaling()):
        assert torch.equal(fp8(x), plain(x))


def test_malformed_fp8_weights_are_refused():
    _, fp8 = _pair()
    e5m2 = ft.Float8CurrentScalingQuantizer("e5m2", True, True)
    fp8.weight = torch.nn.Parameter(e5m2(torch.randn(48, 32)))
    with pytest.raises(TypeError, match="rowwise data is torch.float8_e5m2 but the recipe's "
                                        "forward format is torch.float8_e4m3fn"):
        _run(fp8, torch.randn(4, 32), CurrentScaling())

    state = ext.LinearState(CurrentScaling(), "cpu")
    w = torch.randn(48, 32, requires_grad=True)
    x = torch.randn(4, 32, requires_grad=True)
    data, columnwise, scale_inv = ft.quantize(w.detach(), 2.0, "e4m3", True, True)
    with pytest.raises(ValueError, match="the FP8 weight has no columnwise data, which this "
                                         "call's GEMMs read on cpu"):
        ext.linear_forward(state, x, w, None, False, (data, None, scale_inv))
    with pytest.raises(ValueError, match=r"columnwise data has shape \[48, 32\] but a weight "
                                         r"of shape \[48, 32\] needs \[32, 48\]"):
        ext.linear_forward(state, x, w, None, False, (data, data, scale_inv))
    with pytest.raises(TypeError, match=r"pass \(data, columnwise_data, scale_inv\)"):
        ext.linear_forward(state, x, w, None, False, (data, columnwise))
    with pytest.raises(ValueError, match="scale_inv has shape"):
        ext.linear_forward(state, x, w, None, False, (data, columnwise, torch.ones(2)))
    # Without gradients the dgrad copy is not read, and need not be there.
    with torch.no_grad():
        y = ext.linear_forward(state, x, w, None, False, (data, None, scale_inv))
    assert y.shape == (4, 48)
