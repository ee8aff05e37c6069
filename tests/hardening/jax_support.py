"""What the JAX property modules share: device selection, building an
array of a drawn layout (eagerly or inside jit), and the clear-error check
for asynchronous calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import clear_errors

HP = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
FP8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}


def device_or_skip(device: str):
    """The JAX device of a test's variant ("cpu" or "cuda", skipped without
    one), made the default device so that every array the test creates
    lives there (the child runs CPU and CUDA variants in turn)."""
    if device == "cuda":
        import fp8kit.jax as fj
        if not fj.BUILT_WITH_CUDA:
            pytest.skip("fp8kit was built without CUDA")
        try:
            dev = jax.devices("gpu")[0]
        except RuntimeError:
            pytest.skip("no GPU for JAX")
    else:
        dev = jax.devices("cpu")[0]
    jax.config.update("jax_default_device", dev)
    return dev


def layout_op(layout: str, shape):
    """The jnp operation that makes the logical array from its source
    (fp8_strategies.laid_out), usable inside jit."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        return lambda a: jnp.swapaxes(a, -1, -2)
    if layout == "strided" and shape:
        return lambda a: a[..., ::2]
    if layout == "expanded" and shape:
        return lambda a: jnp.broadcast_to(a, shape)
    return lambda a: a


def source(src: np.ndarray, dtype: str, dev):
    return jax.device_put(jnp.asarray(src).astype(HP[dtype]), dev)


def logical_values(src: np.ndarray, layout: str, shape, dtype: str) -> np.ndarray:
    """The logical array's values as float32 NumPy (the reference's input)."""
    a = jnp.asarray(src).astype(HP[dtype])
    return np.asarray(layout_op(layout, shape)(a)).astype(np.float32)


def np_bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def fp8_array(b: np.ndarray, fmt: str, dev):
    return jax.device_put(jnp.asarray(np.asarray(b, np.uint8).view(FP8[fmt])), dev)


def expect_clear_error(fn_name: str, call, *args, **kwargs):
    """clear_errors.expect_clear_error, waiting for the result: JAX runs
    calls asynchronously, and an error from inside a compiled program
    surfaces only then (and is not a clear one)."""
    return clear_errors.expect_clear_error(fn_name, call, *args, settle=jax.block_until_ready,
                                           **kwargs)
