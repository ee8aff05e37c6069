"""Float8BlockTensor: a tensor quantized to FP8 with one scale per block.

Block scaling (common/include/fp8kit/block_scaling.h) keeps one float32
scale_inv per 1x128 tile ("block_1x128": activations and gradients) or per
128x128 block ("block_128x128": weights) of each stored copy, so an outlier
costs precision only in its own block. A Float8BlockTensor holds the
rowwise copy (the tensor's shape) with its block scales, and/or the
columnwise copy [shape[-1], prod(shape[:-1])] with its own (the 1x128 tiles
of the columnwise copy run down the tensor's columns, so its scales are not
the rowwise copy's), the FP8 format, the scaling mode and the quantizer
that made it (Float8BlockQuantizer; used to re-quantize in place). Its
nominal dtype, shape and device are those of the high-precision tensor it
stands for; the cached properties are QuantizedTensor's.

Created by Float8BlockQuantizer in one C++ call (quantizer(x)), or here.

Ops (the op table at the end): detach and alias share the buffers (so
nn.Parameter(t) works and writes through either reach both); clone,
_to_copy and copy_ copy; the in-place ops fp8kit's Float8Tensor lists run
on the dequantized tensor and re-quantize into every copy; every other
op that only reads runs on the dequantized tensor. Other view ops
(reshape, slicing, t(), ...) raise: a view would have to cut through
blocks that share a scale. Use t.dequantize() and view that.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext
from fp8kit.torch.float8_tensor_ops import register_shared_ops
from fp8kit.torch.quantized_tensor import QuantizedTensor, op_table_decorator

aten = torch.ops.aten
SCALING_MODES = ("block_1x128", "block_128x128")
_columnwise_shape = ext.columnwise_shape  # (shape[-1], prod(shape[:-1]))
_scale_shape = ext.block_scale_inv_shape


class Float8BlockTensor(QuantizedTensor):
    """FP8 data with one scale per block, standing for a high-precision tensor.

    Float8BlockTensor(data, block_scale_inv, *, dtype, scaling_mode,
                      columnwise_data=None, columnwise_block_scale_inv=None,
                      quantizer=None, requires_grad=False, shape=None)

    data: contiguous torch.float8_e4m3fn / torch.float8_e5m2 tensor of the
    logical shape, or None when only the columnwise copy is held (then
    `shape` gives the logical shape; default: the 2-D transpose).
    block_scale_inv: its float32 scales, shape
    ext.block_scale_inv_shape(shape, scaling_mode) (None with data None).
    columnwise_data / columnwise_block_scale_inv: the columnwise copy and its
    scales, or None. scaling_mode: "block_1x128" or "block_128x128".
    dtype: the nominal high-precision dtype.
    """

    # Attributes holding the quantized state, in the order the C++ builder
    # (torch_ext/py_float8_block_tensor.cc) sets them.
    _FIELDS = ("_data", "_block_scale_inv", "_columnwise_data", "_columnwise_block_scale_inv",
               "_fp8_dtype", "_scaling_mode", "_quantizer")
    _OP_TABLE = {}

    def __new__(cls, data, block_scale_inv, *, dtype: torch.dtype, scaling_mode: str,
                columnwise_data=None, columnwise_block_scale_inv=None, quantizer=None,
                requires_grad: bool = False, shape=None):
        fn = "fp8kit.torch.Float8BlockTensor"
        if scaling_mode not in SCALING_MODES:
            raise ValueError(f"{fn}: scaling_mode is {scaling_mode!r}; use 'block_1x128' or "
                             "'block_128x128'")
        ref = _checks.fp8_copies(fn, data, columnwise_data)
        shape = _checks.quantized_shape(fn, dtype, shape, data, columnwise_data,
                                        _columnwise_shape)
        for name, d, s, cw in (("block_scale_inv", data, block_scale_inv, False),
                               ("columnwise_block_scale_inv", columnwise_data,
                                columnwise_block_scale_inv, True)):
            if d is None:
                if s is not None:
                    raise ValueError(f"{fn}: {name} is given but its copy is None")
                continue
            _checks.tensor(fn, name, s)
            want = _scale_shape(list(shape), scaling_mode, cw)
            if s.dtype != torch.float32 or tuple(s.shape) != want or not s.is_contiguous():
                raise ValueError(f"{fn}: {name} is {s.dtype} of shape {tuple(s.shape)}; a "
                                 f"{scaling_mode} tensor of shape {shape} has contiguous "
                                 f"float32 scales of shape {want} there")
            if s.device != ref.device:
                raise ValueError(f"{fn}: {name} is on {s.device} but the data is on "
                                 f"{ref.device}")
        return cls._make(shape, dtype, ref.device, data, block_scale_inv, columnwise_data,
                         columnwise_block_scale_inv, _checks.FP8_NAME[ref.dtype], scaling_mode,
                         quantizer, requires_grad)

    @classmethod
    def _make(cls, shape, dtype, device, data, block_scale_inv, columnwise_data,
              columnwise_block_scale_inv, fp8_dtype, scaling_mode, quantizer,
              requires_grad=False):
        """Unchecked constructor."""
        return cls._new_with_fields(shape, dtype, device, requires_grad, data, block_scale_inv,
                                    columnwise_data, columnwise_block_scale_inv, fp8_dtype,
                                    scaling_mode, quantizer)

    def _fields(self, **changes) -> dict:
        f = dict(shape=self._shape, dtype=self._dtype, device=self._device, data=self._data,
                 block_scale_inv=self._block_scale_inv, columnwise_data=self._columnwise_data,
                 columnwise_block_scale_inv=self._columnwise_block_scale_inv,
                 fp8_dtype=self._fp8_dtype, scaling_mode=self._scaling_mode,
                 quantizer=self._quantizer)
        f.update(changes)
        return f

    def _map_buffers(self, fn) -> dict:
        """The four buffer fields with fn applied to each one held."""
        names = ("data", "block_scale_inv", "columnwise_data", "columnwise_block_scale_inv")
        return {n: None if getattr(self, "_" + n) is None else fn(getattr(self, "_" + n))
                for n in names}

    # ------------------------------------------------------------ accessors
    @property
    def fp8_dtype(self) -> str:
        """'e4m3' or 'e5m2'."""
        return self._fp8_dtype

    @property
    def scaling_mode(self) -> str:
        """'block_1x128' or 'block_128x128'."""
        return self._scaling_mode

    @property
    def quantizer(self):
        return self._quantizer

    @property
    def rowwise_data(self) -> Optional[torch.Tensor]:
        return self._data

    @property
    def block_scale_inv(self) -> Optional[torch.Tensor]:
        return self._block_scale_inv

    @property
    def columnwise_data(self) -> Optional[torch.Tensor]:
        return self._columnwise_data

    @property
    def columnwise_block_scale_inv(self) -> Optional[torch.Tensor]:
        return self._columnwise_block_scale_inv

    # ------------------------------------------------------- dequantize
    def _dequantize_raw(self, dtype) -> torch.Tensor:
        """Each element times its block's scale_inv, in `dtype` (dequantize()
        is QuantizedTensor's)."""
        if self._data is not None:
            return ext.dequantize_block(self._data, self._block_scale_inv, self._scaling_mode,
                                        dtype, False, None)
        return ext.dequantize_block(self._columnwise_data, self._columnwise_block_scale_inv,
                                    self._scaling_mode, dtype, True, list(self._shape))

    # ----------------------------------------------------------- writes
    def _requantize_from(self, src: torch.Tensor) -> None:
        """Writes quantize(src) into every copy this tensor holds, with its
        quantizer (without one: this tensor's format and mode, power-of-two
        scales as BlockScaling's default)."""
        q = self._quantizer
        if q is None:
            q = ext.Float8BlockQuantizer(self._fp8_dtype, self._scaling_mode)
        q.update_quantized(self._requantize_source(src), self)

    # ---------------------------------------------- pickling, copying, repr
    def __reduce_ex__(self, protocol):
        # FP8 buffers travel as uint8 (plain pickle cannot rebuild float8
        # storages).
        as_bytes = (lambda t: None if t is None else t.view(torch.uint8))
        return (_rebuild_float8_block_tensor,
                (as_bytes(self._data), self._block_scale_inv, as_bytes(self._columnwise_data),
                 self._columnwise_block_scale_inv, self._fp8_dtype, self._scaling_mode,
                 self._dtype, tuple(self._shape), self._requires_grad, self._quantizer))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = Float8BlockTensor._make(**self._fields(
            **self._map_buffers(torch.clone), quantizer=copy.deepcopy(self._quantizer, memo)),
            requires_grad=self._requires_grad)
        memo[id(self)] = new
        return new

    def __repr__(self, *, tensor_contents=None):
        layouts = "+".join(n for n, t in (("rowwise", self._data),
                                          ("columnwise", self._columnwise_data))
                          if t is not None)
        return (f"Float8BlockTensor(fp8_dtype={self._fp8_dtype}, "
                f"scaling_mode={self._scaling_mode}, shape={tuple(self._shape)}, "
                f"dtype={self._dtype}, device={self._device}, layouts={layouts}, "
                f"values={self._dequantize_raw(torch.float32)})")

    # torch.compile traces through tensor subclasses that can flatten.
    def __tensor_flatten__(self):
        inner = [n for n in ("_data", "_block_scale_inv", "_columnwise_data",
                             "_columnwise_block_scale_inv") if getattr(self, n) is not None]
        return inner, (self._fp8_dtype, self._scaling_mode, self._dtype, tuple(self._shape),
                       self._quantizer)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        fp8_dtype, scaling_mode, dtype, shape, quantizer = meta
        ref = inner.get("_data", inner.get("_columnwise_data"))
        return Float8BlockTensor._make(shape, dtype, ref.device, inner.get("_data"),
                                       inner.get("_block_scale_inv"),
                                       inner.get("_columnwise_data"),
                                       inner.get("_columnwise_block_scale_inv"), fp8_dtype,
                                       scaling_mode, quantizer)


def _rebuild_float8_block_tensor(data, block_scale_inv, columnwise_data,
                                 columnwise_block_scale_inv, fp8_dtype, scaling_mode, dtype,
                                 shape, requires_grad, quantizer):
    """Unpickles a Float8BlockTensor (see Float8BlockTensor.__reduce_ex__),
    with the constructor's checks."""
    if fp8_dtype not in _checks.TORCH_FP8:
        raise ValueError(f"Float8BlockTensor pickle: unknown fp8 dtype {fp8_dtype!r}")
    as_fp8 = (lambda t: None if t is None else t.view(_checks.TORCH_FP8[fp8_dtype]))
    return Float8BlockTensor(as_fp8(data), block_scale_inv, dtype=dtype,
                             scaling_mode=scaling_mode, columnwise_data=as_fp8(columnwise_data),
                             columnwise_block_scale_inv=columnwise_block_scale_inv,
                             quantizer=quantizer, requires_grad=requires_grad, shape=shape)


# ------------------------------------------------------------- the op table
_implements = op_table_decorator(Float8BlockTensor)


@_implements(aten.detach.default, aten.alias.default)
def _identity_view(func, args, kwargs):
    # The same buffers: a write through either one re-quantizes into both.
    return Float8BlockTensor._make(**args[0]._fields())


@_implements(aten.clone.default)
def _clone(func, args, kwargs):
    t = args[0]
    return Float8BlockTensor._make(**t._fields(**t._map_buffers(torch.clone)))


@_implements(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    t = args[0]
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    non_blocking = kwargs.get("non_blocking", False)
    device = t._device if device is None else torch.device(device)
    if dtype is not None and dtype != t._dtype:
        hp = t._dequantize_raw(dtype if dtype in _checks.HIGH_PRECISION else torch.float32)
        return hp.to(device=device, dtype=dtype, non_blocking=non_blocking)
    move = (lambda b: b.to(device, non_blocking=non_blocking, copy=True))
    return Float8BlockTensor._make(**t._fields(**t._map_buffers(move), device=device))


@_implements(aten.copy_.default)
def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, Float8BlockTensor):  # plain destination: copy the values
        dst.copy_(src.dequantize())
        return dst
    if (isinstance(src, Float8BlockTensor) and src is not dst
            and (src._fp8_dtype, src._scaling_mode, src._shape)
            == (dst._fp8_dtype, dst._scaling_mode, dst._shape)
            and all(getattr(src, n) is not None for n in ("_data", "_columnwise_data")
                    if getattr(dst, n) is not None)):
        # Same format, mode and shape, and every copy dst holds: copy the
        # bits (a checkpoint loads into a parameter exactly).
        for n in ("_data", "_block_scale_inv", "_columnwise_data", "_columnwise_block_scale_inv"):
            if getattr(dst, n) is not None:
                getattr(dst, n).copy_(getattr(src, n))
        return dst
    hp = src.dequantize() if isinstance(src, QuantizedTensor) else src
    dst._requantize_from(hp.to(device=dst._device))
    return dst


register_shared_ops(_implements)
