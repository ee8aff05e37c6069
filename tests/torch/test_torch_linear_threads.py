"""One fp8kit.torch.Linear run from several threads at once, each under its
own recipe: every call returns exactly (bit for bit) what the same calls
return in one thread, and each recipe's FP8 state ends as a one-thread run
leaves it. A layer keeps one state per scaling recipe, so switching recipes
discards nothing."""

import copy
import sys
import threading

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format

HYBRID = Format.HYBRID
# Delayed-scaling states depend on the order of their calls, so each
# delayed recipe belongs to one thread; current scaling keeps no history,
# so the last recipe (fast accumulation only differs) shares the second's
# state with another thread.
RECIPES = [
    DelayedScaling(fp8_format=HYBRID, amax_history_len=4),
    CurrentScaling(fp8_format=HYBRID),
    DelayedScaling(fp8_format=HYBRID, amax_history_len=4, margin=1),
    CurrentScaling(power_2_scale=True),
    DelayedScaling(amax_history_len=2, amax_reduction=AmaxReduction.MOST_RECENT),
    CurrentScaling(amax_epsilon=0.5),
    DelayedScaling(fp8_format=Format.E4M3, amax_history_len=3),
    CurrentScaling(fp8_format=HYBRID, forward_fast_accumulation=True),
]
STEPS = 6
# No-gradient calls after the steps: many, cheap, each must still see its own state.
HAMMER = 2000
STATE_KEYS = ("amax_history", "scale", "scale_inv", "seeded", "recipe")


def _layer():
    torch.manual_seed(0)
    return ft.Linear(64, 32)


def _inputs(thread, step):
    g = torch.Generator().manual_seed(1000 * thread + step)
    scale = 2.0 ** (step % 3 - 1)  # amaxes that move, so the histories differ per step
    return torch.randn(16, 64, generator=g) * scale, torch.randn(16, 32, generator=g)


def _run(layer, thread, recipe, barrier=None, hammer=HAMMER):
    """STEPS calls of `layer` under `recipe` (every third without
    gradients), then `hammer` calls without; the outputs and gradients of
    each."""
    w, b = layer.weight, layer.bias
    out = []
    if barrier is not None:
        barrier.wait()
    for step in range(STEPS):
        x, dy = _inputs(thread, step)
        with ft.autocast(recipe=recipe):
            if step % 3 == 2:
                with torch.no_grad():
                    out.append((layer(x),))
                continue
            x.requires_grad_()
            y = layer(x)
        # autograd.grad, not .backward: the threads' weight gradients must
        # not accumulate into one .grad.
        out.append((y.detach(),) + torch.autograd.grad(y, (x, w, b), dy))
    x, _ = _inputs(thread, STEPS)
    with ft.autocast(recipe=recipe), torch.no_grad():
        out.extend((layer(x),) for _ in range(hammer))
    return out


def _state(layer, recipe):
    st = layer.fp8_state_for(recipe)
    assert st is not None
    return {k: getattr(st, k) for k in STATE_KEYS}


def _assert_same_state(got, want):
    for k in STATE_KEYS:
        if isinstance(want[k], torch.Tensor):
            assert torch.equal(got[k], want[k]), k
        else:
            assert got[k] == want[k], k


@pytest.mark.parametrize("threads", [2, 8])
def test_threads_with_mixed_recipes_match_single_thread_runs(threads):
    recipes = RECIPES[:threads]
    fresh = _layer()
    shared = copy.deepcopy(fresh)
    results, errors = [None] * threads, []
    barrier = threading.Barrier(threads)

    def work(i):
        try:
            results[i] = _run(shared, i, recipes[i], barrier)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    # Switch threads as often as the interpreter can, so that a window
    # between choosing a state and using it is hit.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=300)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in ts), "a thread hangs"
    assert not errors, errors

    for i, recipe in enumerate(recipes):
        alone = copy.deepcopy(fresh)
        want = _run(alone, i, recipe, hammer=1)
        want += want[-1:] * (HAMMER - 1)
        assert len(results[i]) == len(want)
        for step, (g, w) in enumerate(zip(results[i], want)):
            for k, (a, b) in enumerate(zip(g, w)):
                assert torch.equal(a, b), f"thread {i} call {step} output {k}"
        if isinstance(recipe, DelayedScaling):
            _assert_same_state(_state(shared, recipe), _state(alone, recipe))
    # One state per scaling recipe (the fast-accumulation twin shares one).
    n_states = len({repr(shared.fp8_state_for(r).recipe) for r in recipes})
    assert len(shared.fp8_states) == n_states


def test_switching_recipes_keeps_each_recipes_state():
    a, b = RECIPES[0], RECIPES[2]
    fresh = _layer()
    mixed = copy.deepcopy(fresh)
    for step in range(STEPS):  # a, b, a, b, ... in one thread
        for recipe in (a, b):
            x, dy = _inputs(0, step)
            with ft.autocast(recipe=recipe):
                mixed(x.requires_grad_()).backward(dy)
    for recipe in (a, b):
        alone = copy.deepcopy(fresh)
        for step in range(STEPS):
            x, dy = _inputs(0, step)
            with ft.autocast(recipe=recipe):
                alone(x.requires_grad_()).backward(dy)
        _assert_same_state(_state(mixed, recipe), _state(alone, recipe))
    assert len(mixed.fp8_states) == 2
    assert mixed.fp8_state is mixed.fp8_state_for(b)  # the one used last


def test_every_recipe_state_round_trips_through_a_checkpoint():
    lin = _layer()
    for recipe in RECIPES:
        with ft.autocast(recipe=recipe):
            lin(torch.randn(16, 64, requires_grad=True)).sum().backward()
    other = _layer()
    other.load_state_dict(lin.state_dict())
    assert len(other.fp8_states) == len(lin.fp8_states) == 7
    for recipe in RECIPES:
        _assert_same_state(_state(other, recipe), _state(lin, recipe))
    x = torch.randn(16, 64)
    for recipe in RECIPES:  # and each carries on exactly as the original
        with ft.autocast(recipe=recipe):
            assert torch.equal(other(x), lin(x))
