"""The GPU the model tests' JAX runs may use: JAX's first GPU when fp8kit
was built with CUDA, else None (a CPU-only jaxlib raises instead)."""

import jax


def jax_gpu():
    import fp8kit.jax as fj
    if not fj.BUILT_WITH_CUDA:
        return None
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None
