"""GEMM section, block-scaled (target P6-gemm): fp8kit's block-scaled FP8
GEMM against PyTorch's own cuBLASLt block-scaled call on the same FP8 data
and scales in the same run, plus its speedup over a bf16 torch.matmul.

D[M, N] = A[M, K] @ B[N, K]^T, a Linear's forward GEMM (the TN layout
Hopper reads): A (activations) e4m3 with a float32 scale per 1x128 tile, B
(weight) e4m3 with one per 128x128 block, both quantized by
fp8kit.torch.quantize_block, bf16 out, split accumulation (the block-scaled
kernels' only mode). The peer is torch.nn.functional.scaled_mm with
ScalingType.BlockWise1x128 / BlockWise128x128; fp8kit's scale arrays are
converted to the layout it takes (torch_scales) before anything is timed.
Where that call does not run (no CUDA, a PyTorch without it, a GPU or
cuBLASLt without block-scaled FP8) the P6-gemm row says why instead of a
number.

Checked first: fp8kit's output against a float64 product of the operands
dequantized here, from the documented scale layout (so a scale read from
the wrong block fails the check, on the CPU too), then the peer's output
against fp8kit's.
"""

from __future__ import annotations

import functools
from typing import Optional

from fp8kit.bench import checks, timing
from fp8kit.bench.context import Case, Context
from fp8kit.bench.gemm import operand_sets
from fp8kit.bench.results import Row

SECTION = "gemm"
BLOCK = 128
# M x N x K: a square GEMM and a Llama-style MLP's two GEMMs.
SHAPES = [(8192, 8192, 8192), (8192, 4096, 14336), (8192, 14336, 4096)]
QUICK_SHAPES = [(32, 256, 256), (64, 128, 384)]  # several tiles per row, blocks per weight
REF_TOL = 2e-2   # max |fp8kit - float64| / max |float64|: bf16 output and accumulation
PEER_TOL = 2e-2  # max |fp8kit - peer| / max |peer|: accumulation order only
PEER_GROUP = "block-scaled e4m3 GEMM (1x128 x 128x128) vs torch's block-scaled scaled_mm"
BF16_GROUP = "block-scaled e4m3 GEMM (1x128 x 128x128) vs bf16 torch.matmul"


def fp8kit_block_missing(device: str) -> Optional[str]:
    """Why fp8kit's block-scaled GEMM does not run on `device`, or None."""
    import fp8kit.torch as ft
    if ft.supports_block_scaled_fp8_gemm(device):
        return None
    return (f"not run: fp8kit's block-scaled FP8 GEMM needs Hopper with cuBLASLt 12.9+ "
            f"(supports_block_scaled_fp8_gemm({device!r}) is False)")


def dequantized(q, scale_inv, scaling_mode: str):
    """q [R, C] (FP8) times its blocks' scale_inv, in float64, read from the
    layout of common/include/fp8kit/block_scaling.h: block_1x128 scales
    [ceil(C/128), round_up(R, 4)] with tile (r, j) at [j, r]; block_128x128
    scales [ceil(R/128), round_up(ceil(C/128), 4)] with block (i, j) at [i, j]."""
    rows, cols = q.shape
    tiles = -(-cols // BLOCK)
    if scaling_mode == "block_1x128":
        per_element = scale_inv[:tiles, :rows].t().repeat_interleave(BLOCK, dim=1)
    else:
        per_element = (scale_inv[:, :tiles].repeat_interleave(BLOCK, dim=0)
                       .repeat_interleave(BLOCK, dim=1))
    return q.double() * per_element[:rows, :cols].double()


def torch_scales(a_scale_inv, b_scale_inv, m: int):
    """fp8kit's scales of A (1x128) and B (128x128) in the layout
    torch.nn.functional.scaled_mm takes for A @ B^T on Hopper: scale_a
    [M, K/128] with strides (1, M) (fp8kit pads M to a multiple of 4, which
    torch does not), scale_b for mat_b = B^T [round_up(K/128, 4), N/128] with
    strides (1, round_up(K/128, 4)), which is fp8kit's array transposed."""
    return a_scale_inv[:, :m].contiguous().t(), b_scale_inv.t()


def torch_peer(device: str):
    """(call, None) with call(a, b, scale_a, scale_b) = torch's block-scaled
    a @ b^T (a 1x128, b 128x128, scales as torch_scales gives them), or
    (None, why it cannot run here). Hopper and cuBLASLt 12.9+ are checked by
    the call itself (NotImplementedError), so they are not repeated here."""
    import torch
    F = torch.nn.functional
    if not hasattr(F, "scaled_mm"):
        return None, (f"not timed: PyTorch {torch.__version__} has no "
                      "torch.nn.functional.scaled_mm, its call that takes block scales")
    if torch.device(device).type != "cuda":
        return None, ("not timed: torch's block-scaled scaled_mm runs on CUDA only (Hopper, "
                      "cuBLASLt 12.9+)")
    one_by_128, by_128x128 = F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128

    def call(a, b, scale_a, scale_b):
        # Its defaults: bf16 out, split accumulation (use_fast_accum=False), as fp8kit's.
        return F.scaled_mm(a, b.t(), scale_a, one_by_128, scale_b, by_128x128)
    return call, None


def _quantizer(scaling_mode: str):
    """x -> (e4m3 rowwise data, its block scales) by fp8kit.torch.quantize_block."""
    import fp8kit.torch as ft
    return lambda x: ft.quantize_block(x, "e4m3", scaling_mode)[:2]


def run_shape(ctx: Context, m: int, n: int, k: int, seed: int) -> list[Row]:
    import torch

    dev = ctx.torch_device
    flops = 2.0 * m * n * k
    case = f"{m}x{n}x{k}"
    rows = [Row(SECTION, PEER_GROUP, case, flops, "TFLOP/s", "torch scaled_mm, block scales",
                fp8kit_work=flops, anchor_work=flops, target="P6-gemm"),
            Row(SECTION, BF16_GROUP, case, flops, "TFLOP/s", "bf16 torch.matmul",
                fp8kit_work=flops, anchor_work=flops,
                check="(different precision: not compared)")]
    missing = fp8kit_block_missing(dev)
    if missing:
        for r in rows:
            r.note = missing
        return rows
    sets = operand_sets(m, n, k, dev, seed, _quantizer("block_1x128"),
                        _quantizer("block_128x128"))
    try:
        _measure(ctx, sets, m, n, *rows)
    finally:
        del sets
        if dev == "cuda":
            torch.cuda.empty_cache()
    return rows


def _measure(ctx: Context, sets, m: int, n: int, peer_row: Row, bf16_row: Row) -> None:
    """Checks fp8kit's output, times it against bf16 and, where it runs and
    agrees, against torch's block-scaled call; fills the two rows."""
    import torch
    from fp8kit import _torch_ext as ext

    clock = timing.torch_clock(ctx.torch_device)

    def fp8kit_gemm(i):
        s = sets[i % len(sets)]
        # A rowwise [M, K] (trans_a=False), B rowwise [N, K] read as B^T (trans_b=True).
        return ext.gemm_block(s["a"], s["a_si"], None, None, "block_1x128", s["b"], s["b_si"],
                              None, None, "block_128x128", False, True, torch.bfloat16)

    def bf16_matmul(i):
        s = sets[i % len(sets)]
        return torch.matmul(s["a16"], s["b16"].t())

    s = sets[0]
    d = fp8kit_gemm(0)
    try:
        if tuple(d.shape) != (m, n) or d.dtype != torch.bfloat16:
            raise checks.Mismatch(f"fp8kit returned {d.dtype} {tuple(d.shape)}")
        want = (dequantized(s["a"], s["a_si"], "block_1x128")
                @ dequantized(s["b"], s["b_si"], "block_128x128").t())
        peer_row.check = "vs float64: " + checks.within(
            "GEMM output vs float64", checks.max_rel_diff(d, want), REF_TOL, "max rel diff")
        del want
    except checks.Mismatch as e:
        peer_row.error = bf16_row.error = f"fp8kit's output is wrong, not timed: {e}"
        return
    bf16_row.set_times(timing.measure({"fp8kit": fp8kit_gemm, "anchor": bf16_matmul}, clock,
                                      ctx.settings))

    peer, why = torch_peer(ctx.torch_device)
    if peer is None:
        peer_row.note = why
        return
    scales = [torch_scales(o["a_si"], o["b_si"], m) for o in sets]

    def torch_gemm(i):
        s = sets[i % len(sets)]
        return peer(s["a"], s["b"], *scales[i % len(sets)])

    try:
        d_ref = torch_gemm(0)
    except NotImplementedError as e:  # not Hopper, or cuBLASLt older than 12.9
        peer_row.note = f"not timed: torch's block-scaled scaled_mm does not run here: {e}"
        return
    except Exception as e:  # noqa: BLE001  (e.g. scales in a layout this torch refuses)
        peer_row.error = f"torch's block-scaled scaled_mm failed: {type(e).__name__}: {e}"
        return
    try:
        peer_row.check += "; vs torch: " + checks.within(
            "GEMM output vs torch", checks.max_rel_diff(d, d_ref), PEER_TOL, "max rel diff")
    except checks.Mismatch as e:
        peer_row.error = f"outputs disagree, not timed: {e}"
        return
    peer_row.set_times(timing.measure({"fp8kit": fp8kit_gemm, "anchor": torch_gemm}, clock,
                                      ctx.settings))
    peer_row.note = f"{len(sets)} operand copies"


def cases(ctx: Context) -> list[Case]:
    shapes = list(ctx.gemm_shapes) or (QUICK_SHAPES if ctx.quick else SHAPES)
    return [Case(SECTION, PEER_GROUP, f"block GEMM {m}x{n}x{k}",
                 functools.partial(run_shape, ctx, m, n, k, i))
            for i, (m, n, k) in enumerate(shapes)]
