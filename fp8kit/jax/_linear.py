"""The steps of one FP8 Linear (common/include/fp8kit/linear.h) that
fp8kit.jax.dense and the fused layers (layernorm_dense, layernorm_mlp)
share: the copy plan, a current-scaling cast, the forward GEMM, the cast of
the output gradient with the bias gradient, and the two gradient GEMMs.

A `LinearCall` is what is static about one Linear of a layer: the recipe,
the device's GEMM layouts, the dtypes, and its rows of the delayed-scaling
state (input, kernel, output gradient).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _sharding_quantize as shq
from fp8kit.jax import matmul
from fp8kit.jax.delayed_scaling import check_state, quantize_and_record
from fp8kit.jax.scaled_tensor import ScaledTensor


@dataclasses.dataclass(frozen=True)
class LinearCall:
    """Static facts of one Linear: recipe, layouts, dtypes, state rows."""

    fn: str                       # the public function, for error messages
    recipe: recipe_lib.DelayedScaling | recipe_lib.CurrentScaling
    non_tn: bool                  # the device's FP8 GEMM reads non-K-contiguous operands
    x_dtype: jnp.dtype            # the input's dtype: y, dx and the GEMM outputs have it
    kernel_dtype: jnp.dtype
    bias_dtype: Optional[jnp.dtype]
    input_slot: int = 0           # its rows of the delayed-scaling state
    kernel_slot: int = 1
    grad_slot: int = 2

    @property
    def delayed(self) -> bool:
        return isinstance(self.recipe, recipe_lib.DelayedScaling)

    @property
    def forward_fmt(self) -> str:
        return self.recipe.fp8_format.forward_dtype

    @property
    def backward_fmt(self) -> str:
        return self.recipe.fp8_format.backward_dtype

    @property
    def fwd_split_accumulator(self) -> bool:
        """The forward GEMM promotes partial sums to FP32 unless the recipe
        asks for fast accumulation; the gradient GEMMs always do."""
        return not self.recipe.forward_fast_accumulation

    def plan(self, m: int, k: int, n: int, grads: bool) -> dict:
        """The core's copy plan for [M, K] @ [K, N] (grads: dgrad and wgrad)."""
        return _ffi.linear_plan(m, k, n, grads, grads, self.non_tn)


def keep(st: ScaledTensor, copies) -> ScaledTensor:
    """st with only the copies (rowwise, columnwise) the plan keeps."""
    rowwise, columnwise = copies
    return dataclasses.replace(st, data=st.data if rowwise else None,
                               columnwise_data=st.columnwise_data if columnwise else None)


def quantize_current(recipe: recipe_lib.CurrentScaling, t, fmt: str, copies, sums_dtype=None):
    """One current-scaling cast: (ScaledTensor, column sums or None)."""
    rowwise, columnwise = copies
    data, columnwise_data, _, scale_inv, amax, sums = shq.quantize_current_scaling(
        t, fmt, rowwise, columnwise, recipe.amax_epsilon, recipe.power_2_scale, sums_dtype)
    st = ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                      columnwise_data=columnwise_data if columnwise else None, amax=amax,
                      fp8_dtype=fmt)
    return st, (sums if sums_dtype is not None else None)


def quantize_kernel(lin: LinearCall, kernel, state, copies, record: bool):
    """Q(kernel) by the recipe: (state, ScaledTensor)."""
    if lin.delayed:
        state, (kq,), _ = quantize_and_record(state, lin.recipe, lin.kernel_slot, (kernel,),
                                              (copies,), (None,), record)
        return state, kq
    return state, quantize_current(lin.recipe, kernel, lin.forward_fmt, copies)[0]


def forward_gemm(lin: LinearCall, xq: ScaledTensor, kq: ScaledTensor, bias, n: int):
    """y = Q(x) @ Q(kernel) (+ bias) in x's dtype; M = 0 gives an empty y."""
    out = lin.x_dtype
    if xq.shape[0] == 0:  # M = 0: nothing to multiply
        return jnp.zeros((0, n), out)
    # The GEMM epilogue adds a bias of the output's 16-bit type; a float32
    # output gets its bias added outside, in float32, to lose nothing.
    in_epilogue = bias is not None and out != jnp.float32
    y = matmul.gemm_scaled(xq, kq, False, False, out, bias.astype(out) if in_epilogue else None,
                           lin.fwd_split_accumulator, lin.non_tn, lin.fn)
    if bias is not None and not in_epilogue:
        y = y + bias.astype(out)
    return y


def quantize_grad(lin: LinearCall, dy, state, copies):
    """Q(dy) and the bias gradient from the same cast (column sums; the
    cast+transpose pass computes them, so a bias asks for the columnwise
    copy, and a single token row is summed here). Returns (state, dq, db)."""
    m, n = dy.shape
    sums_dtype = lin.bias_dtype if lin.bias_dtype is not None and m > 1 else None
    if sums_dtype is not None:
        copies = (copies[0], True)
    if lin.delayed:
        state, (dq,), (db,) = quantize_and_record(state, lin.recipe, lin.grad_slot, (dy,),
                                                  (copies,), (sums_dtype,), record=True)
    else:
        dq, db = quantize_current(lin.recipe, dy, lin.backward_fmt, copies, sums_dtype)
    return state, dq, bias_grad_of_one_row(lin, dy, db, sums_dtype)


def bias_grad_of_one_row(lin: LinearCall, dy, db, sums_dtype):
    """db as the cast left it, or summed here when the cast could not (no
    bias: None)."""
    if lin.bias_dtype is not None and sums_dtype is None:
        return jnp.sum(dy.astype(jnp.float32), axis=0).astype(lin.bias_dtype)
    return db


def _pad_tokens(st: ScaledTensor, inner: int) -> ScaledTensor:
    """The columnwise copy [cols, M] zero-padded to [cols, inner] (FP8 zero
    bits are 0.0: the padding adds nothing to the wgrad sums)."""
    m = st.columnwise_data.shape[1]
    if inner == m:
        return st
    padded = jnp.pad(st.columnwise_data, ((0, 0), (0, inner - m)))
    return dataclasses.replace(st, data=None, columnwise_data=padded)


def grad_gemms(lin: LinearCall, plan: dict, dq: ScaledTensor, x_saved: ScaledTensor,
               k_saved: ScaledTensor):
    """dx = Q(dy) @ Q(kernel)^T and dk = Q(x)^T @ Q(dy), the wgrad reading
    the plan's (token-padded) copies; M = 0 gives zeros."""
    m, n = dq.shape
    k = k_saved.shape[0]
    if m == 0:
        return jnp.zeros((0, k), lin.x_dtype), jnp.zeros((k, n), lin.kernel_dtype)
    dx = matmul.gemm_scaled(dq, k_saved, False, True, lin.x_dtype, None, True, lin.non_tn,
                            lin.fn)
    x_w, dq_w = x_saved, dq
    if plan["wgrad_columnwise"]:
        inner = plan["wgrad_inner"]
        x_w, dq_w = _pad_tokens(x_saved, inner), _pad_tokens(dq, inner)
    dk = matmul.gemm_scaled(x_w, dq_w, True, False, lin.kernel_dtype, None, True, lin.non_tn,
                            lin.fn)
    return dx, dk


# --- argument checks (before anything is lowered) ------------------------------------------

def check_recipe_state(fn: str, recipe, state, num_linears: int = 1) -> None:
    """recipe is DelayedScaling with a state for num_linears Linears, or
    CurrentScaling with none."""
    if isinstance(recipe, recipe_lib.DelayedScaling):
        check_state(fn, recipe, state, num_linears)
    elif isinstance(recipe, recipe_lib.CurrentScaling):
        if state is not None:
            raise TypeError(f"{fn}: CurrentScaling is stateless; pass state=None")
    else:
        raise TypeError(f"{fn}: recipe must be fp8kit.recipe.DelayedScaling or CurrentScaling, "
                        f"got {type(recipe).__name__}")


def check_kernel(fn: str, arg: str, kernel, x_shape, x_arg: str, n_multiple: int = 1):
    """kernel: [K, N] high precision with K = x's last dim, K and N positive
    multiples of the GEMM alignment (N also of n_multiple: SwiGLU's
    [gate | up] halves). Returns it as an array."""
    _checks.high_precision(fn, arg, kernel)
    kernel = jnp.asarray(kernel)
    if kernel.ndim != 2:
        raise ValueError(f"{fn}: {arg} has shape {kernel.shape}; expected [K, N]")
    k, n = kernel.shape
    if x_shape[-1] != k:
        raise ValueError(f"{fn}: {x_arg} has {x_shape[-1]} features (shape {tuple(x_shape)}) but "
                         f"{arg} expects K={k} (shape {kernel.shape})")
    multiple = _ffi.GEMM_DIM_MULTIPLE
    for name, dim, m in (("K", k, multiple), ("N", n, multiple * n_multiple)):
        if dim % m != 0 or dim == 0:
            raise ValueError(f"{fn}: {name}={dim} must be a positive multiple of {m} ({arg} "
                             f"has shape {kernel.shape}; cuBLASLt's FP8 GEMM alignment, "
                             "enforced on CPU too); pad the kernel.")
    return kernel


def check_bias(fn: str, arg: str, bias, n: int):
    """bias: None or [N] high precision. Returns it as an array (or None)."""
    if bias is None:
        return None
    _checks.high_precision(fn, arg, bias)
    bias = jnp.asarray(bias)
    if bias.shape != (n,):
        raise ValueError(f"{fn}: {arg} has shape {bias.shape}; expected ({n},)")
    return bias
