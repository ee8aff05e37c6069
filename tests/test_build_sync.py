"""The Bazel and CMake builds compile the same sources with the same globs.

fp8kit has two build descriptions: CMakeLists.txt + cmake/*.cmake (pip, GPU
machine) and the BUILD files (Bazel). Both are thin: one glob per library.
This test reads both and fails when they drift:

  * the glob patterns of a library's compiled sources differ
    (CMake `file(GLOB VAR ...)` vs the BUILD target's `glob([...])`);
  * a .cc/.cu file under common/, jax_ext/, torch_ext/ or tests/cpp/ is
    compiled by one build and not the other, or by neither;
  * a header there is declared by no BUILD target (Bazel's sandbox would
    hide it from the compiler, CMake would still find it);
  * the version in CMakeLists.txt, common/BUILD and pyproject.toml differ;
  * the core is not one shared library in both, or an extension module
    links the core's objects or a CUDA runtime of its own instead of it.

Both the CPU configuration and the CUDA one (CMake with FP8KIT_WITH_CUDA,
Bazel with --//:cuda=true) are checked.

The same parse checks that the BUILD files work when fp8kit is an external
repository of another workspace: no include path or label that assumes
fp8kit is the main repository (-I copts, labels of repositories other than
@fp8kit_deps, loads from other repositories).

BUILD files are Starlark, which for BUILD files is a subset of Python: they
are executed here with stand-ins for glob/select/rules that record what
each target compiles. CMake files are tokenised into commands; `file(GLOB)`
gives the patterns, add_library/add_executable/pybind11_add_module/
target_sources say which target they feed, and an enclosing `if(...CUDA...)`
marks a CUDA-only source list.

It reads the real source tree (found through this file's real path), so
under Bazel it runs uncached (tag "external") and needs no data deps.
"""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(os.path.realpath(__file__)).parents[1]

# Directories whose C++/CUDA sources both builds must agree on.
SOURCE_DIRS = ("common", "jax_ext", "torch_ext", "tests/cpp")
COMPILED = (".cc", ".cu")
HEADERS = (".h", ".cuh")

# The libraries both builds define: CMake target -> Bazel target.
LIBRARIES = {
    "fp8kit_core": "//common:fp8kit_core",
    "_jax_ext": "//jax_ext:jax_ext",
    "_torch_ext": "//torch_ext:torch_ext",
    "fp8kit_core_test": "//tests/cpp:fp8kit_core_test",
}

CONFIGS = ("cpu", "cuda")

# The core as one shared library (libfp8kit.so), built from the core's
# objects, and the extension modules that link it: CMake target -> Bazel
# target in both.
SHARED_CORE = ("fp8kit", "//fp8kit:libfp8kit.so")
CORE_OBJECTS = ("fp8kit_core", "//common:fp8kit_core")
EXTENSIONS = {"_jax_ext": "//fp8kit:_jax_ext.so", "_torch_ext": "//fp8kit:_torch_ext.so"}

# Bazel rules whose srcs are compiled (or, for macros, passed through).
CC_RULES = ("cc_library", "cc_binary", "cc_test")


# --------------------------------------------------------------- globbing ---

def _glob_regex(pattern):
    """Bazel/CMake glob pattern (no brackets) -> compiled regex."""
    out = []
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append("(?:.*/)?" if not last else ".*")
            continue
        seg = ""
        for ch in part:
            if ch == "*":
                seg += "[^/]*"
            elif ch == "?":
                seg += "[^/]"
            else:
                seg += re.escape(ch)
        out.append(seg + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


def _files_under(root, pkg_dir, stop_at_packages):
    """Repo-relative paths of files under pkg_dir (not into subpackages)."""
    base = root / pkg_dir if pkg_dir else root
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        keep = []
        for d in dirnames:
            sub = Path(dirpath) / d
            if d.startswith("bazel-") or d == ".git" or d == "__pycache__":
                continue
            if stop_at_packages and any((sub / b).is_file() for b in ("BUILD", "BUILD.bazel")):
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            found.append(f if rel_dir == "." else "%s/%s" % (rel_dir, f))
    return sorted(found)


def expand(root, patterns, pkg="", excludes=(), stop_at_packages=False):
    """Files matching glob `patterns` (relative to package `pkg`)."""
    files = _files_under(root, pkg, stop_at_packages)
    prefix = pkg + "/" if pkg else ""
    inc = [_glob_regex(prefix + p) for p in patterns]
    exc = [_glob_regex(prefix + p) for p in excludes]
    return {f for f in files if any(r.match(f) for r in inc) and not any(r.match(f) for r in exc)}


# ------------------------------------------------------------------ CMake ---

def _cmake_commands(text):
    """Yields (command name, [args]) of a CMake file, in order."""
    text = re.sub(r"#\[\[.*?\]\]", "", text, flags=re.S)
    i, n = 0, len(text)
    name_re = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
    while i < n:
        if text[i] == "#":
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        m = name_re.match(text, i)
        if not m:
            i += 1
            continue
        # Collect arguments up to the matching parenthesis.
        j, depth, args, cur, in_str = m.end(), 1, [], "", False
        while j < n and depth:
            ch = text[j]
            if in_str:
                if ch == "\\" and j + 1 < n:
                    cur += text[j:j + 2]
                    j += 2
                    continue
                if ch == '"':
                    in_str = False
                else:
                    cur += ch
            elif ch == '"':
                in_str = True
            elif ch == "#":
                j = text.find("\n", j)
                j = n if j < 0 else j
                continue
            elif ch == "(":
                depth += 1
                cur += ch
            elif ch == ")":
                depth -= 1
                if depth:
                    cur += ch
            elif ch.isspace():
                if cur:
                    args.append(cur)
                    cur = ""
            else:
                cur += ch
            j += 1
        if cur:
            args.append(cur)
        yield m.group(1).lower(), args
        i = j


def parse_cmake(root):
    """Returns (globs, uses, version).

    globs: VAR -> [repo-relative patterns] from file(GLOB[_RECURSE] VAR ...).
    uses: [(cmake target, VAR, cuda_only)] for each source list a target gets.
    """
    files = [root / "CMakeLists.txt"] + sorted((root / "cmake").glob("*.cmake"))
    globs, uses, version = {}, [], None
    for path in files:
        if not path.is_file():
            continue
        conditions = []
        for cmd, args in _cmake_commands(path.read_text()):
            if cmd == "if":
                conditions.append(" ".join(args))
            elif cmd == "endif" and conditions:
                conditions.pop()
            elif cmd == "project" and "VERSION" in args:
                version = args[args.index("VERSION") + 1]
            elif cmd == "file" and args and args[0] in ("GLOB", "GLOB_RECURSE"):
                pats = [a for a in args[2:] if a not in ("CONFIGURE_DEPENDS", "LIST_DIRECTORIES", "true", "false")]
                globs[args[1]] = [re.sub(r"^\$\{(CMAKE_CURRENT_SOURCE_DIR|PROJECT_SOURCE_DIR|CMAKE_SOURCE_DIR)\}/", "", p)
                                  for p in pats]
            elif cmd in ("add_library", "add_executable", "pybind11_add_module", "target_sources") and args:
                cuda_only = any("CUDA" in c for c in conditions)
                for a in args[1:]:
                    for var in re.findall(r"\$\{(\w+)\}", a):
                        uses.append((args[0], var, cuda_only))
    return globs, uses, version


# ------------------------------------------------------------------ Bazel ---

class Glob:
    def __init__(self, pkg, include, exclude):
        self.pkg, self.include, self.exclude = pkg, list(include), list(exclude)

    def patterns(self):
        prefix = self.pkg + "/" if self.pkg else ""
        return [prefix + p for p in self.include]


class Sel:
    """A Starlark list value that may hold globs and select()s."""

    def __init__(self, parts):
        self.parts = parts  # each: ("items", [..]) or ("select", {cond: value})

    @staticmethod
    def of(value):
        if isinstance(value, Sel):
            return value
        return Sel([("items", list(value))])

    def __add__(self, other):
        return Sel(self.parts + Sel.of(other).parts)

    def __radd__(self, other):
        return Sel(Sel.of(other).parts + self.parts)

    def resolve(self, config):
        """The flat list of items in `config` ("cpu" or "cuda")."""
        out = []
        for kind, value in self.parts:
            if kind == "items":
                for v in value:
                    out.extend(Sel.of(v).resolve(config) if isinstance(v, Sel) else [v])
                continue
            chosen = None
            if config == "cuda":
                chosen = next((v for k, v in value.items() if "cuda" in k), None)
            if chosen is None:
                chosen = value.get("//conditions:default", [])
            out.extend(Sel.of(chosen).resolve(config))
        return out


class Rule:
    def __init__(self, kind, pkg, attrs):
        self.kind, self.pkg, self.attrs = kind, pkg, attrs
        self.label = "//%s:%s" % (pkg, attrs.get("name"))

    def items(self, attr, config):
        return Sel.of(self.attrs.get(attr, [])).resolve(config)


class _Recorder:
    """Callable stand-in for a rule or macro; records each call."""

    def __init__(self, kind, pkg, rules, passes_srcs=False):
        self.kind, self.pkg, self.rules, self.passes_srcs = kind, pkg, rules, passes_srcs

    def __call__(self, *args, **attrs):
        rule = Rule(self.kind, self.pkg, attrs)
        self.rules.append(rule)
        if self.passes_srcs:
            # A macro such as cuda_objects returns what it builds from srcs.
            return Sel.of(attrs.get("srcs", [])) + Sel.of(attrs.get("hdrs", []))
        return None


class _Namespace(dict):
    """Globals for exec'ing a BUILD file: unknown names become rules."""

    def __init__(self, pkg, rules, root):
        super().__init__()
        self.pkg, self.rules, self.loads = pkg, rules, []
        self["glob"] = lambda include, exclude=(), **kw: Sel([("items", [Glob(pkg, include, exclude)])])
        self["select"] = lambda branches, **kw: Sel([("select", dict(branches))])
        self["load"] = self._load
        self["__builtins__"] = {"len": len, "repr": repr, "str": str, "sorted": sorted,
                                "list": list, "dict": dict, "range": range, "enumerate": enumerate,
                                "True": True, "False": False, "None": None}

    def _load(self, label, *names, **aliases):
        self.loads.append(label)
        for n in names:
            self[n] = _Recorder(n, self.pkg, self.rules, passes_srcs=True)
        for alias, n in aliases.items():
            self[alias] = _Recorder(n, self.pkg, self.rules, passes_srcs=True)

    def __missing__(self, key):
        return _Recorder(key, self.pkg, self.rules)


def _ignored_dirs(root):
    path = root / ".bazelignore"
    if not path.is_file():
        return set()
    return {l.strip().strip("/") for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")}


def parse_bazel(root):
    """Executes every BUILD file; returns ({label: Rule}, {package: {NAME: value}},
    {package: [labels of the .bzl files it loads]})."""
    rules, consts, loads = [], {}, {}
    ignored = _ignored_dirs(root)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        dirnames[:] = [d for d in dirnames
                       if not d.startswith("bazel-") and d not in (".git", "__pycache__")
                       and ("%s/%s" % (rel, d)).lstrip("/") not in ignored
                       and not (Path(dirpath) / d / "WORKSPACE").is_file()]
        build = next((f for f in ("BUILD.bazel", "BUILD") if f in filenames), None)
        if build is None:
            continue
        ns = _Namespace(rel, rules, root)
        code = compile((Path(dirpath) / build).read_text(), str(Path(dirpath) / build), "exec")
        exec(code, ns)  # noqa: S102 - our own BUILD files, parsed as Starlark
        consts[rel] = {k: v for k, v in ns.items() if k.isupper()}
        loads[rel] = ns.loads
    return {r.label: r for r in rules if "name" in r.attrs}, consts, loads


def _bazel_compiled(root, rule, config):
    """(source patterns, compiled files) of a cc rule in `config`."""
    pats, files = [], set()
    for item in rule.items("srcs", config):
        if isinstance(item, Glob):
            for p in item.patterns():
                if p.endswith(COMPILED):
                    pats.append(p)
            files |= {f for f in expand(root, item.include, item.pkg, item.exclude, stop_at_packages=True)
                      if f.endswith(COMPILED)}
        elif isinstance(item, str) and item.endswith(COMPILED) and not item.startswith(("@", "/", ":")):
            pats.append("%s/%s" % (rule.pkg, item))
            files.add("%s/%s" % (rule.pkg, item))
    return sorted(pats), files


def _bazel_declared_headers(root, rules):
    """Every file any Bazel glob declares (any attribute, any config)."""
    declared = set()
    for rule in rules.values():
        for attr in ("srcs", "hdrs", "textual_hdrs"):
            for config in CONFIGS:
                for item in rule.items(attr, config):
                    if isinstance(item, Glob):
                        declared |= expand(root, item.include, item.pkg, item.exclude, stop_at_packages=True)
    return declared


# ------------------------------------------------------------ the checks ---

def check_tree(root):
    """All the ways the two builds disagree, as readable strings."""
    root = Path(root)
    problems = []
    globs, uses, cmake_version = parse_cmake(root)
    rules, consts, _ = parse_bazel(root)

    for var in sorted({v for _, v, _ in uses if v not in globs}):
        problems.append("CMake: a target uses ${%s}, which no file(GLOB) defines" % var)
    for target in sorted({t for t, _, _ in uses} - set(LIBRARIES)):
        problems.append("CMake target %s has sources but no Bazel twin in LIBRARIES "
                        "(tests/test_build_sync.py)" % target)
    for label, rule in sorted(rules.items()):
        if rule.kind in CC_RULES and label not in LIBRARIES.values():
            for config in CONFIGS:
                if _bazel_compiled(root, rule, config)[1]:
                    problems.append("Bazel target %s compiles sources but has no CMake twin in LIBRARIES" % label)
                    break

    cmake_all, bazel_all = set(), set()
    for target, label in LIBRARIES.items():
        rule = rules.get(label)
        if rule is None:
            problems.append("Bazel target %s (CMake %s) is missing" % (label, target))
            continue
        for config in CONFIGS:
            cm_pats = sorted({p for t, var, cuda in uses if t == target and (config == "cuda" or not cuda)
                              for p in globs.get(var, [])})
            bz_pats, bz_files = _bazel_compiled(root, rule, config)
            if sorted(set(bz_pats)) != cm_pats:
                problems.append("%s (%s): CMake globs %s but Bazel %s globs %s"
                                % (target, config, cm_pats, label, sorted(set(bz_pats))))
            cm_files = expand(root, cm_pats)
            for f in sorted(cm_files - bz_files):
                problems.append("%s (%s): %s is compiled by CMake, not by Bazel %s" % (target, config, f, label))
            for f in sorted(bz_files - cm_files):
                problems.append("%s (%s): %s is compiled by Bazel %s, not by CMake" % (target, config, f, label))
            cmake_all |= cm_files
            bazel_all |= bz_files

    sources = [f for d in SOURCE_DIRS for f in _files_under(root, d, False) if (root / d).is_dir()]
    for f in sources:
        if f.endswith(COMPILED) and f not in cmake_all and f not in bazel_all:
            problems.append("%s is compiled by neither build (rename it or extend both globs)" % f)
    declared = _bazel_declared_headers(root, rules)
    for f in sources:
        if f.endswith(HEADERS) and f not in declared:
            problems.append("%s is declared in no BUILD file (Bazel's sandbox would hide it)" % f)

    bazel_version = consts.get("common", {}).get("FP8KIT_VERSION")
    pyproject = root / "pyproject.toml"
    m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
    versions = {"CMakeLists.txt": cmake_version, "common/BUILD": bazel_version,
                "pyproject.toml": m.group(1) if m else None}
    if len(set(versions.values())) != 1:
        problems.append("versions differ: %s" % versions)
    return problems + one_core_problems(root, rules)


# -------------------------------------------------- one core per process ---

def _cmake_linking(root):
    """({target: add_library type}, {target: set of target_link_libraries items})."""
    kinds, links = {}, {}
    for path in [root / "CMakeLists.txt"] + sorted((root / "cmake").glob("*.cmake")):
        if not path.is_file():
            continue
        for cmd, args in _cmake_commands(path.read_text()):
            if cmd == "add_library" and len(args) > 1:
                kinds[args[0]] = args[1]
            elif cmd == "target_link_libraries" and args:
                links.setdefault(args[0], set()).update(
                    a for a in args[1:] if a not in ("PRIVATE", "PUBLIC", "INTERFACE"))
    return kinds, links


def _label(pkg, dep):
    """A dependency label of package `pkg`, absolute: //pkg:name or @repo//..."""
    if dep.startswith(":"):
        return "//%s:%s" % (pkg, dep[1:])
    if dep.startswith("//") and ":" not in dep:
        return "%s:%s" % (dep, dep.rsplit("/", 1)[-1])
    return dep


def _bazel_links(rules, label):
    """Labels `label` links through its deps, in any config; stops at a
    cc_import (a prebuilt library: it is linked, its inputs are not)."""
    seen, todo = set(), [label]
    while todo:
        rule = rules.get(todo.pop())
        if rule is None or rule.kind == "cc_import":
            continue
        for config in CONFIGS:
            for dep in rule.items("deps", config):
                dep = _label(rule.pkg, dep)
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
    return seen


def one_core_problems(root, rules):
    """Ways either build gives a process more than one core or CUDA runtime."""
    problems = []
    kinds, links = _cmake_linking(root)
    core, core_label = SHARED_CORE
    if kinds.get(core) != "SHARED" or CORE_OBJECTS[0] not in links.get(core, ()):
        problems.append("CMake: %s must be a SHARED library linking %s" % (core, CORE_OBJECTS[0]))
    rule = rules.get(core_label)
    if (rule is None or rule.kind != "cc_binary" or not rule.attrs.get("linkshared")
            or CORE_OBJECTS[1] not in _bazel_links(rules, core_label)):
        problems.append("Bazel: %s must be a cc_binary with linkshared linking %s"
                        % (core_label, CORE_OBJECTS[1]))
    imports = {r.label for r in rules.values() if r.kind == "cc_import"
               and _label(r.pkg, r.attrs.get("shared_library", "")) == core_label}
    for target, label in sorted(EXTENSIONS.items()):
        mine = links.get(target, set())
        if core not in mine:
            problems.append("CMake: %s does not link %s" % (target, core))
        for item in sorted(i for i in mine if i == CORE_OBJECTS[0] or "cudart" in i):
            problems.append("CMake: %s links %s; it must reach the core and the CUDA runtime "
                            "through %s only" % (target, item, core))
        linked = _bazel_links(rules, label)
        if not linked & imports:
            problems.append("Bazel: %s does not link %s (through a cc_import of it)" % (label, core_label))
        for dep in sorted(d for d in linked if d in ("//common:core", CORE_OBJECTS[1])
                          or d.endswith(":cudart")):
            problems.append("Bazel: %s links %s; it must reach the core and the CUDA runtime "
                            "through %s only" % (label, dep, core_label))
    return problems


# ----------------------------------------- usable from another workspace ---

# Repositories fp8kit's BUILD files may name: the aliases that
# fp8kit_dependencies() defines (@fp8kit_deps, whose targets point at
# repositories of configurable names) and Bazel's own.
ALLOWED_REPOSITORIES = ("@fp8kit_deps//", "@bazel_tools//")


def _strings(value):
    """Every string in an attribute value (lists, dicts, select()s)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Sel):
        for kind, part in value.parts:
            yield from _strings(part if kind == "items" else list(part.keys()) + list(part.values()))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def portability_problems(root):
    """Ways the BUILD files assume fp8kit is the main repository."""
    problems = []
    rules, _, loads = parse_bazel(Path(root))
    for pkg, labels in sorted(loads.items()):
        for label in labels:
            if label.startswith("@") and not label.startswith("@bazel_tools//"):
                problems.append("//%s loads %s: a dependent workspace may not have that "
                                "repository, and loading it fetches it even for builds that "
                                "do not use it" % (pkg, label))
    # .bzl files that BUILD files load, and what they load in turn.
    ignored = _ignored_dirs(Path(root))
    for path in sorted(Path(root).rglob("*.bzl")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("bazel-") or any(rel == d or rel.startswith(d + "/") for d in ignored):
            continue
        for label in re.findall(r'^load\(\s*"(@[^"]*)"', path.read_text(), re.M):
            if not label.startswith("@bazel_tools//"):
                problems.append("%s loads %s: every BUILD file that loads %s would fetch it"
                                % (rel, label, rel))
    for label, rule in sorted(rules.items()):
        for attr, value in sorted(rule.attrs.items()):
            for text in _strings(value):
                if attr in ("copts", "nvcc_flags") and text.startswith(("-I", "-iquote", "-isystem")):
                    problems.append("%s: copt %s is relative to the main repository; use "
                                    "includes/strip_include_prefix on a cc_library" % (label, text))
                if text.startswith("@") and not text.startswith(ALLOWED_REPOSITORIES):
                    problems.append("%s: %s names a repository the dependent workspace may call "
                                    "otherwise; go through @fp8kit_deps" % (label, text))
    return problems


def test_bazel_and_cmake_compile_the_same_sources():
    problems = check_tree(ROOT)
    assert not problems, "Bazel and CMake builds drifted:\n  " + "\n  ".join(problems)


# ------------------------------------------- the checker catches drift ---

_CMAKE = """
project(demo VERSION 1.2.3 LANGUAGES CXX)
file(GLOB FP8KIT_CORE_SRCS CONFIGURE_DEPENDS common/src/*.cc)
file(GLOB FP8KIT_CORE_CUDA_SRCS CONFIGURE_DEPENDS common/cuda/*.cu common/cuda/*.cc)
add_library(fp8kit_core OBJECT ${FP8KIT_CORE_SRCS})
if(FP8KIT_WITH_CUDA)  # a comment (with parentheses)
  target_sources(fp8kit_core PRIVATE ${FP8KIT_CORE_CUDA_SRCS})
  target_link_libraries(fp8kit_core PUBLIC CUDA::cudart_static)
endif()
add_library(fp8kit SHARED)
target_link_libraries(fp8kit PRIVATE fp8kit_core)
file(GLOB FP8KIT_JAX_SRCS CONFIGURE_DEPENDS jax_ext/*.cc)
pybind11_add_module(_jax_ext MODULE ${FP8KIT_JAX_SRCS})
target_link_libraries(_jax_ext PRIVATE fp8kit)
file(GLOB FP8KIT_TORCH_SRCS CONFIGURE_DEPENDS torch_ext/*.cc)
pybind11_add_module(_torch_ext MODULE ${FP8KIT_TORCH_SRCS})
target_link_libraries(_torch_ext PRIVATE fp8kit)
file(GLOB FP8KIT_CPP_TEST_SRCS CONFIGURE_DEPENDS tests/cpp/*_test.cc)
add_executable(fp8kit_core_test ${FP8KIT_CPP_TEST_SRCS})
"""

_BUILDS = {
    "common/BUILD": '''
load("//bazel:cuda.bzl", "cuda_objects")
FP8KIT_VERSION = "1.2.3"
cc_library(
    name = "fp8kit_core",
    srcs = glob(["src/*.cc"]) + glob(["src/*.h"]) + select({
        "//:cuda_enabled": glob(["cuda/*.cc"]) + cuda_objects(name = "o", srcs = glob(["cuda/*.cu"])),
        "//conditions:default": [],
    }),
    hdrs = glob(["include/fp8kit/*.h"]),
)
''',
    "jax_ext/BUILD": 'cc_library(name = "jax_ext", srcs = glob(["*.cc"]) + glob(["*.h"]))\n',
    "torch_ext/BUILD": 'cc_library(name = "torch_ext", srcs = glob(["*.cc"]))\n',
    "fp8kit/BUILD": '''
cc_binary(name = "libfp8kit.so", linkshared = 1, deps = ["//common:fp8kit_core"])
cc_import(name = "libfp8kit", shared_library = ":libfp8kit.so")
cc_binary(name = "_jax_ext.so", linkshared = 1, deps = [":libfp8kit", "//jax_ext"])
cc_binary(name = "_torch_ext.so", linkshared = 1, deps = [":libfp8kit", "//torch_ext"])
''',
    "tests/cpp/BUILD": 'cc_test(name = "fp8kit_core_test", srcs = glob(["*_test.cc"]))\n',
}


def _make_tree(tmp_path, cmake=_CMAKE, builds=None, files=()):
    (tmp_path / "cmake").mkdir()
    (tmp_path / "CMakeLists.txt").write_text(cmake)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.2.3"\n')
    for path, text in dict(_BUILDS, **(builds or {})).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for f in ("common/src/a.cc", "common/src/a.h", "common/include/fp8kit/a.h", "common/cuda/k.cu",
              "common/cuda/g.cc", "jax_ext/m.cc", "torch_ext/t.cc", "tests/cpp/a_test.cc") + tuple(files):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    return tmp_path


def test_build_files_work_from_another_workspace():
    problems = portability_problems(ROOT)
    assert not problems, "BUILD files assume fp8kit is the main repository:\n  " + "\n  ".join(problems)


def test_portability_check_catches_main_repository_assumptions(tmp_path):
    builds = {"torch_ext/BUILD": '''
load("@local_cuda//:defs.bzl", "NVCC")
cc_library(
    name = "torch_ext",
    srcs = glob(["*.cc"]),
    copts = ["-Itorch_ext"],
    deps = ["@fp8kit_deps//:torch"] + select({"//:cuda_enabled": ["@local_cuda//:cudart"]}),
)
'''}
    problems = portability_problems(_make_tree(tmp_path, builds=builds))
    assert any("loads @local_cuda//:defs.bzl" in p for p in problems), problems
    assert any("copt -Itorch_ext" in p for p in problems), problems
    assert any("@local_cuda//:cudart names a repository" in p for p in problems), problems
    assert len(problems) == 3, problems  # @fp8kit_deps//:torch is fine


def test_checker_accepts_matching_builds(tmp_path):
    assert check_tree(_make_tree(tmp_path)) == []


def test_checker_catches_different_patterns(tmp_path):
    builds = {"torch_ext/BUILD": 'cc_library(name = "torch_ext", srcs = glob(["*.cc", "extra/*.cc"]))\n'}
    problems = check_tree(_make_tree(tmp_path, builds=builds, files=["torch_ext/extra/x.cc"]))
    assert any("_torch_ext (cpu): CMake globs" in p for p in problems), problems
    assert any("torch_ext/extra/x.cc is compiled by Bazel" in p for p in problems), problems


def test_checker_catches_cuda_source_missing_from_bazel(tmp_path):
    builds = {"common/BUILD": _BUILDS["common/BUILD"].replace('glob(["cuda/*.cc"]) + ', "")}
    problems = check_tree(_make_tree(tmp_path, builds=builds))
    assert any("common/cuda/g.cc is compiled by CMake, not by Bazel" in p for p in problems), problems
    assert not any("(cpu)" in p for p in problems), problems


def test_checker_catches_file_neither_build_compiles(tmp_path):
    problems = check_tree(_make_tree(tmp_path, files=["tests/cpp/helpers.cc", "torch_ext/detail/x.h"]))
    assert any("tests/cpp/helpers.cc is compiled by neither" in p for p in problems), problems
    assert any("torch_ext/detail/x.h is declared in no BUILD" in p for p in problems), problems


def test_checker_catches_missing_library_and_version_drift(tmp_path):
    cmake = _CMAKE.replace("VERSION 1.2.3", "VERSION 1.2.4") + \
        "file(GLOB EXTRA_SRCS extra/*.cc)\nadd_library(extra ${EXTRA_SRCS})\n"
    problems = check_tree(_make_tree(tmp_path, cmake=cmake, builds={"tests/cpp/BUILD": ""}))
    assert any("CMake target extra has sources but no Bazel twin" in p for p in problems), problems
    assert any("//tests/cpp:fp8kit_core_test (CMake fp8kit_core_test) is missing" in p for p in problems), problems
    assert any("versions differ" in p for p in problems), problems


def test_checker_catches_a_second_core(tmp_path):
    cmake = _CMAKE.replace("target_link_libraries(_jax_ext PRIVATE fp8kit)",
                           "target_link_libraries(_jax_ext PRIVATE fp8kit_core CUDA::cudart)")
    builds = {"torch_ext/BUILD": '''
cc_library(
    name = "torch_ext",
    srcs = glob(["*.cc"]),
    deps = ["//common:core"] + select({"//:cuda_enabled": ["@fp8kit_deps//:cudart"]}),
)
'''}
    problems = check_tree(_make_tree(tmp_path, cmake=cmake, builds=builds))
    assert "CMake: _jax_ext does not link fp8kit" in problems, problems
    assert any("CMake: _jax_ext links fp8kit_core;" in p for p in problems), problems
    assert any("CMake: _jax_ext links CUDA::cudart;" in p for p in problems), problems
    assert any("//fp8kit:_torch_ext.so links //common:core;" in p for p in problems), problems
    assert any("//fp8kit:_torch_ext.so links @fp8kit_deps//:cudart;" in p for p in problems), problems
    assert len(problems) == 5, problems


def test_checker_catches_a_static_core(tmp_path):
    cmake = _CMAKE.replace("add_library(fp8kit SHARED)", "add_library(fp8kit STATIC)")
    builds = {"fp8kit/BUILD": _BUILDS["fp8kit/BUILD"].replace('shared_library = ":libfp8kit.so"',
                                                              'shared_library = ":other.so"')}
    problems = check_tree(_make_tree(tmp_path, cmake=cmake, builds=builds))
    assert "CMake: fp8kit must be a SHARED library linking fp8kit_core" in problems, problems
    assert any("//fp8kit:_jax_ext.so does not link //fp8kit:libfp8kit.so" in p for p in problems), problems
    assert len(problems) == 3, problems


@pytest.mark.parametrize("pattern,path,hit", [
    ("common/src/*.cc", "common/src/a.cc", True),
    ("common/src/*.cc", "common/src/sub/a.cc", False),
    ("src/**/*.h", "src/a.h", True),
    ("src/**/*.h", "src/x/y/a.h", True),
    ("tests/cpp/*_test.cc", "tests/cpp/helpers.cc", False),
])
def test_glob_semantics(pattern, path, hit):
    assert bool(_glob_regex(pattern).match(path)) == hit
