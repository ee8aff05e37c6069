"""FP8 quantization speed (bf16 -> e4m3, per tensor) against the bandwidth
limit measured in the same run (ANCHORS.md target P2).

A thin wrapper: the benchmark lives in fp8kit/bench/quantize.py and runs as
the quantize section of the suite (python -m fp8kit.bench --sections
quantize), which also writes bench_quantize.png next to the JSON file.
Rows: delayed-scaling cast+transpose and rowwise only, current-scaling
cast+transpose, each against a device-to-device copy of the same input;
peers: eager PyTorch and torch.compile (delayed and current). Every fp8kit
output is checked bit for bit against PyTorch before it is timed.

    python benchmarks/bench_quantize.py --out quantize.json [--no-compile]

Needs a CUDA GPU and fp8kit built with CUDA; --quick runs tiny shapes
anywhere (a smoke run, not a measurement).
"""

import sys

from fp8kit.bench import scripts

if __name__ == "__main__":
    sys.exit(scripts.main(__doc__, "quantize", "bench_quantize.json"))
