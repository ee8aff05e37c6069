"""The decoder's checkpoint, one file for both trainers: a TorchTrainer's
checkpoint resumes in a JaxTrainer and the reverse (fp8kit.checkpoint's
safetensors format).

The arrays are named in fp8kit/models/init.py's layout, whatever layout
the framework's model holds them in (kernels [in, out], the fused layers'
concatenated kernels apart):

    params.<name>            float32 weights: params.embed,
                             params.layers.<i>.wq, ..., params.lm_head
    adamw.m.<name>           AdamW's first and second moments, same layout
    adamw.v.<name>           (zeros before the first step)
    fp8.<linear>.<field>     delayed scaling only: each FP8 Linear's state
                             (fp8kit.checkpoint.STATE_FIELDS), <linear> one
                             of FP8_LINEARS (MOE_FP8_LINEARS) per layer:
                             layers.<i>.qkv, ...

and the metadata holds the run's configuration (checked on load, so that a
checkpoint is never resumed into a different model, schedule or recipe),
the step, the batch sampler's state and the framework that wrote it.
"""

from __future__ import annotations

import dataclasses
import enum
import os

import fp8kit.checkpoint as portable
from fp8kit.models.config import LlamaConfig

# A decoder layer's FP8 Linears: the norm + q, k, v projection, the output
# projection, and the MLP's two (gate and up fused in fc1; down in fc2).
FP8_LINEARS = ("qkv", "wo", "mlp.fc1", "mlp.fc2")
# A mixture-of-experts layer's: the MLP's two are its grouped layers, each
# state holding every expert's (amax_history [E, 3, len], scale and seeded
# [E, 3]: fp8kit.jax.GroupedDelayedScalingState's arrays).
MOE_FP8_LINEARS = ("qkv", "wo", "experts.gate_up", "experts.down")


def run_description(model_cfg, train_cfg, recipe) -> dict:
    """Plain values (str, int, float) naming the run's configuration."""
    def plain(obj):
        if obj is None:
            return None
        d = {k: (v.value if isinstance(v, enum.Enum) else v)
             for k, v in dataclasses.asdict(obj).items()}
        return {"type": type(obj).__name__, **d}
    model = plain(model_cfg)
    if model is not None and not model.get("experts"):
        # A dense model has no router: leaving its settings out keeps the
        # files written before they existed loadable.
        for name in ("router_aux_loss_coef", "router_balanced"):
            model.pop(name, None)
    return {"model": model, "train": plain(train_cfg), "recipe": plain(recipe)}


def check_compatible(saved: dict, current: dict, path) -> None:
    """ValueError naming every setting in which `saved` differs from `current`."""
    diffs = []
    for part in ("model", "train", "recipe"):
        a, b = saved.get(part), current[part]
        if a == b:
            continue
        if a is None or b is None:
            diffs.append(f"{part}: saved {a}, now {b}")
            continue
        diffs += [f"{part}.{k}: saved {a.get(k)!r}, now {b.get(k)!r}"
                  for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if diffs:
        raise ValueError(f"checkpoint {os.fspath(path)} was written by a different run; "
                         f"resume it with the same settings ({'; '.join(diffs)})")


def flatten(params: dict) -> dict:
    """init's nested layout as {"embed": a, "layers.0.wq": a, ...}."""
    flat = {k: v for k, v in params.items() if k != "layers"}
    for i, layer in enumerate(params["layers"]):
        flat.update({f"layers.{i}.{k}": v for k, v in layer.items()})
    return flat


def unflatten(flat: dict, cfg: LlamaConfig) -> dict:
    """flatten's inverse."""
    params = {k: v for k, v in flat.items() if not k.startswith("layers.")}
    params["layers"] = [{} for _ in range(cfg.layers)]
    for k, v in flat.items():
        if k.startswith("layers."):
            _, i, name = k.split(".", 2)
            params["layers"][int(i)][name] = v
    return params


def fp8_linear_names(cfg: LlamaConfig) -> list[str]:
    names = MOE_FP8_LINEARS if cfg.experts else FP8_LINEARS
    return [f"layers.{i}.{n}" for i in range(cfg.layers) for n in names]


def to_arrays(params: dict, moments: tuple[dict, dict], fp8_states: dict | None) -> dict:
    """The checkpoint's arrays: params and moments (m, v) flat (flatten's
    names), fp8_states {linear name: {field: array}} or None."""
    arrays = {f"params.{k}": v for k, v in params.items()}
    for which, tree in zip(("m", "v"), moments):
        arrays.update({f"adamw.{which}.{k}": v for k, v in tree.items()})
    for linear, state in (fp8_states or {}).items():
        arrays.update({f"fp8.{linear}.{f}": state[f] for f in portable.STATE_FIELDS})
    return arrays


def save(path, *, framework: str, run: dict, step: int, sampler: dict, params: dict,
         moments: tuple[dict, dict], fp8_states: dict | None) -> None:
    portable.save(path, to_arrays(params, moments, fp8_states),
                  {"run": run, "step": step, "sampler": sampler, "framework": framework})


def load(path, *, run: dict, like: dict) -> tuple[dict, dict]:
    """(arrays, metadata) of the checkpoint at `path`, checked against this
    trainer: the same run, and the arrays `like` (what this trainer's save
    writes) by name, shape and dtype."""
    arrays, meta = portable.load(path)
    for key in ("run", "step", "sampler", "framework"):
        if key not in meta:
            raise ValueError(f"checkpoint {os.fspath(path)} has no {key!r} in its metadata: "
                             "it is an fp8kit checkpoint, but not a trainer's")
    check_compatible(meta["run"], run, path)
    missing, extra = sorted(set(like) - set(arrays)), sorted(set(arrays) - set(like))
    if missing or extra:
        raise ValueError(f"checkpoint {os.fspath(path)} does not hold this trainer's arrays: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    for name, a in arrays.items():
        b = like[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"checkpoint {os.fspath(path)}: {name} is {a.dtype}{list(a.shape)}, "
                             f"the trainer's is {b.dtype}{list(b.shape)}")
        field = name.rsplit(".", 1)[1]
        bad = portable.first_bad_value(field, a) if name.startswith("fp8.") else None
        if bad is not None:
            raise ValueError(f"checkpoint {os.fspath(path)}: {name.rsplit('.', 1)[0]}.{bad[1]}: "
                             "the checkpoint is corrupt (resume from an earlier one)")
    return arrays, meta


def section(arrays: dict, prefix: str) -> dict:
    """The arrays named prefix + name, as {name: array}."""
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def fp8_states(arrays: dict) -> dict:
    """{linear: {field: array}} of the arrays named fp8.<linear>.<field>."""
    out = {}
    for k, v in section(arrays, "fp8.").items():
        linear, field = k.rsplit(".", 1)
        out.setdefault(linear, {})[field] = v
    return out
