"""QuantizedTensor: the torch.Tensor wrapper subclass fp8kit's quantized
tensors derive from.

A QuantizedTensor has no storage of its own: it stands for a high-precision
tensor of a nominal dtype (bfloat16, say) and keeps its quantized buffers as
attributes. Two things make it behave:

* Cached properties. On a tensor subclass, PyTorch answers `t.dtype`,
  `t.shape`, `t.device`, `t.is_cuda` and `t.requires_grad` through
  __torch_function__, which costs microseconds. These five are cached in
  instance attributes (QuantizedTensor._CACHED) that every creation path
  sets (the C++ quantizers, Float8Tensor.__new__, dispatch results, detach,
  clone, deepcopy, unpickling, to()), that __torch_function__ refreshes
  after any torch call on the tensor (so autograd's later changes, e.g. a
  view getting requires_grad, show up), and that the requires_grad setter
  keeps in sync (PyTorch's setter runs first; the cache changes only if it
  succeeds).

* An op table. __torch_dispatch__ looks the aten op up in the subclass's
  _OP_TABLE ({aten op: handler}; a subclass may add rules, e.g. for views,
  in _handler). An op without an entry that writes into none of its quantized
  arguments runs on their dequantized values (a plain result). An op without
  an entry that writes into a quantized argument raises NotImplementedError:
  a write must never be dropped or land in one copy only, so every op that may
  write into a quantized tensor is listed, and its handler re-quantizes the
  result into every copy the tensor holds (run_and_requantize).

* `t.data = x` re-quantizes x into t (as `t.copy_(x)` under no_grad): the
  buffers that the subclass keeps as attributes are what t is, so PyTorch's
  own setter, which swaps the storage that no one reads, would lose x.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
from torch.utils._pytree import tree_map_only

# The dtypes a quantized tensor may stand for (its nominal dtype). Defined
# here, at the bottom of the package's layers: the argument checks
# (_checks) import this module to tell quantized tensors from plain ones.
HIGH_PRECISION = (torch.float32, torch.bfloat16, torch.float16)

# _OP_TABLE key of the handler for every view op (schema: returns an alias,
# writes nothing) that has no entry of its own.
ANY_VIEW = "any view op"

_TB = torch._C.TensorBase
_NATIVE_DTYPE = _TB.dtype
_NATIVE_SHAPE = _TB.shape
_NATIVE_DEVICE = _TB.device
_NATIVE_IS_CUDA = _TB.is_cuda
_NATIVE_REQUIRES_GRAD = _TB.requires_grad
_no_torch_function = torch._C.DisableTorchFunctionSubclass


class _Dequantize(torch.autograd.Function):
    """QuantizedTensor -> high precision, passing the gradient straight through."""

    @staticmethod
    def forward(ctx, t, dtype):
        return t._dequantize_raw(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class QuantizedTensor(torch.Tensor):
    """Base of fp8kit's quantized tensor subclasses (see the module doc)."""

    # Names of the cached properties' attributes, in the order the C++
    # builders (torch_ext/py_wrapper.cc) set them.
    _CACHED = ("_dtype", "_shape", "_device", "_is_cuda", "_requires_grad")
    # {aten OpOverload or ANY_VIEW: handler(func, args, kwargs)}; each
    # subclass has its own.
    _OP_TABLE: Dict[object, Callable] = {}

    # ------------------------------------------------------------ creation
    @staticmethod
    def _new_wrapper(cls, shape, dtype: torch.dtype, device: torch.device,
                     requires_grad: bool, strides=None, storage_offset=None):
        """An instance of cls with its cached properties set (contiguous
        strides unless given: a view reports the strides a plain view would)."""
        shape = torch.Size(shape)
        obj = torch.Tensor._make_wrapper_subclass(cls, shape, strides=strides,
                                                  storage_offset=storage_offset, dtype=dtype,
                                                  device=device, requires_grad=requires_grad)
        obj._set_cache(dtype, shape, device, requires_grad)
        return obj

    @classmethod
    def _new_with_fields(cls, shape, dtype: torch.dtype, device: torch.device,
                         requires_grad: bool, *values):
        """An instance of cls with its cached properties set and its _FIELDS
        set to `values`, in order (as the C++ builders do)."""
        obj = QuantizedTensor._new_wrapper(cls, shape, dtype, device, requires_grad)
        for name, value in zip(cls._FIELDS, values, strict=True):
            setattr(obj, name, value)
        return obj

    def _set_cache(self, dtype, shape, device, requires_grad):
        self._dtype = dtype
        self._shape = shape
        self._device = device
        self._is_cuda = device.type == "cuda"
        self._requires_grad = bool(requires_grad)

    def _refresh_cache(self):
        """Re-reads the cached properties from PyTorch's own state."""
        with _no_torch_function():
            self._set_cache(_NATIVE_DTYPE.__get__(self), _NATIVE_SHAPE.__get__(self),
                            _NATIVE_DEVICE.__get__(self), _NATIVE_REQUIRES_GRAD.__get__(self))

    # ---------------------------------------------------- cached properties
    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_cuda(self) -> bool:
        return self._is_cuda

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value) -> None:
        with _no_torch_function():
            _NATIVE_REQUIRES_GRAD.__set__(self, value)  # raises -> cache untouched
            self._requires_grad = _NATIVE_REQUIRES_GRAD.__get__(self)

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[dim]

    def dim(self) -> int:
        return len(self._shape)

    # -------------------------------------------------- subclass interface
    def _dequantize_raw(self, dtype: torch.dtype) -> torch.Tensor:  # pragma: no cover - abstract
        """The high-precision values in `dtype`, outside autograd."""
        raise NotImplementedError

    def _requantize_from(self, src: torch.Tensor) -> None:  # pragma: no cover - abstract
        """Writes quantize(src) into this tensor's buffers (in-place ops)."""
        raise NotImplementedError

    # ------------------------------------------------ dequantize, requantize
    def dequantize(self, *, dtype=None) -> torch.Tensor:
        """The high-precision tensor this one stands for, its FP8 values times
        their scale_inv, in `dtype` (the nominal dtype by default).
        Differentiable: the gradient passes straight through."""
        if dtype is None:
            dtype = self._dtype
        if self._requires_grad and torch.is_grad_enabled():
            return _Dequantize.apply(self, dtype)
        return self._dequantize_raw(dtype)

    def _requantize_source(self, src: torch.Tensor) -> torch.Tensor:
        """src as what _requantize_from quantizes: in a high-precision dtype
        (this tensor's nominal one when it is not) and broadcast to this
        tensor's shape."""
        if src.dtype not in HIGH_PRECISION:
            src = src.to(self._dtype)
        if tuple(src.shape) != tuple(self._shape):
            src = src.expand(self._shape)
        return src

    # ---------------------------------------------------------- torch hooks
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if func == _DATA_SETTER:
            return args[0]._assign_data(args[1])
        with _no_torch_function():
            out = func(*args, **kwargs)
        # Autograd, setters and in-place ops may have changed what is cached.
        _refresh_results(out)
        if args and isinstance(args[0], QuantizedTensor) and args[0] is not out:
            args[0]._refresh_cache()
        return out

    @classmethod
    def _handler(cls, func):
        """The op table's handler for `func` (its own, else the ANY_VIEW one
        for a view op), or None."""
        handler = cls._OP_TABLE.get(func)
        if handler is None and func.is_view:
            handler = cls._OP_TABLE.get(ANY_VIEW)
        return handler

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        handler = cls._handler(func)
        if handler is not None:
            out = handler(func, args, kwargs)
            if out is not NotImplemented:
                return out
        if func.is_view:
            raise NotImplementedError(
                f"fp8kit: {cls.__name__} has no rule for the view op {func}; writes through its "
                "result would not reach the tensor. Use t.dequantize() and view that")
        written = _quantized_written(func, args, kwargs)
        if written:
            raise NotImplementedError(
                f"fp8kit: {func} writes into a {type(written[0]).__name__}, and fp8kit has no "
                "rule that keeps its quantized copies right under this op. Run it on a "
                "high-precision tensor and copy the result in: hp = t.dequantize(); "
                "<op on hp>; t.copy_(hp)")
        return run_on_dequantized(func, args, kwargs)

    def _assign_data(self, value) -> None:
        """`self.data = value`: re-quantizes value into self's buffers."""
        name = type(self).__name__
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}.data = value: value must be a torch.Tensor, got "
                            f"{type(value).__name__}")
        if tuple(value.shape) != tuple(self._shape) or value.device != self._device:
            raise ValueError(
                f"{name}.data = value re-quantizes value into this tensor, so it needs its shape "
                f"{tuple(self._shape)} and device {self._device}; got {tuple(value.shape)} on "
                f"{value.device}. For another shape or device, make a new {name} "
                "(quantizer(value)) and put it where this one was")
        with torch.no_grad():
            self.copy_(value)


_DATA_SETTER = _TB.data.__set__


def op_table_decorator(cls):
    """`implements` for cls's op table: @implements(op, ...) above a
    handler(func, args, kwargs) registers it for each op."""
    def implements(*ops):
        def register(handler):
            for op in ops:
                cls._OP_TABLE[op] = handler
            return handler
        return register
    return implements


def _refresh_results(out) -> None:
    if isinstance(out, QuantizedTensor):
        out._refresh_cache()
    elif isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, QuantizedTensor):
                o._refresh_cache()


# Which arguments an op writes into: [(position, name, kwarg_only)].
_WRITES: Dict[object, list] = {}


def _written_args(func) -> list:
    w = _WRITES.get(func)
    if w is None:
        w = [(i, a.name, a.kwarg_only) for i, a in enumerate(func._schema.arguments)
             if a.alias_info is not None and a.alias_info.is_write]
        _WRITES[func] = w
    return w


def _arg(args, kwargs, pos, name, kwarg_only):
    if kwarg_only or pos >= len(args):
        return kwargs.get(name)
    return args[pos]


def _elements(v) -> list:
    """A written argument's tensors: Tensor(a!) or Tensor(a!)[] (foreach ops)."""
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _quantized_written(func, args, kwargs) -> list:
    """The quantized tensors `func` writes into."""
    return [t for pos, name, kw in _written_args(func)
            for t in _elements(_arg(args, kwargs, pos, name, kw))
            if isinstance(t, QuantizedTensor)]


def _dequantize(t: "QuantizedTensor") -> torch.Tensor:
    return t.dequantize()


def run_on_dequantized(func, args, kwargs):
    """Runs `func` on the dequantized arguments (an op that writes into no
    quantized argument); the result is plain."""
    hp_args, hp_kwargs = tree_map_only(QuantizedTensor, _dequantize, (args, kwargs))
    return func(*hp_args, **hp_kwargs)


def run_and_requantize(func, args, kwargs):
    """Handler for ops that write into their arguments (in-place, out= and
    foreach ops): runs `func` on dequantized arguments, re-quantizes each
    written high-precision stand-in into the quantized tensor it stands for
    (every copy that tensor holds) and returns those in their place."""
    hp_args, hp_kwargs = tree_map_only(QuantizedTensor, _dequantize, (args, kwargs))
    out = func(*hp_args, **hp_kwargs)
    back = {}
    for pos, name, kw in _written_args(func):
        origs = _elements(_arg(args, kwargs, pos, name, kw))
        hps = _elements(_arg(hp_args, hp_kwargs, pos, name, kw))
        for orig, hp in zip(origs, hps):
            if not isinstance(orig, QuantizedTensor):
                continue
            if tuple(hp.shape) != tuple(orig.shape):
                raise ValueError(
                    f"fp8kit: {func} would resize a {type(orig).__name__} of shape "
                    f"{tuple(orig.shape)} to {tuple(hp.shape)}; a quantized tensor keeps its "
                    "shape. Write into a plain tensor of the result's shape instead")
            orig._requantize_from(hp)
            back[id(hp)] = orig
    if isinstance(out, torch.Tensor):
        return back.get(id(out), out)
    if isinstance(out, (tuple, list)):
        return type(out)(back.get(id(o), o) for o in out)
    return out
