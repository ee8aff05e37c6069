"""Argument checks that run in Python before anything is lowered, so a bad
call fails with a message naming the argument and the fix, never with an
XLA error from inside a compiled program."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

HIGH_PRECISION = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
FP8_DTYPES = {"e4m3": jnp.dtype(jnp.float8_e4m3fn), "e5m2": jnp.dtype(jnp.float8_e5m2)}
FP8_NAMES = {v: k for k, v in FP8_DTYPES.items()}
MAX_RANK = 8


def _dtype_of(x):
    dt = getattr(x, "dtype", None)  # arrays and tracers; lists etc. go through NumPy
    return jnp.dtype(np.asarray(x).dtype if dt is None else dt)


def high_precision(fn: str, arg: str, x) -> None:
    """x must be float32, bfloat16 or float16."""
    dt = _dtype_of(x)
    if dt not in HIGH_PRECISION:
        raise TypeError(
            f"{fn}: {arg} has dtype {dt}; fp8kit takes float32, bfloat16 or float16 here. "
            f"Cast it first, e.g. {arg}.astype(jnp.bfloat16).")


def high_precision_dtype(fn: str, arg: str, dtype) -> jnp.dtype:
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in HIGH_PRECISION:
        raise TypeError(f"{fn}: {arg}={dtype!r} is not supported; use jnp.float32, jnp.bfloat16 "
                        "or jnp.float16.")
    return dt


def fp8_dtype(fn: str, arg: str, fmt) -> str:
    """Accepts 'e4m3'/'e5m2' or the jnp FP8 dtypes; returns 'e4m3'/'e5m2'."""
    if isinstance(fmt, str) and fmt in FP8_DTYPES:
        return fmt
    try:
        dt = jnp.dtype(fmt)
    except TypeError:
        dt = None
    if dt in FP8_NAMES:
        return FP8_NAMES[dt]
    raise TypeError(f"{fn}: {arg}={fmt!r} is not an FP8 format fp8kit supports; use 'e4m3' "
                    "(jnp.float8_e4m3fn) or 'e5m2' (jnp.float8_e5m2).")


def rank(fn: str, arg: str, x, min_rank: int = 0, max_rank: int = MAX_RANK) -> None:
    r = len(np.shape(x))
    if not min_rank <= r <= max_rank:
        raise ValueError(f"{fn}: {arg} has rank {r} (shape {tuple(np.shape(x))}); expected rank "
                         f"{min_rank}..{max_rank}. Reshape it first.")


def scalar_f32(fn: str, arg: str, x) -> None:
    """A per-tensor scale: one float32 element (shape () or (1,))."""
    dt = _dtype_of(x)
    if dt != jnp.float32:
        raise TypeError(f"{fn}: {arg} has dtype {dt}; per-tensor scales are float32. "
                        f"Pass jnp.float32({arg}) or {arg}.astype(jnp.float32).")
    if int(np.prod(np.shape(x), dtype=np.int64)) != 1:
        raise ValueError(f"{fn}: {arg} has shape {tuple(np.shape(x))}; a per-tensor scale is one "
                         "float32 (shape () or (1,)).")
