"""Fake (meta) kernels of the dispatcher ops torch.ops.fp8kit.* (defined in
C++, torch_ext/dispatcher_ops.cc; the functional ops, the Linear's two steps,
the fused layers' steps; cast_statistics, torch_ext/cast_statistics.cc): each
gives its op's output shapes, dtypes and devices without computing anything,
so that the ops trace under FakeTensorMode and torch.compile. They follow
the C++ kernels' rules: a layout not asked for is an empty [0] tensor of the
FP8 dtype, scales and amaxes are float32 [1], and every output is on the
input's device.
tests/torch/test_torch_dispatcher_ops.py checks them against the real kernels
with torch.library.opcheck.
"""

from __future__ import annotations

import torch

from fp8kit.torch._checks import TORCH_FP8
from fp8kit.torch._ext import ext  # also defines the torch.ops.fp8kit library
from fp8kit.torch._plan import plan

# The floats of one quantization's scalars block (scale, scale_inv and amax
# at 16-byte aligned offsets), a view of whose scale_inv every cast returns,
# and where scale_inv sits in it: the extension's own constants.
_SCALARS = int(ext.SCALARS_LEN)
_SCALE_INV = int(ext.SCALARS_SCALE_INV)


def columnwise_shape(shape):
    """ext.columnwise_shape for symbolic sizes too: (shape[-1],
    prod(shape[:-1])), (1, 1) for a 0-d tensor."""
    if len(shape) == 0:
        return (1, 1)
    leading = 1
    for s in shape[:-1]:
        leading = leading * s
    return (shape[-1], leading)


def _f32_scalar(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((1,), dtype=torch.float32)


def _f32_empty(like: torch.Tensor, numel: int) -> torch.Tensor:
    return like.new_empty((numel,), dtype=torch.float32)


def _scale_inv(like: torch.Tensor) -> torch.Tensor:
    """A cast's scale_inv as the kernels return it: a float32 [1] view at
    offset _SCALE_INV into the cast's scalars block."""
    return _f32_empty(like, _SCALARS).narrow(0, _SCALE_INV, 1)


def _fp8_layouts(x: torch.Tensor, fp8_dtype: torch.dtype, rowwise: bool, columnwise: bool):
    data = x.new_empty(x.shape if rowwise else (0,), dtype=fp8_dtype)
    columnwise_data = x.new_empty(columnwise_shape(x.shape) if columnwise else (0,),
                                  dtype=fp8_dtype)
    return data, columnwise_data


@torch.library.register_fake("fp8kit::amax")
def _amax(x):
    return x.new_empty((), dtype=torch.float32)


@torch.library.register_fake("fp8kit::quantize")
def _quantize(x, scale, fp8_dtype, rowwise, columnwise):
    data, columnwise_data = _fp8_layouts(x, fp8_dtype, rowwise, columnwise)
    return data, columnwise_data, _f32_scalar(x), _f32_scalar(x)


@torch.library.register_fake("fp8kit::quantize_current_scaling")
def _quantize_current_scaling(x, fp8_dtype, rowwise, columnwise, amax_epsilon=0.0,
                              power_2_scale=False):
    data, columnwise_data = _fp8_layouts(x, fp8_dtype, rowwise, columnwise)
    return data, columnwise_data, _f32_scalar(x), _f32_scalar(x), _f32_scalar(x)


def dequantized(data, out_dtype, from_columnwise, shape):
    """A dequantize op's output: the logical shape (data's; from columnwise
    data, `shape`, by default the 2-D transpose) in out_dtype."""
    if not from_columnwise:
        logical = data.shape
    elif shape is not None:
        logical = shape
    else:
        logical = (data.shape[1], data.shape[0])
    return data.new_empty(logical, dtype=out_dtype)


@torch.library.register_fake("fp8kit::dequantize")
def _dequantize(data, scale_inv, out_dtype, from_columnwise=False, shape=None):
    return dequantized(data, out_dtype, from_columnwise, shape)


@torch.library.register_fake("fp8kit::columnwise_from_rowwise")
def _columnwise_from_rowwise(data):
    return data.new_empty(columnwise_shape(data.shape))


@torch.library.register_fake("fp8kit::cast_statistics")
def _cast_statistics(x, data, scale_inv, scaling_mode="per_tensor", from_columnwise=False):
    # (amax, underflow, saturated, error_sq, norm_sq): 0-d, the counts int64.
    def scalar(dtype):
        return x.new_empty((), dtype=dtype)

    f32, i64 = torch.float32, torch.int64
    return scalar(f32), scalar(i64), scalar(i64), scalar(f32), scalar(f32)


@torch.library.register_fake("fp8kit::delayed_scaling_update")
def _delayed_scaling_update(amax_histories, amaxes, scales, scale_invs, fp8_dtypes, margin=0,
                            amax_reduction="max"):
    return None


def _operand_rows_cols(x, x_columnwise):
    """The logical 2-D [rows, cols] of a GEMM operand from either layout."""
    if x is not None:
        cols, rows = columnwise_shape(x.shape)
        return rows, cols
    return x_columnwise.shape[1], x_columnwise.shape[0]


def gemm_output(a, a_columnwise, b, b_columnwise, trans_a, trans_b, out_dtype):
    """A GEMM op's output D [m, n] = op(a) @ op(b), each operand given by
    either layout, in out_dtype on a's device."""
    a_rows, a_cols = _operand_rows_cols(a, a_columnwise)
    b_rows, b_cols = _operand_rows_cols(b, b_columnwise)
    m = a_cols if trans_a else a_rows
    n = b_rows if trans_b else b_cols
    like = a if a is not None else a_columnwise
    return like.new_empty((m, n), dtype=out_dtype)


@torch.library.register_fake("fp8kit::gemm")
def _gemm(a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, trans_a, trans_b,
          out_dtype, bias=None, gelu=False, use_split_accumulator=True, d_scale=None):
    return gemm_output(a, a_columnwise, b, b_columnwise, trans_a, trans_b, out_dtype)


def _linear_plan(input, weight, dgrad, wgrad):
    """The core's plan for a call, its token count symbolic or not."""
    n, k = weight.shape
    return plan(input.numel() // k, k, n, dgrad, wgrad,
                ext.supports_non_tn_fp8_gemm(input.device))


def _kept(like, copies, shape, fp8_dtype):
    """The copy of a tensor of `shape` that (rowwise, columnwise) `copies`
    names, or the empty stand-in."""
    rowwise, columnwise = copies
    if rowwise:
        return like.new_empty(shape, dtype=fp8_dtype)
    if columnwise:
        return like.new_empty(columnwise_shape(shape), dtype=fp8_dtype)
    return like.new_empty((0,), dtype=fp8_dtype)


@torch.library.register_fake("fp8kit::linear_forward")
def _linear_forward(input, weight, bias, amax_history, amax, scale, scale_inv, counters, seeded,
                    scaling, forward_dtype, backward_dtype, margin, amax_reduction,
                    amax_epsilon, power_2_scale, fast_accumulation, dgrad, wgrad, bgrad):
    out = input.new_empty((*input.shape[:-1], weight.shape[0]))
    fp8 = TORCH_FP8[forward_dtype]
    if not (dgrad or wgrad or (bgrad and bias is not None)):
        empty_fp8, empty_f32 = input.new_empty((0,), dtype=fp8), _f32_empty(input, 0)
        return out, empty_fp8, empty_f32, empty_fp8, empty_f32
    p = _linear_plan(input, weight, dgrad, wgrad)
    return (out, _kept(input, p.saved_input, input.shape, fp8), _scale_inv(input),
            _kept(input, p.saved_weight, weight.shape, fp8), _scale_inv(input))


@torch.library.register_fake("fp8kit::linear_backward")
def _linear_backward(grad_output, input_fp8, input_scale_inv, weight_fp8, weight_scale_inv,
                     amax_history, amax, scale, scale_inv, counters, seeded, scaling,
                     forward_dtype, backward_dtype, margin, amax_reduction, amax_epsilon,
                     power_2_scale, input_shape, forward_dgrad, forward_wgrad, dgrad, wgrad,
                     bgrad, weight_dtype=None):
    n, k = grad_output.shape[-1], input_shape[-1]
    grad = (lambda wanted, shape, dtype=None: grad_output.new_empty(shape if wanted else (0,),
                                                                    dtype=dtype))
    return (grad(dgrad, input_shape), grad(wgrad, (n, k), weight_dtype),
            grad(bgrad, (n,)))


# ----------------------------------------------------- the fused layers' steps
def _cast_outputs(like, forward_dtype, backward_dtype, slot, shape, rowwise, columnwise):
    """A slot cast's (data, columnwise_data, scale_inv): the slot's format
    (GRAD_OUTPUT, slot 2, the backward one); scale_inv a view at offset
    _SCALE_INV into a scalars block, as the kernels return it."""
    fp8 = TORCH_FP8[backward_dtype if slot == 2 else forward_dtype]
    data = like.new_empty(shape if rowwise else (0,), dtype=fp8)
    cw = like.new_empty(columnwise_shape(shape) if columnwise else (0,), dtype=fp8)
    return data, cw, _scale_inv(like)


def _sums(like, cols, sums_dtype):
    if sums_dtype is None:
        return like.new_empty((0,), dtype=torch.float32)
    return like.new_empty((cols,), dtype=sums_dtype)


@torch.library.register_fake("fp8kit::norm_forward")
def _norm_forward(x, gamma, beta, normalization, epsilon, amax_history, amax, scale, scale_inv,
                  counters, seeded, scaling, forward_dtype, backward_dtype, margin, amax_reduction,
                  amax_epsilon, power_2_scale, slot, record, rowwise, columnwise):
    rows = x.numel() // x.shape[-1]
    mean = _f32_empty(x, rows if normalization == "LayerNorm" else 0)
    return (*_cast_outputs(x, forward_dtype, backward_dtype, slot, x.shape, rowwise, columnwise),
            mean, _f32_empty(x, rows))


@torch.library.register_fake("fp8kit::norm_backward")
def _norm_backward(dy, x, mean, rsigma, gamma, normalization, epsilon):
    hidden = x.shape[-1]
    dbeta = gamma.new_empty((hidden if normalization == "LayerNorm" else 0,))
    return x.new_empty(x.shape), gamma.new_empty((hidden,)), dbeta


def _activation_output_shape(h, activation):
    """a = act(h): SwiGLU halves the last dimension ([gate | up] -> F)."""
    last = h.shape[-1] // 2 if activation == "swiglu" else h.shape[-1]
    return (*h.shape[:-1], last)


@torch.library.register_fake("fp8kit::activation_forward")
def _activation_forward(h, activation, amax_history, amax, scale, scale_inv, counters, seeded,
                        scaling, forward_dtype, backward_dtype, margin, amax_reduction,
                        amax_epsilon, power_2_scale, slot, record, rowwise, columnwise):
    return _cast_outputs(h, forward_dtype, backward_dtype, slot,
                         _activation_output_shape(h, activation), rowwise, columnwise)


@torch.library.register_fake("fp8kit::norm_forward_values")
def _norm_forward_values(x, gamma, beta, normalization, epsilon):
    rows = x.numel() // x.shape[-1]
    mean = _f32_empty(x, rows if normalization == "LayerNorm" else 0)
    return x.new_empty(x.shape), mean, _f32_empty(x, rows)


@torch.library.register_fake("fp8kit::activation_forward_values")
def _activation_forward_values(h, activation):
    return h.new_empty(_activation_output_shape(h, activation))


@torch.library.register_fake("fp8kit::activation_backward_values")
def _activation_backward_values(d_a, h, activation):
    return h.new_empty(h.shape)


@torch.library.register_fake("fp8kit::activation_backward")
def _activation_backward(d_a, h, activation, amax_history, amax, scale, scale_inv, counters,
                         seeded, scaling, forward_dtype, backward_dtype, margin, amax_reduction,
                         amax_epsilon, power_2_scale, slot, record, rowwise, columnwise,
                         sums_dtype, want_dh):
    dh = h.new_empty(h.shape if want_dh else (0,))
    return (*_cast_outputs(h, forward_dtype, backward_dtype, slot, h.shape, rowwise, columnwise),
            _sums(h, h.shape[-1], sums_dtype), dh)


@torch.library.register_fake("fp8kit::quantize_slot")
def _quantize_slot(x, amax_history, amax, scale, scale_inv, counters, seeded, scaling,
                   forward_dtype, backward_dtype, margin, amax_reduction, amax_epsilon,
                   power_2_scale, slot, record, rowwise, columnwise, sums_dtype):
    return (*_cast_outputs(x, forward_dtype, backward_dtype, slot, x.shape, rowwise, columnwise),
            _sums(x, x.shape[-1], sums_dtype))


@torch.library.register_fake("fp8kit::linear_forward_cast_input")
def _linear_forward_cast_input(input_fp8, input_scale_inv, weight, bias, amax_history, amax,
                               scale, scale_inv, counters, seeded, scaling, forward_dtype,
                               backward_dtype, margin, amax_reduction, amax_epsilon,
                               power_2_scale, fast_accumulation, record, dgrad, wgrad,
                               out_dtype=None):
    out = weight.new_empty((input_fp8.shape[0], weight.shape[0]), dtype=out_dtype or weight.dtype)
    fp8 = TORCH_FP8[forward_dtype]
    if not record:
        return out, weight.new_empty((0,), dtype=fp8), _f32_empty(weight, 0)
    p = _linear_plan(input_fp8, weight, dgrad, wgrad)
    kept = _kept(weight, p.saved_weight, weight.shape, fp8)
    return out, kept, _scale_inv(weight)


@torch.library.register_fake("fp8kit::linear_backward_cast_grad")
def _linear_backward_cast_grad(grad_output_fp8, grad_output_columnwise, grad_output_scale_inv,
                               input_fp8, input_scale_inv, weight_fp8, weight_scale_inv,
                               amax_history, amax, scale, scale_inv, counters, seeded, scaling,
                               forward_dtype, backward_dtype, margin, amax_reduction,
                               amax_epsilon, power_2_scale, input_shape, out_features, dtype,
                               forward_dgrad, forward_wgrad, dgrad, wgrad, weight_dtype=None):
    k = input_shape[-1]
    grad = (lambda wanted, shape, dt=dtype: amax_history.new_empty(shape if wanted else (0,),
                                                                   dtype=dt))
    return grad(dgrad, input_shape), grad(wgrad, (out_features, k), weight_dtype or dtype)
