"""The fused layers' steps (normalization, activation, slot casts, GEMM)
twice: as the extension's pybind11 calls (EAGER) and as the dispatcher ops
torch.ops.fp8kit.* that torch.compile and torch.export trace (TRACED).

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


class EAGER:
    """The pybind11 calls (one C++ call per step, no dispatcher)."""
    norm_forward = staticmethod(ext.norm_forward)
    norm_backward = staticmethod(ext.norm_backward)
    activation_forward = staticmethod(ext.activation_forward)
    activation_backward = staticmethod(ext.activation_backward)
    quantize_slot = staticmethod(ext.quantize_slot)
    gemm = staticmethod(ext.gemm)


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


def _quantize_slot(st, x, slot, record, rowwise, columnwise, sums_dtype):
    data, cw, scale_inv, sums = _ops.quantize_slot(x, *st.tensors, *st.recipe, slot, record,
                                                 rowwise, columnwise, sums_dtype)
    return (*_cast(data, cw, scale_inv, rowwise, columnwise),
            sums if sums_dtype is not None else None)


def _gemm(a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, trans_a, trans_b,
          out_dtype, bias, gelu, gelu_aux, accumulate, use_split_accumulator, d_scale, d_amax,
          out):
    # ext.gemm's arguments; the layers use none of those the op lacks.
    assert gelu_aux is None and not accumulate and d_amax is None and out is None
    return _ops.gemm(a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, trans_a,
                     trans_b, out_dtype, bias, gelu, use_split_accumulator, d_scale)


class TRACED:
    """The dispatcher ops, with the bindings' arguments and results."""
    norm_forward = staticmethod(_norm_forward)
    norm_backward = staticmethod(_norm_backward)
    activation_forward = staticmethod(_activation_forward)
    activation_backward = staticmethod(_activation_backward)
    quantize_slot = staticmethod(_quantize_slot)
    gemm = staticmethod(_gemm)
