"""fp8kit.torch.LayerNormMLP: y = fc2(act(fc1(norm(x)))) with the FP8
casts fused into the normalization and the activation.

    fc1_weight  [ffn_hidden_size, hidden_size] for "gelu";
                [2 * ffn_hidden_size, hidden_size] for "swiglu": the gate
                rows first, then the up rows ([gate; up]), so that fc1's
                output is [gate | up] along its last dimension
    fc2_weight  [hidden_size, ffn_hidden_size]
    activation  "gelu" (tanh approximation) or "swiglu" (silu(gate) * up)

Inside fp8kit.torch.autocast the normalization kernel writes fc1's FP8
input and the activation kernel fc2's FP8 input directly, each in the
copies the core's plan asks for; backward keeps those FP8 copies, the input
x (for the normalization backward) and fc1's output h (for the activation
backward). fc1 and fc2 run fp8kit.torch.Linear's own forward and backward
(one C++ call each, fp8kit.torch._fused_steps) on those cast inputs.
Backward: fc2's (dy quantized, its column sums fc2's bias gradient; dgrad
gives d_a in the input's dtype, wgrad dw2); the activation backward casts
dh to FP8 (its column sums are fc1's bias gradient); fc1's dgrad and wgrad
on that cast dh; the normalization backward last. Outside autocast it
computes exactly torch's norm, F.linear and activation.

Under BlockScaling the normalization and the activation are the core's
kernels without their cast (fp8kit.torch._block_fused), in the input's
dtype, and fc1 and fc2 are block-scaled Linears (fp8kit.torch._block_linear),
whose own block quantization casts their inputs; that recipe keeps no
state.

Under torch.compile and torch.export each step is a dispatcher op instead
of a pybind11 call (fp8kit.torch._fused_steps): the same bits, traced
forward and backward with no graph break, the scaling state updated in the
graph.

Scaling state: per recipe, one ext.LinearState per GEMM
(fp8_state_for(recipe) returns (fc1's, fc2's)), six slots in all, each
GEMM's three in the order of fp8kit/linear.h:
    fc1: 0 its input (the normalized x), 1 fc1_weight, 2 its output
         gradient dh (backward format)
    fc2: 0 its input (the activation a), 1 fc2_weight, 2 its output
         gradient dy (backward format)
seeded and recorded exactly as fp8kit.torch.Linear's. A GEMM weight that
is already a Float8Tensor (FSDP2's FP8 all-gather, fp8kit.torch.distributed)
goes to the GEMMs as it is, and its slot records nothing.

state_dict keys: layer_norm_weight, layer_norm_bias (LayerNorm only),
fc1_weight, fc1_bias, fc2_weight, fc2_bias, _extra_state (the
_fused_module docstring describes it; gemms "fc1" and "fc2").

An inf or NaN in the input or a weight is never saturated: the outputs it
reaches are non-finite, as in bf16 (fp8kit.recipe says how the scales treat
it).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from fp8kit.recipe import BlockScaling
from fp8kit.torch._block_fused import block_activation, block_norm
from fp8kit.torch._block_linear import block_linear
from fp8kit.torch._fused_module import (FusedLayer, check_features, check_normalization,
                                        init_linear, master_dtype, read_norm, weight_args)
from fp8kit.torch._fused_steps import GRAD_OUTPUT, INPUT
from fp8kit.torch._outputs import layer_output
from fp8kit.torch._plan import kept, plan
from fp8kit.torch.autocast import STATE as _AUTOCAST

ACTIVATIONS = ("gelu", "swiglu")


class LayerNormMLP(FusedLayer):
    """norm -> fc1 -> activation -> fc2, in FP8 inside fp8kit.torch.autocast."""

    _GEMMS = {"fc1": "fc1_weight", "fc2": "fc2_weight"}

    def __init__(self, hidden_size: int, ffn_hidden_size: int, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu",
                 eps: Optional[float] = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        check_features("LayerNormMLP", "hidden_size", hidden_size)
        check_features("LayerNormMLP", "ffn_hidden_size", ffn_hidden_size)
        check_normalization("LayerNormMLP", normalization, eps)
        if activation not in ACTIVATIONS:
            raise ValueError(f"fp8kit.torch.LayerNormMLP: activation is {activation!r}; use "
                             "'gelu' or 'swiglu'")
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.activation = activation
        self._init_norm(hidden_size, normalization, eps, device, dtype)
        kw = {"device": device, "dtype": dtype}
        fc1_rows = 2 * ffn_hidden_size if activation == "swiglu" else ffn_hidden_size
        for name, shape in (("fc1", (fc1_rows, hidden_size)), ("fc2", (hidden_size,
                                                                      ffn_hidden_size))):
            self.register_parameter(f"{name}_weight", torch.nn.Parameter(torch.empty(shape, **kw)))
            self.register_parameter(f"{name}_bias", torch.nn.Parameter(torch.empty(shape[0], **kw))
                                    if bias else None)
        init_linear(self.fc1_weight, self.fc1_bias)
        init_linear(self.fc2_weight, self.fc2_bias)

    @classmethod
    def from_unfused(cls, norm: torch.nn.Module, fc1: torch.nn.Linear, fc2: torch.nn.Linear,
                     activation: str = "gelu") -> "LayerNormMLP":
        """The layer computing fc2(act(fc1(norm(x)))), with copies of their
        parameters. For "swiglu", fc1 has 2 * ffn rows, the gate rows first
        ([gate; up]), so fc1(x) = [gate | up]."""
        fn = "fp8kit.torch.LayerNormMLP.from_unfused"
        normalization, eps, gamma, beta = read_norm("LayerNormMLP", norm)
        for name, lin in (("fc1", fc1), ("fc2", fc2)):
            if not isinstance(lin, torch.nn.Linear):
                raise TypeError(f"{fn}: {name} must be a torch.nn.Linear, got "
                                f"{type(lin).__name__}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"{fn}: activation is {activation!r}; use 'gelu' or 'swiglu'")
        hidden = gamma.shape[0]
        ffn = fc2.in_features
        fc1_rows = 2 * ffn if activation == "swiglu" else ffn
        if (fc1.in_features, fc1.out_features, fc2.out_features) != (hidden, fc1_rows, hidden):
            raise ValueError(
                f"{fn}: the shapes do not chain: norm over {hidden}, fc1 {fc1.in_features} -> "
                f"{fc1.out_features}, fc2 {fc2.in_features} -> {fc2.out_features}; with "
                f"{activation!r} fc1 must be {hidden} -> {fc1_rows} and fc2 {ffn} -> {hidden}")
        if (fc1.bias is None) != (fc2.bias is None):
            raise ValueError(f"{fn}: fc1 and fc2 must both have a bias or both have none")
        w = fc1.weight
        layer = cls(hidden, ffn, fc1.bias is not None, normalization, activation, eps,
                    device=w.device, dtype=w.dtype)
        with torch.no_grad():
            layer.layer_norm_weight.copy_(gamma)
            if beta is not None:
                layer.layer_norm_bias.copy_(beta)
            layer.fc1_weight.copy_(fc1.weight)
            layer.fc2_weight.copy_(fc2.weight)
            if fc1.bias is not None:
                layer.fc1_bias.copy_(fc1.bias)
                layer.fc2_bias.copy_(fc2.bias)
        return layer

    def _act(self, h: torch.Tensor) -> torch.Tensor:
        if self.activation == "gelu":
            return F.gelu(h, approximate="tanh")
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        recipe = _AUTOCAST.recipe
        if recipe is None:
            h = F.linear(self._norm(input), self.fc1_weight, self.fc1_bias)
            return F.linear(self._act(h), self.fc2_weight, self.fc2_bias)
        p = self._parameters
        params = [p["layer_norm_weight"], p["layer_norm_bias"], p["fc1_weight"], p["fc1_bias"],
                  p["fc2_weight"], p["fc2_bias"]]
        # The per-tensor casts read float32 fc weights as they are (_fp8_inputs).
        master = () if type(recipe) is BlockScaling else (2, 4)
        x, params = self._fp8_inputs(input, params, master)
        if type(recipe) is BlockScaling:
            gamma, beta, w1, b1, w2, b2 = params
            inspect = self._fp8_inspect
            ln = block_norm(x, gamma, beta, self.normalization, self._fp8_eps)
            h = block_linear("LayerNormMLP", recipe, ln, w1, b1, inspect, "fc1")
            a = block_activation(h, self.activation)
            y = block_linear("LayerNormMLP", recipe, a, w2, b2, inspect, "fc2")
            return layer_output(y, input, self.hidden_size)
        steps, states, fast = self._select_states(recipe, (params[2], params[4]))
        call = _Call(steps, states, fast, self.normalization, self._fp8_eps, self.activation,
                     self._fp8_inspect)
        tensors = (x, *params)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            y = _LayerNormMLPFunction.apply(call, *tensors)
        else:
            y = _forward(call, *tensors, None)
        return layer_output(y, input, self.hidden_size)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"bias={self.fc1_bias is not None}, normalization={self.normalization}, "
                f"activation={self.activation}, eps={self.eps}")


class _Call(NamedTuple):
    """What one call runs with besides its tensors."""
    steps: type  # _fused_steps.EAGER or TRACED
    states: tuple  # (fc1's, fc2's): ext.LinearStates, or TracedStates for TRACED
    fast: bool
    normalization: str
    eps: float
    activation: str
    inspect: object  # fp8kit.torch.inspect's recorder at a logged step, else None


# needs_input_grad indices of _LayerNormMLPFunction.apply(call, x, gamma,
# beta, w1, b1, w2, b2).
_X, _GAMMA, _BETA, _W1, _B1, _W2, _B2 = range(1, 8)


def _grads(needs) -> tuple:
    """((dgrad, wgrad) of fc1, (dgrad, wgrad) of fc2) for the gradients
    `needs` asks for (None: a forward without gradients)."""
    if needs is None:
        return (False, False), (False, False)
    dgrad1 = any(needs[_X:_BETA + 1])
    wgrad1 = needs[_W1]
    dgrad2 = dgrad1 or wgrad1 or needs[_B1]  # anything before fc2 wants d_a
    return (dgrad1, wgrad1), (dgrad2, needs[_W2])


def _forward(call, x, gamma, beta, w1, b1, w2, b2, ctx):
    """The FP8 forward; with ctx (a pass that computes gradients) it records
    the scaling state and saves what backward reads."""
    st1, st2 = call.states
    steps = call.steps
    m, k = x.shape
    f1, f = w1.shape[0], w2.shape[1]
    record = ctx is not None
    grads1, grads2 = _grads(ctx.needs_input_grad if record else None)
    p1, p2 = plan(m, k, f1, *grads1, st1.non_tn), plan(m, f, k, *grads2, st2.non_tn)
    inspect = call.inspect
    # Inspected: the kernels also write the values they cast (want_y,
    # want_a), whose statistics the Linear steps record.
    stats1 = stats2 = None
    if inspect is not None:
        stats1, stats2 = inspect.linear_statistics("fc1", m, w1), inspect.linear_statistics(
            "fc2", m, w2)
    x_data, x_cw, x_sinv, mean, rsigma, x_norm = steps.norm_forward(
        x, gamma, beta, call.normalization, call.eps, st1, INPUT, record, *p1.input,
        inspect is not None)
    h, w1_kept, w1_sinv = steps.linear_forward_cast_input(
        st1, "fp8kit.torch.LayerNormMLP (fc1_weight)", x_data, x_sinv, *weight_args(w1), b1, call.fast, record, *grads1, stats1, x_norm,
        out_dtype=x.dtype)
    a_data, a_cw, a_sinv, a = steps.activation_forward(h, call.activation, st2, INPUT, record,
                                                       *p2.input, inspect is not None)
    y, w2_kept, w2_sinv = steps.linear_forward_cast_input(
        st2, "fp8kit.torch.LayerNormMLP (fc2_weight)", a_data, a_sinv, *weight_args(w2), b2, call.fast, record, *grads2, stats2, a,
        out_dtype=x.dtype)
    if record:
        ctx.call, ctx.grads, ctx.statistics = call, (grads1, grads2), (stats1, stats2)
        ctx.weight_dtypes = master_dtype(w1, x), master_dtype(w2, x)
        ctx.save_for_backward(x, mean, rsigma, gamma, kept(p1.saved_input, x_data, x_cw), x_sinv,
                              w1_kept, w1_sinv, h, kept(p2.saved_input, a_data, a_cw), a_sinv,
                              w2_kept, w2_sinv)
    return y


class _LayerNormMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, x, gamma, beta, w1, b1, w2, b2):
        return _forward(call, x, gamma, beta, w1, b1, w2, b2, ctx)

    @staticmethod
    def backward(ctx, dy):
        (x, mean, rsigma, gamma, x_kept, x_sinv, w1_kept, w1_sinv, h, a_kept, a_sinv, w2_kept,
         w2_sinv) = ctx.saved_tensors
        call = ctx.call
        st1, st2 = call.states
        steps = call.steps
        needs = ctx.needs_input_grad
        m, k = x.shape
        f1 = h.shape[-1]
        f = f1 // 2 if call.activation == "swiglu" else f1
        grads = [None] * 8
        if m == 0:  # no tokens: every gradient is zero
            like = {_X: x, _GAMMA: gamma, _BETA: gamma}
            shapes = {_W1: (f1, k), _B1: (f1,), _W2: (k, f), _B2: (k,)}
            for i in range(_X, _B2 + 1):
                if needs[i]:
                    grads[i] = (torch.zeros_like(like[i]) if i in like else
                                torch.zeros(shapes[i], dtype=x.dtype, device=x.device))
            return tuple(grads)
        dy = dy.reshape(m, k).contiguous()
        (dgrad1, wgrad1), (dgrad2, wgrad2) = ctx.grads
        stats1, stats2 = ctx.statistics
        # fc2: fp8kit.torch.Linear's backward (dy's cast, whose column sums
        # are fc2's bias gradient; dgrad gives d_a, wgrad dw2).
        d_a, grads[_W2], grads[_B2] = steps.linear_backward(
            st2, dy, a_kept, a_sinv, w2_kept, w2_sinv, (m, f), dgrad2, wgrad2, dgrad2, wgrad2,
            needs[_B2], stats2, weight_dtype=ctx.weight_dtypes[1])
        if not dgrad2:
            return tuple(grads)
        # The activation backward casts dh for fc1's GEMMs, in the copies
        # fc1's plan reads; its column sums are fc1's bias gradient when
        # that pass is the cast+transpose one.
        rowwise, columnwise = plan(m, k, f1, dgrad1, wgrad1, st1.non_tn).grad_output
        sums_in_cast = needs[_B1] and columnwise and m > 1
        need_dh = needs[_B1] and not sums_in_cast
        dh_data, dh_cw, dh_sinv, db1, dh = steps.activation_backward(
            d_a, h, call.activation, st1, GRAD_OUTPUT, True, rowwise or not columnwise,
            columnwise, x.dtype if sums_in_cast else None, need_dh or stats1 is not None)
        # Each gradient buffer is dropped once read: a backward that held
        # them all to its end peaked at its last step, the norm's, with d_a
        # and dh's casts still allocated (GELU, 8192 tokens: 150 MiB above
        # TransformerEngine's layer).
        del d_a
        grads[_B1] = dh.sum(0, dtype=x.dtype) if need_dh else db1
        if dgrad1 or wgrad1:
            d_norm, grads[_W1] = steps.linear_backward_cast_grad(
                st1, dh_data, dh_cw, dh_sinv, x_kept, x_sinv, w1_kept, w1_sinv, (m, k), f1,
                x.dtype, dgrad1, wgrad1, dgrad1, wgrad1, stats1, dh,
                weight_dtype=ctx.weight_dtypes[0])
        del dh_data, dh_cw, dh
        if dgrad1:
            grads[_X], grads[_GAMMA], grads[_BETA] = steps.norm_backward(
                d_norm, x, mean, rsigma, gamma, call.normalization, call.eps)
        return tuple(grads)
