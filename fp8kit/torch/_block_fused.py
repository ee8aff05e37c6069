"""The normalization and the activation of fp8kit.torch.LayerNormLinear and
LayerNormMLP under BlockScaling.

A block-scaled cast takes one scale per 1x128 tile, which the fused
kernels' per-tensor cast cannot give. So under BlockScaling the layers run
the core's norm and activation kernels without their cast
(torch.ops.fp8kit.norm_forward_values, activation_forward_values and
activation_backward_values; the norm's backward is the fused layers' own,
norm_backward), and the block-scaled Linear that reads each output
(_block_linear) casts it per block. Outputs are in the input's dtype. The
kernels and their bits are the same as the per-tensor layers' and
fp8kit.jax's: the float32 math of fp8kit/normalization.h and activation.h.
"""

from __future__ import annotations

import torch

_ops = torch.ops.fp8kit


class _NormFunction(torch.autograd.Function):
    """y = norm(x) on [rows, hidden] x."""

    @staticmethod
    def forward(ctx, x, gamma, beta, normalization, eps):
        y, mean, rsigma = _ops.norm_forward_values(x, gamma, beta, normalization, eps)
        ctx.cfg = normalization, eps
        ctx.save_for_backward(x, gamma, mean if normalization == "LayerNorm" else None, rsigma)
        return y

    @staticmethod
    def backward(ctx, dy):
        normalization, eps = ctx.cfg
        x, gamma, mean, rsigma = ctx.saved_tensors
        dx, dgamma, dbeta = _ops.norm_backward(dy.contiguous(), x, mean, rsigma, gamma,
                                               normalization, eps)
        return dx, dgamma, dbeta if mean is not None else None, None, None


class _ActivationFunction(torch.autograd.Function):
    """a = act(h): GELU (tanh) on h [rows, F], or SwiGLU on h = [gate | up]."""

    @staticmethod
    def forward(ctx, h, activation):
        ctx.activation = activation
        ctx.save_for_backward(h)
        return _ops.activation_forward_values(h, activation)

    @staticmethod
    def backward(ctx, d_a):
        (h,) = ctx.saved_tensors
        return _ops.activation_backward_values(d_a.contiguous(), h, ctx.activation), None


def block_norm(x: torch.Tensor, gamma: torch.Tensor, beta, normalization: str,
               eps: float) -> torch.Tensor:
    """normalization ("LayerNorm" or "RMSNorm") of x [rows, hidden] in x's
    dtype; beta None for RMSNorm."""
    return _NormFunction.apply(x, gamma, beta, normalization, eps)


def block_activation(h: torch.Tensor, activation: str) -> torch.Tensor:
    """activation ("gelu" or "swiglu") of h [rows, F or 2F] in h's dtype."""
    return _ActivationFunction.apply(h, activation)
