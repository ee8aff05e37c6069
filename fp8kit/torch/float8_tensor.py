"""Float8Tensor: a tensor quantized to FP8 with one per-tensor scale.

Holds rowwise data (the tensor's shape), optionally the columnwise
(transposed) copy [shape[-1], prod(shape[:-1])] that TN-only FP8 GEMMs read,
scale_inv (x ~= q * scale_inv), the FP8 format and the quantizer that made
it (used to re-quantize in place). Its nominal dtype, shape and device are
those of the high-precision tensor it stands for.

Created by fp8kit's C++ quantizers in one call (quantizer(x)), or here. The
op table (what views, copies and in-place ops do) is in float8_tensor_ops,
which registers it on Float8Tensor when imported. That module imports this
one, so the package's __init__ imports it (Python runs the package's
__init__ before any module of it).

Traceable: __tensor_flatten__ / __tensor_unflatten__ (a view included) let
torch.compile and torch.export take a Float8Tensor as a graph input, and
while it is traced (fake buffers, or dynamo / export running) dequantizing
and re-quantizing go through the dispatcher ops, which compute the same
bits as eager mode's pybind11 calls (fp8kit.torch._float8_tracing).

[Note] Views and writes
A Float8Tensor holds up to two copies of its values (rowwise, columnwise)
and one scale, and every write must keep them in step. So:

* A view (view, reshape, t, slicing, select, as_strided, unsqueeze, expand,
  split, detach, .data, nn.Parameter(t), ...) is a Float8Tensor that owns no
  buffers: it records the tensor that owns them (_owner, never itself a view)
  and the view ops leading from it (_steps). Reading a view reads the owner's
  current bits through those ops (an alias where one of the owner's copies
  already has the view's layout, e.g. the columnwise copy for t() of a 2-D
  tensor, else a copy), so a view never goes stale.
* A write runs the op on the dequantized tensor in its nominal dtype and
  re-quantizes the result into every copy the owner holds, with the owner's
  quantizer (its scaling rule; without one, its current scale). A write
  through a view does this on the owner: the op is applied to the same view of
  the owner's dequantized values, as it would be on a plain tensor.
* update_usage on a view changes the owner's copies (the layouts belong to
  the data, like a storage). Ops that change a tensor's own shape or strides in
  place (t_, resize_, set_, ...) and any in-place op not in the table raise.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from fp8kit.torch import _checks, _float8_tracing
from fp8kit.torch._ext import ext
from fp8kit.torch.quantized_tensor import QuantizedTensor

aten = torch.ops.aten


_columnwise_shape = ext.columnwise_shape  # (shape[-1], prod(shape[:-1]))


def _transpose_2d(q: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[rows, cols] FP8 data (any shape with that 2-D view) transposed,
    contiguous: the core's byte transpose (a strided copy reads one byte
    per access, 0.39 ms for an 8192 x 8192 weight on an H200)."""
    return torch.ops.fp8kit.columnwise_from_rowwise(q.reshape(rows, cols))


def replay(steps, x: torch.Tensor) -> torch.Tensor:
    """Applies a view's steps ((aten op, args after self, kwargs, output index
    or None), ...) to a plain tensor of its owner's shape."""
    for func, rest, kwargs, index in steps:
        x = func(x, *rest, **kwargs)
        if index is not None:
            x = x[index]
    return x


# View ops that address the storage itself (offsets and strides), not the
# input's geometry: replayed only on a contiguous tensor at offset 0, where the
# storage is the owner's logical layout.
_STORAGE_VIEWS = frozenset({aten.as_strided.default})


class Float8Tensor(QuantizedTensor):
    """FP8 data with a per-tensor scale, standing for a high-precision tensor.

    Float8Tensor(data, scale_inv, *, dtype, columnwise_data=None, quantizer=None,
                 requires_grad=False, shape=None)

    data: contiguous torch.float8_e4m3fn / torch.float8_e5m2 tensor of the
    logical shape, or None when only `columnwise_data` is held (then `shape`
    gives the logical shape; default: the 2-D transpose of `columnwise_data`).
    columnwise_data: the contiguous [shape[-1], prod(shape[:-1])] copy or None.
    scale_inv: float32 tensor with one element. dtype: the nominal
    high-precision dtype. Views and in-place ops: see the module's note.
    """

    # Attributes holding the quantized state, in the order the C++ builder
    # (torch_ext/py_float8_tensor.cc) sets them. A view sets the buffers and
    # the quantizer to None (they are its owner's).
    _FIELDS = ("_data", "_columnwise_data", "_scale_inv", "_fp8_dtype", "_quantizer")
    _OP_TABLE = {}
    # A view's owner and steps (see the module's note); None / () for a tensor
    # that owns its buffers, which is every tensor the C++ builder makes.
    _owner = None
    _steps = ()

    def __new__(cls, data: Optional[torch.Tensor], scale_inv: torch.Tensor, *,
                dtype: torch.dtype = torch.float32,
                columnwise_data: Optional[torch.Tensor] = None,
                quantizer=None, requires_grad: bool = False, shape=None):
        fn = "fp8kit.torch.Float8Tensor"
        ref = _checks.fp8_copies(fn, data, columnwise_data)
        _checks.tensor(fn, "scale_inv", scale_inv)
        if scale_inv.dtype != torch.float32 or scale_inv.numel() != 1:
            raise TypeError(f"{fn}: scale_inv must be a float32 tensor with one element, got "
                            f"{scale_inv.dtype} of shape {tuple(scale_inv.shape)}")
        if scale_inv.device != ref.device:
            raise ValueError(f"{fn}: scale_inv is on {scale_inv.device} but the data is on "
                             f"{ref.device}; move it with scale_inv.to(data.device)")
        shape = _checks.quantized_shape(fn, dtype, shape, data, columnwise_data,
                                        _columnwise_shape)
        return cls._make(shape, dtype, ref.device, data, columnwise_data, scale_inv,
                         _checks.FP8_NAME[ref.dtype], quantizer, requires_grad)

    @classmethod
    def _make(cls, shape, dtype, device, data, columnwise_data, scale_inv, fp8_dtype, quantizer,
              requires_grad=False):
        """Unchecked constructor of a tensor that owns its buffers."""
        return cls._new_with_fields(shape, dtype, device, requires_grad, data, columnwise_data,
                                    scale_inv, fp8_dtype, quantizer)

    @classmethod
    def _make_view(cls, owner: "Float8Tensor", steps: tuple, meta: torch.Tensor):
        """A view of `owner` through `steps`; `meta` is those steps replayed on
        a meta tensor of the owner's shape (the view's geometry)."""
        obj = QuantizedTensor._new_wrapper(cls, meta.shape, owner._dtype, owner._device, False,
                                           strides=meta.stride(),
                                           storage_offset=meta.storage_offset())
        obj._data = obj._columnwise_data = obj._scale_inv = obj._quantizer = None
        obj._fp8_dtype = owner._fp8_dtype
        obj._owner = owner
        obj._steps = steps
        return obj

    def _make_like(self, **changes) -> "Float8Tensor":
        """A new Float8Tensor owning this (owning) one's fields except `changes`."""
        f = dict(shape=self._shape, dtype=self._dtype, device=self._device, data=self._data,
                 columnwise_data=self._columnwise_data, scale_inv=self._scale_inv,
                 fp8_dtype=self._fp8_dtype, quantizer=self._quantizer, requires_grad=False)
        f.update(changes)
        return Float8Tensor._make(**f)

    def _root(self) -> "Float8Tensor":
        """The tensor owning the buffers: self, or the owner of a view."""
        return self if self._owner is None else self._owner

    # ------------------------------------------------------------ accessors
    @property
    def fp8_dtype(self) -> str:
        """'e4m3' or 'e5m2'."""
        return self._fp8_dtype

    @property
    def quantizer(self):
        return self._root()._quantizer

    @property
    def rowwise_data(self) -> Optional[torch.Tensor]:
        """The rowwise copy (None if not held). On a view: its values in the
        rowwise layout, an alias of the owner's buffer where it has that layout."""
        return self._data if self._owner is None else self._view_rowwise()

    @property
    def columnwise_data(self) -> Optional[torch.Tensor]:
        """The columnwise copy (None if not held). On a view: as rowwise_data."""
        return self._columnwise_data if self._owner is None else self._view_columnwise()

    @property
    def scale_inv(self) -> torch.Tensor:
        return self._root()._scale_inv

    # ------------------------------------------------------------- views
    def _rowwise_bytes(self) -> torch.Tensor:
        """This owning tensor's rowwise data as contiguous uint8 (a copy when
        only the columnwise copy is held)."""
        if self._data is not None:
            return self._data.view(torch.uint8)
        cols, rows = _columnwise_shape(self._shape)
        return _transpose_2d(self._columnwise_data, cols, rows).view(torch.uint8).view(self._shape)

    def _aliases(self, steps) -> list:
        """uint8 tensors of this owning tensor's shape that alias each of its
        buffers (the columnwise copy seen through a transpose)."""
        if any(s[0] in _STORAGE_VIEWS for s in steps):
            return [self._rowwise_bytes()]
        out = []
        if self._data is not None:
            out.append(self._data.view(torch.uint8))
        if self._columnwise_data is not None:
            out.append(self._columnwise_data.view(torch.uint8).t().view(self._shape))
        return out

    def _view_rowwise(self) -> torch.Tensor:
        owner, fp8 = self._owner, _checks.TORCH_FP8[self._fp8_dtype]
        for src in owner._aliases(self._steps):
            try:
                r = replay(self._steps, src)
            except (RuntimeError, ValueError):  # not a view of this buffer (fake: ValueError)
                continue
            if r.is_contiguous():
                return r.view(fp8)
        return replay(self._steps, owner._rowwise_bytes()).contiguous().view(fp8)

    def _view_columnwise(self) -> torch.Tensor:
        owner, fp8 = self._owner, _checks.TORCH_FP8[self._fp8_dtype]
        cols, rows = _columnwise_shape(self._shape)
        for src in owner._aliases(self._steps):
            try:
                c = replay(self._steps, src).view(rows, cols).t()
            except (RuntimeError, ValueError):  # not a view of this buffer (fake: ValueError)
                continue
            if c.is_contiguous():
                return c.view(fp8)
        return _transpose_2d(self._view_rowwise(), rows, cols)

    def _owned_copies(self):
        """(data, columnwise_data): new buffers with this tensor's values, in
        the layouts its owner holds (what clone, to() and pickling store)."""
        root = self._root()
        if self is root:
            c = (lambda t: None if t is None else t.clone())
            return c(self._data), c(self._columnwise_data)
        data = self._view_rowwise().clone() if root._data is not None else None
        cw = self._view_columnwise().clone() if root._columnwise_data is not None else None
        return data, cw

    # ------------------------------------------------------- dequantize
    def _dequantize_raw(self, dtype) -> torch.Tensor:
        """q * scale_inv in `dtype` (dequantize() is QuantizedTensor's)."""
        scale_inv = self._root()._scale_inv
        # Traced (compile, export, fake mode): the dispatcher op, same bits.
        dequantize = (_float8_tracing.dequantize if _float8_tracing.traced(scale_inv)
                      else ext.dequantize)
        if self._owner is not None:
            return dequantize(self._view_rowwise(), scale_inv, dtype, False, None)
        if self._data is not None:
            return dequantize(self._data, scale_inv, dtype, False, None)
        return dequantize(self._columnwise_data, scale_inv, dtype, True, list(self._shape))

    def update_usage(self, rowwise: Optional[bool] = None,
                     columnwise: Optional[bool] = None) -> None:
        """Makes the rowwise and/or columnwise copy present (transposing the
        other one) or drops it. On a view, changes the owner's copies."""
        if self._owner is not None:
            return self._owner.update_usage(rowwise, columnwise)
        if rowwise is False and columnwise is False:
            raise ValueError("Float8Tensor.update_usage: cannot drop both layouts")
        cols, rows = _columnwise_shape(self._shape)
        if rowwise and self._data is None:
            self._data = _transpose_2d(self._columnwise_data, cols, rows).view(self._shape)
        if columnwise and self._columnwise_data is None:
            self._columnwise_data = _transpose_2d(self._data, rows, cols)
        if rowwise is False and self._columnwise_data is not None:
            self._data = None
        if columnwise is False and self._data is not None:
            self._columnwise_data = None

    # ----------------------------------------------------------- writes
    def _requantize_from(self, src: torch.Tensor) -> None:
        """Writes quantize(src) into every copy this tensor's owner holds."""
        if self._owner is not None:
            owner = self._owner
            if not self._steps:  # detach, .data, nn.Parameter: the owner's values
                return owner._requantize_from(src)
            hp = owner._dequantize_raw(owner._dtype)
            replay(self._steps, hp).copy_(src)
            return owner._requantize_from(hp)
        q = self._quantizer
        src = self._requantize_source(src)
        if _float8_tracing.traced(self._scale_inv):
            return _float8_tracing.requantize(self, q, src)
        if q is None:  # keep this tensor's scale
            q = ext.Float8Quantizer(torch.reciprocal(self._scale_inv), self._fp8_dtype)
        q.update_quantized(src, self)

    # ---------------------------------------------- pickling, copying, repr
    def __reduce_ex__(self, protocol):
        # FP8 buffers travel as uint8: plain pickle cannot rebuild float8
        # storages (torch.save can, but both paths should work). A view is
        # saved as a tensor of its own.
        root = self._root()
        data, cw = (root._data, root._columnwise_data) if self is root else self._owned_copies()
        as_bytes = (lambda t: None if t is None else t.view(torch.uint8))
        return (_rebuild_float8_tensor,
                (as_bytes(data), as_bytes(cw), root._scale_inv, self._fp8_dtype, self._dtype,
                 tuple(self._shape), self._requires_grad, root._quantizer))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        root = self._root()
        data, cw = self._owned_copies()
        new = Float8Tensor._make(self._shape, self._dtype, self._device, data, cw,
                                 root._scale_inv.clone(), self._fp8_dtype,
                                 copy.deepcopy(root._quantizer, memo), self._requires_grad)
        memo[id(self)] = new
        return new

    def __repr__(self, *, tensor_contents=None):
        root = self._root()
        layouts = "+".join(n for n, t in (("rowwise", root._data),
                                          ("columnwise", root._columnwise_data))
                          if t is not None)
        view = "" if self is root else f", view of shape {tuple(root._shape)}"
        head = (f"Float8Tensor(fp8_dtype={self._fp8_dtype}, shape={tuple(self._shape)}, "
                f"dtype={self._dtype}, device={self._device}, layouts={layouts}{view}")
        if _float8_tracing.traced(root._scale_inv):  # no values to read while tracing
            return head + ", traced)"
        return (f"{head}, scale_inv={float(root._scale_inv.reshape(()))}, "
                f"values={self._dequantize_raw(torch.float32)})")

    # torch.compile traces through tensor subclasses that can flatten. A view
    # flattens to its owner's buffers and its steps, and unflattens to a view
    # of a new owner over them.
    _FLAT_BUFFERS = ("_flat_data", "_flat_columnwise_data", "_flat_scale_inv")
    _flat_data = property(lambda self: self._root()._data)
    _flat_columnwise_data = property(lambda self: self._root()._columnwise_data)
    _flat_scale_inv = property(lambda self: self._root()._scale_inv)

    def __tensor_flatten__(self):
        root = self._root()
        inner = [n for n in self._FLAT_BUFFERS if getattr(self, n) is not None]
        return inner, (self._fp8_dtype, self._dtype, tuple(root._shape),
                       _QuantizerMeta(root._quantizer), self._steps)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        fp8_dtype, dtype, shape, quantizer, steps = meta
        quantizer = quantizer.quantizer
        ref = inner.get("_flat_data", inner.get("_flat_columnwise_data"))
        owner = Float8Tensor._make(shape, dtype, ref.device, inner.get("_flat_data"),
                                   inner.get("_flat_columnwise_data"), inner["_flat_scale_inv"],
                                   fp8_dtype, quantizer)
        if not steps:
            return owner
        view_meta = replay(steps, torch.empty(shape, dtype=dtype, device="meta"))
        return Float8Tensor._make_view(owner, steps, view_meta)

    @classmethod
    def __metadata_guard__(cls, saved, meta) -> bool:
        """Whether a compiled graph traced with flatten metadata `saved` (a
        deep copy) serves a tensor with `meta`: the same values but for the
        quantizer, whose configuration must match."""
        return (saved[:3] + saved[4:] == meta[:3] + meta[4:]
                and _quantizer_config(saved[3].quantizer) == _quantizer_config(meta[3].quantizer))


class _QuantizerMeta:
    """The quantizer in a Float8Tensor's flatten metadata, held in a plain
    Python object: torch's structured logging pretty-prints that metadata,
    and pprint looks each object's type's __repr__ up in a dict, which a
    pybind11 method (the quantizer's __repr__) cannot be a key of."""

    __slots__ = ("quantizer",)

    def __init__(self, quantizer):
        self.quantizer = quantizer

    def __repr__(self) -> str:
        return f"_QuantizerMeta({self.quantizer!r})"


def _quantizer_config(q) -> tuple:
    """What a quantizer's in-place re-quantization depends on, but for the
    state tensors a delayed-scaling one reads."""
    if q is None:
        return ()
    return (type(q), q.fp8_dtype, q.rowwise, q.columnwise, getattr(q, "amax_epsilon", None),
            getattr(q, "power_2_scale", None))


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
