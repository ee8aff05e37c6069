"""Running a script in a child JAX process with two CPU devices: XLA's host
device count is fixed when jax starts, so tests that need two devices on a
CPU-only machine run their check there and read its output."""

import os
import subprocess
import sys
import textwrap


def run(script: str) -> str:
    """The stdout of `script` (dedented) run with two CPU devices; the
    child's stderr in the assertion message when it fails."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") +
               " --xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout
