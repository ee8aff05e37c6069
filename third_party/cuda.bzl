"""cuda_objects: compile .cu files with nvcc, one genrule per file.

No rules_cuda offline: each .cu file becomes `<name>/<file>.o`, compiled
as position-independent code so that one object serves static and shared
links alike (Bazel takes a precompiled .o for both; a .pic.o beside it would
link the code twice). The returned labels go into a cc_library's srcs.
The genrules are tagged manual: `bazel build //...` reaches them only
through a target that needs them, i.e. under --config=cuda.
"""

load("@local_cuda//:defs.bzl", "CUBLASLT_INCLUDE", "CUDA_MISSING", "NVCC")

# Same as CMake's FP8KIT_CUDA_ARCHITECTURES default "90": SASS for sm_90 plus
# compute_90 PTX.
CUDA_ARCHS = ["90"]

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-lineinfo",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
] + ["-gencode=arch=compute_%s,code=%s_%s" % (a, kind, a) for a in CUDA_ARCHS for kind in ("sm", "compute")]

def cuda_objects(name, srcs, hdrs = [], includes = [], defines = []):
    """Returns the object-file labels of nvcc-compiled `srcs`.

    Args:
      name: prefix for the genrules and the output directory.
      srcs: .cu files of this package.
      hdrs: headers the .cu files may include (any package).
      includes: include directories, relative to the workspace root.
      defines: preprocessor definitions.
    """
    flags = NVCC_FLAGS + ["-I" + i for i in includes] + ["-I" + CUBLASLT_INCLUDE] + ["-D" + d for d in defines]
    objects = []
    for src in srcs:
        stem = src[:-len(".cu")] if src.endswith(".cu") else src
        obj = "%s/%s.o" % (name, stem)
        if NVCC:
            cmd = "%s %s -c $(location %s) -o $(location %s)" % (NVCC, " ".join(flags), src, obj)
        else:
            cmd = "echo 'fp8kit --config=cuda: %s' >&2; exit 1" % CUDA_MISSING
        native.genrule(
            name = "%s_%s" % (name, stem.replace("/", "_")),
            srcs = [src] + hdrs + ["@local_cuda//:nvcc_inputs"],
            outs = [obj],
            cmd = cmd,
            message = "nvcc %s" % src,
            tags = ["manual"],
        )
        objects.append(obj)
    return objects
