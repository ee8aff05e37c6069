"""fp8kit.torch.Linear vs bf16 torch.nn.Linear and torchao's Float8Linear,
in one run (ANCHORS.md targets P3 and P4).

A thin wrapper: the benchmark lives in fp8kit/bench/linear_torch.py (large
layers, fwd and fwd+bwd; target P3 at 8192^3) and fp8kit/bench/overhead.py
(16x1024 input through a 1024x1024 layer, fwd and fwd+bwd, with host time
per call; target P4), run as sections of the suite (python -m fp8kit.bench
--sections linear_torch,overhead --profile). It also prints a
torch.profiler table of the per-call fwd+bwd path (bf16 and fp8kit
delayed; self CPU time = host cost), stores it in the JSON and in
profile_overhead.txt, and writes bench_linear.png and bench_overhead.png,
all next to the JSON file.

    python benchmarks/bench_torch.py --out torch.json

Needs a CUDA GPU with FP8 (sm_89+) and fp8kit built with CUDA; --quick runs
tiny sizes anywhere (a smoke run, not a measurement). torchao is optional
(see ../shared/GPU.md); without it its rows are left out and the rows say so.
"""

import sys

from fp8kit.bench import scripts

if __name__ == "__main__":
    sys.exit(scripts.main(__doc__, "linear_torch,overhead", "bench_torch.json",
                          ["--profile"]))
