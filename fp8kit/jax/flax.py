"""Flax (linen) modules over fp8kit.jax's FP8 layers; import this module on
its own (`import fp8kit.jax.flax`): it needs Flax, which fp8kit does not
depend on.

    Dense(features)                     fp8kit.jax.dense
    LayerNormDense(features)            fp8kit.jax.layernorm_dense
    LayerNormMLP(ffn_features)          fp8kit.jax.layernorm_mlp
    GroupedDense(num_experts, features) fp8kit.jax.grouped_dense

Each module holds its parameters in "params", named as the function's
arguments (kernel, bias; gamma, beta; kernel_1, bias_1, kernel_2,
bias_2), and calls the function with them; the output and every gradient
are the function's. Under DelayedScaling its DelayedScalingState lives in
the "fp8_state" collection (variable "scaling"), created by init. It
updates as the function's state does: the new state is the cotangent of
the old one, so differentiate the loss with respect to "fp8_state" too and
take that gradient as the next state (not an optimizer step):

    variables = model.init(key, x)      # {"params": ..., "fp8_state": ...}

    def loss_fn(params, fp8_state, x, y):
        out = model.apply({"params": params, "fp8_state": fp8_state}, x)
        return jnp.mean((out.astype(jnp.float32) - y) ** 2)

    grads, fp8_state = jax.grad(loss_fn, argnums=(0, 1))(params, fp8_state, x, y)

apply reads the state and never writes it (no mutable=); a call that is
not differentiated leaves it as it was. Call each module once per step:
the cotangents of a state used twice would be summed, so a second call in
one differentiated function is an error while tracing (a module used
twice needs two modules). CurrentScaling and BlockScaling keep no state
and make no "fp8_state" collection.

Importing this module registers DelayedScalingState with
flax.serialization, so the variables, "fp8_state" included, go through
flax.serialization.to_bytes / from_bytes (and msgpack_serialize); a
restore checks the state's shapes and values
(DelayedScalingState.from_state_dict). The state is a pytree of three
arrays, which is what Orbax saves and restores (unchecked: an eager layer
call checks the values, or DelayedScalingState.from_arrays before a jitted
step).

The attributes are checked when a module is constructed: features,
ffn_features and out_features are positive multiples of the FP8 GEMM's
alignment (16).

GroupedDense holds kernel [E, K, N] and bias [E, N] and takes the token
counts at call time, model.apply(variables, x, group_sizes), x [T, K]
sorted by expert. Its recipe defaults to CurrentScaling; under
DelayedScaling its "scaling" variable is a GroupedDelayedScalingState (one
state per expert), updated and serialized as the others' states are.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

try:
    import flax.linen as nn
    from flax import serialization
except ImportError as e:  # flax is optional: say how to get it
    raise ImportError("fp8kit.jax.flax needs Flax, which fp8kit does not install: "
                      "pip install flax") from e

import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi, _ffi_grouped
from fp8kit.jax._fused_steps import NORMALIZATIONS
from fp8kit.jax.delayed_scaling import DelayedScalingState
from fp8kit.jax.dense_layer import dense
from fp8kit.jax.fused_dense_layer import layernorm_dense
from fp8kit.jax.fused_mlp_layer import ACTIVATIONS, layernorm_mlp
from fp8kit.jax.grouped_delayed_scaling import GroupedDelayedScalingState
from fp8kit.jax.grouped_dense_layer import grouped_dense

STATE_COLLECTION = "fp8_state"
Initializer = Callable[..., Any]
_DEFAULT_RECIPE = recipe_lib.DelayedScaling()
_RECIPES = (recipe_lib.DelayedScaling, recipe_lib.CurrentScaling, recipe_lib.BlockScaling)


def _restore_state(target, state_dict):
    """target.from_state_dict (a DelayedScalingState or
    GroupedDelayedScalingState), its errors naming the variable."""
    try:
        return target.from_state_dict(state_dict)
    except (TypeError, ValueError) as e:
        raise type(e)(f"restoring {serialization.current_path()}: {e}") from e


# override: importing this module again (importlib.reload) registers again.
for _state_type in (DelayedScalingState, GroupedDelayedScalingState):
    serialization.register_serialization_state(
        _state_type, _state_type.to_state_dict, _restore_state, override=True)


def _check_attributes(module: nn.Module, **gemm_dims) -> None:
    """The attributes every module has, the optional norm's, and
    `gemm_dims` (attribute: value; out_features may be None)."""
    fn = f"fp8kit.jax.flax.{type(module).__name__}"
    for name, value in gemm_dims.items():
        if not (name == "out_features" and value is None):
            _checks.gemm_dim(fn, name, value, _ffi.GEMM_DIM_MULTIPLE)
    _checks.flag(fn, "use_bias", module.use_bias)
    if not isinstance(module.recipe, _RECIPES):
        raise TypeError(f"{fn}: recipe must be an fp8kit.recipe DelayedScaling, CurrentScaling "
                        f"or BlockScaling, got {module.recipe!r}")
    if hasattr(module, "normalization"):
        if module.normalization not in NORMALIZATIONS:
            raise ValueError(f"{fn}: normalization={module.normalization!r}; use one of "
                             f"{NORMALIZATIONS}")
        _checks.epsilon(fn, "epsilon", module.epsilon)


def _scaling_state(module: nn.Module, count: int, create=DelayedScalingState.create):
    """module's state, created by init as create(recipe, count) (count: the
    Linears of a DelayedScalingState, the experts of a grouped state), None
    for a stateless recipe."""
    if not isinstance(module.recipe, recipe_lib.DelayedScaling):
        return None
    if not module.is_initializing() and not module.has_variable(STATE_COLLECTION, "scaling"):
        raise ValueError(
            f"fp8kit.jax.flax.{type(module).__name__}: DelayedScaling keeps its state in the "
            f"'{STATE_COLLECTION}' collection, which apply was not given; pass the variables "
            f"init made: model.apply({{'params': params, '{STATE_COLLECTION}': fp8_state}}, x)")
    return module.variable(STATE_COLLECTION, "scaling", create, module.recipe, count).value


def _norm_params(module: nn.Module, hidden: int):
    """gamma and (LayerNorm) beta [hidden]."""
    gamma = module.param("gamma", module.gamma_init, (hidden,), module.param_dtype)
    beta = None
    if module.normalization == "layernorm":
        beta = module.param("beta", module.beta_init, (hidden,), module.param_dtype)
    return gamma, beta


class Dense(nn.Module):
    """y = x @ kernel + bias in FP8 (fp8kit.jax.dense); x [..., K]."""

    features: int
    use_bias: bool = True
    recipe: Any = _DEFAULT_RECIPE  # an fp8kit.recipe recipe
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        _check_attributes(self, features=self.features)
        super().__post_init__()

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features),
                            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        return dense(x, kernel, bias, state=_scaling_state(self, 1), recipe=self.recipe)


class LayerNormDense(nn.Module):
    """y = norm(x) @ kernel + bias, the norm writing the FP8 input
    (fp8kit.jax.layernorm_dense); x [..., hidden]."""

    features: int
    normalization: str = "layernorm"  # or "rmsnorm" (no beta)
    epsilon: float = 1e-5
    use_bias: bool = True
    recipe: Any = _DEFAULT_RECIPE
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    gamma_init: Initializer = nn.initializers.ones
    beta_init: Initializer = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        _check_attributes(self, features=self.features)
        super().__post_init__()

    @nn.compact
    def __call__(self, x):
        hidden = x.shape[-1]
        gamma, beta = _norm_params(self, hidden)
        kernel = self.param("kernel", self.kernel_init, (hidden, self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        return layernorm_dense(x, gamma, beta, kernel, bias, normalization=self.normalization,
                               epsilon=self.epsilon, state=_scaling_state(self, 1),
                               recipe=self.recipe)


class LayerNormMLP(nn.Module):
    """y = act(norm(x) @ kernel_1 + bias_1) @ kernel_2 + bias_2, the norm and
    the activation writing the FP8 inputs (fp8kit.jax.layernorm_mlp);
    x [..., hidden], y [..., out_features (default hidden)].

    SwiGLU's kernel_1 is [hidden, 2F] = [gate | up], or with paired=True
    [hidden, 2, F] (bias_1 [2, F]): the layout whose last dim can be split
    over a tensor-parallel mesh axis. kernel_init draws kernel_1 as
    [hidden, 2F] in both layouts (the paired one is its reshape), so one
    key gives the same layer either way."""

    ffn_features: int
    out_features: Optional[int] = None
    activation: str = "gelu"  # or "swiglu"
    normalization: str = "layernorm"  # or "rmsnorm" (no beta)
    epsilon: float = 1e-5
    use_bias: bool = True
    paired: bool = False
    recipe: Any = _DEFAULT_RECIPE
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    gamma_init: Initializer = nn.initializers.ones
    beta_init: Initializer = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        fn = "fp8kit.jax.flax.LayerNormMLP"
        _check_attributes(self, ffn_features=self.ffn_features, out_features=self.out_features)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"{fn}: activation={self.activation!r}; use one of {ACTIVATIONS}")
        if _checks.flag(fn, "paired", self.paired) and self.activation != "swiglu":
            raise ValueError(f"{fn}: paired=True is SwiGLU's kernel_1 layout [hidden, 2, F]; "
                             f"activation={self.activation!r} takes [hidden, F]: pass "
                             "paired=False")
        super().__post_init__()

    @nn.compact
    def __call__(self, x):
        hidden, f = x.shape[-1], self.ffn_features
        n1 = 2 * f if self.activation == "swiglu" else f
        k1_shape, b1_shape = ((hidden, 2, f), (2, f)) if self.paired else ((hidden, n1), (n1,))
        gamma, beta = _norm_params(self, hidden)

        def drawn_as_concatenated(init):
            """init, drawing a paired parameter as [..., 2F] and reshaping it."""
            if not self.paired:
                return init
            return lambda key, shape, dtype: init(key, (*shape[:-2], n1), dtype).reshape(shape)

        kernel_1 = self.param("kernel_1", drawn_as_concatenated(self.kernel_init), k1_shape,
                              self.param_dtype)
        out = hidden if self.out_features is None else self.out_features
        kernel_2 = self.param("kernel_2", self.kernel_init, (f, out), self.param_dtype)
        bias_1 = bias_2 = None
        if self.use_bias:
            bias_1 = self.param("bias_1", drawn_as_concatenated(self.bias_init), b1_shape,
                                self.param_dtype)
            bias_2 = self.param("bias_2", self.bias_init, (out,), self.param_dtype)
        return layernorm_mlp(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2,
                             normalization=self.normalization, activation=self.activation,
                             epsilon=self.epsilon, state=_scaling_state(self, 2),
                             recipe=self.recipe)


class GroupedDense(nn.Module):
    """y[t] = x[t] @ kernel[e] + bias[e] for the expert e of token t, in FP8
    (fp8kit.jax.grouped_dense); x [T, K] sorted by expert, group_sizes
    int32/int64 [num_experts]. Each expert's kernel is drawn as a dense
    layer's [K, N] would be (kernel_init sees the expert axis as a batch
    axis)."""

    num_experts: int
    features: int
    use_bias: bool = True
    recipe: Any = recipe_lib.CurrentScaling()
    kernel_init: Initializer = nn.initializers.lecun_normal(batch_axis=(0,))
    bias_init: Initializer = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        fn = "fp8kit.jax.flax.GroupedDense"
        _check_attributes(self, features=self.features)
        _checks.int_in(fn, "num_experts", self.num_experts, 1, _ffi_grouped.MAX_GROUPS)
        super().__post_init__()

    @nn.compact
    def __call__(self, x, group_sizes):
        e = self.num_experts
        kernel = self.param("kernel", self.kernel_init, (e, x.shape[-1], self.features),
                            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (e, self.features), self.param_dtype)
                if self.use_bias else None)
        state = _scaling_state(self, e, GroupedDelayedScalingState.create)
        return grouped_dense(x, kernel, group_sizes, bias, state=state, recipe=self.recipe)
