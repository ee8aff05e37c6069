"""C++ settings shared by fp8kit's targets, and cc_api_library.

fp8kit's own C++ (the core, both extensions, the GoogleTest binary) is
C++17 whatever the consumer's toolchain defaults to (Bazel 4's passes
-std=c++0x), so the standard is set on those targets' copts rather than in
a .bazelrc, which a workspace depending on fp8kit would not read. The public
C API headers are C and C++11-clean and need neither flag.
"""

# copts of every fp8kit C++ target: C++17, and only what a target exports
# on purpose is visible outside a shared object (CMake:
# CXX_VISIBILITY_PRESET hidden, VISIBILITY_INLINES_HIDDEN).
FP8KIT_COPTS = [
    "-std=c++17",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
]

def _cc_api_library_impl(ctx):
    return [
        DefaultInfo(files = ctx.attr.library[DefaultInfo].files),
        CcInfo(
            compilation_context = ctx.attr.headers[CcInfo].compilation_context,
            linking_context = ctx.attr.library[CcInfo].linking_context,
        ),
    ]

cc_api_library = rule(
    implementation = _cc_api_library_impl,
    attrs = {
        "headers": attr.label(
            providers = [CcInfo],
            mandatory = True,
            doc = "cc_library with the public headers (and their includes and defines) only.",
        ),
        "library": attr.label(
            providers = [CcInfo],
            mandatory = True,
            doc = "cc_library with the implementation; it depends on `headers`.",
        ),
    },
    doc = """A C/C++ library as its dependents should see it: `library`'s objects
and link flags with `headers`' compilation context only.

Bazel 4's cc_library has no implementation_deps: every include directory of
a dependency reaches all dependents. The core's private include directory
(common/src, with headers such as error.h that shadow system ones) must not
end up on a consumer's include path; depending on this target instead of
the cc_library keeps it out.""",
)
