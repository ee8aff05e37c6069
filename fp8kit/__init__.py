"""fp8kit: FP8 training with one C++/CUDA core and JAX and PyTorch front ends.

The front ends are imported on demand so that a JAX user needs no torch and
the reverse: `import fp8kit.jax` or `import fp8kit.torch`.
"""

__version__ = "0.1.0"

from fp8kit import recipe  # noqa: F401  (framework-free)
