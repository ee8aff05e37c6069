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
  _OP_TABLE ({aten op: handler}). Ops without an entry dequantize their
  quantized arguments and run in high precision; ops that write into a
  quantized argument (in-place and out= ops) then re-quantize the result
  into it.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
from torch.utils._pytree import tree_map_only

_TB = torch._C.TensorBase
_NATIVE_DTYPE = _TB.dtype
_NATIVE_SHAPE = _TB.shape
_NATIVE_DEVICE = _TB.device
_NATIVE_IS_CUDA = _TB.is_cuda
_NATIVE_REQUIRES_GRAD = _TB.requires_grad
_no_torch_function = torch._C.DisableTorchFunctionSubclass


class QuantizedTensor(torch.Tensor):
    """Base of fp8kit's quantized tensor subclasses (see the module doc)."""

    # Names of the cached properties' attributes, in the order the C++
    # builder (torch_ext/py_float8_tensor.cc) sets them.
    _CACHED = ("_dtype", "_shape", "_device", "_is_cuda", "_requires_grad")
    # {aten OpOverload: handler(func, args, kwargs)}; each subclass has its own.
    _OP_TABLE: Dict[object, Callable] = {}

    # ------------------------------------------------------------ creation
    @staticmethod
    def _new_wrapper(cls, shape, dtype: torch.dtype, device: torch.device,
                     requires_grad: bool):
        """An instance of cls with its cached properties set."""
        shape = torch.Size(shape)
        obj = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device,
                                                  requires_grad=requires_grad)
        obj._set_cache(dtype, shape, device, requires_grad)
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
    def dequantize(self, *, dtype=None) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _requantize_from(self, src: torch.Tensor) -> None:  # pragma: no cover - abstract
        """Writes quantize(src) into this tensor's buffers (in-place ops)."""
        raise NotImplementedError

    # ---------------------------------------------------------- torch hooks
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        with _no_torch_function():
            out = func(*args, **kwargs)
        # Autograd, setters and in-place ops may have changed what is cached.
        _refresh_results(out)
        if args and isinstance(args[0], QuantizedTensor) and args[0] is not out:
            args[0]._refresh_cache()
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        handler = cls._OP_TABLE.get(func)
        if handler is not None:
            out = handler(func, args, kwargs)
            if out is not NotImplemented:
                return out
        return dequantize_and_run(func, args, kwargs)


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


def _dequantize(t: "QuantizedTensor") -> torch.Tensor:
    return t.dequantize()


def dequantize_and_run(func, args, kwargs):
    """The fallback: run `func` on dequantized arguments; re-quantize into
    the quantized arguments it writes to and return those in place of their
    high-precision stand-ins."""
    hp_args, hp_kwargs = tree_map_only(QuantizedTensor, _dequantize, (args, kwargs))
    out = func(*hp_args, **hp_kwargs)
    written = _written_args(func)
    if not written:
        return out
    back = {}
    for pos, name, kwarg_only in written:
        if kwarg_only or pos >= len(args):
            orig, hp = kwargs.get(name), hp_kwargs.get(name)
        else:
            orig, hp = args[pos], hp_args[pos]
        if isinstance(orig, QuantizedTensor):
            orig._requantize_from(hp)
            back[id(hp)] = orig
    if not back:
        return out
    if isinstance(out, torch.Tensor):
        return back.get(id(out), out)
    if isinstance(out, (tuple, list)):
        return type(out)(back.get(id(o), o) for o in out)
    return out
