"""Per-tensor FP8 GEMM: fp8kit vs torch._scaled_mm on the same inputs, in one
run (ANCHORS.md target P1), with bf16 torch.matmul for reference.

Shapes are M x N x K: D[M, N] = A[M, K] @ B[N, K]^T, the forward GEMM of a
Linear layer with M tokens, K input and N output features (A = activations,
B = weight, both e4m3, per-tensor scales). This is the TN layout Hopper's FP8
tensor cores read, so neither library transposes anything.

For each shape and accumulation mode (split accumulator, i.e.
use_fast_accum=False, and fast accumulation) both libraries run on the same
operands; fp8kit's output is checked against torch._scaled_mm's before
anything is timed. Timing: CUDA events around back-to-back calls, after a
warm-up (which includes fp8kit's one-time plan build and algorithm timing),
several rounds alternating the libraries, median per library. Operands
rotate among several copies so that small shapes are not served from L2.

    python benchmarks/bench_gemm.py --out gemm.json

Needs a CUDA GPU with FP8 (sm_89+), PyTorch with CUDA, and fp8kit built with
CUDA (its PyTorch extension, fp8kit._torch_ext).
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch

# M x N x K
SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
    (8192, 4096, 14336),
    (8192, 14336, 4096),
    (16, 4096, 4096),
    (128, 4096, 4096),
]
E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0
L2_DEFEAT_BYTES = 256 << 20  # rotate operand copies until they cover this much memory
ROUND_SECONDS = 0.025        # target time of one timed batch of one library


def _fp8kit_gemm():
    """fp8kit's GEMM through its PyTorch extension (low-level interface)."""
    try:
        from fp8kit import _torch_ext
    except ImportError as e:  # pragma: no cover - depends on the build
        sys.exit(f"bench_gemm: cannot import fp8kit._torch_ext ({e}); build fp8kit with CUDA first")

    def gemm(a, a_scale_inv, b, b_scale_inv, out_dtype, use_split_accumulator):
        # A: rowwise [M, K] (trans_a=False); B: rowwise [N, K] read as B^T
        # (trans_b=True). No columnwise copies are needed in this layout.
        return _torch_ext.gemm(a, a_scale_inv, None, b, b_scale_inv, None, False, True, out_dtype,
                               use_split_accumulator=use_split_accumulator)

    return gemm


def _quantize(x):
    """Per-tensor e4m3 quantization; returns (data, scale_inv as float32[1])."""
    amax = x.abs().max().float()
    scale = FP8_MAX / amax
    q = (x.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(E4M3)
    return q, (1.0 / scale).reshape(1).to(torch.float32)


class Operands:
    """Several copies of one shape's operands (to defeat L2), all on the GPU."""

    def __init__(self, m, n, k, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        per_set = m * k + n * k + 2 * m * n  # fp8 A, B and a bf16 D
        self.copies = max(1, min(8, math.ceil(L2_DEFEAT_BYTES / per_set)))
        self.sets = []
        for _ in range(self.copies):
            a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
            a_q, a_si = _quantize(a)
            b_q, b_si = _quantize(b)
            self.sets.append({"a": a_q, "a_si": a_si, "b": b_q, "b_si": b_si,
                              "a16": a, "b16": b})


def _time_batch(fn, operands, iters):
    """Mean seconds per call over `iters` back-to-back calls."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    sets = operands.sets
    start.record()
    for i in range(iters):
        fn(sets[i % len(sets)])
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / iters


def _calibrate(fn, operands):
    """Iterations for one batch of about ROUND_SECONDS."""
    t = _time_batch(fn, operands, 3)
    return max(10, min(1000, int(ROUND_SECONDS / max(t, 1e-7))))


def _bench_pair(fns, operands, rounds):
    """Median seconds per call of each function, timed in alternating rounds."""
    iters = {name: _calibrate(fn, operands) for name, fn in fns.items()}
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_time_batch(fn, operands, iters[name]))
    return {name: statistics.median(v) for name, v in samples.items()}


def _rel_diff(x, y):
    x, y = x.float(), y.float()
    return ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench_gemm.json", help="JSON results file")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per library")
    parser.add_argument("--shapes", default="", help="comma-separated MxNxK subset, e.g. 4096x4096x4096")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit("bench_gemm: needs a CUDA GPU")
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    fp8kit_gemm = _fp8kit_gemm()
    torch.backends.cuda.matmul.allow_tf32 = False

    rows = []
    ok = True
    for idx, (m, n, k) in enumerate(shapes):
        ops = Operands(m, n, k, seed=idx)
        flops = 2.0 * m * n * k
        row = {"M": m, "N": n, "K": k, "operand_copies": ops.copies}
        for mode, fast in (("split", False), ("fast", True)):
            def torch_fp8(s, fast=fast):
                return torch._scaled_mm(s["a"], s["b"].t(), scale_a=s["a_si"].reshape(()),
                                        scale_b=s["b_si"].reshape(()), out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)

            def fp8kit_fp8(s, fast=fast):
                return fp8kit_gemm(s["a"], s["a_si"], s["b"], s["b_si"], torch.bfloat16,
                                   use_split_accumulator=not fast)

            # Agreement first (also fp8kit's plan build and algorithm choice).
            s0 = ops.sets[0]
            d_ref = torch_fp8(s0)
            d_kit = fp8kit_fp8(s0)
            torch.cuda.synchronize()
            diff = _rel_diff(d_kit, d_ref)
            row[f"{mode}_max_rel_diff"] = diff
            if not (diff <= 2e-2) or tuple(d_kit.shape) != (m, n) or d_kit.dtype != torch.bfloat16:
                print(f"MISMATCH {m}x{n}x{k} {mode}: fp8kit vs _scaled_mm max rel diff {diff:.3g}, "
                      f"shape {tuple(d_kit.shape)}, dtype {d_kit.dtype}; not timed", flush=True)
                row[f"{mode}_error"] = "outputs disagree"
                ok = False
                continue
            for _ in range(3):
                torch_fp8(s0)
                fp8kit_fp8(s0)
            t = _bench_pair({"fp8kit": fp8kit_fp8, "scaled_mm": torch_fp8}, ops, args.rounds)
            row[f"{mode}_fp8kit_s"] = t["fp8kit"]
            row[f"{mode}_scaled_mm_s"] = t["scaled_mm"]
            row[f"{mode}_fp8kit_tflops"] = flops / t["fp8kit"] / 1e12
            row[f"{mode}_scaled_mm_tflops"] = flops / t["scaled_mm"] / 1e12
            row[f"{mode}_ratio"] = t["scaled_mm"] / t["fp8kit"]
        t16 = _bench_pair({"bf16": lambda s: torch.matmul(s["a16"], s["b16"].t())}, ops,
                          max(3, args.rounds // 2))
        row["bf16_matmul_s"] = t16["bf16"]
        row["bf16_matmul_tflops"] = flops / t16["bf16"] / 1e12
        rows.append(row)
        del ops
        torch.cuda.empty_cache()

    def fmt(row, key, spec):
        return format(row[key], spec) if key in row else "-"

    header = (f"{'M x N x K':>20} | {'split: fp8kit':>13} {'_scaled_mm':>10} {'ratio':>6} | "
              f"{'fast: fp8kit':>12} {'_scaled_mm':>10} {'ratio':>6} | {'bf16':>7}")
    print("\nTFLOP/s (ratio = fp8kit speed / torch._scaled_mm speed, same inputs, same run)")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['M']:>6}x{r['N']}x{r['K']:<6}".rjust(20) + " | "
              f"{fmt(r, 'split_fp8kit_tflops', '13.1f')} {fmt(r, 'split_scaled_mm_tflops', '10.1f')} "
              f"{fmt(r, 'split_ratio', '6.3f')} | "
              f"{fmt(r, 'fast_fp8kit_tflops', '12.1f')} {fmt(r, 'fast_scaled_mm_tflops', '10.1f')} "
              f"{fmt(r, 'fast_ratio', '6.3f')} | {fmt(r, 'bf16_matmul_tflops', '7.1f')}")

    summary = {}
    for mode in ("split", "fast"):
        ratios = [r[f"{mode}_ratio"] for r in rows if f"{mode}_ratio" in r]
        if len(ratios) != len(rows):
            summary[mode] = {"complete": False}
            continue
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        summary[mode] = {"complete": True, "geomean_ratio": geo, "min_ratio": min(ratios),
                         "p1_met": min(ratios) >= 1.00 and geo >= 1.03}
        print(f"{mode:>5} accumulation: geomean ratio {geo:.3f}, min {min(ratios):.3f} "
              f"(P1: every shape >= 1.00 and geomean >= 1.03: "
              f"{'met' if summary[mode]['p1_met'] else 'NOT met'})")

    result = {
        "benchmark": "per-tensor FP8 GEMM, fp8kit vs torch._scaled_mm (P1)",
        "shape_convention": "M x N x K; D[M,N] = A[M,K] @ B[N,K]^T, e4m3 inputs, bf16 output",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rounds": args.rounds,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": rows,
        "summary": summary,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
