"""How fp8kit's grouped GEMM is made, checked by measurement: the forward
GEMM of a GroupedLinear alone, on the same FP8 operands, as fp8kit runs it
(one cuBLASLt GEMM per expert, fp8kit/grouped.h) and as PyTorch's own FP8
grouped GEMM runs it (torch._scaled_grouped_mm: one CUTLASS kernel for all
experts, each row and column scaled), next to bf16 torch._grouped_mm, at
Mixtral-like (8 experts, 16384 routed tokens, 4096 -> 14336) and
DeepSeek-like (64 experts, 65536 tokens, 7168 -> 2048) shapes, balanced
counts. Each FP8 result is checked against fp8kit's before it is timed.

    python scripts/grouped_gemm_method.py        (a CUDA GPU with FP8 GEMMs)
"""
import torch

import fp8kit.torch  # noqa: F401  (registers torch.ops.fp8kit)
from fp8kit.torch._ext import ext

ops = torch.ops.fp8kit
SHAPES = [(8, 16384, 4096, 14336), (64, 65536, 7168, 2048)]  # experts, tokens, K, N


def microseconds(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def compare(experts: int, tokens: int, k: int, n: int) -> None:
    sizes = torch.full((experts,), tokens // experts, dtype=torch.int64)
    ends = torch.cumsum(sizes, 0).to(torch.int32).cuda()
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    e4m3 = torch.float8_e4m3fn
    x_q, _, _, x_sinv, _ = ops.grouped_quantize(x, sizes, e4m3, True, False, None, 0.0, False)
    w_q, _, _, w_sinv, _ = ops.grouped_quantize(w.reshape(experts * n, k),
                                                torch.full((experts,), n), e4m3, True, False,
                                                None, 0.0, False)
    w_q = w_q.view(experts, n, k)
    times = {"bf16 torch._grouped_mm": microseconds(
        lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=ends))}

    def fp8kit_gemm():
        return ops.grouped_gemm_tokens(x_q, x_sinv, w_q, None, w_sinv, sizes, True,
                                       torch.bfloat16, None, False)
    times["fp8kit grouped_gemm_tokens"] = microseconds(fp8kit_gemm)
    # The same per-expert scales as torch's per-row (x) and per-column (w) ones.
    stride = ext.GROUP_SCALE_STRIDE
    row_scale = x_sinv.view(-1)[::stride][:experts].repeat_interleave(tokens // experts)
    col_scale = w_sinv.view(-1)[::stride][:experts, None].expand(experts, n).contiguous()

    def torch_gemm():
        return torch._scaled_grouped_mm(x_q.view(e4m3), w_q.view(e4m3).transpose(-2, -1),
                                        row_scale, col_scale, offs=ends,
                                        out_dtype=torch.bfloat16, use_fast_accum=True)
    try:
        want = fp8kit_gemm().float()
        diff = float((torch_gemm().float() - want).norm() / want.norm())
        print(f"E={experts}: torch._scaled_grouped_mm vs fp8kit, relative difference {diff:.2g}")
        times["torch._scaled_grouped_mm"] = microseconds(torch_gemm)
    except (AttributeError, RuntimeError) as e:  # a PyTorch without it, or not for this GPU
        print(f"torch._scaled_grouped_mm unavailable: {type(e).__name__}: {str(e)[:200]}")
    flops = 2.0 * tokens * k * n
    for name, us in times.items():
        print(f"E={experts} {tokens}x{k}x{n} forward GEMM, {name}: {us:.0f} us, "
              f"{flops / us / 1e6:.0f} TFLOP/s")


if __name__ == "__main__":
    for shape in SHAPES:
        compare(*shape)
