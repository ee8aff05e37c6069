"""unity_sources: a package's .cc files compiled as a few larger files.

Each of the PyTorch extension's sources spends nearly all of its compile
time in torch's and pybind11's headers (about 10 of 11 seconds at -O0), and
Bazel precompiles no header. Compiling them as a few files that each
#include a share of the sources parses those headers a few times instead of
once per source. CMake's UNITY_BUILD with the same batch size (see
cmake/Torch.cmake) groups the sources the same way, so a name that two
files of one group both define in their anonymous namespaces fails both
builds alike.
"""

def _unity_file_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".cc")

    # Each source by its path in its repository: the repository's root is
    # on the include path of its own targets (-iquote . in fp8kit's
    # workspace, -iquote external/fp8kit in one that depends on it).
    lines = []
    for f in ctx.files.srcs:
        root = f.owner.workspace_root
        lines.append('#include "%s"\n' % (f.path[len(root) + 1:] if root else f.path))
    ctx.actions.write(out, "".join(lines))
    return [DefaultInfo(files = depset([out]))]

_unity_file = rule(
    implementation = _unity_file_impl,
    attrs = {"srcs": attr.label_list(allow_files = [".cc"], mandatory = True)},
)

def unity_sources(name, srcs, batch_size):
    """Declares the unity files of `srcs`, `batch_size` sources each, in order.

    Args:
      name: prefix of the generated targets (name_0, name_1, ...).
      srcs: the sources, in the order CMake lists them (sorted).
      batch_size: sources per unity file.

    Returns:
      the labels of the unity files, for a cc target's srcs; `srcs` go in
      its textual_hdrs, so that they are inputs but not compiled alone.
    """
    labels = []
    for start in range(0, len(srcs), batch_size):
        target = "%s_%d" % (name, len(labels))
        _unity_file(name = target, srcs = srcs[start:start + batch_size])
        labels.append(":" + target)
    return labels
