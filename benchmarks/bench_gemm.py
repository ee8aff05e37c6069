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

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench_gemm.json", help="JSON results file")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per library")
    parser.add_argument("--shapes", default="",
                        help="comma-separated MxNxK subset, e.g. 4096x4096x4096")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, also on the CPU")
    args = parser.parse_args()

    from fp8kit.bench.cli import main as suite

    argv = ["--sections", "gemm", "--quick" if args.quick else "--full", "--json", args.out,
            "--out", os.path.dirname(os.path.abspath(args.out)), "--rounds", str(args.rounds)]
    if args.shapes:
        argv += ["--gemm-shapes", args.shapes]
    return suite(argv)


if __name__ == "__main__":
    sys.exit(main())
