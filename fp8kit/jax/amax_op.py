"""fp8kit.jax.amax: max |x| over a whole tensor, through the core's kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8kit.jax import _checks, _registry  # noqa: F401  (_registry registers the FFI targets)

AMAX_TARGET = "fp8kit_amax"


def amax_call(x: jax.Array) -> jax.Array:
    """The raw custom call (no argument checks): float32 scalar."""
    return jax.ffi.ffi_call(AMAX_TARGET, jax.ShapeDtypeStruct((), jnp.float32),
                            vmap_method="sequential")(x)


def amax(x) -> jax.Array:
    """max |x| over every element of `x` as a float32 scalar.

    x: float32, bfloat16 or float16, any rank up to 8. A NaN anywhere gives
    NaN, an inf gives inf, an empty array gives 0. Works under jit, vmap
    (one amax per example), on CPU and CUDA devices, and sharded (the
    global amax, reduced across devices; see partitioning.py).
    """
    from fp8kit.jax import partitioning  # noqa: PLC0415  (it imports this module)

    _checks.high_precision("fp8kit.jax.amax", "x", x)
    _checks.rank("fp8kit.jax.amax", "x", x)
    return partitioning.amax(jnp.asarray(x))
