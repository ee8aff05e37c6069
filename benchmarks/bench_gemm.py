"""Per-tensor FP8 GEMM: fp8kit vs torch._scaled_mm on the same inputs, in one
run (ANCHORS.md target P1), with bf16 torch.matmul for reference.

A thin wrapper: the benchmark lives in fp8kit/bench/gemm.py and runs as the
GEMM section of the suite (python -m fp8kit.bench --sections gemm), which
also writes bench_gemm.png next to the JSON file.

    python benchmarks/bench_gemm.py --out gemm.json [--shapes 4096x4096x4096]

Needs a CUDA GPU with FP8 (sm_89+), PyTorch with CUDA, and fp8kit built with
CUDA (its PyTorch extension, fp8kit._torch_ext); --quick runs tiny shapes
anywhere (a smoke run, not a measurement).
"""

import sys

from fp8kit.bench import scripts


def main() -> int:
    parser = scripts.parser(__doc__, "bench_gemm.json")
    parser.add_argument("--shapes", default="",
                        help="comma-separated MxNxK subset, e.g. 4096x4096x4096")
    args = parser.parse_args()
    return scripts.run(args, "gemm", ["--gemm-shapes", args.shapes] if args.shapes else [])


if __name__ == "__main__":
    sys.exit(main())
