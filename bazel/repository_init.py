"""The fp8kit repository's directory in Bazel runfiles, standing in for the
fp8kit package that lives one level below it (fp8kit/fp8kit/).

A py_binary or py_test puts the runfiles root on sys.path ahead of its
`imports`, and a workspace that depends on fp8kit calls the repository
`fp8kit`, so `import fp8kit` finds the repository directory first. Under
legacy_create_init (the py_test default) Bazel would put an empty
__init__.py there and the real package would be shadowed. This file sits in
that place (Bazel generates none where one exists) and loads the real
package under the same name, replacing itself in sys.modules, so
`import fp8kit` is the package whatever the test's settings.
"""
import importlib.util
import os
import sys


def _load_package():
    package_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp8kit")
    spec = importlib.util.spec_from_file_location(
        __name__, os.path.join(package_dir, "__init__.py"),
        submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


# Under another repository name nothing shadows the package; stay inert.
if __name__ == "fp8kit":
    _load_package()
