"""fp8kit_py_tests: the pytest files of a package, run through pytest.

The runner, bazel/pytest_runner.py, hands test files to pytest.main, so
pytest features (fixtures, parametrize, skips, conftest.py) work as they
do under plain `pytest tests/`, from this workspace or from one that
depends on fp8kit.

Each file gets a py_test of its own, named after it. With `group`, those
are tagged "manual" (run by name only), and one sharded py_test named
`group` runs all the files instead, several in each pytest process: every
process pays some seconds for importing torch, JAX and the reference
before its first test, and one process per file made that most of the
suite's time on a 2-core machine.
"""

def fp8kit_py_tests(srcs, deps = ["//fp8kit"], data = [], size = "medium", tags = [],
                    group = None, shard_count = 1):
    """py_tests for the files in `srcs` (test_*.py files of this package).

    Each test also gets the package's other .py files (conftest.py, shared
    reference helpers such as torch_reference.py) and //tests:pytest_support.
    Per-file tests are visible to //tests only, whose test suites are the
    public way to run them. `tags` go on every target of the call: a
    package whose files want different tags calls the macro once per set of
    files; "manual" keeps a target out of `bazel test //...` (and of any
    other target pattern) while `bazel test //pkg:test_name` still runs it.

    group: the name of a py_test that runs every file of `srcs`, its files
      dealt round-robin over `shard_count` shards (one pytest process per
      shard); the per-file tests are then "manual". Naming the group after
      the package makes `bazel test //tests/torch` run it.
    """
    helpers = native.glob(["*.py"], exclude = ["test_*.py"])
    common = dict(
        main = "//bazel:pytest_runner.py",
        deps = deps,
        data = data + ["//tests:pytest_support"],
        # pytest imports test files by their directory (no generated
        # __init__.py making tests/ a package of the repository).
        legacy_create_init = False,
        python_version = "PY3",
        srcs_version = "PY3",
        size = size,
    )
    for src in srcs:
        native.py_test(
            name = src[:-len(".py")],
            srcs = [src, "//bazel:pytest_runner.py"] + helpers,
            # rootpath is relative to the runfiles directory of the main
            # repository, also when fp8kit is an external one (../fp8kit/...).
            args = ["$(rootpath %s)" % src],
            tags = tags + (["manual"] if group else []),
            visibility = ["//tests:__pkg__"],
            **common
        )
    if group:
        native.py_test(
            name = group,
            srcs = srcs + ["//bazel:pytest_runner.py"] + helpers,
            args = ["$(rootpath %s)" % src for src in sorted(srcs)],
            shard_count = shard_count,
            tags = tags,
            visibility = ["//visibility:public"],
            **common
        )
