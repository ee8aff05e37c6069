"""cuda_objects: compile .cu files with nvcc, one action per file.

No rules_cuda offline: each .cu file becomes `<name>/<file>.o`, compiled as
position-independent code so that one object serves static and shared links
alike (Bazel takes a precompiled .o for both; a .pic.o beside it would link
the code twice). The macro returns the target's label, for a cc_library's
srcs (normally inside a select on //:cuda_enabled).

Include directories and defines come from the CcInfo of `deps`, the same
way a cc_library's would, so the paths are right whether fp8kit is the main
repository or an external one. nvcc itself is `@fp8kit_deps//:nvcc`: a
script that runs the toolkit's nvcc, or fails with the reason when the
machine has none. That label is resolved only when a CUDA build analyses
this target; nothing here loads from the CUDA repository, so CPU builds and
`bazel query` never fetch it.
"""

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

def _cuda_objects_impl(ctx):
    contexts = [d[CcInfo].compilation_context for d in ctx.attr.deps]
    args = list(NVCC_FLAGS)
    for c in contexts:
        args += ["-I" + p for p in c.includes.to_list()]
        args += ["-I" + p for p in c.quote_includes.to_list()]
        for p in c.system_includes.to_list():
            args += ["-isystem", p]
        args += ["-D" + d for d in c.defines.to_list()]
    args += ["-D" + d for d in ctx.attr.defines]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in contexts])
    objects = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(".cu")]
        obj = ctx.actions.declare_file("%s/%s.o" % (ctx.label.name, stem))
        ctx.actions.run(
            executable = ctx.executable._nvcc,
            arguments = args + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            # nvcc runs the host compiler found on PATH.
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "defines": attr.string_list(),
        "_nvcc": attr.label(
            default = "@fp8kit_deps//:nvcc",
            executable = True,
            cfg = "host",
            allow_single_file = True,
        ),
    },
)

def cuda_objects(name, srcs, hdrs = [], deps = [], defines = []):
    """Declares the nvcc objects of `srcs`; returns [":name"] for a cc_library's srcs.

    Args:
      name: target name (and output directory).
      srcs: .cu files of this package.
      hdrs: headers the .cu files include that no dependency declares
        (.cuh files, which cc_library does not take).
      deps: cc_library targets whose headers, include directories and
        defines the .cu files use.
      defines: extra preprocessor definitions for these files only.
    """
    _cuda_objects(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        defines = defines,
        # Reached only through a cc_library under --//:cuda=true; a CPU
        # `bazel build //...` must not try to run nvcc.
        tags = ["manual"],
        visibility = ["//visibility:private"],
    )
    return [":" + name]
