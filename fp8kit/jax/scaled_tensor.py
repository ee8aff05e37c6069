"""ScaledTensor: an FP8 tensor with its per-tensor dequantization factor.

    x ~= data.astype(float32) * scale_inv          (fp8kit's scale convention)

A pytree (jax.tree_util), so it passes through jit, vmap, grad's residuals
and sharding like any array container. Children: the FP8 data (rowwise,
x's shape), the columnwise (transposed) data, scale_inv and the amax of the
source tensor; either data layout may be None when not held, amax may be
None. The FP8 format ("e4m3"/"e5m2") is static (pytree aux data).

Columnwise layout: the core stores the tensor flattened to 2-D as
[prod(shape[:-1]), shape[-1]] and transposed. Here that array is shaped
(shape[-1], *shape[:-1]) - the same bytes - so that the logical shape stays
recoverable from it alone: shape = col.shape[1:] + col.shape[:1].
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from fp8kit.jax import _checks


def columnwise_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the columnwise array of a tensor of logical `shape`."""
    shape = tuple(shape)
    return shape[-1:] + shape[:-1]


def logical_shape_from_columnwise(col_shape: tuple[int, ...]) -> tuple[int, ...]:
    col_shape = tuple(col_shape)
    return col_shape[1:] + col_shape[:1]


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
        """The logical shape (the source tensor's)."""
        if self.data is not None:
            return tuple(self.data.shape)
        if self.columnwise_data is not None:
            return logical_shape_from_columnwise(self.columnwise_data.shape)
        raise ValueError("ScaledTensor holds neither rowwise nor columnwise data")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def as_2d(self) -> "ScaledTensor":
        """The same tensor viewed as [prod(shape[:-1]), shape[-1]] (a free
        reshape of both layouts); what the GEMM takes."""
        shape = self.shape
        if len(shape) == 2:
            return self
        if len(shape) == 0:
            rows, cols = 1, 1
        else:
            rows, cols = math.prod(shape[:-1]), shape[-1]
        return dataclasses.replace(
            self,
            data=None if self.data is None else self.data.reshape(rows, cols),
            columnwise_data=(None if self.columnwise_data is None
                             else self.columnwise_data.reshape(cols, rows)))

    def rowwise_only(self) -> "ScaledTensor":
        return dataclasses.replace(self, columnwise_data=None)

    def columnwise_only(self) -> "ScaledTensor":
        return dataclasses.replace(self, data=None)
