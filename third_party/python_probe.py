"""Prints what the Bazel build needs to know about this Python installation.

Run by third_party/python_configure.bzl (sections "frameworks") and
cuda_configure.bzl ("nvidia") with the interpreter the py_tests will use. Output: one `key=value` line per fact; a missing package gives an
empty value plus a `<key>_error` line so the BUILD can say what is wrong.
Paths are printed as the interpreter reports them (a venv's python stays
the venv's, so py_tests see the venv's site-packages).
"""
import os
import sys
import sysconfig


def emit(key, value):
    print("%s=%s" % (key, value))


def probe(key, fn):
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - report any failure as text
        emit(key, "")
        emit(key + "_error", ("%s: %s" % (type(e).__name__, e)).replace("\n", " "))
        return
    if isinstance(value, (list, tuple)):
        value = os.pathsep.join(value)
    emit(key, value)


def _pybind11():
    import pybind11
    return pybind11.get_include()


def _xla_ffi():
    import jax.ffi
    return jax.ffi.include_dir()


def _torch():
    import torch
    import torch.utils.cpp_extension as ext
    emit("torch_lib", os.path.join(os.path.dirname(torch.__file__), "lib"))
    emit("torch_cxx11_abi", int(torch._C._GLIBCXX_USE_CXX11_ABI))
    emit("torch_cuda", torch.version.cuda or "")
    emit("torch_version", torch.__version__)
    return ext.include_paths()


def _nvidia_dirs():
    # pip's CUDA wheels (nvidia-cublas etc.) unpack under site-packages/nvidia/
    # as cu13/ (CUDA 13) or one directory per library (cublas/, cuda_runtime/).
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    if spec is None:
        return []
    roots = list(spec.submodule_search_locations)
    return sorted(os.path.join(r, d) for r in roots for d in os.listdir(r)
                  if os.path.isdir(os.path.join(r, d)))


def main(sections):
    emit("python", sys.executable)
    emit("python_version", "%d.%d" % sys.version_info[:2])
    emit("python_include", sysconfig.get_paths()["include"])
    if "frameworks" in sections:  # slow: imports jax and torch
        probe("pybind11_include", _pybind11)
        probe("xla_ffi_include", _xla_ffi)
        probe("torch_include", _torch)
    if "nvidia" in sections:
        probe("nvidia_dirs", _nvidia_dirs)


if __name__ == "__main__":
    main(sys.argv[1:] or ["frameworks", "nvidia"])
