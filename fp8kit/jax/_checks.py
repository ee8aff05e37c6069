"""Argument checks that run in Python before anything is lowered, so a bad
call fails with a message naming the argument and the fix, never with an
XLA error from inside a compiled program."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# The largest float32: the core stores amax_epsilon in one.
FLOAT32_MAX = float(np.finfo(np.float32).max)
HIGH_PRECISION = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
FP8_DTYPES = {"e4m3": jnp.dtype(jnp.float8_e4m3fn), "e5m2": jnp.dtype(jnp.float8_e5m2)}
FP8_NAMES = {v: k for k, v in FP8_DTYPES.items()}
MAX_RANK = 8
# ScaledTensor's scaling modes; the core's codes for them are
# _ffi.SCALING_MODE_CODES (the same keys; tests/jax check it).
SCALING_MODES = ("per_tensor", "block_1x128", "block_128x128")


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


def high_precision_dtype(fn: str, arg: str, dtype, allowed=HIGH_PRECISION) -> jnp.dtype:
    """A dtype among `allowed`, named by a dtype object (jnp.bfloat16, its
    np.dtype) or its full name ("bfloat16"); None is not a dtype here."""
    dt = None
    if dtype is not None:
        try:
            dt = jnp.dtype(dtype)
        except TypeError:
            pass
    if dt not in allowed:
        names = ", ".join(f"jnp.{d.name}" for d in allowed)
        raise TypeError(f"{fn}: {arg}={dtype!r} is not supported; use one of {names}.")
    return dt


def flag(fn: str, arg: str, value) -> bool:
    """A bool (or NumPy bool); 0, 1, None and strings are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: {arg}={value!r} must be True or False")
    return bool(value)


def int_in(fn: str, arg: str, value, lo: int, hi: int) -> int:
    """An int in [lo, hi]; a bool is not an int here."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: {arg} must be an int >= {lo} and <= {hi}, got {value!r} "
                        f"({type(value).__name__})")
    if not lo <= value <= hi:
        raise ValueError(f"{fn}: {arg} must be an int >= {lo} and <= {hi}, got {value!r}")
    return int(value)


def gemm_dim(fn: str, arg: str, value, multiple: int) -> int:
    """A dimension an FP8 GEMM reads: a positive int multiple of `multiple`
    (its alignment); a bool is not an int here."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: {arg} must be an int, a positive multiple of {multiple}, got "
                        f"{value!r} ({type(value).__name__})")
    if value <= 0 or value % multiple:
        fit = max(multiple, -(-value // multiple) * multiple)
        raise ValueError(f"{fn}: {arg}={value}; it must be a positive multiple of {multiple} "
                         f"(the FP8 GEMM's alignment, enforced on the CPU too): use e.g. "
                         f"{arg}={fit}")
    return int(value)


def epsilon(fn: str, arg: str, value) -> float:
    """A finite float >= 0 that float32 holds (a Python or NumPy real
    number; bools and strings are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: {arg} must be a float >= 0 (0.0 disables it), got {value!r} "
                        f"({type(value).__name__})")
    if not (math.isfinite(value) and 0 <= value <= FLOAT32_MAX):
        raise ValueError(f"{fn}: {arg} must be >= 0 and finite (at most {FLOAT32_MAX:g}, the "
                         f"largest float32; 0.0 disables it), got {value!r}")
    return float(value)


def array(fn: str, arg: str, x) -> None:
    """x must be an array (jax or NumPy), not a list, scalar or None."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{fn}: {arg} must be a jax or NumPy array, got {type(x).__name__}; "
                        f"pass jnp.asarray({arg}, dtype) instead.")


def same_devices(fn: str, arg: str, x, ref_arg: str, ref) -> None:
    """x and ref, when both are arrays committed to devices (jax.device_put),
    are on the same ones; JAX places uncommitted arrays and tracers itself."""
    def placed(a) -> bool:
        return isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and a.committed

    def names(a) -> str:
        return ", ".join(sorted(str(d) for d in a.devices()))

    if placed(x) and placed(ref) and x.devices() != ref.devices():
        raise ValueError(f"{fn}: {arg} is on {names(x)} but {ref_arg} is on {names(ref)}; "
                         f"put them on one device, e.g. jax.device_put({arg}, "
                         f"{ref_arg}.sharding)")


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


def quantize_args(fn: str, x, fmt, rowwise, columnwise) -> tuple:
    """A quantization's common arguments: x high precision of rank <= 8, its
    FP8 format `fmt` (the argument fp8_dtype) and the rowwise / columnwise
    flags, at least one set. Returns (format name, rowwise, columnwise)."""
    high_precision(fn, "x", x)
    rank(fn, "x", x)
    fmt = fp8_dtype(fn, "fp8_dtype", fmt)
    rowwise = flag(fn, "rowwise", rowwise)
    columnwise = flag(fn, "columnwise", columnwise)
    if not (rowwise or columnwise):
        raise ValueError(f"{fn}: rowwise and columnwise are both False; ask for at least one "
                         "layout (rowwise for x @ w, columnwise for the transposed use in a "
                         "backward GEMM).")
    return fmt, rowwise, columnwise


def rank(fn: str, arg: str, x, min_rank: int = 0, max_rank: int = MAX_RANK) -> None:
    r = len(np.shape(x))
    if not min_rank <= r <= max_rank:
        raise ValueError(f"{fn}: {arg} has rank {r} (shape {tuple(np.shape(x))}); expected rank "
                         f"{min_rank}..{max_rank}. Reshape it first.")


def scalar_f32(fn: str, arg: str, x) -> None:
    """A per-tensor scale: one float32 element (shape () or (1,))."""
    if x is None or isinstance(x, (bool, str)):
        raise TypeError(f"{fn}: {arg} is {x!r}; pass a float32 scalar, e.g. jnp.float32(1.0).")
    dt = _dtype_of(x)
    if dt != jnp.float32:
        raise TypeError(f"{fn}: {arg} has dtype {dt}; per-tensor scales are float32. "
                        f"Pass jnp.float32({arg}) or {arg}.astype(jnp.float32).")
    if tuple(np.shape(x)) not in ((), (1,)):
        raise ValueError(f"{fn}: {arg} has shape {tuple(np.shape(x))}; a per-tensor scale is one "
                         "float32 (shape () or (1,)).")
