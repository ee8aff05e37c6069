"""The steps of one FP8 Linear (common/include/fp8kit/linear.h) that
fp8kit.jax.dense and the fused layers (layernorm_dense, layernorm_mlp)
share: the copy plan, a current-scaling cast, the forward GEMM, the cast of
the output gradient with the bias gradient, and the two gradient GEMMs.

A `LinearCall` is what is static about one Linear of a layer: the recipe,
the device's GEMM layouts, the dtypes, and its rows of the delayed-scaling
state (input, kernel, output gradient).

BlockScaling: x and dy are quantized 1x128 and the kernel 128x128, each
block with its own current scale (no state), and the GEMMs read the copies
the plan of a TN device names (block-scaled GEMMs are TN only). cuBLASLt's
block-scaled GEMM writes bfloat16 or float32 (a float16 layer computes in
float32 and rounds once); a layer pads x and dy with zero token rows to
the next multiple of GEMM_DIM_MULTIPLE, as fp8kit/linear.h says and
fp8kit.torch does (zero rows are whole 1x128 tiles of their own in the
rowwise copies and add nothing to an amax in the columnwise ones, so every
real scale is unchanged), and slices y and dx back.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _sharding_block as shb
from fp8kit.jax import _sharding_quantize as shq
from fp8kit.jax import matmul
from fp8kit.jax.delayed_scaling import check_state, quantize_and_record
from fp8kit.jax.scaled_tensor import ScaledTensor

# Block scaling pads the token count M to this (fp8kit/linear.h, "Block
# scaling"): the forward and dgrad GEMMs need M a multiple of 8, the wgrad
# GEMM, whose inner dimension M is, a multiple of GEMM_DIM_MULTIPLE.
BLOCK_GEMM_M_MULTIPLE = _ffi.GEMM_DIM_MULTIPLE


@dataclasses.dataclass(frozen=True)
class LinearCall:
    """Static facts of one Linear: recipe, layouts, dtypes, state rows."""

    fn: str                       # the public function, for error messages
    recipe: recipe_lib.DelayedScaling | recipe_lib.CurrentScaling | recipe_lib.BlockScaling
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
    def block(self) -> bool:
        return isinstance(self.recipe, recipe_lib.BlockScaling)

    @property
    def token_multiple(self) -> int:
        """M is padded to a multiple of this (1: not padded)."""
        return BLOCK_GEMM_M_MULTIPLE if self.block else 1

    def gemm_rows(self, m: int) -> int:
        """The token rows the GEMMs see for m tokens (m rounded up to
        token_multiple)."""
        return -(-m // self.token_multiple) * self.token_multiple

    def gemm_dtype(self, dtype) -> jnp.dtype:
        """The dtype a GEMM writes for a result of `dtype`."""
        if self.block and jnp.dtype(dtype) == jnp.float16:
            return jnp.dtype(jnp.float32)
        return jnp.dtype(dtype)

    @property
    def forward_dtype(self) -> str:
        return self.recipe.fp8_format.forward_dtype

    @property
    def backward_dtype(self) -> str:
        return self.recipe.fp8_format.backward_dtype

    @property
    def fwd_split_accumulator(self) -> bool:
        """The forward GEMM promotes partial sums to FP32 unless the recipe
        asks for fast accumulation; the gradient GEMMs always do."""
        return not self.recipe.forward_fast_accumulation

    def plan(self, m: int, k: int, n: int, grads: bool) -> dict:
        """The core's copy plan for [M, K] @ [K, N] (grads: dgrad and wgrad)."""
        return _ffi.linear_plan(m, k, n, grads, grads, self.non_tn and not self.block)


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


def quantize_block(lin: LinearCall, t, fmt: str, copies, scaling_mode: str,
                   what: str) -> ScaledTensor:
    """One block-scaled cast with the recipe's settings; a sharding type
    that splits a block is refused while tracing, naming the layer and
    `what` is cast."""
    rowwise, columnwise = copies
    shb.check_explicit_shards(lin.fn, what, t, scaling_mode, rowwise, columnwise)
    recipe = lin.recipe
    data, columnwise_data, scales, columnwise_scales = shb.quantize_block_scaling(
        t, fmt, rowwise, columnwise, scaling_mode, recipe.amax_epsilon, recipe.power_2_scale)
    return ScaledTensor(data=data if rowwise else None, scale_inv=None,
                        columnwise_data=columnwise_data if columnwise else None, fp8_dtype=fmt,
                        scaling_mode=scaling_mode, block_scale_inv=scales if rowwise else None,
                        columnwise_block_scale_inv=columnwise_scales if columnwise else None)


def pad_token_rows(lin: LinearCall, t):
    """t [M, ...] with zero rows up to lin.gemm_rows(M)."""
    m = t.shape[0]
    padded = lin.gemm_rows(m)
    if padded == m:
        return t
    return jnp.pad(t, [(0, padded - m)] + [(0, 0)] * (t.ndim - 1))


def unpad_token_rows(t, m: int):
    """The first m rows of a GEMM output computed on padded tokens."""
    return t if t.shape[0] == m else t[:m]


def quantize_input(lin: LinearCall, x, copies) -> ScaledTensor:
    """Q(x) by a stateless recipe (current or block scaling)."""
    if lin.block:
        return quantize_block(lin, x, lin.forward_dtype, copies, "block_1x128", "x")
    return quantize_current(lin.recipe, x, lin.forward_dtype, copies)[0]


def quantize_kernel(lin: LinearCall, kernel, state, copies, record: bool):
    """Q(kernel) by the recipe: (state, ScaledTensor)."""
    if lin.block:
        return state, quantize_block(lin, kernel, lin.forward_dtype, copies, "block_128x128",
                                     "the kernel")
    if lin.delayed:
        state, (kq,), _ = quantize_and_record(state, lin.recipe, lin.kernel_slot, (kernel,),
                                              (copies,), (None,), record)
        return state, kq
    return state, quantize_current(lin.recipe, kernel, lin.forward_dtype, copies)[0]


def forward_gemm(lin: LinearCall, xq: ScaledTensor, kq: ScaledTensor, bias, n: int):
    """y = Q(x) @ Q(kernel) (+ bias) in x's dtype; M = 0 gives an empty y."""
    out = lin.gemm_dtype(lin.x_dtype)
    if xq.shape[0] == 0:  # M = 0: nothing to multiply
        return jnp.zeros((0, n), lin.x_dtype)
    # The GEMM epilogue adds a bias of the output's 16-bit type; a float32
    # output gets its bias added outside, in float32, to lose nothing.
    in_epilogue = bias is not None and out != jnp.float32
    y = matmul.gemm_scaled(xq, kq, False, False, out, bias.astype(out) if in_epilogue else None,
                           lin.fwd_split_accumulator, lin.non_tn, lin.fn)
    if bias is not None and not in_epilogue:
        y = y + bias.astype(out)
    return y.astype(lin.x_dtype)


def quantize_grad(lin: LinearCall, dy, state, copies):
    """Q(dy) and the bias gradient from the same cast (column sums; the
    cast+transpose pass computes them, so a bias asks for the columnwise
    copy, and a single token row is summed here). Returns (state, dq, db)."""
    m, n = dy.shape
    if lin.block:  # the block cast writes no column sums
        dq = quantize_block(lin, dy, lin.backward_dtype, copies, "block_1x128",
                            "the output gradient")
        return state, dq, bias_grad_of_one_row(lin, dy, None, None)
    sums_dtype = lin.bias_dtype if lin.bias_dtype is not None and m > 1 else None
    if sums_dtype is not None:
        copies = (copies[0], True)
    if lin.delayed:
        state, (dq,), (db,) = quantize_and_record(state, lin.recipe, lin.grad_slot, (dy,),
                                                  (copies,), (sums_dtype,), record=True)
    else:
        dq, db = quantize_current(lin.recipe, dy, lin.backward_dtype, copies, sums_dtype)
    return state, dq, bias_grad_of_one_row(lin, dy, db, sums_dtype)


def bias_grad_of_one_row(lin: LinearCall, dy, db, sums_dtype):
    """db as the cast left it, or summed here when the cast could not (no
    bias: None). Zero token rows of a padded dy add nothing."""
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
    # Block scales stay as they are: M and inner have the same 128-row tiles.
    return dataclasses.replace(st.columnwise_only(), columnwise_data=padded)


def dgrad_gemm(lin: LinearCall, dq: ScaledTensor, k_saved: ScaledTensor, dx_dtype=None):
    """dx = Q(dy) @ Q(kernel)^T in dx_dtype (default x's); M = 0 gives
    zeros."""
    dx_dtype = lin.x_dtype if dx_dtype is None else jnp.dtype(dx_dtype)
    if dq.shape[0] == 0:
        return jnp.zeros((0, k_saved.shape[0]), dx_dtype)
    return matmul.gemm_scaled(dq, k_saved, False, True, lin.gemm_dtype(dx_dtype), None, True,
                              lin.non_tn, lin.fn).astype(dx_dtype)


def wgrad_gemm(lin: LinearCall, plan: dict, dq: ScaledTensor, x_saved: ScaledTensor):
    """dk = Q(x)^T @ Q(dy), reading the plan's (token-padded) copies; M = 0
    gives zeros."""
    m, n = dq.shape
    if m == 0:
        return jnp.zeros((x_saved.shape[-1], n), lin.kernel_dtype)
    x_w, dq_w = x_saved, dq
    if plan["wgrad_columnwise"]:
        inner = plan["wgrad_inner"]
        x_w, dq_w = _pad_tokens(x_saved, inner), _pad_tokens(dq, inner)
    return matmul.gemm_scaled(x_w, dq_w, True, False, lin.gemm_dtype(lin.kernel_dtype), None,
                              True, lin.non_tn, lin.fn).astype(lin.kernel_dtype)


def grad_gemms(lin: LinearCall, plan: dict, dq: ScaledTensor, x_saved: ScaledTensor,
               k_saved: ScaledTensor):
    """(dx, dk): dgrad_gemm and wgrad_gemm."""
    return dgrad_gemm(lin, dq, k_saved), wgrad_gemm(lin, plan, dq, x_saved)


# --- argument checks (before anything is lowered) ------------------------------------------

def check_recipe_state(fn: str, recipe, state, num_linears: int = 1) -> None:
    """recipe is DelayedScaling with a state for num_linears Linears, or
    CurrentScaling or BlockScaling with none."""
    if isinstance(recipe, recipe_lib.DelayedScaling):
        check_state(fn, recipe, state, num_linears)
    elif isinstance(recipe, (recipe_lib.CurrentScaling, recipe_lib.BlockScaling)):
        if state is not None:
            raise TypeError(f"{fn}: {type(recipe).__name__} is stateless; pass state=None")
    else:
        raise TypeError(f"{fn}: recipe must be fp8kit.recipe.DelayedScaling, CurrentScaling "
                        f"or BlockScaling, got {type(recipe).__name__}")


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
