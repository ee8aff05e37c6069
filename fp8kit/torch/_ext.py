"""Loads the compiled extension fp8kit._torch_ext (after torch, whose
libraries it links against)."""

import torch  # noqa: F401  (loads libtorch before the extension)

try:
    from fp8kit import _torch_ext as ext
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "fp8kit.torch needs the compiled extension fp8kit._torch_ext, which is built when torch "
        "is installed at build time (pip install --no-build-isolation . with torch present, or a "
        "CMake build with -DFP8KIT_TORCH=ON). Importing it failed: " + str(e)) from e

__all__ = ["ext"]
