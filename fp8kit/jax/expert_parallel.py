"""Expert parallelism for grouped_dense: each device of a mesh axis holds
E / D of the E experts and a 1 / D share of the tokens, and the tokens
travel to their experts' devices and back with two all-to-alls per
direction of the layer (GShard's dispatch and combine, with a capacity).

Inside jax.shard_map over that axis:

    local, plan = fj.expert_parallel.dispatch(x, expert, num_experts=E,
                                              capacity=C, axis_name="ep")
    y_local = fj.grouped_dense(local, kernels_local, plan.group_sizes, ...)
    y = fj.expert_parallel.combine(y_local, plan)

x [P, K] holds this device's (token, expert) pairs and expert [P] (int32)
the global expert of each. Device d owns experts d * E/D .. (d+1) * E/D - 1
(kernels [E, K, N] sharded along E over the axis). Each device sends every
expert up to C of its pairs for that expert (its first C, in pair order);
a pair beyond an expert's capacity is dropped: its row of combine's output
is zero (raise C to drop none: C = P never drops). So every shape is
static, no count is read on the host, and both functions are
differentiable (the all-to-all's transpose is the reverse all-to-all).

The experts' devices see their tokens as one contiguous grouped tensor:
expert j's rows are the C slots from source device 0, then from device 1,
and so on, the unfilled slots zero rows. A zero row leaves each expert's
amax (and so its current or delayed scale) and weight gradient as they
are, and its output is dropped, so with no pair dropped the result is that
of grouped_dense over all the pairs sorted by expert (tokens split over
the devices in order), at the cost of computing the empty slots. Under
BlockScaling the weight gradient reads each expert's tokens in 1x128
tiles, which the empty slots shift: it agrees to FP8 rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Plan(NamedTuple):
    """What combine needs of a dispatch (a pytree of arrays, plus static ints)."""
    slot: jax.Array         # [P] int32: each pair's row of the sent buffer (E * C for dropped)
    kept: jax.Array         # [P] bool: the pair was sent (not beyond its expert's capacity)
    group_sizes: jax.Array  # [E / D] int32: the rows of each local expert (D * C each)
    num_experts: int
    capacity: int
    axis_name: str


def dispatch(x, expert, *, num_experts: int, capacity: int, axis_name: str):
    """(rows of this device's experts [E/D * D * C, K], Plan) for the pairs
    x [P, K] with global experts `expert` [P]; call inside shard_map over
    `axis_name`."""
    devices = jax.lax.axis_size(axis_name)
    if x.ndim != 2:
        raise ValueError(f"expert_parallel.dispatch: x has shape {x.shape}; pass the pairs as "
                         "[pairs, features]")
    if expert.shape != x.shape[:1]:
        raise ValueError(f"expert_parallel.dispatch: expert has shape {expert.shape} but x "
                         f"holds {x.shape[0]} pairs; pass one expert index per pair")
    if not jnp.issubdtype(expert.dtype, jnp.integer):
        raise TypeError(f"expert_parallel.dispatch: expert has dtype {expert.dtype}; pass int32 "
                        "expert indices")
    if num_experts % devices:
        raise ValueError(f"expert_parallel.dispatch: num_experts={num_experts} does not split "
                         f"over the {devices} devices of axis {axis_name!r}; use a multiple "
                         "of the axis size")
    if not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"expert_parallel.dispatch: capacity is {capacity!r}; pass a positive "
                         "int (the pairs each device sends each expert at most)")
    pairs, features = x.shape
    local = num_experts // devices
    expert = expert.astype(jnp.int32)
    # Each pair's position among this device's pairs of its expert, in pair
    # order (a stable sort by expert, then the offset from the expert's start).
    order = jnp.argsort(expert, stable=True)
    counts = jnp.bincount(expert, length=num_experts).astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    position = jnp.zeros(pairs, jnp.int32).at[order].set(
        jnp.arange(pairs, dtype=jnp.int32) - starts[expert[order]])
    kept = position < capacity
    slot = jnp.where(kept, expert * capacity + position, num_experts * capacity)
    # Row E * C takes the dropped pairs and is cut off before sending.
    sent = jnp.zeros((num_experts * capacity + 1, features), x.dtype).at[slot].set(x)
    sent = sent[:num_experts * capacity]
    # Chunk d (experts of device d) goes to device d; the received chunks
    # stack by source device: [D, E/D, C, K], regrouped by local expert.
    received = jax.lax.all_to_all(sent, axis_name, 0, 0, tiled=True)
    rows = received.reshape(devices, local, capacity, features).transpose(1, 0, 2, 3)
    group_sizes = jnp.full((local,), devices * capacity, jnp.int32)
    plan = Plan(slot, kept, group_sizes, num_experts, capacity, axis_name)
    return rows.reshape(local * devices * capacity, features), plan


def combine(y, plan: Plan):
    """Each pair's output [P, N] (zero for a dropped pair) from the local
    experts' outputs y [E/D * D * C, N] of the rows dispatch gave."""
    devices = jax.lax.axis_size(plan.axis_name)
    local = plan.num_experts // devices
    if y.ndim != 2 or y.shape[0] != local * devices * plan.capacity:
        raise ValueError(f"expert_parallel.combine: y has shape {y.shape}; it must be the "
                         f"[{local * devices * plan.capacity}, N] outputs of dispatch's rows")
    n = y.shape[1]
    by_source = y.reshape(local, devices, plan.capacity, n).transpose(1, 0, 2, 3)
    back = jax.lax.all_to_all(by_source.reshape(devices * local * plan.capacity, n),
                              plan.axis_name, 0, 0, tiled=True)
    # back: [E * C, N] in global expert order; the dropped pairs read row 0
    # and are zeroed.
    out = back[jnp.where(plan.kept, plan.slot, 0)]
    return jnp.where(plan.kept[:, None], out, jnp.zeros_like(out))
