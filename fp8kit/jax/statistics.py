"""Cast statistics through the core: what the cast of a tensor to FP8 lost,
read from the tensor and the FP8 copy the cast wrote (nothing is
re-quantized): its amax, how many values underflowed to zero or saturated
at the format's max, and the sums of squared error and of x^2
(fp8kit.statistics.CastStatistics says exactly what each is).

One custom call, one pass over x, on CPU and CUDA devices; under vmap one
call per example. It has no sharding rule: XLA gathers sharded operands to
run it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _statistics_rows as _rows
from fp8kit.jax.block_quantization import check_block_scales
from fp8kit.jax.scaled_tensor import ScaledTensor, columnwise_shape
from fp8kit.statistics import CastStatistics


def cast_statistics(x, scaled: ScaledTensor, columnwise: bool = False) -> CastStatistics:
    """The statistics of the cast of x into `scaled`, its FP8 copy.

    x:          the high-precision array (float32/bfloat16/float16, rank
                <= 8) that `scaled` was made from.
    scaled:     a ScaledTensor of x, per-tensor or block scaled (as
                fp8kit.jax.quantize, quantize_current_scaling or
                quantize_block_scaling return it).
    columnwise: read its columnwise copy (which must be held) instead of
                its rowwise one; under block scaling the two have their own
                blocks, so their statistics may differ.
    Returns a CastStatistics of scalars (amax, error_sq, norm_sq float32;
    underflow, saturated uint32), with relative_error, underflow_rate(numel)
    and saturation_rate(numel) derived from them. Works under jit and vmap.
    Not differentiable: its operands are read through stop_gradient, so it
    may sit in a function that jax.grad differentiates (as an aux output).
    Fewer than 2**32 elements.
    """
    fn = "fp8kit.jax.cast_statistics"
    _checks.array(fn, "x", x)
    _checks.high_precision(fn, "x", x)
    _checks.rank(fn, "x", x)
    if not isinstance(scaled, ScaledTensor):
        raise TypeError(f"{fn}: scaled must be an fp8kit.jax.ScaledTensor (the FP8 copy of x, "
                        f"e.g. fp8kit.jax.quantize_current_scaling(x)[0]), got "
                        f"{type(scaled).__name__}")
    columnwise = _checks.flag(fn, "columnwise", columnwise)
    scaled.check(fn, "scaled")
    name = "columnwise_data" if columnwise else "data"
    data = getattr(scaled, name)
    if data is None:
        which, held = ("columnwise", "rowwise") if columnwise else ("rowwise", "columnwise")
        raise ValueError(f"{fn}: scaled holds no {which} copy; read its {held} one "
                         f"(columnwise={not columnwise}) or quantize x with {which}=True")
    shape = tuple(x.shape)
    want = columnwise_shape(shape) if columnwise else shape
    if tuple(data.shape) != want:
        raise ValueError(f"{fn}: x has shape {shape} but scaled.{name} has shape "
                         f"{tuple(data.shape)} (a copy of x's is {want}); pass the FP8 copy of "
                         "x itself")
    _checks.same_devices(fn, "x", x, f"scaled.{name}", data)
    if scaled.block_scaled:
        check_block_scales(fn, "scaled", scaled)
        scales = scaled.columnwise_block_scale_inv if columnwise else scaled.block_scale_inv
    else:
        scales = jnp.reshape(jnp.asarray(scaled.scale_inv, jnp.float32), ())
    # A diagnostic: no gradient flows through it (the custom call has no
    # differentiation rule, which would fail a function under jax.grad).
    x, data, scales = jax.lax.stop_gradient((jnp.asarray(x), data, scales))
    return CastStatistics(*_ffi.cast_statistics_call(x, data, scales, columnwise,
                                                     scaled.scaling_mode))


# --- a layer's statistics rows --------------------------------------------------------

# (GEMM, role) of each row of a layer's statistics, by its number of rows:
# the rows of its delayed-scaling state (dense and layernorm_dense: one
# Linear; layernorm_mlp: fc1 and fc2).
_ROW_TENSORS = {
    3: (("", "input"), ("", "weight"), ("", "grad_output")),
    6: ((".fc1", "input"), (".fc1", "weight"), (".fc2", "input"), (".fc2", "weight"),
        (".fc1", "grad_output"), (".fc2", "grad_output")),
}


def statistics_rows(num_linears: int = 1):
    """Zeroed statistics rows for one layer call: pass them as the layer's
    `statistics` argument (dense, layernorm_dense and grouped_dense:
    num_linears=1; layernorm_mlp: 2) and differentiate with respect to them; the
    gradient is the filled rows (fp8kit/jax/_statistics_rows.py), which
    tensor_statistics reads."""
    if num_linears not in (1, 2):
        raise ValueError(f"fp8kit.jax.statistics_rows: num_linears={num_linears!r}; a layer "
                         "has 1 (dense, layernorm_dense) or 2 (layernorm_mlp) Linears")
    return jnp.zeros((3 * num_linears, len(_rows.COLUMNS)), jnp.float32)


def tensor_statistics(rows, layer: str) -> list:
    """The filled rows of one layer as fp8kit.inspect TensorStats (host
    numbers; this reads the device): one per cast that ran, named
    `layer` (+ ".fc1" / ".fc2" for layernorm_mlp) and its role."""
    from fp8kit.inspect.records import TensorStats
    rows = jnp.asarray(rows)
    names = _ROW_TENSORS.get(rows.shape[0]) if rows.ndim == 2 else None
    if names is None or rows.shape[1] != len(_rows.COLUMNS):
        raise ValueError(f"fp8kit.jax.tensor_statistics: rows have shape {rows.shape}; pass "
                         "what a layer filled from statistics_rows(1) or statistics_rows(2)")
    return [TensorStats(layer=layer + suffix, role=role, **values)
            for (suffix, role), values in zip(names, _rows.read(rows)) if values is not None]
