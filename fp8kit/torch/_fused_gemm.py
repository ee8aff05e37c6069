"""The FP8 GEMMs of the fused layers (LayerNormLinear, LayerNormMLP), each
one call into the extension, following the Linear layer protocol
(common/include/fp8kit/linear.h) exactly as fp8kit.torch.Linear does:

    fprop  y[M, N]  = Q(x)[M, K] @ Q(w)[N, K]^T (+ bias)
    dgrad  dx[M, K] = Q(dy)[M, N] @ Q(w)
    wgrad  dw[N, K] = Q(dy)^T @ Q(x), the token dimension M zero-padded to
                      the plan's wgrad_inner when wgrad reads columnwise copies

Which FP8 copies each cast writes and which a forward keeps come from the
core's plan (fp8kit.torch._plan, symbolic token counts included);
weight_copies gives a weight's copies, cast or, for a weight already in
FP8, its own. Each function runs its steps through `steps`, a table of
fp8kit.torch._fused_steps (the pybind11 calls, or the dispatcher ops while
torch.compile traces).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from fp8kit.torch._ext import ext
from fp8kit.torch._plan import Plan
from fp8kit.torch.float8_tensor import Float8Tensor

# The slots of a LinearState (fp8kit_linear_slot), as the core numbers them.
INPUT, WEIGHT, GRAD_OUTPUT = ext.SLOT_INPUT, ext.SLOT_WEIGHT, ext.SLOT_GRAD_OUTPUT


def kept(copies: tuple, rowwise, columnwise):
    """The copy a plan's saved_* entry names (at most one), or None."""
    if copies[0]:
        return rowwise
    return columnwise if copies[1] else None


def weight_copies(steps, state, weight: torch.Tensor, record: bool, p: Plan,
                  fn: str) -> tuple:
    """(data, columnwise, scale_inv) of a GEMM's weight in the copies p.weight
    names. A high-precision weight is cast into the state's weight slot
    (recorded when `record`). A weight already in FP8 (a Float8Tensor:
    FSDP2's FP8 all-gather, fp8kit.torch.distributed) gives its own copies,
    as fp8kit.torch.Linear reads one (the columnwise copy of a view is a
    transpose of its FP8 bits, exact), and records nothing: its scale
    belongs to whoever cast it. Errors name `fn` (the layer's weight)."""
    if not isinstance(weight, Float8Tensor):
        data, columnwise, scale_inv, _ = steps.quantize_slot(state, weight, WEIGHT, record,
                                                             *p.weight, None)
        return data, columnwise, scale_inv
    fp8 = state.recipe["forward_dtype"]
    if weight.fp8_dtype != fp8:
        raise TypeError(f"{fn} is a Float8Tensor in {weight.fp8_dtype} but the recipe's forward "
                        f"format is {fp8}; cast the weight with the recipe's forward format")
    copies = []
    for wanted, layout in zip(p.weight, ("rowwise", "columnwise")):
        copy = getattr(weight, f"{layout}_data") if wanted else None
        if wanted and copy is None:
            raise ValueError(f"{fn} is a Float8Tensor without its {layout} copy, which this "
                             f"call's GEMMs read on {weight.device}; make it with "
                             f"update_usage({layout}=True)")
        copies.append(copy)
    # A copy of scale_inv: FSDP2 rewrites the gathered weight's in place
    # (with the same value) when it gathers the weight again for backward,
    # and autograd refuses a saved tensor written since the forward.
    return copies[0], copies[1], weight.scale_inv.clone()


def fprop(steps, x_data, x_scale_inv, w_data, w_scale_inv, bias: Optional[torch.Tensor],
          out_dtype: torch.dtype, fast_accumulation: bool) -> torch.Tensor:
    """y = x @ w^T (+ bias) from the rowwise copies of x [M, K] and w [N, K]."""
    m, n = x_data.shape[0], w_data.shape[0]
    if m == 0:
        return torch.zeros((0, n), dtype=out_dtype, device=w_data.device)
    # The bias epilogue takes a bias in D's dtype, which would round an fp32
    # bias for an fp32 output: that one is added separately.
    fused_bias = bias if bias is not None and out_dtype != torch.float32 else None
    y = steps.gemm(x_data, x_scale_inv, None, w_data, w_scale_inv, None, False, True, out_dtype,
                   fused_bias, False, None, False, not fast_accumulation, None, None, None)
    if bias is not None and fused_bias is None:
        # Out of place: the fused layers' autograd.Functions return y, and
        # torch 2.11's dynamo routes the gradient of a returned tensor that
        # was modified in place inside the forward to the wrong output, so
        # the compiled layers' gradients came out zero
        # (pytorch/pytorch#180642).
        y = y + bias
    return y


def dgrad(steps, dy_data, dy_scale_inv, w_kept, w_scale_inv, p: Plan,
          out_dtype: torch.dtype) -> torch.Tensor:
    """dx = dy @ w, w read N-contiguous (its columnwise copy on TN-only
    devices: whichever copy the forward kept)."""
    rowwise = bool(p.saved_weight[0])
    return steps.gemm(dy_data, dy_scale_inv, None, w_kept if rowwise else None, w_scale_inv,
                      None if rowwise else w_kept, False, False, out_dtype, None, False, None,
                      False, True, None, None, None)


def wgrad(steps, dy_data, dy_columnwise, dy_scale_inv, x_kept, x_scale_inv, p: Plan,
          out_dtype: torch.dtype) -> torch.Tensor:
    """dw = dy^T @ x over the tokens."""
    if p.wgrad_columnwise:
        dy_cw = _pad_tokens(dy_columnwise, p.wgrad_inner)
        x_cw = _pad_tokens(x_kept, p.wgrad_inner)
        return steps.gemm(None, dy_scale_inv, dy_cw, None, x_scale_inv, x_cw, True, False,
                          out_dtype, None, False, None, False, True, None, None, None)
    return steps.gemm(dy_data, dy_scale_inv, None, x_kept, x_scale_inv, None, True, False,
                      out_dtype, None, False, None, False, True, None, None, None)


def _pad_tokens(columnwise: torch.Tensor, inner) -> torch.Tensor:
    """[features, M] FP8 data zero-padded to [features, inner] (zeros add
    nothing to the sum over tokens). A symbolic inner (torch.compile's
    dynamic token count) is padded always, by a pad that may be 0:
    comparing it with M would specialize the graph on M's alignment."""
    tokens = columnwise.shape[1]
    if statically_known_true(tokens == inner):
        return columnwise
    return F.pad(columnwise.view(torch.uint8), (0, inner - tokens)).view(columnwise.dtype)


def cast_grad_output(steps, state, dy: torch.Tensor, p: Plan, bias_dtype: Optional[torch.dtype]):
    """Q(dy) with the copies the plan asks for, recorded (a backward), and
    the bias gradient: dy's column sums from the cast itself when it is the
    cast+transpose pass, else one reduction. Returns (data, columnwise,
    scale_inv, db)."""
    m, n = dy.shape
    rowwise, columnwise = p.grad_output
    db = None
    if rowwise or columnwise:
        in_cast = bias_dtype is not None and columnwise and m > 1 and n > 1
        data, cw, scale_inv, db = steps.quantize_slot(state, dy, GRAD_OUTPUT, True, rowwise,
                                                      columnwise, bias_dtype if in_cast else None)
    else:
        data = cw = scale_inv = None
    if bias_dtype is not None and db is None:
        db = dy.sum(0, dtype=bias_dtype)
    return data, cw, scale_inv, db
