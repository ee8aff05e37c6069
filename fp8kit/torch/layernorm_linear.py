"""fp8kit.torch.LayerNormLinear: y = Linear(norm(x)) with the FP8 cast of
the normalized x fused into the normalization.

Inside fp8kit.torch.autocast the normalization kernel (ext.norm_forward)
writes the FP8 input of the GEMM directly, in the copies the core's plan
asks for (rowwise for the forward GEMM, columnwise for wgrad on TN-only
devices); those FP8 copies are what backward keeps, never the
high-precision normalized x. The GEMMs are fp8kit.torch.Linear's own
forward and backward (one C++ call each, fp8kit.torch._fused_steps), on
that cast input: the weight's cast and the forward GEMM; backward
quantizes dy (its column sums are the bias gradient) and runs the dgrad
and wgrad FP8 GEMMs, then the normalization backward gives dx,
d(layer_norm_weight) and d(layer_norm_bias). Outside autocast it computes
exactly torch's norm followed by F.linear.

Under BlockScaling the normalization is the core's kernel without its cast
(fp8kit.torch._block_fused), in the input's dtype, and its output goes
through the block-scaled Linear (fp8kit.torch._block_linear), whose own
block quantization casts it; that recipe keeps no state.

Under torch.compile and torch.export each step is a dispatcher op instead
of a pybind11 call (fp8kit.torch._fused_steps): the same bits, traced
forward and backward with no graph break, the scaling state updated in the
graph.

Scaling state: one ext.LinearState per recipe (fp8_state_for(recipe)
returns it as a 1-tuple), with the three slots of fp8kit/linear.h:
    0  the normalized x (the GEMM's input)   forward format
    1  weight                                forward format
    2  dy, the output gradient               backward format
seeded and recorded exactly as fp8kit.torch.Linear's (a forward that
computes no gradient records nothing). A weight that is already a
Float8Tensor (FSDP2's FP8 all-gather, fp8kit.torch.distributed) goes to
the GEMMs as it is, and its slot records nothing.

state_dict keys: layer_norm_weight, layer_norm_bias (LayerNorm only),
weight [out_features, in_features], bias, _extra_state (fp8kit's
_fused_module docstring describes it).

An inf or NaN in the input or a weight is never saturated: the outputs it
reaches are non-finite, as in bf16 (fp8kit.recipe says how the scales treat
it).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from fp8kit.recipe import BlockScaling
from fp8kit.torch._block_fused import block_norm
from fp8kit.torch._block_linear import block_linear
from fp8kit.torch._fused_module import (FusedLayer, check_features, check_normalization,
                                        init_linear, master_dtype, read_norm, weight_args)
from fp8kit.torch._fused_steps import INPUT
from fp8kit.torch._outputs import layer_output
from fp8kit.torch._plan import kept, plan
from fp8kit.torch.autocast import STATE as _AUTOCAST


class LayerNormLinear(FusedLayer):
    """norm (LayerNorm or RMSNorm over in_features) followed by a Linear,
    in FP8 inside fp8kit.torch.autocast."""

    _GEMMS = {"linear": "weight"}

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 normalization: str = "LayerNorm", eps: Optional[float] = 1e-5, device=None,
                 dtype=None) -> None:
        super().__init__()
        check_features("LayerNormLinear", "in_features", in_features)
        check_features("LayerNormLinear", "out_features", out_features)
        check_normalization("LayerNormLinear", normalization, eps)
        self.in_features, self.out_features = in_features, out_features
        self._init_norm(in_features, normalization, eps, device, dtype)
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **kw))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **kw))
        else:
            self.register_parameter("bias", None)
        init_linear(self.weight, self.bias)

    @classmethod
    def from_unfused(cls, norm: torch.nn.Module, linear: torch.nn.Linear) -> "LayerNormLinear":
        """The layer computing linear(norm(x)), with copies of their parameters
        (norm: torch.nn.LayerNorm or torch.nn.RMSNorm over one dimension, with
        its elementwise affine parameters)."""
        normalization, eps, gamma, beta = read_norm("LayerNormLinear", norm)
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError("fp8kit.torch.LayerNormLinear.from_unfused: linear must be a "
                            f"torch.nn.Linear, got {type(linear).__name__}")
        if linear.in_features != gamma.shape[0]:
            raise ValueError("fp8kit.torch.LayerNormLinear.from_unfused: linear.in_features is "
                             f"{linear.in_features} but the norm is over {gamma.shape[0]} "
                             "features; they must match")
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    normalization, eps, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            layer.layer_norm_weight.copy_(gamma)
            if beta is not None:
                layer.layer_norm_bias.copy_(beta)
            layer.weight.copy_(w)
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        recipe = _AUTOCAST.recipe
        if recipe is None:
            return F.linear(self._norm(input), self.weight, self.bias)
        p = self._parameters
        params = [p["layer_norm_weight"], p["layer_norm_bias"], p["weight"], p["bias"]]
        # The per-tensor casts read a float32 weight as it is (_fp8_inputs).
        master = () if type(recipe) is BlockScaling else (2,)
        x, (gamma, beta, weight, bias) = self._fp8_inputs(input, params, master)
        if type(recipe) is BlockScaling:
            y = block_linear("LayerNormLinear", recipe,
                             block_norm(x, gamma, beta, self.normalization, self._fp8_eps),
                             weight, bias, self._fp8_inspect)
            return layer_output(y, input, self.out_features)
        steps, (state,), fast = self._select_states(recipe, (weight,))
        call = _Call(steps, state, fast, self.normalization, self._fp8_eps, self._fp8_inspect)
        tensors = (x, gamma, beta, weight, bias)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            y = _LayerNormLinearFunction.apply(call, *tensors)
        else:
            y = _forward(call, x, gamma, beta, weight, bias, None)
        return layer_output(y, input, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, normalization={self.normalization}, "
                f"eps={self.eps}")


class _Call(NamedTuple):
    """What one call runs with besides its tensors."""
    steps: type  # _fused_steps.EAGER or TRACED
    state: object  # an ext.LinearState, or a TracedState for TRACED
    fast: bool
    normalization: str
    eps: float
    inspect: object  # fp8kit.torch.inspect's recorder at a logged step, else None


def _forward(call, x, gamma, beta, weight, bias, ctx):
    """The FP8 forward; with ctx (a pass that computes gradients) it records
    the scaling state and saves the FP8 copies backward reads."""
    st, steps = call.state, call.steps
    m, k = x.shape
    n = weight.shape[0]
    record = ctx is not None
    dgrad = record and any(ctx.needs_input_grad[1:4])
    wgrad = record and ctx.needs_input_grad[4]
    p = plan(m, k, n, dgrad, wgrad, st.non_tn)
    inspect = call.inspect
    # Inspected: the kernel also writes the normalized x it casts (want_y),
    # whose statistics the Linear step records.
    x_data, x_cw, x_sinv, mean, rsigma, x_norm = steps.norm_forward(
        x, gamma, beta, call.normalization, call.eps, st, INPUT, record, *p.input,
        inspect is not None)
    statistics = None if inspect is None else inspect.linear_statistics("", m, weight)
    y, w_kept, w_sinv = steps.linear_forward_cast_input(
        st, "fp8kit.torch.LayerNormLinear (weight)", x_data, x_sinv, *weight_args(weight), bias, call.fast, record, dgrad, wgrad,
        statistics, x_norm, out_dtype=x.dtype)
    if record:
        ctx.call, ctx.grads, ctx.statistics = call, (dgrad, wgrad), statistics
        ctx.weight_dtype = master_dtype(weight, x)
        ctx.save_for_backward(x, mean, rsigma, gamma, kept(p.saved_input, x_data, x_cw), x_sinv,
                              w_kept, w_sinv)
    return y


class _LayerNormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, x, gamma, beta, weight, bias):
        return _forward(call, x, gamma, beta, weight, bias, ctx)

    @staticmethod
    def backward(ctx, dy):
        x, mean, rsigma, gamma, x_kept, x_sinv, w_kept, w_sinv = ctx.saved_tensors
        call = ctx.call
        st, steps = call.state, call.steps
        needs = ctx.needs_input_grad
        m, k = x.shape
        n = dy.shape[-1]
        dgrad, wgrad = ctx.grads
        dx = dgamma = dbeta = dw = db = None
        if m == 0:  # no tokens: every gradient is zero
            dx = torch.zeros_like(x) if needs[1] else None
            dgamma = torch.zeros_like(gamma) if needs[2] else None
            dbeta = torch.zeros_like(gamma) if needs[3] else None
            dw = torch.zeros((n, k), dtype=x.dtype, device=x.device) if wgrad else None
            db = torch.zeros(n, dtype=x.dtype, device=x.device) if needs[5] else None
            return None, dx, dgamma, dbeta, dw, db
        dy = dy.reshape(m, n).contiguous()
        d_norm, dw, db = steps.linear_backward(st, dy, x_kept, x_sinv, w_kept, w_sinv, (m, k),
                                               dgrad, wgrad, dgrad, wgrad, needs[5],
                                               ctx.statistics, weight_dtype=ctx.weight_dtype)
        if dgrad:
            dx, dgamma, dbeta = steps.norm_backward(d_norm, x, mean, rsigma, gamma,
                                                    call.normalization, call.eps)
        return None, dx, dgamma, dbeta, dw, db
