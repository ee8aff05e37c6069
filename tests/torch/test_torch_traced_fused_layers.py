"""fp8kit.torch.LayerNormLinear and LayerNormMLP under torch.compile and
torch.export: their steps as the dispatcher ops torch.ops.fp8kit.norm_forward,
norm_backward, activation_forward, activation_backward and quantize_slot
(opcheck, and the same bits and state updates as their pybind11 bindings),
and the layers compiled with fullgraph=True: outputs, gradients and scaling
state equal to eager mode's bit for bit over 20 delayed-scaling steps with
one compilation and no graph break, and exported without dynamo.

Eager mode is the reference: test_fused_layers.py checks its numerics
against a float64 reference."""

import contextlib
import copy

import pytest
import torch
import torch._dynamo.testing

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch._ext import ext
from fp8kit.torch._plan import kept, plan
from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from torch_reference import DEVICES, assert_bits_equal, device_of

ops = torch.ops.fp8kit
RECIPES = {"delayed": DelayedScaling(amax_history_len=4), "current": CurrentScaling()}
INPUT, WEIGHT, GRAD_OUTPUT = ext.SLOT_INPUT, ext.SLOT_WEIGHT, ext.SLOT_GRAD_OUTPUT


def recipe_args(state):
    r = state.recipe
    return (r["scaling"], r["forward_dtype"], r["backward_dtype"], r.get("margin", 0),
            r.get("amax_reduction", "max"), r.get("amax_epsilon", 0.0),
            r.get("power_2_scale", False))


def twin_states(recipe, dev):
    """Two fresh states of `recipe`: one for the binding, one for the op."""
    return ext.LinearState(recipe, dev), ext.LinearState(recipe, dev)


def assert_same_state(got, want):
    """The state tensors bit for bit, and the seeded flags a checkpoint of
    each would record (the ops set a state's tensors, not the layer's
    state object)."""
    for g, w in zip(got.tensors, want.tensors):
        assert_bits_equal(g, w)
    assert got.seeded == want.seeded
    assert torch.equal(got.get_state()["seeded"], want.get_state()["seeded"])


# ----------------------------------------------------------------- the ops
# opcheck's test_schema compares FP8 outputs with allclose, which has no FP8
# kernel; the state mutation the schemas declare is checked against the
# bindings below instead.
_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_norm_ops_equal_their_bindings(device, recipe, normalization):
    dev = device_of(device)
    torch.manual_seed(0)
    x, gamma = torch.randn(24, 32, device=dev), torch.rand(32, device=dev) + 0.5
    beta = torch.randn(32, device=dev) if normalization == "LayerNorm" else None
    bound, traced = twin_states(RECIPES[recipe], dev)
    args = lambda st: (x, gamma, beta, normalization, 1e-5, *st.tensors,  # noqa: E731
                       *recipe_args(st), INPUT, True, True, True)
    torch.library.opcheck(ops.norm_forward.default, args(ext.LinearState(RECIPES[recipe], dev)),
                          test_utils=_UTILS)
    want = ext.norm_forward(x, gamma, beta, normalization, 1e-5, bound, INPUT, True, True, True)
    data, cw, scale_inv, mean, rsigma = ops.norm_forward(*args(traced))
    assert_bits_equal(data, want[0])
    assert_bits_equal(cw, want[1])
    assert_bits_equal(scale_inv, want[2])
    if normalization == "LayerNorm":
        assert_bits_equal(mean, want[3])
    else:
        assert mean.shape == (0,)
    assert_bits_equal(rsigma, want[4])
    assert_same_state(traced, bound)

    dy = torch.randn(24, 32, device=dev)
    bwd = (dy, x, want[3], rsigma, gamma, normalization, 1e-5)
    torch.library.opcheck(ops.norm_backward.default, bwd)
    want_grads = ext.norm_backward(*bwd)
    got_grads = ops.norm_backward(*bwd)
    for got, w in zip(got_grads, want_grads):
        if w is None:
            assert got.shape == (0,)
        else:
            assert_bits_equal(got, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_activation_ops_equal_their_bindings(device, recipe, activation):
    dev = device_of(device)
    torch.manual_seed(1)
    h = torch.randn(24, 64, device=dev)
    bound, traced = twin_states(RECIPES[recipe], dev)
    fwd = lambda st: (h, activation, *st.tensors, *recipe_args(st), INPUT,  # noqa: E731
                      True, True, True)
    torch.library.opcheck(ops.activation_forward.default,
                          fwd(ext.LinearState(RECIPES[recipe], dev)), test_utils=_UTILS)
    want = ext.activation_forward(h, activation, bound, INPUT, True, True, True)
    data, cw, scale_inv = ops.activation_forward(*fwd(traced))
    for got, w in zip((data, cw, scale_inv), want[:3]):
        assert_bits_equal(got, w)
    assert_same_state(traced, bound)

    d_a = torch.randn(24, 32 if activation == "swiglu" else 64, device=dev)
    bwd = lambda st: (d_a, h, activation, *st.tensors, *recipe_args(st),  # noqa: E731
                      GRAD_OUTPUT, True, True, True, torch.float32, True)
    torch.library.opcheck(ops.activation_backward.default,
                          bwd(ext.LinearState(RECIPES[recipe], dev)), test_utils=_UTILS)
    want = ext.activation_backward(d_a, h, activation, bound, GRAD_OUTPUT, True, True, True,
                                   torch.float32, True)
    got = ops.activation_backward(*bwd(traced))
    for g, w in zip((got[0], got[1], got[2], got[3], got[4]), want):
        assert_bits_equal(g, w)
    assert_same_state(traced, bound)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("slot,sums", [(WEIGHT, None), (GRAD_OUTPUT, torch.float32)])
def test_quantize_slot_op_equals_its_binding(device, recipe, slot, sums):
    dev = device_of(device)
    torch.manual_seed(2)
    x = torch.randn(24, 48, device=dev) * 3
    bound, traced = twin_states(RECIPES[recipe], dev)
    args = lambda st: (x, *st.tensors, *recipe_args(st), slot, True, True, True,  # noqa: E731
                       sums)
    torch.library.opcheck(ops.quantize_slot.default, args(ext.LinearState(RECIPES[recipe], dev)),
                          test_utils=_UTILS)
    want = ext.quantize_slot(bound, x, slot, True, True, True, sums)
    data, cw, scale_inv, got_sums = ops.quantize_slot(*args(traced))
    for got, w in zip((data, cw, scale_inv), want[:3]):
        assert_bits_equal(got, w)
    if sums is None:
        assert got_sums.shape == (0,)
    else:
        assert_bits_equal(got_sums, want[3])
    assert_same_state(traced, bound)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linear_step_ops_equal_their_bindings(device, recipe):
    """The Linear's steps on a cast input (forward) and a cast dy
    (backward), as the fused layers run them: op and binding give the same
    bits and state updates."""
    dev = device_of(device)
    torch.manual_seed(3)
    x, w, b = (torch.randn(24, 32, device=dev), torch.randn(48, 32, device=dev),
               torch.randn(48, device=dev))
    dy = torch.randn(24, 48, device=dev) * 1e-2
    bound, traced = twin_states(RECIPES[recipe], dev)
    p = plan(24, 32, 48, True, True, bound.non_tn)
    # x as the norm kernel casts it, dy as the activation backward does.
    x_casts = {st: ext.quantize_slot(st, x, INPUT, True, *p.input) for st in (bound, traced)}
    dy_casts = {st: ext.quantize_slot(st, dy, GRAD_OUTPUT, True, *p.grad_output)
                for st in (bound, traced)}
    fwd = lambda st, cast: (x_casts[cast][0], x_casts[cast][2], w, b,  # noqa: E731
                            *st.tensors, *recipe_args(st), False, True, True, True)
    # opcheck runs the op several times: on a state of its own.
    torch.library.opcheck(ops.linear_forward_cast_input.default,
                          fwd(ext.LinearState(RECIPES[recipe], dev), bound), test_utils=_UTILS)
    want = ext.linear_forward_cast_input(bound, "test", x_casts[bound][0], x_casts[bound][2], w,
                                         None, b, False, True, True, True)
    got = ops.linear_forward_cast_input(*fwd(traced, traced))
    for g, wt in zip(got, want):
        assert_bits_equal(g, wt)
    assert_same_state(traced, bound)

    def bwd(st, w_kept, w_sinv):
        data, cw, sinv, _ = dy_casts[st]
        x_data, x_cw, x_sinv, _ = x_casts[st]
        return (_or_empty(data), _or_empty(cw), sinv, kept(p.saved_input, x_data, x_cw), x_sinv,
                w_kept, w_sinv, *st.tensors, *recipe_args(st), [24, 32], 48, torch.float32,
                True, True, True, True)
    torch.library.opcheck(ops.linear_backward_cast_grad.default, bwd(bound, *want[1:]),
                          test_utils=_UTILS)
    data, cw, sinv, _ = dy_casts[bound]
    x_data, x_cw, x_sinv, _ = x_casts[bound]
    want = ext.linear_backward_cast_grad(bound, data, cw, sinv, kept(p.saved_input, x_data, x_cw),
                                         x_sinv, *want[1:], [24, 32], 48, torch.float32, True,
                                         True, True, True)
    got = ops.linear_backward_cast_grad(*bwd(traced, *got[1:]))
    for g, wt in zip(got, want):
        assert_bits_equal(g, wt)
    assert_same_state(traced, bound)


def _or_empty(t):
    return t if t is not None else torch.empty(0)


def test_fused_op_schemas_declare_the_mutated_state():
    state = ["amax_history", "amax", "scale", "scale_inv", "counters", "seeded"]
    for op in (ops.norm_forward, ops.activation_forward, ops.activation_backward,
               ops.quantize_slot, ops.linear_forward_cast_input):
        schema = op.default._schema
        mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
        assert mutated == state, op
    assert not ops.norm_backward.default._schema.is_mutable
    assert not ops.linear_backward_cast_grad.default._schema.is_mutable


def test_fused_ops_name_a_bad_argument():
    st = ext.LinearState(DelayedScaling(), "cpu")
    x, gamma, beta = torch.randn(4, 32), torch.ones(32), torch.zeros(32)
    state = list(st.tensors)
    with pytest.raises(ValueError, match=r"fp8kit::norm_forward: slot is 3; it must be in"):
        ops.norm_forward(x, gamma, beta, "LayerNorm", 1e-5, *state, *recipe_args(st), 3, True,
                         True, False)
    with pytest.raises(ValueError, match="fp8kit::quantize_slot: rowwise and columnwise are "
                                         "both False"):
        ops.quantize_slot(x, *state, *recipe_args(st), WEIGHT, True, False, False, None)
    with pytest.raises(ValueError, match=r"fp8kit::activation_forward: scale is .* \[2\]; pass "
                                         "the layer's state tensors"):
        ops.activation_forward(x, "gelu", *state[:2], torch.ones(2), *state[3:],
                               *recipe_args(st), INPUT, True, True, False)
    with pytest.raises(ValueError, match="fp8kit::norm_backward: normalization is 'BatchNorm'"):
        ops.norm_backward(x, x, None, torch.ones(4), gamma, "BatchNorm", 1e-5)


# -------------------------------------------------------- compiled layers
def _layer(kind, dev):
    torch.manual_seed(3)
    if kind == "LayerNormLinear":
        layer = ft.LayerNormLinear(32, 48)
    else:
        layer = ft.LayerNormMLP(32, 64, activation=kind.split("-")[1], normalization="RMSNorm")
    with torch.no_grad():
        layer.layer_norm_weight.uniform_(0.5, 1.5)
    return layer.to(dev)


def _states(layer):
    return [st for sts in layer.fp8_states.values() for st in sts]


def _train_steps(kind, dev, backend, steps, torch_autocast=False):
    eager = _layer(kind, dev)
    model = copy.deepcopy(eager)
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    recipe = DelayedScaling(amax_history_len=4)
    torch.manual_seed(4)
    for step in range(steps):
        x = torch.randn(2, 12, 32, device=dev) * (1 + step)  # moving amaxes
        x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
        for m in (eager, model):
            m.zero_grad()
        outer = (torch.autocast(dev.type, dtype=torch.bfloat16) if torch_autocast
                 else contextlib.nullcontext())
        with outer, ft.autocast(recipe=recipe):
            want, got = eager(x_eager), compiled(x_compiled)
        dy = torch.randn_like(want)
        want.backward(dy)
        got.backward(dy)
        assert_bits_equal(got, want)
        assert_bits_equal(x_compiled.grad, x_eager.grad)
        for g, w in zip(model.parameters(), eager.parameters()):
            assert_bits_equal(g.grad, w.grad)
        for g, w in zip(_states(model), _states(eager)):
            assert_same_state(g, w)
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["LayerNormLinear", "LayerNormMLP-gelu", "LayerNormMLP-swiglu"])
def test_compiled_layer_equals_eager_with_one_compilation(device, kind):
    """20 delayed-scaling training steps: same bits as eager every step
    (outputs, gradients, scaling state), one compilation, no graph break."""
    _train_steps(kind, device_of(device), "aot_eager", 20)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["LayerNormLinear", "LayerNormMLP-swiglu"])
def test_compiled_layer_under_torch_autocast_equals_eager(device, kind):
    """Under bf16 torch.autocast the float32 weights go to FP8 as they are
    and their gradients come out in float32, compiled as eager."""
    _train_steps(kind, device_of(device), "aot_eager", 5, torch_autocast=True)


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_compiled_layer_equals_eager(device):
    _train_steps("LayerNormLinear", device_of(device), "inductor", 20)


def test_explain_finds_one_graph_and_no_break():
    model = torch.nn.Sequential(_layer("LayerNormLinear", "cpu"), torch.nn.ReLU(),
                                ft.LayerNormMLP(48, 32, activation="swiglu"))

    def step(x):
        with ft.autocast(recipe=DelayedScaling()):
            return model(x)

    explained = torch._dynamo.explain(step)(torch.randn(8, 32, requires_grad=True))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


@pytest.mark.parametrize("kind", ["LayerNormLinear", "LayerNormMLP-gelu"])
def test_export_without_dynamo(kind):
    """torch.export's default (non-strict) tracing reaches the dispatcher
    ops too; the layer's fresh state is made with real tensors."""
    layer = _layer(kind, "cpu")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            with ft.autocast(recipe=DelayedScaling()):
                return self.layer(x)

    model = Model()
    x = torch.randn(8, 32)
    exported = torch.export.export(model, (x,))
    code = exported.graph_module.print_readable(print_output=False)
    assert "torch.ops.fp8kit.norm_forward.default" in code
    assert all(type(t) is torch.Tensor for st in _states(layer) for t in st.tensors)
    with torch.no_grad():
        want = model(x)
    assert_bits_equal(exported.module()(x), want)
