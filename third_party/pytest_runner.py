"""Runs one pytest file as a Bazel py_test: pytest_runner.py <test file>.

Bazel runs tests from the runfiles tree, which is read-only and has no
pytest configuration of its own, so the runner points pytest at the repo's
pyproject.toml (shipped as data), keeps its cache and bytecode out of the
tree, and writes JUnit XML where Bazel expects it.
"""
import os
import sys

sys.dont_write_bytecode = True

import pytest  # noqa: E402


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: pytest_runner.py <test file>\n")
        return 2
    args = [argv[0], "-p", "no:cacheprovider", "-ra"]
    if os.path.exists("pyproject.toml"):
        args += ["-c", "pyproject.toml", "--rootdir", "."]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    return pytest.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
