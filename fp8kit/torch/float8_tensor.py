"""Float8Tensor: a tensor quantized to FP8 with one per-tensor scale.

Holds rowwise data (the tensor's shape), optionally the columnwise
(transposed) copy [shape[-1], prod(shape[:-1])] that TN-only FP8 GEMMs read,
scale_inv (x ~= q * scale_inv), the FP8 format and the quantizer that made
it (used to re-quantize in place). Its nominal dtype, shape and device are
those of the high-precision tensor it stands for.

Created by fp8kit's C++ quantizers in one call (quantizer(x)), or here.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext
from fp8kit.torch.quantized_tensor import QuantizedTensor

aten = torch.ops.aten


class _Dequantize(torch.autograd.Function):
    """Float8Tensor -> high precision, passing the gradient straight through."""

    @staticmethod
    def forward(ctx, t, dtype):
        return t._dequantize_raw(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


_columnwise_shape = ext.columnwise_shape  # (shape[-1], prod(shape[:-1]))


def _transpose_2d(q: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[rows, cols] FP8 data (any shape with that 2-D view) transposed, contiguous."""
    return q.view(torch.uint8).reshape(rows, cols).t().contiguous().view(q.dtype)


class Float8Tensor(QuantizedTensor):
    """FP8 data with a per-tensor scale, standing for a high-precision tensor.

    Float8Tensor(data, scale_inv, *, dtype, columnwise_data=None, quantizer=None,
                 requires_grad=False, shape=None)

    data: torch.float8_e4m3fn / torch.float8_e5m2 tensor of the logical shape,
    or None when only `columnwise_data` is held (then `shape` gives the
    logical shape; default: the 2-D transpose of `columnwise_data`).
    columnwise_data: the [shape[-1], prod(shape[:-1])] copy or None.
    scale_inv: float32 tensor with one element. dtype: the nominal
    high-precision dtype.
    """

    # Attributes holding the quantized state, in the order the C++ builder
    # (torch_ext/py_float8_tensor.cc) sets them.
    _FIELDS = ("_data", "_columnwise_data", "_scale_inv", "_fp8_dtype", "_quantizer")
    _OP_TABLE = {}

    def __new__(cls, data: Optional[torch.Tensor], scale_inv: torch.Tensor, *,
                dtype: torch.dtype = torch.float32,
                columnwise_data: Optional[torch.Tensor] = None,
                quantizer=None, requires_grad: bool = False, shape=None):
        fn = "fp8kit.torch.Float8Tensor"
        if data is None and columnwise_data is None:
            raise ValueError(f"{fn}: data and columnwise_data are both None; pass at least one")
        ref = data if data is not None else columnwise_data
        for name, t in (("data", data), ("columnwise_data", columnwise_data)):
            if t is None:
                continue
            _checks.tensor(fn, name, t)
            if t.dtype not in _checks.FP8_NAME:
                raise TypeError(f"{fn}: {name} has dtype {t.dtype}; expected torch.float8_e4m3fn "
                                "or torch.float8_e5m2")
            if t.dtype != ref.dtype:
                raise TypeError(f"{fn}: data is {data.dtype} but columnwise_data is "
                                f"{columnwise_data.dtype}")
            if t.device != ref.device:
                raise ValueError(f"{fn}: data is on {data.device} but columnwise_data is on "
                                 f"{columnwise_data.device}; keep both on one device")
        _checks.tensor(fn, "scale_inv", scale_inv)
        if scale_inv.dtype != torch.float32 or scale_inv.numel() != 1:
            raise TypeError(f"{fn}: scale_inv must be a float32 tensor with one element, got "
                            f"{scale_inv.dtype} of shape {tuple(scale_inv.shape)}")
        if scale_inv.device != ref.device:
            raise ValueError(f"{fn}: scale_inv is on {scale_inv.device} but the data is on "
                             f"{ref.device}; move it with scale_inv.to(data.device)")
        if dtype not in _checks.HIGH_PRECISION:
            raise TypeError(f"{fn}: dtype is {dtype}; the nominal dtype must be torch.float32, "
                            "torch.bfloat16 or torch.float16")
        if shape is None:
            shape = tuple(data.shape) if data is not None else (columnwise_data.shape[1],
                                                                columnwise_data.shape[0])
        shape = tuple(int(s) for s in shape)
        if data is not None and tuple(data.shape) != shape:
            raise ValueError(f"{fn}: shape {shape} differs from data's shape {tuple(data.shape)}")
        if (columnwise_data is not None
                and tuple(columnwise_data.shape) != _columnwise_shape(shape)):
            raise ValueError(f"{fn}: columnwise_data has shape {tuple(columnwise_data.shape)} but "
                             f"a tensor of shape {shape} has the columnwise layout "
                             f"{_columnwise_shape(shape)}")
        return cls._make(shape, dtype, ref.device, data, columnwise_data, scale_inv,
                         _checks.FP8_NAME[ref.dtype], quantizer, requires_grad)

    @classmethod
    def _make(cls, shape, dtype, device, data, columnwise_data, scale_inv, fp8_dtype, quantizer,
              requires_grad=False):
        """Unchecked constructor: every Python creation path ends here."""
        obj = QuantizedTensor._new_wrapper(cls, shape, dtype, device, requires_grad)
        obj._data = data
        obj._columnwise_data = columnwise_data
        obj._scale_inv = scale_inv
        obj._fp8_dtype = fp8_dtype
        obj._quantizer = quantizer
        return obj

    def _make_like(self, **changes) -> "Float8Tensor":
        """A new Float8Tensor with this one's fields except `changes`."""
        f = dict(shape=self._shape, dtype=self._dtype, device=self._device, data=self._data,
                 columnwise_data=self._columnwise_data, scale_inv=self._scale_inv,
                 fp8_dtype=self._fp8_dtype, quantizer=self._quantizer, requires_grad=False)
        f.update(changes)
        return Float8Tensor._make(**f)

    # ------------------------------------------------------------ accessors
    @property
    def fp8_dtype(self) -> str:
        """'e4m3' or 'e5m2'."""
        return self._fp8_dtype

    @property
    def quantizer(self):
        return self._quantizer

    @property
    def rowwise_data(self) -> Optional[torch.Tensor]:
        return self._data

    @property
    def columnwise_data(self) -> Optional[torch.Tensor]:
        return self._columnwise_data

    @property
    def scale_inv(self) -> torch.Tensor:
        return self._scale_inv

    def _dequantize_raw(self, dtype) -> torch.Tensor:
        if self._data is not None:
            return ext.dequantize(self._data, self._scale_inv, dtype, False, None)
        return ext.dequantize(self._columnwise_data, self._scale_inv, dtype, True,
                              list(self._shape))

    def dequantize(self, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The high-precision tensor q * scale_inv (nominal dtype by default).
        Differentiable: the gradient passes straight through."""
        if dtype is None:
            dtype = self._dtype
        if self._requires_grad and torch.is_grad_enabled():
            return _Dequantize.apply(self, dtype)
        return self._dequantize_raw(dtype)

    def update_usage(self, rowwise: Optional[bool] = None,
                     columnwise: Optional[bool] = None) -> None:
        """Makes the rowwise and/or columnwise copy present (transposing the
        other one) or drops it."""
        cols, rows = _columnwise_shape(self._shape)
        if rowwise and self._data is None:
            self._data = _transpose_2d(self._columnwise_data, cols, rows).view(self._shape)
        if columnwise and self._columnwise_data is None:
            self._columnwise_data = _transpose_2d(self._data, rows, cols)
        if rowwise is False and columnwise is not False and self._columnwise_data is not None:
            self._data = None
        if columnwise is False and rowwise is not False and self._data is not None:
            self._columnwise_data = None
        if self._data is None and self._columnwise_data is None:
            raise ValueError("Float8Tensor.update_usage: cannot drop both layouts")

    def _requantize_from(self, src: torch.Tensor) -> None:
        q = self._quantizer
        if q is None:  # keep this tensor's scale
            q = ext.Float8Quantizer(torch.reciprocal(self._scale_inv), self._fp8_dtype)
        if src.dtype not in _checks.HIGH_PRECISION:
            src = src.to(self._dtype)
        if tuple(src.shape) != tuple(self._shape):
            src = src.expand(self._shape)
        q.update_quantized(src, self)

    # ---------------------------------------------- pickling, copying, repr
    def __reduce_ex__(self, protocol):
        # FP8 buffers travel as uint8: plain pickle cannot rebuild float8
        # storages (torch.save can, but both paths should work).
        as_bytes = (lambda t: None if t is None else t.view(torch.uint8))
        return (_rebuild_float8_tensor,
                (as_bytes(self._data), as_bytes(self._columnwise_data), self._scale_inv,
                 self._fp8_dtype, self._dtype, tuple(self._shape), self._requires_grad,
                 self._quantizer))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        c = (lambda t: None if t is None else t.clone())
        new = self._make_like(data=c(self._data), columnwise_data=c(self._columnwise_data),
                              scale_inv=self._scale_inv.clone(),
                              quantizer=copy.deepcopy(self._quantizer, memo),
                              requires_grad=self._requires_grad)
        memo[id(self)] = new
        return new

    def __repr__(self, *, tensor_contents=None):
        layouts = "+".join(n for n, t in (("rowwise", self._data),
                                          ("columnwise", self._columnwise_data))
                          if t is not None)
        return (f"Float8Tensor(fp8_dtype={self._fp8_dtype}, shape={tuple(self._shape)}, "
                f"dtype={self._dtype}, device={self._device}, layouts={layouts}, "
                f"scale_inv={float(self._scale_inv.reshape(()))}, "
                f"values={self._dequantize_raw(torch.float32)})")

    # torch.compile traces through tensor subclasses that can flatten.
    def __tensor_flatten__(self):
        inner = [n for n in ("_data", "_columnwise_data", "_scale_inv")
                 if getattr(self, n) is not None]
        return inner, (self._fp8_dtype, self._dtype, tuple(self._shape), self._quantizer)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        fp8_dtype, dtype, shape, quantizer = meta
        ref = inner.get("_data", inner.get("_columnwise_data"))
        return Float8Tensor._make(shape, dtype, ref.device, inner.get("_data"),
                                  inner.get("_columnwise_data"), inner["_scale_inv"], fp8_dtype,
                                  quantizer)


def _rebuild_float8_tensor(data, columnwise_data, scale_inv, fp8_dtype, dtype, shape,
                           requires_grad, quantizer):
    """Unpickles a Float8Tensor (see Float8Tensor.__reduce_ex__)."""
    if fp8_dtype not in _checks.TORCH_FP8:
        raise ValueError(f"Float8Tensor pickle: unknown fp8 dtype {fp8_dtype!r}")
    as_fp8 = (lambda t: None if t is None else t.view(_checks.TORCH_FP8[fp8_dtype]))
    data, columnwise_data = as_fp8(data), as_fp8(columnwise_data)
    ref = data if data is not None else columnwise_data
    return Float8Tensor._make(shape, dtype, ref.device, data, columnwise_data, scale_inv, fp8_dtype,
                              quantizer, requires_grad)


# ------------------------------------------------------------------ op table
def implements(*ops):
    def register(handler):
        for op in ops:
            Float8Tensor._OP_TABLE[op] = handler
        return handler
    return register


def _clone_or_none(t):
    return None if t is None else t.clone()


@implements(aten.detach.default, aten.alias.default)
def _detach(func, args, kwargs):
    return args[0]._make_like()


@implements(aten.clone.default)
def _clone(func, args, kwargs):
    t = args[0]
    return t._make_like(data=_clone_or_none(t._data),
                        columnwise_data=_clone_or_none(t._columnwise_data),
                        scale_inv=t._scale_inv.clone())


def _resolve_shape(size, numel):
    size = [int(s) for s in size]
    if -1 in size:
        known = 1
        for s in size:
            if s != -1:
                known *= s
        size[size.index(-1)] = numel // known if known else 0
    return tuple(size)


@implements(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, args, kwargs):
    t, size = args[0], args[1]
    shape = _resolve_shape(size, math.prod(t._shape))
    cw = _columnwise_shape(shape)
    same_columnwise = cw == _columnwise_shape(t._shape)
    if t._data is None:
        if not same_columnwise:
            return NotImplemented
        return t._make_like(shape=torch.Size(shape))
    data = t._data.view(shape)
    columnwise_data = t._columnwise_data
    if columnwise_data is not None and not same_columnwise:
        columnwise_data = _transpose_2d(data, cw[1], cw[0])
    return t._make_like(shape=torch.Size(shape), data=data, columnwise_data=columnwise_data)


@implements(aten.t.default, aten.transpose.int)
def _transpose_op(func, args, kwargs):
    # For a 2-D tensor the columnwise copy is the transpose's rowwise data
    # and the other way round: swap them.
    t = args[0]
    if t.dim() != 2:
        return NotImplemented
    if func is aten.transpose.int and {args[1] % 2, args[2] % 2} != {0, 1}:
        return NotImplemented
    m, n = t._shape
    data, columnwise_data = t._data, t._columnwise_data
    if columnwise_data is None:
        columnwise_data = _transpose_2d(data, m, n)
    if data is None:
        data = _transpose_2d(columnwise_data, n, m)
    return t._make_like(shape=torch.Size((n, m)), data=columnwise_data, columnwise_data=data)


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
    mv = (lambda x: None if x is None else x.to(device, non_blocking=non_blocking, copy=True))
    q = t._quantizer
    if q is not None and device != t._device:
        q = q.to(device)
    return t._make_like(device=device, data=mv(t._data), columnwise_data=mv(t._columnwise_data),
                        scale_inv=mv(t._scale_inv), quantizer=q)


@implements(aten.copy_.default)
def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, Float8Tensor):  # plain destination: copy the values
        dst.copy_(src.dequantize())
        return dst
    if (isinstance(src, Float8Tensor) and src._fp8_dtype == dst._fp8_dtype
            and src._shape == dst._shape):
        # Same format and shape: copy the bits.
        cols, rows = _columnwise_shape(dst._shape)
        if dst._data is not None:
            s = src._data
            if s is None:
                s = _transpose_2d(src._columnwise_data, cols, rows)
            dst._data.copy_(s.view(dst._data.shape))
        if dst._columnwise_data is not None:
            s = src._columnwise_data
            if s is None:
                s = _transpose_2d(src._data, rows, cols)
            dst._columnwise_data.copy_(s)
        dst._scale_inv.copy_(src._scale_inv.reshape(dst._scale_inv.shape))
        return dst
    hp = src.dequantize() if isinstance(src, QuantizedTensor) else src
    dst._requantize_from(hp.to(device=dst._device))
    return dst


@implements(aten.is_same_size.default)
def _is_same_size(func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)


@implements(aten.dequantize.self)
def _dequantize_op(func, args, kwargs):
    return args[0]._dequantize_raw(args[0]._dtype)
