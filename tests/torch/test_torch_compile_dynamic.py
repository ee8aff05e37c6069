"""fp8kit's layers under torch.compile with a dynamic token dimension: a
small model (Linear, LayerNormLinear, LayerNormMLP), each layer compiled
with fullgraph=True on its own, trained over 20 token counts (most not
multiples of 16) under every recipe, compiles no more graphs per layer
than the torch.nn layer of the same shape does (one for the first count,
then one with the count symbolic), and computes what eager mode does, bit
for bit (outputs, gradients, scaling state). dynamic=True compiles once,
from the first call.

Also the two rules the fake kernels compute for symbolic sizes, each
against the core's own answer for concrete ones: the Linear plan
(fp8kit.torch._plan) and the block scales' shape."""

import copy

import pytest
import torch
import torch._dynamo.testing

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch._block_fake_ops import block_scale_inv_shape
from fp8kit.torch._ext import ext
from fp8kit.torch._plan import plan
from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from torch_reference import assert_bits_equal

RECIPES = {"delayed": DelayedScaling(amax_history_len=4), "current": CurrentScaling(),
           "block": BlockScaling()}
# Sequence lengths of a [2, s, 32] batch: tokens 2 * s, from 4 to 300 (a
# block-scaled layer's columnwise scales then span one to three blocks).
LENGTHS = [8, 12, 3, 40, 21, 64, 5, 150, 33, 8, 99, 2, 57, 16, 130, 7, 45, 24, 71, 10]
HIDDEN = 32


def fp8_layers():
    torch.manual_seed(0)
    layers = [ft.Linear(HIDDEN, HIDDEN), ft.LayerNormLinear(HIDDEN, HIDDEN),
              ft.LayerNormMLP(HIDDEN, 2 * HIDDEN)]
    with torch.no_grad():
        layers[1].layer_norm_weight.uniform_(0.5, 1.5)
    return layers


class Plain(torch.nn.Module):
    """torch.nn modules in a module of the test's own: dynamo does not
    compile a torch.nn module's forward as the top frame."""

    def __init__(self, *modules):
        super().__init__()
        self.body = torch.nn.Sequential(*modules)

    def forward(self, x):
        return self.body(x)


def plain_layers():
    """The torch.nn layers of the same shapes, compiled the same way."""
    ln = lambda: torch.nn.LayerNorm(HIDDEN)  # noqa: E731
    return [Plain(torch.nn.Linear(HIDDEN, HIDDEN)),
            Plain(ln(), torch.nn.Linear(HIDDEN, HIDDEN)),
            Plain(ln(), torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.GELU(approximate="tanh"),
                  torch.nn.Linear(2 * HIDDEN, HIDDEN))]


def compile_each(layers, backend, dynamic):
    """Each layer compiled on its own (as FSDP2 and torchtitan do), with
    its own compile counter."""
    counters = []
    for layer in layers:
        counters.append(torch._dynamo.testing.CompileCounterWithBackend(backend))
        layer.compile(backend=counters[-1], fullgraph=True, dynamic=dynamic)
    return counters


def run(layers, x, recipe):
    """A residual model over `layers`, each layer's output added to its
    input, as a transformer block does."""
    with ft.autocast(enabled=recipe is not None, recipe=recipe):
        for layer in layers:
            x = x + layer(x)
    return x


def fp8_states(layers):
    states = []
    for layer in layers:
        if isinstance(layer, ft.Linear):
            states += layer.fp8_states
        else:
            states += [st for sts in layer.fp8_states.values() for st in sts]
    return states


def plain_frame_counts(lengths, backend, dynamic):
    layers = plain_layers()
    counters = compile_each(layers, backend, dynamic)
    for s in lengths:
        run(layers, torch.randn(2, s, HIDDEN, requires_grad=True), None).sum().backward()
    return [c.frame_count for c in counters]


def train_and_compare(recipe, backend, lengths, dynamic=None):
    """Trains the eager and the compiled copies of the model over `lengths`,
    asserting the same bits every step; returns each compiled layer's frame
    count."""
    eager = fp8_layers()
    layers = copy.deepcopy(eager)
    counters = compile_each(layers, backend, dynamic)
    torch.manual_seed(1)
    for step, s in enumerate(lengths):
        x = torch.randn(2, s, HIDDEN) * (1 + step % 3)  # moving amaxes
        x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
        for layer in eager + layers:
            layer.zero_grad()
        want, got = run(eager, x_eager, recipe), run(layers, x_compiled, recipe)
        dy = torch.randn_like(want)
        want.backward(dy)
        got.backward(dy)
        assert_bits_equal(got, want)
        assert_bits_equal(x_compiled.grad, x_eager.grad)
        for layer, ref in zip(layers, eager):
            for g, w in zip(layer.parameters(), ref.parameters()):
                assert_bits_equal(g.grad, w.grad)
        for g, w in zip(fp8_states(layers), fp8_states(eager)):
            for name in ("amax_history", "scale", "scale_inv"):
                assert_bits_equal(getattr(g, name), getattr(w, name))
    return [c.frame_count for c in counters]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_varying_token_counts_compile_as_a_plain_model_does(recipe):
    got = train_and_compare(RECIPES[recipe], "aot_eager", LENGTHS)
    want = plain_frame_counts(LENGTHS, "aot_eager", None)
    assert got == want == [2, 2, 2], (got, want)


@pytest.mark.parametrize("recipe", ["delayed", "block"])
def test_dynamic_true_compiles_once(recipe):
    """One graph per layer from the first call. (The backend may be called
    twice for it: under dynamic=True dynamo traces a float attribute, such
    as the norm's eps, as a symbol, and traces the frame again when it
    specializes it.)"""
    torch._dynamo.utils.counters.clear()
    train_and_compare(RECIPES[recipe], "aot_eager", LENGTHS[:6], dynamic=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3


def test_inductor_with_varying_token_counts():
    """Inductor compiles the graphs around the ops to C++; the FP8 layers'
    own math is in the ops, so the bits stay eager mode's."""
    got = train_and_compare(RECIPES["delayed"], "inductor", LENGTHS[:5])
    assert got == [2, 2, 2]


@pytest.mark.parametrize("non_tn", [False, True])
def test_the_plan_for_symbolic_counts_equals_the_core_plan(non_tn):
    for tokens in range(0, 70):
        for dgrad in (False, True):
            for wgrad in (False, True):
                want = ext.linear_plan(tokens, 32, 48, dgrad, wgrad, non_tn)
                assert tuple(plan(tokens, 32, 48, dgrad, wgrad, non_tn)) == tuple(want), tokens


@pytest.mark.parametrize("mode", ["block_1x128", "block_128x128"])
def test_the_fake_block_scale_shape_equals_the_core(mode):
    shapes = [(m,) for m in (1, 128, 129)] + [(m, k) for m in (1, 2, 127, 128, 129, 300)
                                               for k in (16, 128, 144, 512)] + [(2, 3, 144), ()]
    for shape in shapes:
        for columnwise in (False, True):
            want = tuple(ext.block_scale_inv_shape(list(shape), mode, columnwise))
            assert block_scale_inv_shape(shape, mode, columnwise) == want, (shape, columnwise)
