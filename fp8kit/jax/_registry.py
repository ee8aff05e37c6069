"""Loads fp8kit._jax_ext and registers its XLA FFI handlers with JAX, once.

The extension exports `registrations()`: {target name: {platform: PyCapsule}}.
Each capsule is registered for its platform ("cpu" always, "CUDA" only when
the module was built with CUDA). Importing fp8kit.jax runs this module once;
Python's import cache makes a second registration impossible.

FP8KIT_JAX_COMMAND_BUFFERS=1 registers the CUDA handlers marked
command-buffer compatible, so XLA may record fp8kit's calls into the CUDA
graphs it builds for a jitted program instead of calling them between graphs
(jax_ext/handlers.h). Under capture the GEMM uses cuBLASLt's first heuristic
choice: it cannot time candidates there.
"""

from __future__ import annotations

import os

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


def _command_buffers_requested() -> bool:
    value = os.environ.get("FP8KIT_JAX_COMMAND_BUFFERS", "0")
    if value not in ("0", "1"):
        raise ValueError(
            f"FP8KIT_JAX_COMMAND_BUFFERS={value!r}: expected '0' (fp8kit's CUDA calls run "
            "between XLA's CUDA graphs) or '1' (XLA may record them into its graphs)")
    return value == "1"


COMMAND_BUFFERS: bool = _command_buffers_requested()


def _register_all() -> tuple[str, ...]:
    names = []
    for name, platforms in sorted(ext.registrations(COMMAND_BUFFERS).items()):
        for platform, capsule in platforms.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
        names.append(name)
    return tuple(names)


TARGETS = _register_all()
