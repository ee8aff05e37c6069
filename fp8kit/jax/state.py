"""Delayed-scaling state of one FP8 dense layer, as an explicit pytree.

Rows (one per quantized tensor of the layer):
    X = 0       the input x              (forward format, E4M3)
    KERNEL = 1  the kernel               (forward format, E4M3)
    GRAD = 2    the output gradient dy   (backward format: E5M2 under HYBRID)

amax_history[i, 0] is tensor i's newest amax; scale[i] is the scale its
next quantization uses (scale_inv = 1/scale travels with the quantized
data, so it is not stored).

How the state gets updated (the "state cotangent" convention): the amax of
dy exists only in the backward pass, so the updated state leaves `dense`
the only way a backward pass can return anything - as the cotangent of
the `state` argument. Differentiate the loss with respect to the state as
well as the parameters and use that "gradient" as the next state:

    loss_and_grads = jax.value_and_grad(loss_fn, argnums=(0, 1))
    loss, (param_grads, new_state) = loss_and_grads(params, state, batch)
    state = new_state                      # not an optimizer step

The backward pass of each dense call rolls the three new amaxes into the
history and recomputes the scales in one fp8kit_delayed_scaling_update
call, so new_state is exactly the recipe's next state. Use each state in
exactly one dense call per step (cotangents of a shared input are summed).
Under jax.vmap pass the state batched (in_axes=0, one state per example);
an unbatched state would receive the sum of the per-example updates.
A forward pass without differentiation reads the state and leaves it
unchanged.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fp8kit import recipe as recipe_lib

X, KERNEL, GRAD = 0, 1, 2
NUM_TENSORS = 3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DelayedScalingState:
    """amax_history: float32 [3, history_len]; scale: float32 [3]."""

    amax_history: jax.Array
    scale: jax.Array

    @classmethod
    def create(cls, recipe: recipe_lib.DelayedScaling) -> "DelayedScalingState":
        """Fresh state: empty history, scale 1 (the first step quantizes
        unscaled, as TransformerEngine does; the history fills from then on)."""
        if not isinstance(recipe, recipe_lib.DelayedScaling):
            raise TypeError("DelayedScalingState.create: recipe must be an "
                            f"fp8kit.recipe.DelayedScaling, got {type(recipe).__name__}")
        return cls(amax_history=jnp.zeros((NUM_TENSORS, recipe.amax_history_len), jnp.float32),
                   scale=jnp.ones((NUM_TENSORS,), jnp.float32))

    @staticmethod
    def formats(recipe: recipe_lib.DelayedScaling) -> tuple[str, str, str]:
        """FP8 format of each row under `recipe`."""
        fmt = recipe.fp8_format
        return (fmt.forward_dtype, fmt.forward_dtype, fmt.backward_dtype)
