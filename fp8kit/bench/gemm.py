"""GEMM section (target P1): per-tensor FP8 GEMM, fp8kit vs
torch._scaled_mm on the same operands in the same run, plus the FP8
speedup over a bf16 torch.matmul of the same shape.

Shapes are M x N x K: D[M, N] = A[M, K] @ B[N, K]^T, the forward GEMM of a
Linear layer with M tokens, K input and N output features (A =
activations, B = weight, both e4m3 with per-tensor scales, bf16 out). This
is the TN layout Hopper's FP8 tensor cores read, so neither library
transposes anything. Each shape runs with split accumulation
(use_fast_accum=False, FP32-promoted partial sums) and with fast
accumulation; fp8kit's output is checked against torch._scaled_mm's first.
Operands rotate among copies (timing.copies_for_l2) so that small shapes
are not served from L2.
"""

from __future__ import annotations

import functools

from fp8kit.bench import checks, timing
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "gemm"
# M x N x K: the P1 set (square, a Llama-style MLP's two GEMMs, few tokens).
SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
    (8192, 4096, 14336),
    (8192, 14336, 4096),
    (16, 4096, 4096),
    (128, 4096, 4096),
]
QUICK_SHAPES = [(16, 64, 64), (64, 64, 128), (128, 96, 64)]
CHECK_TOL = 2e-2  # max |fp8kit - _scaled_mm| / max |_scaled_mm|: accumulation order only
MODES = (("split", False), ("fast", True))  # (name, use_fast_accum)


def group_name(mode: str) -> str:
    return f"e4m3 GEMM, {mode} accumulation, vs torch._scaled_mm"


def cast_e4m3(x, scale):
    """PyTorch's own per-tensor e4m3 cast: x * scale in float32, saturated
    to the e4m3 range, rounded to nearest even."""
    import torch
    e4m3_max = torch.finfo(torch.float8_e4m3fn).max
    return (x.float() * scale).clamp(-e4m3_max, e4m3_max).to(torch.float8_e4m3fn)


def quantize_e4m3(x):
    """x in e4m3 with the scale that maps its amax to the e4m3 max:
    (data, scale_inv as float32[1]). Also used by the tools in scripts/."""
    import torch
    scale = torch.finfo(torch.float8_e4m3fn).max / x.abs().max().float()
    return cast_e4m3(x, scale), (1.0 / scale).reshape(1).to(torch.float32)


def operand_sets(m, n, k, device, seed, quantize_a, quantize_b) -> list:
    """The copies (timing.copies_for_l2) of one GEMM's operands: random bf16
    A [M, K] and B [N, K] from `seed`, and their FP8 forms. Each set is a
    dict: a, a_si = quantize_a(A), b, b_si = quantize_b(B) (FP8 data and
    scale_inv), a16 = A, b16 = B."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    copies = timing.copies_for_l2(m * k + n * k + 2 * m * n)  # fp8 A, B and the bf16 D
    sets = []
    for _ in range(copies):
        a16 = torch.randn(m, k, device=device, generator=g, dtype=torch.bfloat16)
        b16 = torch.randn(n, k, device=device, generator=g, dtype=torch.bfloat16)
        a, a_si = quantize_a(a16)
        b, b_si = quantize_b(b16)
        sets.append({"a": a, "a_si": a_si, "b": b, "b_si": b_si, "a16": a16, "b16": b16})
    return sets


def run_shape(ctx: Context, m: int, n: int, k: int, seed: int) -> list[Row]:
    import torch
    from fp8kit import _torch_ext as ext

    dev = ctx.torch_device
    sets = operand_sets(m, n, k, dev, seed, quantize_e4m3, quantize_e4m3)
    flops = 2.0 * m * n * k
    case = f"{m}x{n}x{k}"
    clock = timing.torch_clock(dev)
    rows = []
    checked = {}  # mode -> fp8kit's GEMM function, once its output passed the check
    for mode, fast in MODES:
        def scaled_mm(i, fast=fast):
            s = sets[i % len(sets)]
            return torch._scaled_mm(s["a"], s["b"].t(), scale_a=s["a_si"].reshape(()),
                                    scale_b=s["b_si"].reshape(()), out_dtype=torch.bfloat16,
                                    use_fast_accum=fast)

        def fp8kit_gemm(i, fast=fast):
            s = sets[i % len(sets)]
            # A rowwise [M, K] (trans_a=False), B rowwise [N, K] read as B^T (trans_b=True).
            return ext.gemm(s["a"], s["a_si"], None, s["b"], s["b_si"], None, False, True,
                            torch.bfloat16, use_split_accumulator=not fast)

        row = Row(SECTION, group_name(mode), case, flops, "TFLOP/s", "torch._scaled_mm",
                  fp8kit_work=flops, anchor_work=flops, target="P1")
        rows.append(row)
        try:
            d_kit, d_ref = fp8kit_gemm(0), scaled_mm(0)
            if tuple(d_kit.shape) != (m, n) or d_kit.dtype != torch.bfloat16:
                raise checks.Mismatch(f"fp8kit returned {d_kit.dtype} {tuple(d_kit.shape)}")
            row.check = checks.within("GEMM output", checks.max_rel_diff(d_kit, d_ref),
                                      CHECK_TOL, "max rel diff")
        except checks.Mismatch as e:
            row.error = f"outputs disagree, not timed: {e}"
            continue
        row.set_times(timing.measure({"fp8kit": fp8kit_gemm, "anchor": scaled_mm}, clock,
                                     ctx.settings))
        row.note = f"{len(sets)} operand copies"
        checked[mode] = fp8kit_gemm

    # The FP8 speedup over bf16 (information: no target).
    def bf16_matmul(i):
        s = sets[i % len(sets)]
        return torch.matmul(s["a16"], s["b16"].t())

    row = Row(SECTION, "fp8kit split accumulation vs bf16 torch.matmul", case, flops, "TFLOP/s",
              "bf16 torch.matmul", fp8kit_work=flops, anchor_work=flops,
              check="(different precision: not compared)")
    rows.append(row)
    if "split" not in checked:
        row.error = "fp8kit's split-accumulation GEMM did not pass its check"
    else:
        row.set_times(timing.measure({"fp8kit": checked["split"], "anchor": bf16_matmul},
                                     clock, ctx.settings))
    del sets
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def cases(ctx: Context) -> list[Case]:
    shapes = list(ctx.gemm_shapes) or (QUICK_SHAPES if ctx.quick else SHAPES)
    out = []
    for i, (m, n, k) in enumerate(shapes):
        out.append(Case(SECTION, group_name("split"), f"GEMM {m}x{n}x{k}",
                        functools.partial(run_shape, ctx, m, n, k, i)))
    return out
