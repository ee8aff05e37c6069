"""fp8kit_py_tests: one py_test per pytest file, run through pytest.

Each tests/**/test_*.py becomes a py_test named after the file whose main is
bazel/pytest_runner.py; the runner hands the file to pytest.main, so pytest
features (fixtures, parametrize, skips, conftest.py) work as they do under
plain `pytest tests/`, from this workspace or from one that depends on
fp8kit.
"""

def fp8kit_py_tests(srcs, deps = ["//fp8kit"], data = [], size = "medium", tags = []):
    """One py_test per file in `srcs` (test_*.py files of this package).

    Each test also gets the package's other .py files (conftest.py, shared
    reference helpers such as torch_reference.py) and //tests:pytest_support.
    Tests are visible to //tests only, whose test suites are the public way
    to run them. `tags` go on every target of the call: a package whose
    files want different tags calls the macro once per set of files;
    "manual" keeps a target out of `bazel test //...` (and of any other
    target pattern) while `bazel test //pkg:test_name` still runs it.
    """
    helpers = native.glob(["*.py"], exclude = ["test_*.py"])
    for src in srcs:
        native.py_test(
            name = src[:-len(".py")],
            srcs = [src, "//bazel:pytest_runner.py"] + helpers,
            main = "//bazel:pytest_runner.py",
            # rootpath is relative to the runfiles directory of the main
            # repository, also when fp8kit is an external one (../fp8kit/...).
            args = ["$(rootpath %s)" % src],
            deps = deps,
            data = data + ["//tests:pytest_support"],
            # pytest imports test files by their directory (no generated
            # __init__.py making tests/ a package of the repository).
            legacy_create_init = False,
            python_version = "PY3",
            srcs_version = "PY3",
            size = size,
            tags = tags,
            visibility = ["//tests:__pkg__"],
        )
