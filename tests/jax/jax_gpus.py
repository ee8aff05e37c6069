"""The GPUs the JAX tests may use: JAX's GPU devices when fp8kit was built
with CUDA, else none (a CPU-only jaxlib raises instead of returning [])."""

import jax

import fp8kit.jax as fj


def gpus() -> list:
    try:
        return jax.devices("gpu") if fj.BUILT_WITH_CUDA else []
    except RuntimeError:
        return []
