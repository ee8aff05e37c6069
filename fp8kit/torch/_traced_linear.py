"""fp8kit.torch.Linear's forward as torch.compile traces it.

The eager layer is one pybind11 call (ext.linear_forward) that records a C++
autograd node: fast, but opaque to dynamo. Under torch.compile, Linear.forward
calls traced_linear instead, which runs the same C++ steps as the dispatcher
ops torch.ops.fp8kit.linear_forward and linear_backward (same kernels, same
bits) inside an autograd.Function, so that dynamo traces forward and backward
into one graph each, with no graph break.

The layer's scaling state enters the graph as its LinearState's own tensors
(LinearState.tensors), which the two ops update in place and whose schemas
say so: a training step's delayed-scaling updates are graph mutations, and
the next step reuses the same compiled graph. Which state a call uses
(RecipeStates.select: the recipe's state, made on first use) is decided at
trace time, where select runs as plain Python: dynamo guards on the layer's
RecipeStates object, the recipe's type and field values and the weight, so
a recipe with other values (or loading a checkpoint, which replaces the
states) compiles again, and nothing else does: an equal recipe made anew
each step does not. The weight cache (cache_fp8_weight) is an eager
optimization; compiled calls quantize the weight every time.

The fused layers take their states the same way (traced_state), as
TracedStates that their dispatcher ops read (fp8kit.torch._fused_steps).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from fp8kit.torch._linear_states import by_key

_ops = torch.ops.fp8kit


class _OnDevice(NamedTuple):
    """What RecipeStates.select reads of a weight: its device."""
    device: torch.device


class TracedState(NamedTuple):
    """A LinearState as the dispatcher ops take it."""
    tensors: tuple  # LinearState.tensors, which the ops update in place
    recipe: tuple   # LinearState.recipe as the ops' recipe arguments
    non_tn: bool    # LinearState.non_tn


@torch.compiler.assume_constant_result
def _selection(states_key: str, recipe_type, recipe_values, device, cache_weight: bool):
    """(the state's tensors, its recipe as linear_forward's recipe
    arguments, its non_tn, forward_fast_accumulation) for the recipe
    recipe_type(*recipe_values) in the RecipeStates `states_key` names,
    made on `device` on first use; run at trace time. Every argument is a
    Python constant: older dynamo versions refuse anything else here."""
    recipe = recipe_type(*recipe_values)
    # Non-strict torch.export runs this under its fake and proxy modes: a
    # state made here on first use must hold real tensors (the layer keeps
    # it; the export lifts them as constants).
    with _disable_current_modes():
        # select reads only the weight's device (for a state made here).
        state, fast = by_key(states_key).select(recipe, _OnDevice(device), cache_weight)
    r = state.recipe
    recipe_args = (r["scaling"], r["forward_dtype"], r["backward_dtype"], r.get("margin", 0),
                   r.get("amax_reduction", "max"), r.get("amax_epsilon", 0.0),
                   r.get("power_2_scale", False))
    return state.tensors, recipe_args, state.non_tn, fast


def _select(states, recipe, weight, cache_weight: bool):
    """_selection for `recipe`, which dynamo reads field by field: its
    guards then compare the recipe's type and values, not the object, so an
    equal recipe made anew reuses the compiled graph."""
    values = tuple(getattr(recipe, f.name) for f in dataclasses.fields(recipe))
    return _selection(states.key, type(recipe), values, weight.device, cache_weight)


def traced_state(states, recipe, weight, cache_weight: bool):
    """(TracedState, forward_fast_accumulation) of `recipe` in `states`
    (RecipeStates; the state is made on first use), chosen at trace time."""
    tensors, recipe_args, non_tn, fast = _select(states, recipe, weight, cache_weight)
    return TracedState(tensors, recipe_args, non_tn), fast


class _LinearFunction(torch.autograd.Function):
    """The FP8 Linear with autograd over the two dispatcher ops."""

    @staticmethod
    def forward(ctx, input, weight, bias, state, recipe_args, fast, dgrad, wgrad, bgrad):
        out, x_q, x_scale_inv, w_q, w_scale_inv = _ops.linear_forward(
            input, weight, bias, *state, *recipe_args, fast, dgrad, wgrad, bgrad)
        ctx.save_for_backward(x_q, x_scale_inv, w_q, w_scale_inv)
        # The state is not saved: forward and backward update it in place.
        ctx.state = state
        ctx.recipe_args = recipe_args
        ctx.input_shape = list(input.shape)
        ctx.forward_grads = (dgrad, wgrad)
        ctx.weight_dtype = weight.dtype  # float32 beside a bf16 input: a master weight
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x_q, x_scale_inv, w_q, w_scale_inv = ctx.saved_tensors
        forward_dgrad, forward_wgrad = ctx.forward_grads
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        dgrad, wgrad = forward_dgrad and need_input, forward_wgrad and need_weight
        dx, dw, db = _ops.linear_backward(
            grad_output, x_q, x_scale_inv, w_q, w_scale_inv, *ctx.state, *ctx.recipe_args,
            ctx.input_shape, forward_dgrad, forward_wgrad, dgrad, wgrad, need_bias,
            ctx.weight_dtype)
        return (dx if dgrad else None, dw if wgrad else None, db if need_bias else None,
                None, None, None, None, None, None)


def traced_linear(states, recipe, input, weight, bias, cache_weight: bool):
    """y = input @ weight.T + bias in FP8 with `recipe`, as ext.linear_forward
    computes it (same state, same bits), through dispatcher ops."""
    state, recipe_args, _, fast = _select(states, recipe, weight, cache_weight)
    grad = torch.is_grad_enabled()
    dgrad = grad and input.requires_grad
    wgrad = grad and weight.requires_grad
    bgrad = grad and bias is not None and bias.requires_grad
    if not (dgrad or wgrad or bgrad):
        return _ops.linear_forward(input, weight, bias, *state, *recipe_args, fast, False, False,
                                   False)[0]
    return _LinearFunction.apply(input, weight, bias, state, recipe_args, fast, dgrad, wgrad,
                                 bgrad)
