"""ScaledTensor: an FP8 tensor with its dequantization factors.

    x ~= data.astype(float32) * scale_inv          (fp8kit's scale convention)

Per-tensor scaling ("per_tensor") keeps one float32 scale_inv. Block
scaling ("block_1x128", "block_128x128": common/include/fp8kit/block_scaling.h
states the rule and the layout) keeps one per block instead, for each
stored copy: block_scale_inv for `data`, columnwise_block_scale_inv for
`columnwise_data` (the columnwise copy's 1x128 tiles run down the tensor's
columns, so its scales are its own); scale_inv is then None. The scale
arrays are 2-D float32 in the layout cuBLASLt reads, shaped by the core
(fp8kit.jax's quantize_block_scaling makes them).

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

PER_TENSOR = "per_tensor"


def columnwise_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the columnwise copy of a tensor of logical `shape`:
    (last, prod(leading)), 2-D for every rank."""
    shape = tuple(shape)
    last = shape[-1] if shape else 1
    return (last, math.prod(shape[:-1]))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScaledTensor:
    """FP8 data + float32 scales (+ optional transposed data and amax)."""

    data: Optional[jax.Array]
    scale_inv: Optional[jax.Array]   # per-tensor scaling; None under block scaling
    columnwise_data: Optional[jax.Array] = None
    amax: Optional[jax.Array] = None
    # "e4m3" or "e5m2"; None: taken from the data's dtype.
    fp8_dtype: Optional[str] = dataclasses.field(default=None, metadata=dict(static=True))
    # "per_tensor", "block_1x128" or "block_128x128" (_checks.SCALING_MODES).
    scaling_mode: str = dataclasses.field(default=PER_TENSOR, metadata=dict(static=True))
    block_scale_inv: Optional[jax.Array] = None              # scales of `data`
    columnwise_block_scale_inv: Optional[jax.Array] = None   # scales of `columnwise_data`

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
        if self.scaling_mode not in _checks.SCALING_MODES:
            raise ValueError(f"ScaledTensor: scaling_mode must be one of "
                             f"{', '.join(map(repr, _checks.SCALING_MODES))}, got "
                             f"{self.scaling_mode!r}")
        for name in ("scale_inv", "block_scale_inv", "columnwise_block_scale_inv"):
            a = getattr(self, name)
            if hasattr(a, "dtype") and jnp.dtype(a.dtype) not in (jnp.float32,
                                                                  jax.dtypes.float0):
                raise TypeError(f"ScaledTensor: {name} has dtype {jnp.dtype(a.dtype)}; it is "
                                "float32 (pass jnp.float32(value) or .astype(jnp.float32)).")

    def check(self, fn: str, arg: str) -> None:
        """What an op needs of this tensor, checked before anything is
        lowered: FP8 data in at least one layout, copies of agreeing shapes,
        one float32 scale_inv (a Python float is taken as one)."""
        if self.data is None and self.columnwise_data is None:
            raise ValueError(f"{fn}: {arg} holds neither rowwise nor columnwise data")
        if self.block_scaled:
            self._check_block_fields(fn, arg)
        elif not isinstance(self.scale_inv, float):
            _checks.scalar_f32(fn, f"{arg}.scale_inv", self.scale_inv)
            if self.block_scale_inv is not None or self.columnwise_block_scale_inv is not None:
                raise ValueError(f"{fn}: {arg} is per-tensor scaled but holds block scales; "
                                 "set scaling_mode to the block mode they were made with")
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

    def _check_block_fields(self, fn: str, arg: str) -> None:
        """A block-scaled tensor: no per-tensor scale_inv, and the block
        scales of each copy held, 2-D (their exact shape is the core's:
        fp8kit.jax checks it where it has the core at hand)."""
        if self.scale_inv is not None:
            raise ValueError(f"{fn}: {arg} is {self.scaling_mode} but has a per-tensor "
                             "scale_inv; block-scaled tensors keep block_scale_inv and "
                             "columnwise_block_scale_inv only (set scale_inv=None)")
        for copy, scales in (("data", "block_scale_inv"),
                             ("columnwise_data", "columnwise_block_scale_inv")):
            held, s = getattr(self, copy) is not None, getattr(self, scales)
            if held and s is None:
                raise ValueError(f"{fn}: {arg}.{copy} is held but {arg}.{scales} is None; each "
                                 "copy of a block-scaled tensor comes with its scales "
                                 "(fp8kit.jax.quantize_block_scaling makes both)")
            if held and (not hasattr(s, "dtype") or len(s.shape) != 2):
                raise ValueError(f"{fn}: {arg}.{scales} must be a 2-D float32 array, got "
                                 f"{getattr(s, 'shape', type(s).__name__)}")

    @property
    def block_scaled(self) -> bool:
        """Block scaling (one scale per 1x128 tile or 128x128 block)?"""
        return self.scaling_mode != PER_TENSOR

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
        return dataclasses.replace(self, columnwise_data=None, columnwise_block_scale_inv=None)

    def columnwise_only(self) -> "ScaledTensor":
        return dataclasses.replace(self, data=None, block_scale_inv=None)
