"""Float8Tensor's op table: what aten ops do when a Float8Tensor is an
argument (QuantizedTensor.__torch_dispatch__ looks them up here). Importing
this module registers them; fp8kit/torch/__init__.py does (float8_tensor
cannot: this module imports it).

* Views: every view op makes a view that owns no buffers (the module note in
  float8_tensor says why); detach and alias too.
* Copies: clone, _to_copy (a new tensor owning its buffers), copy_.
* Writes: each op that may write into a Float8Tensor is listed below by name
  (every overload of it), and runs on the dequantized tensor before the result
  is re-quantized into every copy (run_and_requantize). An op that writes into
  a Float8Tensor and is not listed raises (QuantizedTensor.__torch_dispatch__).
* Everything else reads: it runs on the dequantized values, giving a plain
  tensor.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from fp8kit.torch import _checks
from fp8kit.torch.float8_tensor import Float8Tensor, _columnwise_shape, _transpose_2d, replay
from fp8kit.torch.quantized_tensor import (ANY_VIEW, QuantizedTensor, _written_args,
                                           op_table_decorator, run_and_requantize)

aten = torch.ops.aten


implements = op_table_decorator(Float8Tensor)


# ------------------------------------------------------------------ views
# Identity views: the result views the same values through the same steps.
_IDENTITY = frozenset({aten.detach.default, aten.alias.default})


@implements(ANY_VIEW, aten.detach.default, aten.alias.default, aten._unsafe_view.default)
def _view(func, args, kwargs):
    t, rest = args[0], tuple(args[1:])
    if any(isinstance(a, torch.Tensor) for a in tree_flatten((rest, kwargs))[0]):
        raise NotImplementedError(
            f"Float8Tensor: no rule for the view op {func} with tensor arguments; use "
            "t.dequantize() and view that")
    owner = t._root()
    step = () if func in _IDENTITY else ((func, rest, dict(kwargs), None),)
    steps = t._steps + step
    meta = replay(steps, torch.empty(owner._shape, dtype=owner._dtype, device="meta"))
    outs = [meta] if isinstance(meta, torch.Tensor) else list(meta)
    for m in outs:
        if m.dtype != owner._dtype:
            raise TypeError(
                f"Float8Tensor: {func} would reinterpret a {owner._dtype} tensor as {m.dtype}; "
                "view t.dequantize() instead, or the FP8 bits (t.rowwise_data)")
    if isinstance(meta, torch.Tensor):
        return Float8Tensor._make_view(owner, steps, meta)
    return [Float8Tensor._make_view(owner, t._steps + ((func, rest, dict(kwargs), i),), m)
            for i, m in enumerate(outs)]


# ----------------------------------------------------------------- copies
@implements(aten.clone.default)
def _clone(func, args, kwargs):
    t = args[0]
    root = t._root()
    data, cw = t._owned_copies()
    return Float8Tensor._make(t._shape, t._dtype, t._device, data, cw, root._scale_inv.clone(),
                              t._fp8_dtype, root._quantizer)


@implements(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    t = args[0]
    dtype = kwargs.get("dtype")
    device = kwargs.get("device")
    non_blocking = kwargs.get("non_blocking", False)
    device = t._device if device is None else torch.device(device)
    if dtype is not None and dtype != t._dtype:
        hp = t._dequantize_raw(dtype if dtype in _checks.HIGH_PRECISION else torch.float32)
        return hp.to(device=device, dtype=dtype, non_blocking=non_blocking)
    root = t._root()
    data, cw = (root._data, root._columnwise_data) if t is root else t._owned_copies()
    mv = (lambda x: None if x is None else x.to(device, non_blocking=non_blocking, copy=True))
    q = root._quantizer
    if q is not None and device != t._device:
        q = q.to(device)
    return Float8Tensor._make(t._shape, t._dtype, device, mv(data), mv(cw),
                              mv(root._scale_inv), t._fp8_dtype, q)


def _layouts_of(src: Float8Tensor, rowwise: bool, columnwise: bool):
    """src's FP8 data in the layouts asked for (None for one not asked for):
    aliases of its buffers where they have the layout, else transposed copies."""
    cols, rows = _columnwise_shape(src._shape)
    data = cw = None
    if rowwise:
        data = src.rowwise_data
        if data is None:
            data = _transpose_2d(src._columnwise_data, cols, rows)
    if columnwise:
        cw = src.columnwise_data
        if cw is None:
            cw = _transpose_2d(src._data, rows, cols)
    return data, cw


@implements(aten.copy_.default)
def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, Float8Tensor):  # plain destination: copy the values
        dst.copy_(src.dequantize())
        return dst
    # A tensor owning its buffers, or a view of all of one (detach, .data,
    # nn.Parameter): the tensor whose buffers dst is.
    target = None if dst._steps else dst._root()
    if (isinstance(src, Float8Tensor) and target is not None
            and src._root() is not target and src._fp8_dtype == dst._fp8_dtype
            and src._shape == dst._shape):
        # Same format and shape: copy the bits (a checkpoint loads into a
        # parameter exactly).
        data, cw = _layouts_of(src, target._data is not None,
                               target._columnwise_data is not None)
        if data is not None:
            target._data.copy_(data.view(target._data.shape))
        if cw is not None:
            target._columnwise_data.copy_(cw)
        target._scale_inv.copy_(src.scale_inv.reshape(target._scale_inv.shape))
        return dst
    hp = src.dequantize() if isinstance(src, QuantizedTensor) else src
    dst._requantize_from(hp.to(device=dst._device))
    return dst


# ------------------------------------------------------------------ reads
def _is_same_size(func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)


def _dequantize_op(func, args, kwargs):
    return args[0]._dequantize_raw(args[0]._dtype)


# ----------------------------------------------------------------- writes
# In-place ops whose result has the tensor's own shape (every overload).
_ELEMENTWISE_ = (
    "abs_", "add_", "addcdiv_", "addcmul_", "ceil_", "clamp_", "clamp_max_", "clamp_min_",
    "clip_", "copysign_", "cos_", "div_", "elu_", "erfinv_", "exp_", "expm1_", "floor_",
    "fmod_", "frac_", "gelu_", "hardsigmoid_", "hardswish_", "hardtanh_", "leaky_relu_",
    "lerp_", "log_", "log1p_", "logit_", "mish_", "mul_", "nan_to_num_", "neg_", "pow_",
    "reciprocal_", "relu_", "remainder_", "round_", "rsqrt_", "selu_", "sgn_", "sigmoid_",
    "sign_", "silu_", "sin_", "sqrt_", "square_", "sub_", "tanh_", "threshold_", "trunc_",
    "xlogy_",
)
# Random fills (torch.nn.init).
_RANDOM_ = ("bernoulli_", "cauchy_", "exponential_", "geometric_", "log_normal_", "normal_",
            "random_", "uniform_")
# Fills and indexed writes: t[i] = v and t[mask] = v (index_put_; slices and
# selects write through a view with fill_ / copy_), scatter, masked fills.
_INDEXED_ = ("fill_", "zero_", "fill_diagonal_", "masked_fill_", "masked_scatter_",
             "index_put_", "_index_put_impl_", "index_fill_", "index_copy_", "index_add_",
             "index_reduce_", "put_", "scatter_", "scatter_add_", "scatter_reduce_", "tril_",
             "triu_")
# List ops writing their first list in place: what torch.optim's foreach
# paths (SGD, Adam, AdamW, ...) and swa_utils run over parameters.
_FOREACH_ = (
    "_foreach_abs_", "_foreach_add_", "_foreach_addcdiv_", "_foreach_addcmul_",
    "_foreach_clamp_max_", "_foreach_clamp_min_", "_foreach_copy_", "_foreach_div_",
    "_foreach_exp_", "_foreach_lerp_", "_foreach_maximum_", "_foreach_minimum_",
    "_foreach_mul_", "_foreach_neg_", "_foreach_pow_", "_foreach_reciprocal_",
    "_foreach_rsqrt_", "_foreach_sign_", "_foreach_sqrt_", "_foreach_sub_", "_foreach_zero_",
)
# torch.optim's fused steps (fused=True) write params, grads and state lists.
_FUSED_ = ("_fused_adam_", "_fused_adamw_", "_fused_sgd_")

IN_PLACE = _ELEMENTWISE_ + _RANDOM_ + _INDEXED_ + _FOREACH_ + _FUSED_


def _writing_overloads(name: str) -> list:
    packet = getattr(aten, name)
    ops = (getattr(packet, o) for o in packet.overloads())
    return [op for op in ops if _written_args(op)]


def register_shared_ops(implements_in_table) -> None:
    """Registers, through `implements_in_table` (a subclass's `implements`),
    what every fp8kit quantized tensor does alike: the reads is_same_size and
    dequantize, and run_and_requantize for every overload of each IN_PLACE op
    and of its out= form."""
    implements_in_table(aten.is_same_size.default)(_is_same_size)
    implements_in_table(aten.dequantize.self)(_dequantize_op)
    for name in IN_PLACE:
        implements_in_table(*_writing_overloads(name))(run_and_requantize)
        # out= forms of the same op (add.out, _foreach_add.List_out, ...).
        functional = name[:-1]
        if hasattr(aten, functional):
            implements_in_table(*_writing_overloads(functional))(run_and_requantize)


register_shared_ops(implements)
