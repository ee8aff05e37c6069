"""fp8kit.torch.Linear with a weight that is already FP8: the Float8Tensor
that an FSDP2 FP8 all-gather builds (fp8kit.torch.distributed.fsdp).

The C++ forward takes the FP8 copies of such a weight instead of casting it
(torch_ext/linear_autograd.h, FP8Weight) and a plain stand-in tensor as
`weight`, which gives the call the weight's shape, dtype and autograd edge:
the weight gradient reaches the Float8Tensor parameter as a plain
high-precision tensor, which FSDP2 reduce-scatters. The weight's scaling
slot records nothing here: whoever cast the weight owns its scale.
untraceable(layer) is the error every layer gives such a weight while
torch.compile or torch.export traces.
"""

from __future__ import annotations

import torch

from fp8kit.torch._ext import ext

_linear_forward = ext.linear_forward


def stand_in(weight: torch.Tensor) -> torch.Tensor:
    """A plain tensor with an FP8 weight's shape, dtype and device (one
    element, expanded: the C++ forward never reads its values)."""
    return torch.empty((), dtype=weight.dtype, device=weight.device).expand(weight.shape)


class _WeightStandIn(torch.autograd.Function):
    """stand_in(weight), whose gradient goes straight to the weight."""

    @staticmethod
    def forward(ctx, weight):
        return stand_in(weight)

    @staticmethod
    def backward(ctx, grad):
        return grad


def untraceable(layer: str) -> NotImplementedError:
    """The error of fp8kit.torch.<layer> given a Float8Tensor weight while
    torch.compile or torch.export traces: the layers' dispatcher ops take
    high-precision weights."""
    return NotImplementedError(
        f"fp8kit.torch.{layer}: a Float8Tensor weight (FSDP2's FP8 all-gather, "
        "fp8kit.torch.distributed.enable_fp8_all_gather) does not trace under torch.compile "
        "or torch.export; all-gather the weights in high precision (leave "
        "enable_fp8_all_gather out) to compile the layer, or keep it out of the compiled "
        "region (torch.compiler.disable)")


def linear_with_fp8_weight(states, recipe, input, weight, bias, cache_weight: bool,
                           inspect=None):
    """y = input @ weight.T + bias in FP8 with a Float8Tensor `weight`
    (2-D, in the recipe's forward format), the layer's `states`
    (RecipeStates) giving the input's and the gradient's scaling; inspect:
    the layer's recorder at a logged step of fp8kit.torch.inspect (the
    input's and the gradient's casts report, the weight had none here)."""
    if torch.compiler.is_compiling():
        raise untraceable("Linear")
    state, fast = states.select(recipe, weight, cache_weight)
    # The dgrad GEMM reads the weight's columnwise copy on devices whose FP8
    # GEMMs take the TN layout only: the weight's own, or a transpose of its
    # FP8 bits (exact), which backward keeps and frees.
    columnwise = None
    if not state.non_tn and torch.is_grad_enabled():
        columnwise = weight.columnwise_data
    data = weight.rowwise_data
    stand_in = _WeightStandIn.apply(weight)
    statistics = None if inspect is None else inspect.linear_statistics(
        "", input.numel() // weight.shape[1], weight)
    return _linear_forward(state, input, stand_in, bias, fast,
                           (data, columnwise, weight.scale_inv), statistics)
