"""Runs the hardening tests in child processes, so that a segfault, an abort
or a hang in fp8kit is one failing test with a reproducer, not the end of
the pytest run (or a run that never ends).

One child (child_worker.py) serves the tests of one test file in turn, so
torch and jax are imported once per file; a child that dies (signal,
exit) or does not answer within the test's timeout is killed and reported,
and the next test starts a fresh one. Tests that measure the process
itself (memory growth) ask for a fresh child of their own.
"""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(os.path.realpath(__file__)).parent
WORKER = HERE / "child_worker.py"
# How long one test may run before its child counts as hung.
TIMEOUT_S = float(os.environ.get("FP8KIT_HARDENING_TIMEOUT_S", "240"))


def functions(module: str, prefix: str = "check_") -> list[str]:
    """Names of the top-level functions `prefix*` of HERE/module.py, read
    without importing it (the parent never runs fp8kit code)."""
    tree = ast.parse((HERE / f"{module}.py").read_text())
    return [n.name for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name.startswith(prefix)]


def _env(log: str) -> dict:
    env = dict(os.environ)
    # The child sees the same fp8kit (installed, or the source tree) as
    # this process, plus this folder for the test modules.
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in sys.path if p])
    env["FP8KIT_HARDENING_EXAMPLE_LOG"] = log
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # Keep JAX off any GPU unless a test asks for one, and from taking
    # most of its memory when it does.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


class Child:
    """A worker process answering run requests (see child_worker.py)."""

    def __init__(self):
        self._log = tempfile.NamedTemporaryFile(prefix="fp8kit-example-", suffix=".txt",
                                                delete=False)
        self._log.close()
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-u", str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=_env(self._log.name), cwd=tempfile.gettempdir(),
                                     start_new_session=True)
        self._buf = b""

    def _read_line(self, deadline: float):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return b""
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _stderr_tail(self, n: int = 4000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-n:]

    def _last_example(self) -> str:
        try:
            return Path(self._log.name).read_text(errors="replace").strip() or "(none logged)"
        except OSError:
            return "(none logged)"

    def run(self, module: str, function: str, kwargs: dict, timeout: float) -> dict:
        request = {"module": module, "function": function, "kwargs": kwargs}
        Path(self._log.name).write_text("")
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read_line(time.monotonic() + timeout)
        if line:
            return json.loads(line)
        how = self._kill_reason(line is None, timeout)
        return {"outcome": "died", "text": (
            f"{how} while running {module}.{function}({kwargs})\n"
            f"last example started: {self._last_example()}\n"
            f"reproduce: python {WORKER} {module} {function} '{json.dumps(kwargs)}'\n"
            f"--- child stderr (tail) ---\n{self._stderr_tail()}")}

    def _kill_reason(self, timed_out: bool, timeout: float) -> str:
        if timed_out:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return (f"the child process hung (no answer in {timeout:.0f} s; killed; a failing "
                    "property still shrinking its example looks the same: rerun with a larger "
                    "FP8KIT_HARDENING_TIMEOUT_S)")
        rc = self.proc.wait()
        if rc < 0:
            return f"the child process died of {signal.Signals(-rc).name}"
        return f"the child process exited with status {rc}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self):
        if self.alive:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._stderr.close()
        os.unlink(self._log.name)


class ChildPool:
    """One reusable child per test file (a pytest fixture holds it)."""

    def __init__(self):
        self._child = None

    def run(self, module: str, function: str, fresh: bool = False, **kwargs) -> None:
        """Runs module.function(**kwargs) in a child; turns its outcome into
        this test's (pass, fail with the child's traceback, or skip)."""
        if fresh or self._child is None or not self._child.alive:
            self.close()
            self._child = Child()
        result = self._child.run(module, function, kwargs, TIMEOUT_S)
        if fresh or result["outcome"] == "died":
            self.close()
        if result["outcome"] == "skipped":
            pytest.skip(result["text"])
        if result["outcome"] != "passed":
            pytest.fail(result["text"], pytrace=False)

    def close(self):
        if self._child is not None:
            self._child.close()
            self._child = None


# The CUDA variant of each test runs where an NVIDIA driver is (the child
# then skips it if fp8kit or the framework has no CUDA); elsewhere it is
# skipped here, without starting a child for it.
_NO_GPU = pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="no NVIDIA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, _NO_GPU])]
