"""Facts about the run that go into the JSON file: versions, device, commit."""

from __future__ import annotations

import os
import platform
import subprocess
import time

import fp8kit


def _git(*args) -> str | None:
    repo = os.path.dirname(os.path.dirname(os.path.realpath(fp8kit.__file__)))
    try:
        out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def collect(torch_device: str) -> dict:
    m = {"time": time.strftime("%Y-%m-%d %H:%M:%S %z"), "host": platform.node(),
         "python": platform.python_version(), "fp8kit": fp8kit.__version__,
         "commit": _git("rev-parse", "HEAD")}
    status = _git("status", "--porcelain", "--untracked-files=no")
    m["commit_dirty"] = None if status is None else bool(status)
    try:
        import torch
        m["torch"] = torch.__version__
        m["torch_cuda"] = torch.version.cuda
        if torch_device == "cuda":
            m["device"] = torch.cuda.get_device_name()
            m["capability"] = list(torch.cuda.get_device_capability())
        else:
            m["device"] = platform.processor() or platform.machine()
            m["cpu_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        import jax
        m["jax"] = jax.__version__
        m["jax_backend"] = jax.default_backend()
    except ImportError:
        pass
    return m
