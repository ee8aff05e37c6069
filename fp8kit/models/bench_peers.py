"""The models benchmark's peers (fp8kit/models/bench.py): the trainers'
arguments that run the decoder with TransformerEngine's layers in place of
fp8kit's, or with torchao's Float8Linear. Each raises RuntimeError saying
why when its library is missing or cannot run the config; the benchmark
puts that on the run's row.

TransformerEngine in PyTorch: te.Linear, te.LayerNormLinear and
te.LayerNormMLP where fp8kit's layers are, and for a mixture-of-experts
config te.GroupedLinear for the experts' two grouped GEMMs, with the
routing of fp8kit's block (moe_te.py), under each of TE's recipes
te-delayed, te-current and te-block (Float8BlockScaling, which TE's
GroupedLinear runs since TE 2.3, on Hopper). In JAX: its flax layers for
a dense config (fp8kit/bench/te_peer.py's jax_layers), te-delayed and
te-current (TE-JAX has no Float8BlockScaling).

The libraries accumulate their FP8 GEMMs differently by default
(accumulation() says how each run does): fp8kit promotes every GEMM's sums
to FP32 ("split"), and its forward GEMM's fast accumulation is an opt-in;
TE in PyTorch and torchao run the forward GEMM fast and the gradients
split; TE in JAX runs every GEMM fast unless
NVTE_FP8_GEMM_HIGH_PRECISION_ACCUMULATION=1 (TE_JAX_SPLIT_ENV). Block
scaling is split in every library (cuBLASLt's block-scaled GEMM has no
fast mode). Fast accumulation is faster and less exact, so a row compares
like with like only where the two runs' accumulation is the same.
"""

from __future__ import annotations

import functools
import os

TE_RECIPES = ("te-delayed", "te-current", "te-block")
TE_JAX_RECIPES = ("te-delayed", "te-current")
TE_JAX_SPLIT_ENV = "NVTE_FP8_GEMM_HIGH_PRECISION_ACCUMULATION"


def accumulation(framework: str, recipe_name: str, forward_fast: bool) -> str | None:
    """How a run's FP8 GEMMs accumulate (the module's docstring): "split"
    (every GEMM's sums promoted to FP32), "fast fwd" (the forward GEMM in
    the tensor cores' own precision, the gradients split) or "fast" (every
    GEMM); None for bf16. forward_fast: fp8kit's per-tensor recipes' opt-in.
    TE-JAX's is read from this process's environment."""
    if recipe_name == "bf16":
        return None
    if recipe_name in ("block", "te-block"):
        return "split"
    if recipe_name == "torchao" or (recipe_name in TE_RECIPES and framework == "torch"):
        return "fast fwd"
    if recipe_name in TE_RECIPES:
        return "split" if os.environ.get(TE_JAX_SPLIT_ENV) == "1" else "fast"
    return "fast fwd" if forward_fast else "split"


def torch_te(model_cfg, recipe_name: str) -> dict:
    """TorchTrainer's recipe, layers and convert for TE recipe `recipe_name`
    (TE_RECIPES)."""
    from fp8kit.bench import te_peer
    from fp8kit.models import moe_te
    from fp8kit.models.llama_torch import FP8Layers
    te, missing = te_peer.torch_module()
    if te is None:
        raise RuntimeError(missing)
    layers = FP8Layers(te.Linear, te.LayerNormLinear, te.LayerNormMLP,
                       lambda recipe: te_peer.torch_fp8_autocast(te, recipe),
                       float32_seams=False)
    convert = None
    if model_cfg.experts:
        if not hasattr(te, "GroupedLinear"):
            raise RuntimeError("this TransformerEngine has no GroupedLinear (TE 1.9 or later) "
                               "for the mixture-of-experts layers")
        convert = functools.partial(moe_te.convert, te)
    return {"recipe": te_peer.recipe(recipe_name[len("te-"):]), "layers": layers,
            "convert": convert}


def jax_te_layers(model_cfg, recipe_name: str):
    """llama_jax.JaxLayers of TE-JAX's layers for TE recipe `recipe_name`."""
    from fp8kit.bench import te_peer
    if recipe_name not in TE_JAX_RECIPES:
        raise RuntimeError(f"{recipe_name} runs in PyTorch only (TE-JAX has no "
                           "Float8BlockScaling)")
    if model_cfg.experts:
        raise RuntimeError("TE's rows of a mixture-of-experts config are PyTorch's: the JAX "
                           "model's experts would run fp8kit's grouped_dense, not TE's")
    tej, missing = te_peer.jax_module()
    if tej is None:
        raise RuntimeError(missing)
    return te_peer.jax_layers(tej, recipe_name[len("te-"):])


def torchao_convert():
    """A TorchTrainer convert that swaps every projection but the lm_head
    for torchao's Float8Linear (tensorwise scaling); RuntimeError when
    torchao is missing."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise RuntimeError("torchao is not installed" if e.name == "torchao"
                           else f"torchao.float8 does not import: {e}") from None
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    return lambda model: convert_to_float8_training(
        model, config=config, module_filter_fn=lambda module, fqn: fqn != "lm_head")
