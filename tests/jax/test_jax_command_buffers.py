"""FP8KIT_JAX_COMMAND_BUFFERS: the choice between fp8kit's two forms of its
CUDA FFI handlers (jax_ext/handlers.h). The variable is read when
fp8kit.jax is imported, so each case runs in a child process."""

import os
import subprocess
import sys

import pytest

import fp8kit.jax as fj

HERE = os.path.dirname(os.path.abspath(__file__))


def _child_env(value) -> dict:
    env = dict(os.environ)
    env.pop("FP8KIT_JAX_COMMAND_BUFFERS", None)
    if value is not None:
        env["FP8KIT_JAX_COMMAND_BUFFERS"] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _gpus():
    import jax
    try:
        return jax.devices("gpu") if fj.BUILT_WITH_CUDA else []
    except RuntimeError:
        return []


@pytest.mark.parametrize("value, expected", [(None, "False"), ("0", "False"), ("1", "True")],
                         ids=["unset", "0", "1"])
def test_value_is_read_at_import(value, expected):
    code = "import fp8kit.jax._registry as r; print(r.COMMAND_BUFFERS, len(r.TARGETS))"
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env(value),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    flag, targets = proc.stdout.split()
    assert flag == expected and int(targets) == len(fj._registry.TARGETS)


def test_bad_value_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-c", "import fp8kit.jax"], env=_child_env("yes"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "FP8KIT_JAX_COMMAND_BUFFERS='yes'" in proc.stderr
    assert "expected '0'" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not _gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
def test_gpu_tests_pass_with_calls_recorded_into_xla_graphs():
    """The JAX GPU tests again, with XLA free to record fp8kit's calls into
    its CUDA graphs (the GEMM then runs cuBLASLt's first heuristic choice)."""
    files = [os.path.join(HERE, f) for f in
             ("test_jax_dense.py", "test_jax_gemm.py", "test_jax_quantize.py",
              "test_jax_amax.py", "test_jax_delayed_scaling.py")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "gpu", *files], env=_child_env("1"), cwd="/",
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
