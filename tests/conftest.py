"""Shared setup for every test under tests/: puts this folder on sys.path,
so that the tests of each front end (tests/torch, tests/jax,
tests/hardening and the child processes it starts) import the shared NumPy
reference as `import fp8_reference`, as they import the helper modules of
their own folder. Under Bazel the py_library //tests:fp8_reference does the
same (imports = ["."])."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
