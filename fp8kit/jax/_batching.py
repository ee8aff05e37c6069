"""jax.vmap of the fused delayed-scaling call (quantize, seed and record).

The per-example ("sequential") batching every other custom call uses is
wrong for this one when the state is shared: with an unbatched state and
batched inputs each example would seed and record on its own, and the
state's cotangent (how dense returns the updated state) would be the sum
of the per-example updates - a scale doubled by a batch of two. The rule
here makes a vmapped call with a shared state behave as one call over the
whole batch, which is what the recipe means:

  - every example is cast with the scale that one call would use (a fresh
    slot seeded from the amax of the whole batch);
  - the state records once, with the batch's amax (the max over the
    examples), one roll of the history per call;
  - the state and scale_inv come out unbatched, so nothing is summed.

With a batched state (one state per example, in_axes=0) each example runs
its own call, as before. The rule peels one vmap level at a time: the
calls it makes are this same function, so an outer vmap applies it again.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fp8kit.jax import _ffi
from fp8kit.jax import _sharding_quantize as shq


@functools.lru_cache(maxsize=None)
def _fused(call: _ffi.DelayedQuantize, with_amax: bool):
    """The call as a custom_vmap function of (history, scale, seeded, amax,
    *xs), flat results. amax (with_amax): [n] lower bounds of the inputs'
    amaxes (the batch's), which start the core's accumulators."""

    def fused(history, scale, seeded, amax, *xs):
        if with_amax:  # only under vmap, where nothing is partitioned
            return shq.flatten_delayed(*_ffi.quantize_delayed_update_call(
                call, history, scale, seeded, list(xs), amax))
        return shq.flatten_delayed(*shq.quantize_delayed_update(call, history, scale, seeded,
                                                                list(xs)))

    fused = jax.custom_batching.custom_vmap(fused)
    fused.def_vmap(functools.partial(_vmap_rule, call, with_amax))
    return fused


def _vmap_rule(call, with_amax, axis_size, in_batched, history, scale, seeded, amax, *xs):
    n = len(xs)
    state_batched, amax_batched, xs_batched = any(in_batched[:3]), in_batched[3], in_batched[4:]
    if state_batched:  # one state per example: one call per example
        args = (history, scale, seeded, amax, *xs)
        out = jax.lax.map(lambda b: _fused(call, with_amax)(*_merge(args, in_batched, b)),
                          [a for a, b in zip(args, in_batched) if b])
        return tuple(out), (True,) * len(out)

    # A shared state: the batch's amax of each input, then one record.
    batch_amax = jnp.stack([_ffi.amax_call(x) for x in xs]).reshape(n)
    if with_amax:
        given = jnp.max(amax, axis=0) if amax_batched else amax
        batch_amax = jnp.maximum(batch_amax, given)
    # The state update and each scale_inv depend on the state and the
    # batch's amax only: one call on a single example (no example at all for
    # an empty batch) records them; it also casts the unbatched inputs.
    # (Its column sums of a batched input are not used: not asked for.)
    first = [x[:1].reshape((-1,) + x.shape[2:]) if b else x for x, b in zip(xs, xs_batched)]
    one_call = dataclasses.replace(call, sums_dtypes=tuple(
        None if b else d for d, b in zip(call.sums_dtypes, xs_batched)))
    one = _fused(one_call, True)(history, scale, seeded, batch_amax, *first)
    out, out_batched = list(one[:3]), [False] * 3
    if not call.record:  # the state is read, not written: it stays as passed
        out[:3] = history, scale, seeded
    # Each batched input cast per example with that same scale (not recording).
    idx = [i for i, b in enumerate(xs_batched) if b]
    casts = ()
    if idx:
        sub = dataclasses.replace(
            call, fmts=tuple(call.fmts[i] for i in idx),
            copies=tuple(call.copies[i] for i in idx),
            sums_dtypes=tuple(call.sums_dtypes[i] for i in idx), record=False, first_slot=0)
        rows = jnp.asarray([call.first_slot + i for i in idx])  # their state rows
        casts = jax.lax.map(
            lambda xb: _fused(sub, True)(history[rows], scale[rows], seeded[rows],
                                         batch_amax[jnp.asarray(idx)], *xb),
            [xs[i] for i in idx])
    for i in range(n):
        mine = one[3 + 4 * i:7 + 4 * i]
        if xs_batched[i]:  # its casts per example, the one call's scale_inv
            j = 3 + 4 * idx.index(i)
            out += [*casts[j:j + 3], mine[3]]
        else:
            out += mine
        out_batched += [bool(xs_batched[i])] * 3 + [False]
    return tuple(out), tuple(out_batched)


def _merge(args, in_batched, batched_values):
    """args with the batched ones replaced, in order, by batched_values."""
    it = iter(batched_values)
    return [next(it) if b else a for a, b in zip(args, in_batched)]


def quantize_delayed_update(call: _ffi.DelayedQuantize, amax_history, scale, seeded, xs):
    """shq.quantize_delayed_update with the vmap rule above:
    (history, scale, seeded, outputs)."""
    return shq.unflatten_delayed(_fused(call, False)(amax_history, scale, seeded, None, *xs))
