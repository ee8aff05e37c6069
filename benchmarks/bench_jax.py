"""fp8kit's JAX front end vs JAX's own ops under jax.jit, in one run
(ANCHORS.md target P5).

A thin wrapper: the benchmark lives in fp8kit/bench/dense_jax.py and runs
as the JAX half of the suite's linear section (python -m fp8kit.bench
--sections dense_jax), which also writes bench_linear.png next to the JSON
file. Rows: fp8kit.jax.gemm on pre-quantized e4m3 (fast and split
accumulation) vs lax.dot_general on the same e4m3 data; fp8kit.jax.dense
fwd and fwd+bwd (random cotangent), delayed and current scaling, vs bf16.

    python benchmarks/bench_jax.py --out jax.json

Needs a CUDA GPU and fp8kit built with CUDA (and PyTorch, which the suite
uses for device detection); --quick runs tiny sizes anywhere (a smoke run,
not a measurement).
"""

import sys

from fp8kit.bench import scripts

if __name__ == "__main__":
    sys.exit(scripts.main(__doc__, "dense_jax", "bench_jax.json"))
