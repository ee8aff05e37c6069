"""python_configure: the local Python, pybind11, JAX FFI and torch for Bazel.

A repository rule (no downloads) that runs one Python interpreter, asks it
where its headers and libraries are (third_party/python_probe.py), symlinks
those directories into the generated repository and writes a BUILD with:

  :python_headers  Python.h
  :pybind11        pybind11 headers (+ Python.h)
  :xla_ffi         the XLA FFI headers of jaxlib (jax.ffi.include_dir())
  :torch           torch's C++ headers, libtorch/libtorch_cpu/libtorch_python/
                   libc10, and -D_GLIBCXX_USE_CXX11_ABI matching this torch
  :torch_cuda      torch_cuda/c10_cuda + FP8KIT_TORCH_CUDA when torch has CUDA,
                   else empty (used only by the CUDA build)
  :py_toolchain    the Python toolchain pinned to the same interpreter, so
                   py_tests import the very packages the headers came from

Interpreter: $FP8KIT_PYTHON, else $PYTHON_BIN_PATH, else `python3` on PATH.
A package that is missing does not break the repository: its target becomes
a rule that fails with the reason, so only builds that need it fail.
After upgrading a pip package whose headers Bazel uses, re-run this rule
with `bazel sync --configure`.
"""

_ENV_VARS = ["FP8KIT_PYTHON", "PYTHON_BIN_PATH", "PATH"]

# File types cc_library accepts as headers (torch also ships .cuh files,
# which no host compilation includes).
_HDR_PATTERNS = ["**/*.h", "**/*.hpp", "**/*.inc"]

def find_python(repository_ctx):
    """Path of the interpreter to configure, or fail() with what to do."""
    for var in ["FP8KIT_PYTHON", "PYTHON_BIN_PATH"]:
        value = repository_ctx.os.environ.get(var, "")
        if value:
            path = repository_ctx.path(value)
            if not path.exists:
                fail("%s=%s does not exist" % (var, value))
            return str(path)
    python = repository_ctx.which("python3")
    if python == None:
        fail("No python3 on PATH: set FP8KIT_PYTHON to the interpreter that has jax and torch installed")
    return str(python)

def run_probe(repository_ctx, python, sections):
    """Runs probe.py `sections` with `python`; returns its key=value lines as a dict."""
    probe = repository_ctx.path(Label("//third_party:python_probe.py"))
    result = repository_ctx.execute([python, "-B", str(probe)] + sections, timeout = 300, quiet = True)
    if result.return_code != 0:
        fail("Running %s %s failed:\n%s%s" % (python, probe, result.stdout, result.stderr))
    facts = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key] = value
    return facts

def _hdr_glob(dirname):
    return "glob([%s])" % ", ".join(['"%s/%s"' % (dirname, p) for p in _HDR_PATTERNS])

def failing_target(name, why):
    """BUILD text: cc_library `name` whose build fails, printing `why`.

    The library's header is the output of a failing genrule: anything that
    compiles against `name` needs the header first, so the build stops with
    the reason before any compiler error; builds without `name` never see it.
    """
    cmd = "echo 'ERROR: %s' >&2; exit 1" % why.replace("'", "'\\''").replace("$", "$$")
    return """
genrule(
    name = "{name}_missing",
    outs = ["{name}_missing.h"],
    cmd = {cmd},
    message = "{name} is not available",
)

cc_library(
    name = "{name}",
    hdrs = [":{name}_missing"],
)
""".format(name = name, cmd = repr(cmd))

def _header_library(repository_ctx, name, dirs, deps = [], defines = [], extra = ""):
    """A cc_library for include directories `dirs` (symlinked into the repo).

    Directories nested in an earlier one reuse its symlink, so torch's two
    include directories are declared once.
    """
    includes = []
    linked = []
    hdrs = []
    for i, d in enumerate(dirs):
        rel = None
        for root, link in linked:
            if d == root:
                rel = link
            elif d.startswith(root + "/"):
                rel = link + d[len(root):]
        if rel == None:
            link = "%s_include%s" % (name, "" if i == 0 else "_%d" % i)
            repository_ctx.symlink(d, link)
            linked.append((d, link))
            hdrs.append(_hdr_glob(link))
            rel = link
        includes.append(rel)
    return """
cc_library(
    name = "{name}",
    hdrs = {hdrs},
    includes = {includes},
    defines = {defines},
    deps = {deps},{extra}
)
""".format(
        name = name,
        hdrs = " + ".join(hdrs),
        includes = repr(includes),
        defines = repr(defines),
        deps = repr(deps),
        extra = extra,
    )

def _shared_libs(repository_ctx, prefix, libdir, names):
    """cc_import targets for lib<name>.so in libdir; returns (labels, BUILD text)."""
    link = prefix + "_lib"
    repository_ctx.symlink(libdir, link)
    labels = []
    text = ""
    for n in names:
        so = "%s/lib%s.so" % (link, n)
        if not repository_ctx.path(so).exists:
            fail("%s/lib%s.so not found" % (libdir, n))
        labels.append(":%s_%s" % (prefix, n))
        text += """
cc_import(
    name = "{prefix}_{n}",
    shared_library = "{so}",
)
""".format(prefix = prefix, n = n, so = so)
    return labels, text

def _python_configure_impl(repository_ctx):
    python = find_python(repository_ctx)
    facts = run_probe(repository_ctx, python, ["frameworks"])
    interpreter = facts["python"]
    build = [
        "# Generated by //third_party:python_configure.bzl for %s (Python %s).\n" % (interpreter, facts["python_version"]),
        'load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")\n\n',
        'package(default_visibility = ["//visibility:public"])\n',
    ]

    build.append(_header_library(repository_ctx, "python_headers", [facts["python_include"]]))

    if facts.get("pybind11_include"):
        build.append(_header_library(repository_ctx, "pybind11", [facts["pybind11_include"]], deps = [":python_headers"]))
    else:
        build.append(failing_target("pybind11", "pybind11 is not importable by %s (%s); pip install pybind11" % (interpreter, facts.get("pybind11_include_error"))))

    if facts.get("xla_ffi_include"):
        build.append(_header_library(repository_ctx, "xla_ffi", [facts["xla_ffi_include"]]))
    else:
        build.append(failing_target("xla_ffi", "jax is not importable by %s (%s); pip install jax or set FP8KIT_PYTHON" % (interpreter, facts.get("xla_ffi_include_error"))))

    if facts.get("torch_include"):
        libs, text = _shared_libs(repository_ctx, "torch", facts["torch_lib"], ["torch", "torch_cpu", "torch_python", "c10"])
        build.append(text)
        build.append(_header_library(
            repository_ctx,
            "torch",
            facts["torch_include"].split(":"),
            deps = libs + [":python_headers"],
            defines = ["_GLIBCXX_USE_CXX11_ABI=%s" % facts["torch_cxx11_abi"]],
        ))
        if facts.get("torch_cuda"):
            cuda_libs, text = _shared_libs(repository_ctx, "torch_cuda", facts["torch_lib"], ["torch_cuda", "c10_cuda"])
            build.append(text)
            cuda_headers = repository_ctx.attr.cuda_headers
            if cuda_headers:
                # The CUDA headers, not the runtime: what c10's CUDA headers
                # call inline resolves to the runtime torch itself loads (a
                # dependency of libc10_cuda), and fp8kit's own is inside
                # libfp8kit.so.
                build.append("""
cc_library(
    name = "torch_cuda",
    defines = ["FP8KIT_TORCH_CUDA"],
    deps = {deps},
)
""".format(deps = repr(cuda_libs + [":torch", cuda_headers])))
            else:
                build.append(failing_target("torch_cuda", "torch %s has CUDA but fp8kit_dependencies() configured no CUDA repository (cuda_repo = None)" % facts["torch_version"]))
        else:
            build.append('\n# torch %s has no CUDA: the CUDA build of torch_ext uses CPU tensors only.\ncc_library(name = "torch_cuda")\n' % facts["torch_version"])
    else:
        why = "torch is not importable by %s (%s); pip install torch or set FP8KIT_PYTHON" % (interpreter, facts.get("torch_include_error"))
        build.append(failing_target("torch", why))
        build.append('\ncc_library(name = "torch_cuda", deps = [":torch"])\n')

    build.append("""
py_runtime(
    name = "python3_runtime",
    interpreter_path = "{interpreter}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(interpreter = interpreter))

    repository_ctx.file("BUILD", "".join(build))
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)
    repository_ctx.file("defs.bzl", "\n".join([
        '"""Facts about the configured Python (generated)."""',
        "PYTHON_BIN = %r" % interpreter,
        "",
    ]))

python_configure = repository_rule(
    implementation = _python_configure_impl,
    attrs = {
        "cuda_headers": attr.string(
            doc = "Label of the CUDA toolkit's headers, which :torch_cuda needs (a CUDA torch only); \"\" for none.",
        ),
    },
    environ = _ENV_VARS,
    local = True,
    configure = True,
)
