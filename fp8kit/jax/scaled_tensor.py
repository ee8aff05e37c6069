"""ScaledTensor: an FP8 tensor with its per-tensor dequantization factor.

    x ~= data.astype(float32) * scale_inv          (fp8kit's scale convention)

A pytree (jax.tree_util), so it passes through jit, vmap, grad's residuals
and sharding like any array container. Children: the FP8 data (rowwise,
x's shape), the columnwise (transposed) data, scale_inv and the amax of the
source tensor; either data layout may be None when not held, amax may be
None. The FP8 format ("e4m3"/"e5m2") is static (pytree aux data).

Columnwise layout, one rule in both front ends and the core: the tensor
viewed as 2-D, [prod(shape[:-1]), shape[-1]], and transposed, so
columnwise_data has shape (shape[-1], prod(shape[:-1])) whatever the rank
(a scalar's is (1, 1), a vector's (n, 1)). A ScaledTensor holding only the
columnwise copy therefore knows its 2-D view, not the leading dims: its
`shape` is (prod(leading), last).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from fp8kit.jax import _checks


def columnwise_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the columnwise copy of a tensor of logical `shape`:
    (last, prod(leading)), 2-D for every rank."""
    shape = tuple(shape)
    last = shape[-1] if shape else 1
    return (last, math.prod(shape[:-1]))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScaledTensor:
    """FP8 data + float32 scale_inv (+ optional transposed data and amax)."""

    data: Optional[jax.Array]
    scale_inv: jax.Array
    columnwise_data: Optional[jax.Array] = None
    amax: Optional[jax.Array] = None
    # "e4m3" or "e5m2"; None: taken from the data's dtype.
    fp8_dtype: Optional[str] = dataclasses.field(default=None, metadata=dict(static=True))

    def __post_init__(self):
        # The FP8 dtype of the held data, when the leaves are FP8 arrays (JAX
        # also rebuilds pytrees with other leaves, e.g. vmap's in_axes ints).
        held = {_checks.FP8_NAMES[jnp.dtype(a.dtype)]
                for a in (self.data, self.columnwise_data)
                if hasattr(a, "dtype") and jnp.dtype(a.dtype) in _checks.FP8_NAMES}
        if len(held) > 1:
            raise ValueError("ScaledTensor: data and columnwise_data have different FP8 dtypes")
        fmt = self.fp8_dtype
        if fmt is None:
            if not held:
                raise ValueError("ScaledTensor: pass fp8_dtype='e4m3' or 'e5m2' (or FP8 data "
                                 "to take it from)")
            object.__setattr__(self, "fp8_dtype", held.pop())
        elif fmt not in _checks.FP8_DTYPES:
            raise ValueError(f"ScaledTensor: fp8_dtype must be 'e4m3' or 'e5m2', got {fmt!r}")
        elif held and held != {fmt}:
            raise ValueError(f"ScaledTensor: fp8_dtype={fmt!r} but the data is {held.pop()}; "
                             "they must agree")
        # Array leaves of other dtypes are mistakes (a tree rebuilt by JAX
        # holds FP8 data, or float0 cotangents of it, and a float32
        # scale_inv, or no arrays at all).
        for name in ("data", "columnwise_data"):
            a = getattr(self, name)
            if hasattr(a, "dtype") and jnp.dtype(a.dtype) not in (*_checks.FP8_NAMES,
                                                                  jax.dtypes.float0):
                raise TypeError(f"ScaledTensor: {name} has dtype {jnp.dtype(a.dtype)}; it holds "
                                "FP8 data (jnp.float8_e4m3fn or jnp.float8_e5m2). Make it "
                                "with fp8kit.jax.quantize.")
        if hasattr(self.scale_inv, "dtype") and jnp.dtype(self.scale_inv.dtype) != jnp.float32:
            raise TypeError(f"ScaledTensor: scale_inv has dtype {jnp.dtype(self.scale_inv.dtype)};"
                            " it is float32 (pass jnp.float32(value)).")

    def check(self, fn: str, arg: str) -> None:
        """What an op needs of this tensor, checked before anything is
        lowered: FP8 data in at least one layout, copies of agreeing shapes,
        one float32 scale_inv (a Python float is taken as one)."""
        if self.data is None and self.columnwise_data is None:
            raise ValueError(f"{fn}: {arg} holds neither rowwise nor columnwise data")
        if not isinstance(self.scale_inv, float):
            _checks.scalar_f32(fn, f"{arg}.scale_inv", self.scale_inv)
        for name in ("data", "columnwise_data"):
            a = getattr(self, name)
            if a is not None and not hasattr(a, "dtype"):
                raise TypeError(f"{fn}: {arg}.{name} must be an FP8 array, got "
                                f"{type(a).__name__}")
        if self.data is not None and self.columnwise_data is not None:
            want = columnwise_shape(self.data.shape)
            if tuple(self.columnwise_data.shape) != want:
                raise ValueError(
                    f"{fn}: {arg}.columnwise_data has shape {tuple(self.columnwise_data.shape)} "
                    f"but data {tuple(self.data.shape)} needs {want} (its 2-D view "
                    "transposed); quantize once with rowwise=True, columnwise=True.")

    @property
    def has_rowwise(self) -> bool:
        return self.data is not None

    @property
    def has_columnwise(self) -> bool:
        return self.columnwise_data is not None

    @property
    def dtype(self) -> jnp.dtype:
        """The jnp FP8 dtype of the data (float8_e4m3fn or float8_e5m2)."""
        return _checks.FP8_DTYPES[self.fp8_dtype]

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape (the source tensor's), or its 2-D view
        (prod(leading), last) when only the columnwise copy is held."""
        if self.data is not None:
            return tuple(self.data.shape)
        if self.columnwise_data is not None:
            return tuple(self.columnwise_data.shape[::-1])
        raise ValueError("ScaledTensor holds neither rowwise nor columnwise data")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def as_2d(self) -> "ScaledTensor":
        """The same tensor viewed as [prod(shape[:-1]), shape[-1]] (a free
        reshape of the rowwise data; the columnwise copy is 2-D already);
        what the GEMM takes."""
        if self.data is None or self.data.ndim == 2:
            return self
        cols, rows = columnwise_shape(self.data.shape)
        return dataclasses.replace(self, data=self.data.reshape(rows, cols))

    def rowwise_only(self) -> "ScaledTensor":
        return dataclasses.replace(self, columnwise_data=None)

    def columnwise_only(self) -> "ScaledTensor":
        return dataclasses.replace(self, data=None)
