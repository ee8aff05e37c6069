"""Loads fp8kit._jax_ext and registers its XLA FFI handlers with JAX, once.

The extension exports `registrations()`: {target name: {platform: PyCapsule}}.
Each capsule is registered for its platform ("cpu" always, "CUDA" only when
the module was built with CUDA). Importing fp8kit.jax runs this module once;
Python's import cache makes a second registration impossible.
"""

from __future__ import annotations

import jax

try:
    from fp8kit import _jax_ext as ext
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fp8kit.jax needs the compiled extension fp8kit._jax_ext, which failed to load "
        f"({e}). Build and install fp8kit with `pip install .` (see README.md); a build "
        "made on another machine (other jaxlib or Python) will not load here.") from e

BUILT_WITH_CUDA: bool = ext.built_with_cuda()

TARGETS: tuple[str, ...] = ()


def _register_all() -> tuple[str, ...]:
    names = []
    for name, platforms in sorted(ext.registrations().items()):
        for platform, capsule in platforms.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
        names.append(name)
    return tuple(names)


TARGETS = _register_all()
