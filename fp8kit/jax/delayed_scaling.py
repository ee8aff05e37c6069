"""Delayed scaling's amax-history update for many tensors in one custom call.

History layout: amax_history[i] is tensor i's history, column 0 the newest.
The rule is the core's (fp8kit/delayed_scaling.h): roll the history in the
newest amax, reduce it (max or most recent), and set
scale = fp8_max / amax_reduced / 2**margin unless that amax is zero or not
finite (then the previous scale is kept); scale_inv = 1 / scale.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _registry

UPDATE_TARGET = "fp8kit_delayed_scaling_update"

_REDUCTION_CODES = {recipe_lib.AmaxReduction.MAX: 0, recipe_lib.AmaxReduction.MOST_RECENT: 1}


def delayed_scaling_update_call(amax_history, amax, scale, fmts: Sequence[str], margin: int,
                                reduction: recipe_lib.AmaxReduction):
    n, length = amax_history.shape
    f32 = jnp.float32
    codes = np.asarray([_registry.ext.FP8_DTYPE_CODES[f] for f in fmts], dtype=np.int32)
    return jax.ffi.ffi_call(
        UPDATE_TARGET,
        (jax.ShapeDtypeStruct((n, length), f32), jax.ShapeDtypeStruct((n,), f32),
         jax.ShapeDtypeStruct((n,), f32)),
        vmap_method="sequential",
        # The core updates history and scale in place.
        input_output_aliases={0: 0, 2: 1},
    )(amax_history, amax, scale, margin=np.int32(margin),
      reduction=np.int32(_REDUCTION_CODES[reduction]), fp8_dtypes=codes)


def delayed_scaling_update(amax_history, amax, scale, fp8_dtypes: Sequence, margin: int = 0,
                           reduction=recipe_lib.AmaxReduction.MAX):
    """Update n tensors' scaling state at once.

    amax_history: float32 [n, history_len]; amax: float32 [n] (the newest
    amaxes); scale: float32 [n] (the scales in use); fp8_dtypes: n formats
    ("e4m3"/"e5m2"). Returns (new_history, new_scale, new_scale_inv).
    """
    fn = "fp8kit.jax.delayed_scaling_update"
    amax_history, amax, scale = (jnp.asarray(a) for a in (amax_history, amax, scale))
    for name, a in (("amax_history", amax_history), ("amax", amax), ("scale", scale)):
        if a.dtype != jnp.float32:
            raise TypeError(f"{fn}: {name} has dtype {a.dtype}; scaling state is float32")
    if amax_history.ndim != 2 or amax_history.shape[1] < 1:
        raise ValueError(f"{fn}: amax_history must be [n, history_len >= 1], got shape "
                         f"{amax_history.shape}")
    n = amax_history.shape[0]
    if amax.shape != (n,) or scale.shape != (n,):
        raise ValueError(f"{fn}: amax and scale must have shape ({n},) to match amax_history "
                         f"{amax_history.shape}; got {amax.shape} and {scale.shape}")
    fmts = [_checks.fp8_dtype(fn, f"fp8_dtypes[{i}]", f) for i, f in enumerate(fp8_dtypes)]
    if len(fmts) != n:
        raise ValueError(f"{fn}: fp8_dtypes lists {len(fmts)} formats for {n} tensors")
    if not isinstance(margin, (int, np.integer)) or margin < 0:
        raise ValueError(f"{fn}: margin must be an int >= 0, got {margin!r}")
    if not isinstance(reduction, recipe_lib.AmaxReduction):
        raise TypeError(f"{fn}: reduction must be an fp8kit.recipe.AmaxReduction, got "
                        f"{reduction!r}")
    return delayed_scaling_update_call(amax_history, amax, scale, fmts, int(margin), reduction)
