"""Fused section, the activation kernels alone: fp8kit's SwiGLU and GELU,
forward and backward, as LayerNormMLP runs them in training
(ext.activation_forward / ext.activation_backward: bf16 in, the next GEMM's
FP8 operand rowwise and columnwise out, the amax recorded into the
delayed-scaling state, no high-precision copy), against the bandwidth
limit measured in the same run.

Bytes moved per output element of the forward (F columns): SwiGLU reads
gate and up (4 B) and writes two FP8 copies (2 B): 6 B; GELU 2 + 2 = 4 B.
The backward writes [rows, 2F] (SwiGLU) or [rows, F] (GELU) FP8 gradients
twice and reads d_a and h: SwiGLU 2 + 4 + 4 = 10 B, GELU 2 + 2 + 2 = 6 B
per element of d_a. The limit is a device-to-device copy of a bf16
[rows, F] tensor (4 B/element), timed in the same alternating rounds and
scaled to the kernel's bytes. Target P7-act: 90% of that limit.

The backward also runs as LayerNormMLP runs it when fc1 has a bias
("+ bias grad"): the kernel adds dh's column sums (fc1's bias gradient) in
the same pass; they read and write nothing per element beyond the cast, so
the bytes counted are the same and the row shows what the sums cost.

Shape: the Llama-3-8B MLP's 8192 tokens x 14336. Before timing, the
rowwise FP8 output dequantized must match the float64 activation within
the FP8 format's rounding, the columnwise copy be its transpose, and the
bias gradient match the float64 column sums within bf16's rounding.
"""

from __future__ import annotations

from fp8kit.bench import checks, timing
from fp8kit.bench.context import Case, Context, shape_cases
from fp8kit.bench.quantize import bf16_inputs
from fp8kit.bench.results import Row

SECTION = "fused"
GROUP = "activation + FP8 cast (bf16 -> row+col, amax), vs bytes-moved limit"
SHAPES = [(8192, 14336)]
QUICK_SHAPES = [(48, 64)]
# (activation, pass) -> bytes moved per element of [rows, F]
BYTES_PER_ELEMENT = {("swiglu", "forward"): 6, ("swiglu", "backward"): 10,
                     ("swiglu", "backward + bias grad"): 10,
                     ("gelu", "forward"): 4, ("gelu", "backward"): 6,
                     ("gelu", "backward + bias grad"): 6}
# The bias gradient (bf16 column sums of float32 sums) against float64.
SUMS_TOL = 2.0 ** -7
# ||dequantized - float64|| / ||float64||: E4M3 rounds by <= 2^-4, E5M2 by <= 2^-3.
TOL = {"forward": 2.0 ** -4, "backward": 2.0 ** -3}


def _float64_activation(act: str, h, d_a=None):
    """The activation (forward) or dh (backward) in float64, by torch."""
    import torch
    h = h.double()
    if act == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        if d_a is None:
            return torch.nn.functional.silu(gate) * up
        gate = gate.detach().requires_grad_()
        up = up.detach().requires_grad_()
        (torch.nn.functional.silu(gate) * up).backward(d_a.double())
        return torch.cat([gate.grad, up.grad], dim=-1)
    if d_a is None:
        return torch.nn.functional.gelu(h, approximate="tanh")
    h = h.detach().requires_grad_()
    torch.nn.functional.gelu(h, approximate="tanh").backward(d_a.double())
    return h.grad


def run_shape(ctx: Context, tokens: int, f: int, seed: int) -> list[Row]:
    import torch
    from fp8kit.recipe import DelayedScaling
    from fp8kit.torch._ext import ext

    dev = ctx.torch_device
    n = tokens * f
    _, copy = bf16_inputs(tokens, f, dev, seed)   # the limit: a copy of [tokens, F] bf16
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    h = {"swiglu": torch.randn(tokens, 2 * f, device=dev, dtype=torch.bfloat16, generator=g),
         "gelu": torch.randn(tokens, f, device=dev, dtype=torch.bfloat16, generator=g)}
    d_a = torch.randn(tokens, f, device=dev, dtype=torch.bfloat16, generator=g)
    fns = {"copy": copy}
    rows = {}
    for (act, direction), per_el in BYTES_PER_ELEMENT.items():
        name = f"{act} {direction}"
        row = Row(SECTION, GROUP, f"{name} {tokens}x{f}", n, "TB/s", "bytes-moved limit (copy)",
                  fp8kit_work=per_el * n, anchor_work=per_el * n, target="P7-act")
        rows[name] = (row, per_el)
        st = ext.LinearState(DelayedScaling(), dev)
        if direction == "forward":
            def fn(i, act=act, st=st):
                # record, rowwise and columnwise, no high-precision copy.
                return ext.activation_forward(h[act], act, st, 0, True, True, True, False)
            want = _float64_activation(act, h[act])
        else:
            sums_dtype = torch.bfloat16 if direction.endswith("bias grad") else None
            def fn(i, act=act, st=st, sums_dtype=sums_dtype):
                return ext.activation_backward(d_a, h[act], act, st, 2, True, True, True,
                                               sums_dtype, False)
            want = _float64_activation(act, h[act], d_a)
        try:
            fn(0)   # the first call seeds the slot; the second casts with that scale
            out = fn(0)
            row.check = checks.fp8_copies(name, out, want, TOL[direction.split(" ")[0]])
            if direction.endswith("bias grad"):
                err = checks.norm_rel_err(out[3], want.sum(0))
                row.check += "; bias grad " + checks.within(f"{name} sums", err, SUMS_TOL, "rel err")
            del out
            fns[name] = fn
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
        del want
    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings)
    t_copy = t["copy"].median_s
    for name, (row, per_el) in rows.items():
        row.note = f"copy {4 * n / t_copy / 1e12:.3g} TB/s (4 B/el)"
        if name in t:
            row.fp8kit_s = t[name].median_s
            row.anchor_s = t_copy * per_el / 4   # the copy's time for the kernel's bytes
            row.timing = {"fp8kit": t[name].to_json(), "copy": t["copy"].to_json()}
    del h, d_a, copy, fns
    if dev == "cuda":
        torch.cuda.empty_cache()
    return [row for row, _ in rows.values()]


def cases(ctx: Context) -> list[Case]:
    return shape_cases(ctx, SECTION, GROUP, "activation + cast", run_shape, SHAPES,
                       QUICK_SHAPES)
