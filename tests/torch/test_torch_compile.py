"""fp8kit.torch.Linear under torch.compile and torch.export: the dispatcher
ops torch.ops.fp8kit.linear_forward / linear_backward (opcheck), a small MLP
compiled with fullgraph=True whose outputs, gradients and scaling state equal
eager mode's bit for bit over training steps with one compilation, no graph
break, recompiles only where the recipe's values change (not for an equal
recipe made anew), autocast's recipe guarded per thread, and torch.export of
a forward, with dynamo (strict) and without (the default).

Eager mode is the reference here: its numerics are checked against float64
and ml_dtypes references in test_torch_linear.py. Between FP8 layers the MLP
has ReLU, which every backend computes exactly (inductor's GELU differs from
eager's in the last bit, which would hide what this file checks).
"""

import copy
import threading

import pytest
import torch
import torch._dynamo.testing

import fp8kit.torch as ft
from fp8kit.torch._ext import ext
from fp8kit.recipe import CurrentScaling, DelayedScaling
from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from torch_reference import DEVICES, assert_bits_equal, device_of

ops = torch.ops.fp8kit


def mlp(dev, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(ft.Linear(32, 64), torch.nn.ReLU(),
                               ft.Linear(64, 16, bias=False)).to(dev, dtype)


def assert_same_layers(got_model, want_model):
    """Parameters, gradients and every recipe's scaling state, bit for bit,
    and the seeded flags a checkpoint of it would record."""
    for got, want in zip(got_model.parameters(), want_model.parameters()):
        assert_bits_equal(got, want)
        assert_bits_equal(got.grad, want.grad)
    got_layers = [m for m in got_model.modules() if isinstance(m, ft.Linear)]
    want_layers = [m for m in want_model.modules() if isinstance(m, ft.Linear)]
    for got, want in zip(got_layers, want_layers):
        assert len(got.fp8_states) == len(want.fp8_states)
        for g, w in zip(got.fp8_states, want.fp8_states):
            assert g.recipe == w.recipe
            for name in ("amax_history", "amax", "scale", "scale_inv"):
                assert_bits_equal(getattr(g, name), getattr(w, name))
            assert g.seeded == w.seeded
            assert torch.equal(g.get_state()["seeded"], w.get_state()["seeded"])


def train_step(model, x, dy, recipe):
    with ft.autocast(recipe=recipe):
        y = model(x)
    y.backward(dy)
    return y


# ----------------------------------------------------------- dispatcher ops
def _state_tensors(dev, recipe):
    return ext.LinearState(recipe, dev).tensors


def _recipe_args(recipe):
    return ("delayed", "e4m3", "e5m2", 0, "max", 0.0, False) if isinstance(
        recipe, DelayedScaling) else ("current", "e4m3", "e5m2", 0, "max", 0.0, False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=4), CurrentScaling()])
def test_linear_ops_opcheck(device, recipe):
    dev = device_of(device)
    torch.manual_seed(1)
    x, w, b = (torch.randn(24, 32, device=dev), torch.randn(16, 32, device=dev),
               torch.randn(16, device=dev))
    state = _state_tensors(dev, recipe)
    fwd_args = (x, w, b, *state, *_recipe_args(recipe), False, True, True, True)
    # test_schema is left out: it compares FP8 outputs with allclose, which
    # has no FP8 kernel; the mutation the schemas declare is checked below.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.linear_forward.default, fwd_args, test_utils=utils)
    _, x_q, x_scale_inv, w_q, w_scale_inv = ops.linear_forward(*fwd_args)
    dy = torch.randn(24, 16, device=dev)
    bwd_args = (dy, x_q, x_scale_inv, w_q, w_scale_inv, *state, *_recipe_args(recipe), [24, 32],
                True, True, True, True, True)
    torch.library.opcheck(ops.linear_backward.default, bwd_args, test_utils=utils)


def test_linear_op_schemas_declare_the_mutated_state():
    state = ["amax_history", "amax", "scale", "scale_inv", "counters", "seeded"]
    for op in (ops.linear_forward, ops.linear_backward):
        schema = op.default._schema
        mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
        assert mutated == state, op


def test_linear_ops_name_a_bad_argument():
    state = list(_state_tensors("cpu", DelayedScaling()))
    x, w = torch.randn(4, 32), torch.randn(16, 32)
    args = lambda st, recipe: (x, w, None, *st, *recipe, False, False, False, False)  # noqa: E731
    with pytest.raises(ValueError, match=r"fp8kit::linear_forward: scale is .* \[2\]; pass the "
                                         r"layer's state tensors"):
        ops.linear_forward(*args(state[:2] + [torch.ones(2)] + state[3:],
                                 _recipe_args(DelayedScaling())))
    with pytest.raises(ValueError, match="fp8kit::linear_forward: margin is 200"):
        ops.linear_forward(*args(state, ("delayed", "e4m3", "e5m2", 200, "max", 0.0, False)))
    with pytest.raises(ValueError, match="fp8kit::linear_forward: in_features is 24"):
        ops.linear_forward(torch.randn(4, 24), torch.randn(16, 24), None, *state,
                           *_recipe_args(DelayedScaling()), False, False, False, False)


# ------------------------------------------------------------ compiled MLP
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_mlp_equals_eager_with_one_compilation(device, backend):
    """20 delayed-scaling training steps: same bits as eager every step
    (outputs, gradients, scaling state), one compilation, no graph break."""
    dev = device_of(device)
    eager = mlp(dev)
    model = copy.deepcopy(eager)
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    recipe = DelayedScaling(amax_history_len=4)
    torch.manual_seed(2)
    for step in range(20):
        x = torch.randn(24, 32, device=dev) * (1 + step)  # moving amaxes
        dy = torch.randn(24, 16, device=dev)
        x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
        for m in (eager, model):
            m.zero_grad()
        want = train_step(eager, x_eager, dy, recipe)
        got = train_step(compiled, x_compiled, dy, recipe)
        assert_bits_equal(got, want)
        assert_bits_equal(x_compiled.grad, x_eager.grad)
        assert_same_layers(model, eager)
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_mlp_under_torch_autocast(device):
    """bf16 torch.autocast around the compiled model, current scaling."""
    dev = device_of(device)
    eager = mlp(dev)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    for _ in range(2):
        x, dy = torch.randn(24, 32, device=dev), torch.randn(24, 16, device=dev).bfloat16()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            want = train_step(eager, x, dy, CurrentScaling())
            got = train_step(compiled, x, dy, CurrentScaling())
        assert got.dtype == torch.bfloat16
        assert_bits_equal(got, want)
        assert_same_layers(model, eager)


def test_explain_finds_one_graph_and_no_break():
    model = mlp("cpu")

    def forward(x):
        with ft.autocast(recipe=DelayedScaling()):
            return model(x)

    explained = torch._dynamo.explain(forward)(torch.randn(8, 32, requires_grad=True))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    assert explained.break_reasons == []


@torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True)
def test_layers_compiled_one_by_one_do_not_break_the_graph():
    """Each layer compiled on its own (torchtitan's way, and FSDP2's
    modules), so one compiled forward sees every layer's state in turn:
    with a changing int attribute dynamo would make it symbolic (as it
    does under FSDP2; here the config does it) and the state selection
    would break the graph. Every layer runs compiled, equal to eager."""
    eager = mlp("cpu")
    model = copy.deepcopy(eager)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fp8_layers = [layer for layer in model if isinstance(layer, ft.Linear)]
    for layer in fp8_layers:
        layer.compile(backend=counter, fullgraph=True)
    x, dy = torch.randn(24, 32), torch.randn(24, 16)
    for _ in range(2):
        want = train_step(eager, x, dy, CurrentScaling())
        got = train_step(model, x, dy, CurrentScaling())
        assert_bits_equal(got, want)
    assert counter.frame_count == len(fp8_layers)  # each compiled once, none fell back
    assert_same_layers(model, eager)


def test_recipe_changes_recompile_and_compute_with_the_new_recipe():
    eager = mlp("cpu")
    model = copy.deepcopy(eager)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    delayed, current = DelayedScaling(margin=1), CurrentScaling(power_2_scale=True)
    torch.manual_seed(4)
    x, dy = torch.randn(24, 32), torch.randn(24, 16)
    # The recipe object, then autocast off, then the first recipe again.
    for recipe, compilations in ((delayed, 1), (current, 2), (None, 3), (delayed, 3)):
        for m in (eager, model):
            m.zero_grad()
        want = train_step(eager, x, dy, recipe) if recipe else eager(x)
        got = train_step(compiled, x, dy, recipe) if recipe else compiled(x)
        assert_bits_equal(got, want)
        assert counter.frame_count == compilations
    assert [s.recipe["scaling"] for s in model[0].fp8_states] == ["delayed", "current"]
    assert_same_layers(model, eager)


def test_autocast_is_guarded_per_thread():
    """A thread without autocast gets high precision from a function
    compiled inside autocast on another thread, and the other way round."""
    layer = ft.Linear(32, 16)
    x = torch.randn(8, 32)
    compiled = torch.compile(lambda t: layer(t), backend="aot_eager", fullgraph=True)
    with torch.no_grad(), ft.autocast(recipe=CurrentScaling()):
        fp8 = compiled(x)
        want_fp8 = layer(x)
    results = {}

    def other_thread():
        with torch.no_grad():
            results["plain"] = compiled(x)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert_bits_equal(fp8, want_fp8)
    assert_bits_equal(results["plain"], torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert not torch.equal(results["plain"], fp8)


def test_an_equal_recipe_made_anew_does_not_recompile():
    model = mlp("cpu")
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    x, dy = torch.randn(24, 32), torch.randn(24, 16)
    for margin, compilations in ((1, 1), (1, 1), (2, 2), (1, 2)):
        train_step(compiled, x, dy, DelayedScaling(margin=margin))
        assert counter.frame_count == compilations
    assert [s.recipe["margin"] for s in model[0].fp8_states] == [1, 2]


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling()])
def test_export_of_a_forward_under_autocast(strict, recipe):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp("cpu")

        def forward(self, x):
            with ft.autocast(recipe=recipe):
                return self.body(x)

    model = Model()
    x = torch.randn(8, 32)
    exported = torch.export.export(model, (x,), strict=strict)
    code = exported.graph_module.print_readable(print_output=False)
    assert code.count("torch.ops.fp8kit.linear_forward.default") == 2
    # A state made while export traces holds real tensors (the layer keeps it).
    states = [st for m in model.body if isinstance(m, ft.Linear) for st in m.fp8_states]
    assert states and all(type(t) is torch.Tensor for st in states for t in st.tensors)
    with torch.no_grad():
        assert_bits_equal(exported.module()(x), model(x))
