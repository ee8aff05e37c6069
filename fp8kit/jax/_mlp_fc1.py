"""fc1 of fp8kit.jax.layernorm_mlp: one Linear, or SwiGLU's gate and up
halves when kernel_1 comes in the paired layout.

The paired layout is SwiGLU's layout for tensor parallelism: kernel_1
[hidden, 2, F] with the gate kernel_1[:, 0] and the up projection
kernel_1[:, 1], bias_1 [2, F]; it is kernel_1.reshape(hidden, 2, F) of
the [hidden, 2F] = [gate | up] layout. Sharding its last dimension gives
each device matching gate and up columns, where sharding the columns of
[hidden, 2F] would give one device gates and another their ups (refused:
_sharding_fused.py).

fc1 then runs as the two Linears of the halves, each FP8 operand a `Pair`:
    h[:, i]          = ln @ Q(kernel_1)[:, i] + bias_1[i]     h [tokens, 2, F]
    d_ln             = Q(dh) @ Q(kernel_1)^T, summed over both halves
    dkernel_1[:, i]  = ln^T @ Q(dh)[:, i]
Per-tensor recipes cast kernel_1 and dh whole (one state row, one scale
from the global amax); the halves' GEMMs read slices of those casts, and
d_ln is one GEMM over K = (2, F) (_sharding_gemm.py's grouped K), so one
sum across the tensor axis. Every value is then the same sum as with
[hidden, 2F] (the same bits on the CPU). BlockScaling casts each half with
blocks of its own and sums d_ln's two float32 partial products. Against
[hidden, 2F] the pair costs a copy of h (the halves' GEMM outputs stacked
for the activation kernel) and FP8 copies of the halves: keep [hidden, 2F]
when fc1 is not sharded.

Under Explicit mesh axes a custom call's results are typed replicated
whatever their layout, and a jnp op on them (slicing a Pair, stacking the
halves, BlockScaling's activation on h) would gather them to that type:
each is first typed with its layout (`axes`: the tokens' and F's mesh
axes; free, it is that layout).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax.numpy as jnp

from fp8kit.jax import _checks, _ffi, _linear
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _sharding_fused as shf
from fp8kit.jax._linear import LinearCall
from fp8kit.jax.scaled_tensor import ScaledTensor

HALVES = ("gate", "up")


def check_paired(fn: str, kernel_1, bias_1, x_shape):
    """kernel_1 [hidden, 2, F] high precision with hidden = x's last dim and
    F a positive multiple of the GEMM alignment; bias_1 None or [2, F].
    Returns them as arrays."""
    _checks.high_precision(fn, "kernel_1", kernel_1)
    kernel_1 = jnp.asarray(kernel_1)
    hidden, pair, f = kernel_1.shape
    if pair != 2:
        raise ValueError(f"{fn}: kernel_1 has shape {kernel_1.shape}; a 3-D kernel_1 is SwiGLU's "
                         "paired layout [hidden, 2, F] (gate kernel_1[:, 0], up kernel_1[:, 1])")
    if x_shape[-1] != hidden:
        raise ValueError(f"{fn}: x has {x_shape[-1]} features (shape {tuple(x_shape)}) but "
                         f"kernel_1 expects {hidden} (shape {kernel_1.shape})")
    multiple = _ffi.GEMM_DIM_MULTIPLE
    for name, dim in (("hidden", hidden), ("F", f)):
        if dim % multiple != 0 or dim == 0:
            raise ValueError(f"{fn}: {name}={dim} must be a positive multiple of {multiple} "
                             f"(kernel_1 has shape {kernel_1.shape}; cuBLASLt's FP8 GEMM "
                             "alignment, enforced on CPU too); pad the kernel.")
    if bias_1 is not None:
        _checks.high_precision(fn, "bias_1", bias_1)
        bias_1 = jnp.asarray(bias_1)
        if bias_1.shape != (2, f):
            raise ValueError(f"{fn}: bias_1 has shape {bias_1.shape}; with the paired kernel_1 "
                             f"{kernel_1.shape} it is [2, F] = (2, {f})")
    return kernel_1, bias_1


def check_sharding(fn: str, activation: str, kernel_1) -> None:
    """Under Explicit mesh axes, refuse while tracing a SwiGLU kernel_1 whose
    sharding would separate gates from their ups: [hidden, 2F] sharded
    along its columns or [hidden, 2, F] along its pair dimension. Under
    Auto axes the shardings are known only when XLA partitions: the
    per-tensor activation's partition refuses the first, and BlockScaling
    (a jnp activation) and the cast of kernel_1 (which replicates the pair
    dimension) let XLA move the data instead, correct but not parallel."""
    spec = sh.explicit_spec(kernel_1)
    if spec is None or activation != "swiglu":
        return
    axes = sh.spec_axes(spec, 1)
    if not axes:
        return
    if kernel_1.ndim == 2:
        raise ValueError(shf.unpaired_swiglu_message(axes))
    raise ValueError(f"{fn}: kernel_1 {kernel_1.shape} has its pair dimension (dim 1: gate, up) "
                     f"sharded over mesh axes {axes}; a device would hold gates without their "
                     "ups. Shard its last dimension (F) instead.")


class Pair(NamedTuple):
    """An FP8 operand of SwiGLU's paired halves. whole: the cast of the
    paired tensor [.., 2, F] (per-tensor recipes; None under BlockScaling),
    read by the dgrad GEMM over both halves; halves: the (gate, up) casts
    [.., F] that each half's GEMMs read (slices of whole, or casts of their
    own); either None where no GEMM reads it."""

    whole: Optional[ScaledTensor]
    halves: Optional[tuple[ScaledTensor, ScaledTensor]]


def explicit_axes(x, kernel_1):
    """(mesh axes of x's tokens, of kernel_1's F) from their sharding types
    under Explicit mesh axes, else None."""
    x_spec = sh.explicit_spec(x)
    if x_spec is None:
        return None
    return sh.spec_axes(x_spec, 0), sh.spec_axes(sh.explicit_spec(kernel_1), kernel_1.ndim - 1)


def _typed(t, dims):
    """t typed with mesh axes `dims` per dim (None: t as it is)."""
    return t if t is None or dims is None else sh.retype(t, sh.spec_of(dims))


def _kernel_halves(kq: ScaledTensor, features) -> tuple[ScaledTensor, ScaledTensor]:
    """The cast of kernel_1 [hidden, 2, F] (F on mesh axes `features`, None
    without Explicit axes) as the casts of its halves [hidden, F]: rowwise
    data[:, i]; the columnwise copy [F, hidden * 2] (the 2-D view
    [hidden * 2, F] transposed) interleaves the halves' rows, so half i is
    columnwise_data[:, i::2]."""
    f = None if features is None else [features]
    data = _typed(kq.data, None if f is None else [(), (), *f])
    columnwise = _typed(kq.columnwise_data, None if f is None else [*f, ()])
    return tuple(dataclasses.replace(
        kq, data=None if data is None else data[:, i],
        columnwise_data=None if columnwise is None else columnwise[:, i::2]) for i in range(2))


def grad_pair(data, columnwise_data, scale_inv, fmt: str, h_spec=None) -> Pair:
    """The cast of a paired dh (one scale): rowwise data [rows, 2, F], read
    whole by the dgrad GEMM, and columnwise_data [2, F, rows] (the
    activation kernel's [2F, rows] on each device), whose half i [F, rows]
    the half's wgrad reads; None for a copy not cast. h_spec: the sharding
    type of h under Explicit axes (else None)."""
    if h_spec is not None:
        rows, _, f = (sh.spec_axes(h_spec, i) for i in range(3))
        data, columnwise_data = _typed(data, [rows, (), f]), _typed(columnwise_data, [(), f, rows])
    whole = None if data is None else ScaledTensor(data, scale_inv, fp8_dtype=fmt)
    halves = tuple(ScaledTensor(data=None if data is None else data[:, i], scale_inv=scale_inv,
                                columnwise_data=None if columnwise_data is None
                                else columnwise_data[i], fp8_dtype=fmt) for i in range(2))
    return Pair(whole, halves)


def quantize_kernel(lin: LinearCall, kernel_1, state, copies, record: bool):
    """Q(kernel_1) by the recipe: (state, ScaledTensor, or the Pair of a
    paired kernel_1)."""
    if kernel_1.ndim == 2:
        return _linear.quantize_kernel(lin, kernel_1, state, copies, record)
    if lin.block:
        return state, Pair(None, tuple(
            _linear.quantize_block(lin, kernel_1[:, i], lin.forward_dtype, copies,
                                   "block_128x128", f"kernel_1's {half} half")
            for i, half in enumerate(HALVES)))
    state, kq = _linear.quantize_kernel(lin, kernel_1, state, copies, record)
    spec = sh.explicit_spec(kernel_1)
    return state, Pair(kq, _kernel_halves(kq, None if spec is None else sh.spec_axes(spec, 2)))


def keep(kq, copies):
    """What backward keeps of Q(kernel_1): the plan's copies of it (of a
    Pair's whole, else of its halves)."""
    if not isinstance(kq, Pair):
        return _linear.keep(kq, copies)
    if kq.whole is not None:
        return Pair(_linear.keep(kq.whole, copies), None)
    return Pair(None, tuple(_linear.keep(k, copies) for k in kq.halves))


def forward_gemm(lin: LinearCall, ln: ScaledTensor, kq, bias_1, m: int, axes):
    """h = Q(ln) @ Q(kernel_1) + bias_1 for the first m token rows:
    [m, N1], or [m, 2, F] for a Pair (axes: explicit_axes)."""
    if not isinstance(kq, Pair):
        h = _typed(_linear.forward_gemm(lin, ln, kq, bias_1, kq.shape[1]), axes)
        return _linear.unpad_token_rows(h, m)
    halves = [_typed(_linear.forward_gemm(lin, ln, k, None if bias_1 is None else bias_1[i],
                                          k.shape[1]), axes)
              for i, k in enumerate(kq.halves)]
    return jnp.stack([_linear.unpad_token_rows(h, m) for h in halves], axis=1)


def grad_gemms(lin: LinearCall, plan: dict, dq, ln: ScaledTensor, kq, axes):
    """(d_ln, dkernel_1); dq and kq are ScaledTensors or Pairs (dkernel_1
    then [hidden, 2, F]; axes: explicit_axes)."""
    if not isinstance(kq, Pair):
        return _linear.grad_gemms(lin, plan, dq, ln, kq)
    if dq.whole is not None and kq.whole is not None:
        d_ln = _linear.dgrad_gemm(lin, dq.whole, kq.whole)
    else:
        d_gate, d_up = (_typed(_linear.dgrad_gemm(lin, d, k, dx_dtype=jnp.float32),
                               None if axes is None else [axes[0], ()])
                        for d, k in zip(dq.halves, kq.halves))
        d_ln = (d_gate + d_up).astype(lin.x_dtype)
    dk = [_typed(_linear.wgrad_gemm(lin, plan, d, ln), None if axes is None else [(), axes[1]])
          for d in dq.halves]
    return d_ln, jnp.stack(dk, axis=1)
