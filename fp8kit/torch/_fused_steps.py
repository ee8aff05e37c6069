"""The fused layers' steps (normalization, activation, and the Linear's
forward and backward around them) twice: as the extension's pybind11
calls (EAGER) and as the dispatcher ops torch.ops.fp8kit.* that
torch.compile and torch.export trace (TRACED).

The GEMM steps are fp8kit.torch.Linear's own, in C++ (one protocol:
which copies are kept, the bias epilogue, the token padding of wgrad, the
bias gradient), on an input that the normalization or activation kernel
has already cast into the GEMM's input slot:

    linear_forward_cast_input  weight cast (or an FP8 weight's copies),
                               forward GEMM; returns (y, the weight copy
                               the plan keeps, its scale_inv)
    linear_backward            dy's cast and column sums, dgrad, wgrad
    linear_backward_cast_grad  dgrad and wgrad on a dy the activation
                               backward has already cast

LayerNormLinear and LayerNormMLP pick one table per call (TRACED while
dynamo or export traces) and run every step through it, so their forward
and backward are written once. Both tables take the same arguments and
return the same values; they differ in the scaling state they take:

* EAGER: an ext.LinearState;
* TRACED: a TracedState (fp8kit.torch._traced_linear), the state's tensors
  and recipe arguments, which the ops update in place as the schemas say.

Both run the same C++ functions (torch_ext/fused_ops.h), so a compiled
layer computes the same bits as an eager one.
"""

from __future__ import annotations

import torch

from fp8kit.torch._ext import ext

_ops = torch.ops.fp8kit
# The slots of a LinearState (fp8kit_linear_slot) the fused kernels cast
# into, as the core numbers them.
INPUT, GRAD_OUTPUT = ext.SLOT_INPUT, ext.SLOT_GRAD_OUTPUT


class EAGER:
    """The pybind11 calls (one C++ call per step, no dispatcher)."""
    norm_forward = staticmethod(ext.norm_forward)
    norm_backward = staticmethod(ext.norm_backward)
    activation_forward = staticmethod(ext.activation_forward)
    activation_backward = staticmethod(ext.activation_backward)
    linear_forward_cast_input = staticmethod(ext.linear_forward_cast_input)
    linear_backward = staticmethod(ext.linear_backward)
    linear_backward_cast_grad = staticmethod(ext.linear_backward_cast_grad)


def _cast(data, columnwise_data, scale_inv, rowwise, columnwise):
    """An op's cast outputs as the binding returns them: (data or None,
    columnwise_data or None, scale_inv)."""
    return data if rowwise else None, columnwise_data if columnwise else None, scale_inv


# want_y and want_a (the high-precision outputs beside the casts) serve
# fp8kit.torch.inspect, which runs eagerly only: these two ops have neither.


def _norm_forward(x, gamma, beta, normalization, eps, st, slot, record, rowwise, columnwise,
                  want_y=False):
    assert not want_y
    data, cw, scale_inv, mean, rsigma = _ops.norm_forward(
        x, gamma, beta, normalization, eps, *st.tensors, *st.recipe, slot, record, rowwise,
        columnwise)
    return (*_cast(data, cw, scale_inv, rowwise, columnwise),
            mean if normalization == "LayerNorm" else None, rsigma, None)


def _norm_backward(dy, x, mean, rsigma, gamma, normalization, eps):
    dx, dgamma, dbeta = _ops.norm_backward(dy, x, mean, rsigma, gamma, normalization, eps)
    return dx, dgamma, dbeta if normalization == "LayerNorm" else None


def _activation_forward(h, activation, st, slot, record, rowwise, columnwise, want_a=False):
    assert not want_a
    data, cw, scale_inv = _ops.activation_forward(h, activation, *st.tensors, *st.recipe, slot,
                                                record, rowwise, columnwise)
    return (*_cast(data, cw, scale_inv, rowwise, columnwise), None)


def _activation_backward(d_a, h, activation, st, slot, record, rowwise, columnwise, sums_dtype,
                         want_dh):
    data, cw, scale_inv, sums, dh = _ops.activation_backward(
        d_a, h, activation, *st.tensors, *st.recipe, slot, record, rowwise, columnwise,
        sums_dtype, want_dh)
    return (*_cast(data, cw, scale_inv, rowwise, columnwise),
            sums if sums_dtype is not None else None, dh if want_dh else None)


def _tensor(t, like):
    """t, or for None (a copy the plan does not keep) an empty stand-in."""
    return t if t is not None else like.new_empty((0,))


def _linear_forward_cast_input(st, name, x_data, x_scale_inv, weight, fp8_weight, bias, fast,
                               record, dgrad, wgrad, statistics=None, input_values=None,
                               out_dtype=None):
    # Traced layers take high-precision weights and are never inspected.
    assert fp8_weight is None and statistics is None
    return _ops.linear_forward_cast_input(x_data, x_scale_inv, weight, bias, *st.tensors,
                                          *st.recipe, fast, record, dgrad, wgrad, out_dtype)


def _linear_backward(st, dy, x_q, x_scale_inv, w_q, w_scale_inv, input_shape, forward_dgrad,
                     forward_wgrad, dgrad, wgrad, bgrad, statistics=None, weight_dtype=None):
    assert statistics is None
    dx, dw, db = _ops.linear_backward(
        dy, _tensor(x_q, dy), _tensor(x_scale_inv, dy), _tensor(w_q, dy),
        _tensor(w_scale_inv, dy), *st.tensors, *st.recipe, input_shape, forward_dgrad,
        forward_wgrad, dgrad, wgrad, bgrad, weight_dtype)
    return dx if dgrad else None, dw if wgrad else None, db if bgrad else None


def _linear_backward_cast_grad(st, dy_data, dy_columnwise, dy_scale_inv, x_q, x_scale_inv, w_q,
                               w_scale_inv, input_shape, out_features, dtype, forward_dgrad,
                               forward_wgrad, dgrad, wgrad, statistics=None,
                               grad_output_values=None, weight_dtype=None):
    assert statistics is None
    like = dy_scale_inv
    dx, dw = _ops.linear_backward_cast_grad(
        _tensor(dy_data, like), _tensor(dy_columnwise, like), dy_scale_inv, _tensor(x_q, like),
        _tensor(x_scale_inv, like), _tensor(w_q, like), _tensor(w_scale_inv, like), *st.tensors,
        *st.recipe, input_shape, out_features, dtype, forward_dgrad, forward_wgrad, dgrad, wgrad,
        weight_dtype)
    return dx if dgrad else None, dw if wgrad else None


class TRACED:
    """The dispatcher ops, with the bindings' arguments and results."""
    norm_forward = staticmethod(_norm_forward)
    norm_backward = staticmethod(_norm_backward)
    activation_forward = staticmethod(_activation_forward)
    activation_backward = staticmethod(_activation_backward)
    linear_forward_cast_input = staticmethod(_linear_forward_cast_input)
    linear_backward = staticmethod(_linear_backward)
    linear_backward_cast_grad = staticmethod(_linear_backward_cast_grad)
