"""Runs pytest files as a Bazel py_test: pytest_runner.py <test file>...

Bazel runs tests from the runfiles tree, which is read-only and has no
pytest configuration of its own, so the runner points pytest at fp8kit's
pyproject.toml (shipped as data next to the tests: the nearest one above the
first test file, which is found also when fp8kit is an external repository
and the working directory is the main repository's), keeps its cache and
bytecode out of the tree, and writes JUnit XML where Bazel expects it.

A sharded target (shard_count) runs, in shard i of n, the files i, i + n,
i + 2n, ... of its arguments, in one pytest process.
"""
import os
import sys

sys.dont_write_bytecode = True

import pytest  # noqa: E402


def find_config(test_file):
    """Directory of the nearest pyproject.toml above `test_file`, or None."""
    directory = os.path.dirname(os.path.abspath(test_file))
    while True:
        if os.path.isfile(os.path.join(directory, "pyproject.toml")):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def runfiles_path(test_file):
    """Where `test_file` (a rootpath) is in the runfiles tree."""
    # A file of another repository is external/<repo>/... under the main
    # repository's runfiles only with --legacy_external_runfiles (Bazel 4's
    # default); it is always at ../<repo>/...
    if not os.path.exists(test_file) and test_file.startswith("external/"):
        return os.path.join("..", test_file[len("external/"):])
    return test_file


def this_shards_files(test_files):
    """The files of this shard, when Bazel runs the target sharded."""
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    index = int(os.environ.get("TEST_SHARD_INDEX", "0"))
    status = os.environ.get("TEST_SHARD_STATUS_FILE")
    if status:  # tells Bazel that this runner shards
        open(status, "w").close()
    return test_files[index::total]


def main(argv):
    if not argv:
        sys.stderr.write("usage: pytest_runner.py <test file>...\n")
        return 2
    test_files = this_shards_files([runfiles_path(f) for f in argv])
    if not test_files:
        print("pytest_runner: more shards than test files; this shard runs none")
        return 0
    args = test_files + ["-p", "no:cacheprovider", "-ra"]
    root = find_config(test_files[0])
    if root is not None:
        args += ["-c", os.path.join(root, "pyproject.toml"), "--rootdir", root]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    return pytest.main(args)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
