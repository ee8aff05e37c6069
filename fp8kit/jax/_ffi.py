"""The custom calls: every fp8kit FFI target with its operands, results and
attributes, in one module.

Importing it loads fp8kit._jax_ext and registers its handlers with JAX
("cpu" always, "CUDA" when the extension was built with CUDA); Python's
import cache makes a second registration impossible. Each `*_call`
function is one jax.ffi.ffi_call on one device's buffers: no argument
checks (the public functions check first) and no sharding (the
_sharding_* modules wrap these calls). The handlers' operand lists are in
jax_ext/*_ffi.cc; keep the two in step.

The core's constants come from the extension, not from copies here:
FP8_MAX, GEMM_DIM_MULTIPLE, FP8_DTYPE_CODES, AMAX_REDUCTION_CODES, the
delayed-scaling ranges MARGIN_MAX, AMAX_HISTORY_LEN_MAX, and block scaling's
SCALING_MODE_CODES, BLOCK_LEN and block_scale_inv_shape.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fp8kit.jax import _checks
from fp8kit.jax.scaled_tensor import columnwise_shape

try:
    from fp8kit import _jax_ext as ext
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fp8kit.jax needs the compiled extension fp8kit._jax_ext, which failed to load "
        f"({e}). Build and install fp8kit with `pip install .` (see README.md); a build "
        "made on another machine (other jaxlib or Python) will not load here.") from e

BUILT_WITH_CUDA: bool = ext.built_with_cuda()
FP8_MAX: dict[str, float] = dict(ext.FP8_MAX)
GEMM_DIM_MULTIPLE: int = int(ext.GEMM_DIM_MULTIPLE)
# The slots of a Linear's scaling state (fp8kit_linear_slot).
SLOT_INPUT: int = int(ext.SLOT_INPUT)
SLOT_WEIGHT: int = int(ext.SLOT_WEIGHT)
SLOT_GRAD_OUTPUT: int = int(ext.SLOT_GRAD_OUTPUT)
NUM_SLOTS: int = int(ext.NUM_SLOTS)
FP8_DTYPE_CODES: dict[str, int] = dict(ext.FP8_DTYPE_CODES)
AMAX_REDUCTION_CODES: dict[str, int] = dict(ext.AMAX_REDUCTION_CODES)
MARGIN_MAX: int = int(ext.MARGIN_MAX)
AMAX_HISTORY_LEN_MAX: int = int(ext.AMAX_HISTORY_LEN_MAX)
SCALING_MODE_CODES: dict[str, int] = dict(ext.SCALING_MODE_CODES)
BLOCK_LEN: int = int(ext.BLOCK_LEN)
BLOCK_SCALE_INNER_MULTIPLE: int = int(ext.BLOCK_SCALE_INNER_MULTIPLE)
CAST_STATISTICS_WORKSPACE_BYTES: int = int(ext.CAST_STATISTICS_WORKSPACE_BYTES)
GEMM_ROW_BYTES_MULTIPLE: int = int(ext.GEMM_ROW_BYTES_MULTIPLE)
BLOCK_GEMM_MN_MULTIPLE: int = int(ext.BLOCK_GEMM_MN_MULTIPLE)


def _register_all() -> tuple[str, ...]:
    names = []
    for name, platforms in sorted(ext.registrations().items()):
        for platform, capsule in platforms.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
        names.append(name)
    return tuple(names)


TARGETS: tuple[str, ...] = _register_all()

F32_SCALAR = jax.ShapeDtypeStruct((), jnp.float32)
# Stands in for an operand or result that is not used (the handler leaves it
# alone): every call of a target has one fixed signature.
PLACEHOLDER = (0,)


def placeholder(dtype) -> jax.Array:
    return jnp.zeros(PLACEHOLDER, dtype)


def default_device():
    """The device jit places computations on: jax.default_device(...) when
    set (a device or a platform name), else the default backend's first."""
    d = jax.config.jax_default_device
    if d is None:
        return jax.devices()[0]
    if isinstance(d, str):
        return jax.devices(d)[0]
    return d


def core_platform(device) -> str:
    """The core's name for a JAX device's platform: "cpu" or "cuda"."""
    return "cpu" if device.platform == "cpu" else "cuda"


# --- amax -------------------------------------------------------------------------

def amax_call(x: jax.Array) -> jax.Array:
    """fp8kit_amax: max |x| as a float32 scalar."""
    return jax.ffi.ffi_call("fp8kit_amax", F32_SCALAR, vmap_method="sequential")(x)


# --- quantize ---------------------------------------------------------------------

def fp8_results(shape, fmt: str, rowwise: bool, columnwise: bool):
    dt = _checks.FP8_DTYPES[fmt]
    return (jax.ShapeDtypeStruct(tuple(shape) if rowwise else PLACEHOLDER, dt),
            jax.ShapeDtypeStruct(columnwise_shape(shape) if columnwise else PLACEHOLDER, dt))


def quantize_call(x, scale, fmt: str, rowwise: bool, columnwise: bool):
    """fp8kit_quantize with a given scale: (data, columnwise_data, scale_inv,
    amax), a placeholder for a layout not asked for."""
    return jax.ffi.ffi_call(
        "fp8kit_quantize",
        (*fp8_results(x.shape, fmt, rowwise, columnwise), F32_SCALAR, F32_SCALAR),
        vmap_method="sequential",
    )(x, scale, rowwise=bool(rowwise), columnwise=bool(columnwise))


def view_2d(shape) -> tuple[int, int]:
    """(rows, cols) = (prod(leading), last): the 2-D view the columnwise copy
    and the column sums use."""
    cols, rows = columnwise_shape(shape)
    return rows, cols


def workspace_result(tensors, with_state: bool) -> jax.ShapeDtypeStruct:
    """The uint8 workspace result of a quantize call (jax_ext/scratch.h);
    tensors: (shape, column_sums) per input."""
    views = [(*view_2d(shape), bool(sums)) for shape, sums in tensors]
    return jax.ShapeDtypeStruct((int(ext.workspace_bytes(views, with_state)),), jnp.uint8)


def sums_result(shape, sums_dtype) -> jax.ShapeDtypeStruct:
    if sums_dtype is None:
        return jax.ShapeDtypeStruct(PLACEHOLDER, jnp.float32)
    return jax.ShapeDtypeStruct((view_2d(shape)[1],), sums_dtype)


def quantize_current_scaling_call(x, fmt: str, rowwise: bool, columnwise: bool,
                                  amax_epsilon: float, power_2_scale: bool, sums_dtype=None):
    """fp8kit_quantize_current_scaling: (data, columnwise_data, scale,
    scale_inv, amax, sums); sums, the column sums of x's 2-D view in
    `sums_dtype`, only when one is given (it needs the columnwise copy)."""
    out = jax.ffi.ffi_call(
        "fp8kit_quantize_current_scaling",
        (*fp8_results(x.shape, fmt, rowwise, columnwise), F32_SCALAR, F32_SCALAR, F32_SCALAR,
         sums_result(x.shape, sums_dtype), workspace_result([(x.shape, sums_dtype is not None)], False)),
        vmap_method="sequential",
    )(x, rowwise=bool(rowwise), columnwise=bool(columnwise), sums=sums_dtype is not None,
      amax_epsilon=np.float32(amax_epsilon), power_2_scale=bool(power_2_scale))
    return out[:-1]


def compute_scale_call(amax, fmt: str, amax_epsilon: float, power_2_scale: bool):
    """fp8kit_compute_scale: (scale, scale_inv) from an amax."""
    return jax.ffi.ffi_call("fp8kit_compute_scale", (F32_SCALAR, F32_SCALAR),
                            vmap_method="sequential")(
        amax, fp8_dtype=np.int32(FP8_DTYPE_CODES[fmt]), amax_epsilon=np.float32(amax_epsilon),
        power_2_scale=bool(power_2_scale))


def dequantize_call(data, scale_inv, shape, dtype, from_columnwise: bool,
                    scaling_mode: str = "per_tensor"):
    """fp8kit_dequantize: `data` (rowwise, or the columnwise copy) times
    scale_inv (one float32, or that copy's block scales), in the logical
    `shape`."""
    return jax.ffi.ffi_call("fp8kit_dequantize", jax.ShapeDtypeStruct(tuple(shape), dtype),
                            vmap_method="sequential")(
        data, scale_inv, from_columnwise=bool(from_columnwise),
        scaling_mode=np.int32(SCALING_MODE_CODES[scaling_mode]))


# --- cast statistics --------------------------------------------------------------------

def cast_statistics_call(x, data, scale_inv, from_columnwise: bool, scaling_mode: str):
    """fp8kit_cast_statistics_of: (amax, underflow, saturated, error_sq,
    norm_sq) of the cast of x into `data` (its rowwise copy, or its
    columnwise one), read with scale_inv (one float32, or that copy's block
    scales; scaling_mode "per_row": one float32 per row of x's [prod(leading),
    last] view, a grouped copy's rows, fp8kit_cast_statistics_of_rows);
    scalars, the counts uint32. The CUDA kernels' scratch is one more
    result, so that the call allocates nothing inside XLA's command
    buffers."""
    per_row = scaling_mode == "per_row"
    u32 = jax.ShapeDtypeStruct((), jnp.uint32)
    workspace = jax.ShapeDtypeStruct((CAST_STATISTICS_WORKSPACE_BYTES,), jnp.uint8)
    *statistics, _ = jax.ffi.ffi_call("fp8kit_cast_statistics",
                                      (F32_SCALAR, u32, u32, F32_SCALAR, F32_SCALAR, workspace),
                                      vmap_method="sequential")(
        x, data, scale_inv, from_columnwise=bool(from_columnwise),
        scaling_mode=np.int32(SCALING_MODE_CODES["per_tensor" if per_row else scaling_mode]),
        per_row=per_row)
    return tuple(statistics)


# --- block scaling -----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def block_scale_inv_shape(scaling_mode: str, shape: tuple[int, ...],
                          columnwise: bool) -> tuple[int, int]:
    """The core's (outer, inner) of the float32 block scales of the rowwise
    or columnwise copy of a tensor of logical `shape` (the 2-D view of the
    columnwise-only ScaledTensor gives the same answer)."""
    return tuple(ext.block_scale_inv_shape(SCALING_MODE_CODES[scaling_mode], tuple(shape),
                                           bool(columnwise)))


def quantize_block_scaling_call(x, fmt: str, rowwise: bool, columnwise: bool, scaling_mode: str,
                                amax_epsilon: float, power_2_scale: bool):
    """fp8kit_quantize_block_scaling: (data, columnwise_data,
    block_scale_inv, columnwise_block_scale_inv), placeholders for a copy
    not asked for."""
    scales = [jax.ShapeDtypeStruct(
        block_scale_inv_shape(scaling_mode, x.shape, cw) if wanted else PLACEHOLDER, jnp.float32)
        for cw, wanted in ((False, rowwise), (True, columnwise))]
    return jax.ffi.ffi_call(
        "fp8kit_quantize_block_scaling",
        (*fp8_results(x.shape, fmt, rowwise, columnwise), *scales),
        vmap_method="sequential",
    )(x, rowwise=bool(rowwise), columnwise=bool(columnwise),
      scaling_mode=np.int32(SCALING_MODE_CODES[scaling_mode]),
      amax_epsilon=np.float32(amax_epsilon), power_2_scale=bool(power_2_scale))


# --- delayed scaling ------------------------------------------------------------------

def delayed_scaling_update_call(amax_history, amax, scale, fmts: Sequence[str], margin: int,
                                amax_reduction: str):
    """fp8kit_delayed_scaling_update for n tensors: (history, scale, scale_inv)."""
    n, length = amax_history.shape
    f32 = jnp.float32
    return jax.ffi.ffi_call(
        "fp8kit_delayed_scaling_update",
        (jax.ShapeDtypeStruct((n, length), f32), jax.ShapeDtypeStruct((n,), f32),
         jax.ShapeDtypeStruct((n,), f32)),
        vmap_method="sequential",
        # The core updates history and scale in place.
        input_output_aliases={0: 0, 2: 1},
    )(amax_history, amax, scale, margin=np.int32(margin),
      amax_reduction=np.int32(AMAX_REDUCTION_CODES[amax_reduction]),
      fp8_dtypes=np.asarray([FP8_DTYPE_CODES[f] for f in fmts], dtype=np.int32))


@dataclasses.dataclass(frozen=True)
class DelayedQuantize:
    """Static description of one fp8kit_quantize_delayed_update call, per
    input: its FP8 format, the copies written (rowwise, columnwise) and the
    dtype of its column sums (None: no sums)."""

    fmts: tuple[str, ...]
    copies: tuple[tuple[bool, bool], ...]
    sums_dtypes: tuple[Optional[jnp.dtype], ...]
    record: bool          # update the state (a pass that computes gradients)
    margin: int
    amax_reduction: str   # fp8kit.recipe.AmaxReduction value
    first_slot: int = 0   # the state row of the first input


def quantize_delayed_update_call(call: DelayedQuantize, amax_history, scale, seeded, xs,
                                 amax=None):
    """fp8kit_quantize_delayed_update on len(xs) inputs with a layer's whole
    state (amax_history [slots, L], scale [slots], seeded float32 [slots]),
    input i using row call.first_slot + i: the state goes in and comes out
    as it is, with no slicing or scattering of rows around the call.
    Recording, the state comes out updated (the target aliases it); not
    recording, a read-only target casts with it and the state returned is
    the one passed in.

    amax: [n] amaxes of the whole inputs, reduced across the devices that
    share them, to start the core's accumulators at (None: 0).
    Returns (amax_history, scale, seeded, outputs), outputs one (data,
    columnwise_data, sums, scale_inv) per input, placeholders where not
    asked for; scale_inv = 1 / the scale the input was cast with.
    """
    n = len(xs)
    f32 = jnp.float32
    per_input = []
    for x, fmt, (rowwise, columnwise), sums_dtype in zip(xs, call.fmts, call.copies,
                                                         call.sums_dtypes):
        per_input += [*fp8_results(x.shape, fmt, rowwise, columnwise),
                      sums_result(x.shape, sums_dtype), F32_SCALAR]
    workspace = workspace_result([(x.shape, d is not None) for x, d in zip(xs, call.sums_dtypes)],
                           True)
    state_results = (jax.ShapeDtypeStruct(amax_history.shape, f32),
                     jax.ShapeDtypeStruct(scale.shape, f32),
                     jax.ShapeDtypeStruct(seeded.shape, f32)) if call.record else ()
    flags = lambda values: np.asarray(values, dtype=np.int32)  # noqa: E731
    out = jax.ffi.ffi_call(
        "fp8kit_quantize_delayed_update" if call.record else "fp8kit_quantize_delayed",
        (*state_results, workspace, *per_input),
        vmap_method="sequential",
        # Recording, the core updates history, scale and seeded in place.
        input_output_aliases={0: 0, 1: 1, 2: 2} if call.record else {},
    )(amax_history, scale, seeded, placeholder(f32) if amax is None else amax, *xs,
      first_slot=np.int64(call.first_slot), margin=np.int32(call.margin),
      amax_reduction=np.int32(AMAX_REDUCTION_CODES[call.amax_reduction]),
      rowwise=flags([c[0] for c in call.copies]), columnwise=flags([c[1] for c in call.copies]),
      sums=flags([d is not None for d in call.sums_dtypes]))
    if call.record:
        amax_history, scale, seeded = out[:3]
    first = len(state_results) + 1  # past the workspace
    outputs = [tuple(out[first + 4 * i:first + 4 * i + 4]) for i in range(n)]
    return amax_history, scale, seeded, outputs


def linear_plan(tokens: int, in_features: int, out_features: int, dgrad: bool, wgrad: bool,
                non_tn: bool) -> dict:
    """fp8kit_linear_plan_make for a [K, N] kernel (FP8KIT_WEIGHT_IN_OUT):
    which copies each slot's cast writes and backward keeps (fp8kit/linear.h)."""
    return ext.linear_plan(tokens, in_features, out_features, "in_out", dgrad, wgrad, non_tn)


# --- GEMM -------------------------------------------------------------------------------

# Bias dtype the core takes for each output dtype (fp8kit/gemm.h's table).
BIAS_DTYPE = {jnp.dtype(jnp.bfloat16): jnp.dtype(jnp.bfloat16),
              jnp.dtype(jnp.float16): jnp.dtype(jnp.float16),
              jnp.dtype(jnp.float32): jnp.dtype(jnp.bfloat16)}


@dataclasses.dataclass(frozen=True)
class GemmLayout:
    """Static description of one fp8kit_gemm call: which copy of each operand
    is passed (the other is a placeholder), the transposes, the output."""

    trans_a: bool
    trans_b: bool
    a_rowwise: bool        # a's buffer is its rowwise data (else its columnwise data)
    b_rowwise: bool
    out_dtype: jnp.dtype
    has_bias: bool
    use_split_accumulator: bool
    # "per_tensor" (a and b scale_inv one float32 each) or a block mode (the
    # scale_inv arguments are the block scales of the buffers passed).
    a_scaling_mode: str = "per_tensor"
    b_scaling_mode: str = "per_tensor"

    @property
    def block_scaled(self) -> bool:
        return self.a_scaling_mode != "per_tensor"

    @property
    def a_is_km(self) -> bool:
        """a's buffer is [K, M] (else [M, K])."""
        return self.a_rowwise == self.trans_a

    @property
    def b_is_kn(self) -> bool:
        """b's buffer is [K, N] (else [N, K])."""
        return self.b_rowwise != self.trans_b


def gemm_workspace_bytes() -> int:
    """cuBLASLt workspace for the platform jit compiles for (0 for the CPU)."""
    return int(ext.gemm_workspace_size(core_platform(default_device())))


def gemm_call(layout: GemmLayout, a_buf, a_scale_inv, b_buf, b_scale_inv, bias=None):
    """fp8kit_gemm on one device's 2-D buffers: D [M, N]. Per-tensor scales
    are float32 scalars; block scales are passed as they are."""
    m = a_buf.shape[1] if layout.a_is_km else a_buf.shape[0]
    n = b_buf.shape[1] if layout.b_is_kn else b_buf.shape[0]
    a_none, b_none = placeholder(a_buf.dtype), placeholder(b_buf.dtype)
    a_row, a_col = (a_buf, a_none) if layout.a_rowwise else (a_none, a_buf)
    b_row, b_col = (b_buf, b_none) if layout.b_rowwise else (b_none, b_buf)
    bias_arg = bias if layout.has_bias else placeholder(BIAS_DTYPE[layout.out_dtype])
    # cuBLASLt's workspace is a second, discarded result, so XLA allocates it
    # with the program's temporaries (jax_ext/gemm_ffi.cc says why).
    workspace = jax.ShapeDtypeStruct((gemm_workspace_bytes(),), jnp.uint8)
    d, _ = jax.ffi.ffi_call("fp8kit_gemm",
                            (jax.ShapeDtypeStruct((m, n), layout.out_dtype), workspace),
                            vmap_method="sequential")(
        a_row, a_col, a_scale_inv, b_row, b_col, b_scale_inv, bias_arg,
        trans_a=layout.trans_a, trans_b=layout.trans_b, a_rowwise=layout.a_rowwise,
        a_columnwise=not layout.a_rowwise, b_rowwise=layout.b_rowwise,
        b_columnwise=not layout.b_rowwise, has_bias=layout.has_bias,
        use_split_accumulator=layout.use_split_accumulator,
        a_scaling_mode=np.int32(SCALING_MODE_CODES[layout.a_scaling_mode]),
        b_scaling_mode=np.int32(SCALING_MODE_CODES[layout.b_scaling_mode]))
    return d
