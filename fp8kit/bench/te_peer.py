"""TransformerEngine as a peer of the fused and model benchmarks, when it is
installed (it is optional: every function returns the reason instead when
`import transformer_engine` fails, and the caller notes it on its rows).

The peer layers are built from the same weights as fp8kit's and checked
against the same bf16 output before they are timed, so a mapping mistake
shows up as an untimed row, not as a wrong number. Recipes follow fp8kit's
defaults (E4M3 forward, E5M2 gradients, history 16, max): TE's delayed
scaling and its current (per-tensor) scaling; and for block scaling TE's
Float8BlockScaling with its defaults, which are fp8kit's BlockScaling's
(E4M3 everywhere, 1x128 tiles for activations and gradients, 128x128
blocks for weights, power-of-two scales).
"""

from __future__ import annotations

import importlib.util
import os


def torch_module():
    """(transformer_engine.pytorch, None) or (None, why it is missing)."""
    try:
        import transformer_engine.pytorch as te
    except Exception as e:  # noqa: BLE001  (a missing library or one that fails to load)
        return None, f"TransformerEngine (PyTorch) not available ({type(e).__name__}: {e})"
    return te, None


def recipe(name: str):
    """TE's recipe 'delayed', 'current' or 'block', with fp8kit's defaults."""
    from transformer_engine.common import recipe as r
    if name == "delayed":
        return r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=16,
                                amax_compute_algo="max")
    if name == "block":
        return r.Float8BlockScaling()
    return r.Float8CurrentScaling(fp8_format=r.Format.HYBRID)


def torch_fp8_autocast(te, te_recipe):
    """TE's autocast context (te.autocast, or te.fp8_autocast in older releases)."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=te_recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=te_recipe)


def torch_autocast(te, recipe_name: str):
    """A context factory: TE's autocast with its recipe of that name."""
    te_recipe = recipe(recipe_name)
    return lambda: torch_fp8_autocast(te, te_recipe)


def _copy(dst, src):
    import torch
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"TE parameter shape {tuple(dst.shape)} != {tuple(src.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def per_call_autocast(fn, enter):
    """fn(i) in its own TE autocast, as a training step runs it: TE reduces
    amaxes and updates delayed scales when the autocast exits, so one
    autocast around many calls would skip that work."""
    def step(i):
        with enter():
            return fn(i)
    return step


def torch_linear(te, base):
    """te.Linear with the weight and bias of a bf16 torch.nn.Linear."""
    import torch
    layer = te.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                      params_dtype=torch.bfloat16, device=base.weight.device)
    _copy(layer.weight, base.weight)
    if base.bias is not None:
        _copy(layer.bias, base.bias)
    return layer


def torch_grouped_linear(te, base):
    """te.GroupedLinear (no bias) with the experts' weights, and the dtype,
    of an fp8kit.torch.GroupedLinear (weight [E, out, in]; TE holds one
    weight<e> [out, in] per expert)."""
    import torch
    experts, out_features, in_features = base.weight.shape
    layer = te.GroupedLinear(experts, in_features, out_features, bias=False,
                             params_dtype=base.weight.dtype, device=base.weight.device)
    with torch.no_grad():
        for e in range(experts):
            getattr(layer, f"weight{e}").copy_(base.weight[e])
    return layer


def torch_layer(te, norm, fc1, fc2, activation):
    """te.LayerNormMLP (fc2 given) or te.LayerNormLinear with the weights of
    an RMSNorm and nn.Linear modules (bf16, biases)."""
    import torch
    dev = fc1.weight.device
    kw = {"params_dtype": torch.bfloat16, "device": dev, "bias": True,
          "normalization": "RMSNorm", "eps": norm.eps}
    if fc2 is None:
        layer = te.LayerNormLinear(fc1.in_features, fc1.out_features, **kw)
        _copy(layer.weight, fc1.weight)
        _copy(layer.bias, fc1.bias)
    else:
        layer = te.LayerNormMLP(fc1.in_features, fc2.in_features, activation=activation, **kw)
        _copy(layer.fc1_weight, fc1.weight)   # swiglu: [gate | up] rows, as fp8kit's
        _copy(layer.fc1_bias, fc1.bias)
        _copy(layer.fc2_weight, fc2.weight)
        _copy(layer.fc2_bias, fc2.bias)
    _copy(layer.layer_norm_weight, norm.weight)
    return layer


def jax_module():
    """(transformer_engine.jax, None) or (None, why it is missing)."""
    try:
        import transformer_engine.jax as tej
        import transformer_engine.jax.flax  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return None, (f"TransformerEngine (JAX) not available ({type(e).__name__}: {e})"
                      + _cudnn_hint(str(e)))
    return tej, None


def _cudnn_hint(error: str) -> str:
    """The fix for TE-JAX's import in a process that loaded torch's cuDNN
    first: the system's cuDNN sub-libraries do not match it (undefined
    symbols), unless torch's cuDNN folder comes first on the loader's path."""
    if "libcudnn" not in error or "undefined symbol" not in error:
        return ""
    return f"; torch loaded its own cuDNN first: {torch_cudnn_first()}"


def torch_cudnn_lib() -> str | None:
    """Where torch's own cuDNN libraries are (the nvidia.cudnn package's
    lib folder); None where that package is not installed.
    scripts/gpu_check.sh puts it first on LD_LIBRARY_PATH for PyTorch runs."""
    spec = importlib.util.find_spec("nvidia.cudnn")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def torch_cudnn_folder() -> str:
    """torch_cudnn_lib, or words for it where the package is missing."""
    return torch_cudnn_lib() or "the nvidia/cudnn/lib folder of torch's environment"


def loaded_cudnn_folders(maps: str = "/proc/self/maps") -> list[str]:
    """The folders whose cuDNN libraries this process has mapped, sorted
    (Linux; [] where `maps` cannot be read). cuDNN 9 loads its
    sub-libraries as it needs them, so a process that found two cuDNNs
    (torch's and the system's) can run kernels of both."""
    try:
        with open(maps) as f:
            paths = {line.split()[-1] for line in f if "/libcudnn" in line}
    except OSError:
        return []
    return sorted({os.path.dirname(path) for path in paths})


def torch_cudnn_first() -> str:
    """The fix wherever two cuDNNs meet in one process (TE-JAX's import
    above, the models bench's PyTorch runs)."""
    return f"start Python with {torch_cudnn_folder()} first on LD_LIBRARY_PATH"


def jax_autocast(tej, recipe_name: str):
    te_recipe = recipe(recipe_name)
    if hasattr(tej, "autocast"):
        return tej.autocast(enabled=True, recipe=te_recipe)
    return tej.fp8_autocast(enabled=True, fp8_recipe=te_recipe)


def jax_dense(tej, recipe_name: str, x, kernel):
    """(layer, variables): TE-JAX's flax DenseGeneral (no bias, bf16) with
    `kernel` [in, out] as its kernel, and layer(x, kernel, variables) -> y
    (the kernel apart, so a vjp gives its gradient as fp8kit.jax.dense's
    does). Raises ValueError when the parameter tree is not {kernel}."""
    import jax
    import jax.numpy as jnp
    from flax.core import meta, unfreeze

    with jax_autocast(tej, recipe_name):
        module = tej.flax.DenseGeneral(features=kernel.shape[1], use_bias=False,
                                       dtype=jnp.bfloat16)
        variables = meta.unbox(unfreeze(module.init(jax.random.PRNGKey(0), x)))
    params = variables.pop("params")
    if set(params) != {"kernel"} or params["kernel"].shape != kernel.shape:
        raise ValueError(f"TE-JAX DenseGeneral parameters "
                         f"{ {k: v.shape for k, v in params.items()} }, expected kernel "
                         f"{kernel.shape}")

    def layer(x, kernel, variables):
        with jax_autocast(tej, recipe_name):
            return module.apply({"params": {"kernel": kernel}, **variables}, x)
    return layer, variables


def jax_mlp(tej, recipe_name: str, act: str, x, gamma, k1, k2, eps: float):
    """(block, variables): TE-JAX's flax LayerNormMLP (RMSNorm, no biases)
    with fp8kit's weights written into its parameters, and
    block(x, variables) -> y for [tokens, hidden] x. Raises ValueError when
    the parameter tree is not the one expected (names and shapes)."""
    import jax
    import jax.numpy as jnp
    from flax.core import meta, unfreeze

    hidden, ffn = k2.shape[1], k2.shape[0]
    acts = ("silu", "linear") if act == "swiglu" else ("gelu",)
    with jax_autocast(tej, recipe_name):
        # return_layernorm_output=False: with the default (True) TE-JAX
        # runs the norm apart from the first GEMM instead of its fused path.
        module = tej.flax.LayerNormMLP(intermediate_dim=ffn, activations=acts,
                                       layernorm_type="rmsnorm", epsilon=eps, use_bias=False,
                                       intermediate_dropout_rate=0.0,
                                       return_layernorm_output=False, dtype=jnp.bfloat16)
        # Plain arrays: init returns its parameters boxed with their
        # logical sharding axes (flax's LogicallyPartitioned).
        variables = meta.unbox(unfreeze(module.init(jax.random.PRNGKey(0), x[None])))
    params = variables["params"]
    want = {"scale": gamma, "wi_kernel": k1.reshape(hidden, len(acts), ffn), "wo_kernel": k2}
    if set(params) != set(want):
        raise ValueError(f"TE-JAX LayerNormMLP parameters {sorted(params)}, expected "
                         f"{sorted(want)}")
    for name, value in want.items():
        if params[name].shape != value.shape:
            raise ValueError(f"TE-JAX {name} shape {params[name].shape} != {value.shape}")
        params[name] = value.astype(params[name].dtype)

    def block(x, variables):
        with jax_autocast(tej, recipe_name):
            y = module.apply(variables, x[None])
        return (y[0] if isinstance(y, tuple) else y)[0]   # (out, norm output) in some versions
    return block, variables


def jax_layers(tej, recipe_name: str):
    """llama_jax.JaxLayers of TE-JAX's flax LayerNormDenseGeneral,
    DenseGeneral and LayerNormMLP (RMSNorm, no biases), for the JAX
    decoder, with bf16 seams as TE's PyTorch layers run in the PyTorch
    decoder: the model's own weights are their params, and their non-param
    collections (TE's scaling metadata, created when a module is
    initialized under TE's autocast) are the FP8 state, whose gradient is
    its next value (te.update_collections' convention, the decoder's too).
    Every call runs under TE's autocast with the recipe of that name."""
    import jax
    import jax.numpy as jnp
    from flax.core import meta, unfreeze

    from fp8kit.models.llama_jax import JaxLayers

    def layernorm_dense_module(features, epsilon):
        return tej.flax.LayerNormDenseGeneral(
            features=features, layernorm_type="rmsnorm", epsilon=epsilon, use_bias=False,
            return_layernorm_output=False, dtype=jnp.float32)

    def dense_module(features):
        return tej.flax.DenseGeneral(features=features, use_bias=False, dtype=jnp.float32)

    def mlp_module(ffn, epsilon):
        return tej.flax.LayerNormMLP(
            intermediate_dim=ffn, activations=("silu", "linear"), layernorm_type="rmsnorm",
            epsilon=epsilon, use_bias=False, intermediate_dropout_rate=0.0,
            return_layernorm_output=False, dtype=jnp.float32)

    def apply(module, params, state, x):
        with jax_autocast(tej, recipe_name):
            y = module.apply({"params": params, **state}, x)
        return y[0] if isinstance(y, tuple) else y   # (out, norm output) from the norm layers

    def layernorm_dense(x, gamma, beta, kernel, *, normalization, epsilon, state, recipe):
        return apply(layernorm_dense_module(kernel.shape[1], epsilon),
                     {"scale": gamma, "kernel": kernel}, state, x)

    def dense(x, kernel, *, state, recipe):
        return apply(dense_module(kernel.shape[1]), {"kernel": kernel}, state, x)

    def layernorm_mlp(x, gamma, beta, kernel_1, kernel_2, *, normalization, activation,
                      epsilon, state, recipe):
        hidden, ffn = kernel_2.shape[1], kernel_2.shape[0]
        # [w_gate | w_up] -> TE's [hidden, 2, ffn]: silu of the first, times the second.
        return apply(mlp_module(ffn, epsilon),
                     {"scale": gamma, "wi_kernel": kernel_1.reshape(hidden, 2, ffn),
                      "wo_kernel": kernel_2}, state, x)

    def state_of(module, x):
        """The module's non-param collections after init under TE's autocast."""
        with jax_autocast(tej, recipe_name):
            variables = meta.unbox(unfreeze(module.init(jax.random.PRNGKey(0), x)))
        variables.pop("params")
        return variables

    def create_states(cfg, recipe):
        x = jnp.zeros((1, 128, cfg.hidden), jnp.bfloat16)   # 128 tokens: FP8 GEMM-sized
        kinds = {"qkv": state_of(layernorm_dense_module(cfg.hidden + 2 * cfg.kv_width,
                                                        cfg.norm_eps), x),
                 "wo": state_of(dense_module(cfg.hidden), x),
                 "mlp": state_of(mlp_module(cfg.ffn, cfg.norm_eps), x)}
        return {"layers": [dict(kinds) for _ in range(cfg.layers)]}   # arrays are immutable

    return JaxLayers(layernorm_dense, dense, layernorm_mlp, create_states,
                     float32_seams=False)
