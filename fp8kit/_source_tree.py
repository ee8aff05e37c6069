"""Why fp8kit's compiled extensions are missing, when the reason is the
usual one: `python -m fp8kit.<tool>` run from a source checkout imports
./fp8kit, which has no compiled modules, instead of the installed package."""

import glob
import os


def source_tree_hint() -> str:
    """A sentence to append to an import error, or "" when the imported
    fp8kit does hold compiled extensions."""
    import fp8kit  # noqa: PLC0415  (the package this module belongs to)

    pkg = os.path.dirname(os.path.realpath(fp8kit.__file__))
    if glob.glob(os.path.join(pkg, "_*_ext*.so")) or glob.glob(os.path.join(pkg, "_*_ext*.pyd")):
        return ""
    return (f" (fp8kit was imported from {pkg}, which holds no compiled extensions: run from "
            "another directory so that the installed fp8kit is imported, or build in place)")
