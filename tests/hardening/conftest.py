"""The hardening suite (property-based, crash-path, thread-stress and
memory-growth tests of fp8kit.torch, fp8kit.jax and fp8kit.recipe).

Each test_*.py file is thin: its tests run functions of the helper
modules here (props_*, crash_paths_torch, stress_threads, memory_growth)
in a child process (child_process.py), so that a segfault, an abort or a
hang is one failing test with a reproducer - the last example started and
a command line that reruns the function - not the end of the run.

Environment knobs (all optional): FP8KIT_HARDENING_EXAMPLES scales the
number of hypothesis examples and of thread-stress rounds (default 1),
FP8KIT_HARDENING_DEADLINE_MS sets the per-example deadline ("none" turns
it off), FP8KIT_HARDENING_TIMEOUT_S how long one test may run before its
child counts as hung (default 240). FP8KIT_HARDENING_UNDER_SANITIZER=1
(set by scripts/gpu_check.sh's sanitizer stage) skips the GPU thread-stress
checks that run backward on several threads, which deadlock the tool
(stress_threads.py says why).
"""

import pytest

from child_process import ChildPool


@pytest.fixture(scope="module")
def child():
    pool = ChildPool()
    yield pool
    pool.close()
