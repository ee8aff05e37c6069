"""What the sharding tests share. XLA's host device count is fixed when jax
starts, so each test file runs its cases in a child process (the file
itself, run as a script) that reports per case; each parametrized test in
the parent asserts one case."""

import functools
import json
import os
import subprocess
import sys
import traceback

import pytest

_RESULTS = "FP8KIT_SHARDING_RESULTS "


def run_cases(cases, run) -> None:
    """The child's loop: run(name) for each case, every case reported (not
    just the first failure). Each is named before it runs, so that a case
    that aborts the process (an XLA check failure) is named in the
    parent's failure message."""
    results = {}
    for name in cases:
        print(f"FP8KIT_SHARDING_CASE {name}", flush=True)
        try:
            run(name)
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - the traceback is the report
            results[name] = traceback.format_exc()
    print(_RESULTS + json.dumps(results))


@functools.lru_cache(maxsize=None)
def child_results(script: str, platform: str = "cpu", mesh_shape: str = "2x4"):
    """(results by case, "") of `script`'s child on `platform`, or (None,
    what the child printed) when it reported nothing."""
    env = dict(os.environ)
    if platform == "cpu":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            " --xla_force_host_platform_device_count=8").strip()
        env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run([sys.executable, os.path.abspath(script), platform, mesh_shape],
                          env=env, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULTS):
            return json.loads(line[len(_RESULTS):]), ""
    return None, f"child exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"


def assert_case_ok(script: str, case: str, platform: str = "cpu",
                   mesh_shape: str = "2x4") -> None:
    """The parent's assertion: `case` of `script`'s child on `platform`
    passed (its traceback, or the child's output, as the failure). A GPU
    child needs two GPUs (skipped otherwise, or with FP8KIT_SKIP_MULTI_GPU)."""
    if platform == "gpu" and (os.environ.get("FP8KIT_SKIP_MULTI_GPU") or gpu_count() < 2):
        pytest.skip("needs 2 GPUs and fp8kit built with CUDA")
    results, failure = child_results(script, platform, mesh_shape)
    assert results is not None, failure
    assert results[case] == "ok", results[case]


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """GPUs JAX sees, asked in a child (this process may run jax on the CPU
    only); 0 for a CPU-only build."""
    import fp8kit.jax as fj  # a CPU-only build needs no GPU probe
    if not fj.BUILT_WITH_CUDA:
        return 0
    code = ("import jax\n"
            "try: print(len(jax.devices('gpu')))\n"
            "except RuntimeError: print(0)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("JAX_PLATFORMS", None)
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300).stdout.strip().splitlines()
        return int(out[-1]) if out else 0
    except (subprocess.SubprocessError, ValueError):
        return 0


def sum_atol(platform: str, want, floor: float) -> float:
    """Absolute tolerance of a sum split across devices another way than the
    unsharded one. On GPUs Hopper's FP8 tensor cores keep about 2^-10 of the
    largest partial sum, so each of the two sums may move by that much of
    the array's scale, not only of each element, and they differ by up to
    twice it: 2^-9 (on two H200s a split dgrad's dx moved by 1.1 x 2^-10
    of max|dx|)."""
    import numpy as np
    if platform == "cpu":
        return floor
    return max(floor, 2.0 ** -9 * float(np.abs(np.asarray(want, np.float64)).max(initial=0.0)))


def assert_matches(name: str, got, want, platform: str, bit_exact: bool,
                   floor: float = 1e-3) -> None:
    """got equal to want bit for bit where the sharded computation sums as
    the unsharded one does (bit_exact), else within 2^-7 relative and
    sum_atol(platform, want, floor) absolute."""
    import numpy as np
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    if bit_exact:
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=2**-7, atol=sum_atol(platform, want, floor),
                                   err_msg=name)
