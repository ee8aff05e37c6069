"""Training the decoder in JAX: the same run as fp8kit/models/train_torch.py
(AdamW on float32 master weights, global-norm clipping, warmup + cosine
learning rate, the same batches) as one jit-compiled step.

    trainer = JaxTrainer(LlamaConfig(), TrainConfig(), DelayedScaling())
    loss = trainer.train_step()
    trainer.save("ckpt.npz")             # later: trainer.load("ckpt.npz")

The step differentiates the loss with respect to the params and, under
delayed scaling, the FP8 states, whose "gradient" is their updated value
(fp8kit.jax.dense's convention): it replaces the states rather than being
applied by the optimizer.

A checkpoint is one .npz file: every array of the params, the optimizer
state (step count, first and second moments) and the FP8 states, named by
its pytree path, plus a JSON entry with the step, the batch sampler's
state and the run's configuration. Loading restores into the trainer's own
pytrees and checks that the file is such an archive (a TorchTrainer
checkpoint is named as one), that every name, shape and dtype matches, and
that every FP8 scaling state's values are valid (the rule fp8kit.torch
applies to its saved state).
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

import fp8kit.jax as fj
from fp8kit.models import checkpoint, data, llama_jax
from fp8kit.models.config import LlamaConfig
from fp8kit.models.init import init_params
from fp8kit.models.schedule import TrainConfig, decays, learning_rate

_META = "__meta__"


def default_device():
    return jax.devices()[0]


def _clip_by_global_norm(grads, clip_norm: float):
    """grads scaled by min(1, clip_norm / (norm + 1e-6)), as
    torch.nn.utils.clip_grad_norm_ does."""
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(1.0, clip_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * scale, grads)


def _adamw(params, grads, opt, lr, cfg: TrainConfig):
    """torch.optim.AdamW's update (decoupled weight decay on matrices)."""
    count = opt["count"] + 1
    m = jax.tree.map(lambda m, g: cfg.beta1 * m + (1 - cfg.beta1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: cfg.beta2 * v + (1 - cfg.beta2) * g * g, opt["v"], grads)
    c1 = 1 - cfg.beta1 ** count.astype(jnp.float32)
    c2 = 1 - cfg.beta2 ** count.astype(jnp.float32)

    def update(p, m, v):
        if decays(p.ndim):
            p = p * (1 - lr * cfg.weight_decay)
        return p - (lr / c1) * m / (jnp.sqrt(v) / jnp.sqrt(c2) + cfg.eps)

    return jax.tree.map(update, params, m, v), {"count": count, "m": m, "v": v}


@functools.partial(jax.jit, static_argnames=("model_cfg", "recipe", "layers", "attention_impl"))
def _loss(params, fp8_states, batch, model_cfg, recipe, layers, attention_impl):
    logits = llama_jax.forward(params, fp8_states, batch[:, :-1], model_cfg, recipe, layers,
                               attention_impl)
    return llama_jax.cross_entropy(logits, batch[:, 1:])


# jit-compiled once per (configs, recipe), whichever trainer calls it. The
# state it replaces (params, FP8 states, optimizer moments) is donated: XLA
# writes the new state into the old one's buffers, as PyTorch's optimizers
# update in place, instead of holding both (12 bytes per parameter) at once.
@functools.partial(jax.jit, static_argnames=("model_cfg", "train_cfg", "recipe", "layers",
                                             "attention_impl"),
                   donate_argnames=("params", "fp8_states", "opt"))
def _train_step(params, fp8_states, opt, batch, lr, *, model_cfg, train_cfg, recipe, layers,
                attention_impl):
    model = (batch, model_cfg, recipe, layers, attention_impl)
    if fp8_states is None:
        loss, grads = jax.value_and_grad(_loss)(params, None, *model)
    else:
        loss, (grads, fp8_states) = jax.value_and_grad(_loss, argnums=(0, 1))(
            params, fp8_states, *model)
    grads = _clip_by_global_norm(grads, train_cfg.clip_norm)
    params, opt = _adamw(params, grads, opt, lr, train_cfg)
    return params, fp8_states, opt, loss


class JaxTrainer:
    """One training run. recipe None trains in bf16; params (NumPy, as
    init_params makes them) default to init_params(model_cfg, train_cfg.seed);
    layers: the FP8 calls (llama_jax.JaxLayers), fp8kit.jax's by default."""

    framework = "jax"

    def __init__(self, model_cfg: LlamaConfig, train_cfg: TrainConfig, recipe=None,
                 params: dict | None = None, device=None,
                 layers: llama_jax.JaxLayers = llama_jax.FP8KIT_LAYERS):
        self.model_cfg, self.train_cfg, self.recipe = model_cfg, train_cfg, recipe
        self.layers = layers
        self.device = device if device is not None else default_device()
        self.attention_impl = llama_jax.attention_implementation(self.device)
        if params is None:
            params = init_params(model_cfg, train_cfg.seed)
        params = llama_jax.model_params(params, recipe)
        self.params = self._own(params)
        self.fp8_states = self._own(llama_jax.create_fp8_states(model_cfg, recipe, layers))
        zeros = jax.tree.map(lambda p: np.zeros(p.shape, np.float32), params)
        self.opt_state = self._own({"count": np.zeros((), np.int32), "m": zeros, "v": zeros})
        train_tokens, _ = data.split(data.corpus())
        self.sampler = data.BatchSampler(train_tokens, train_cfg.batch, model_cfg.seq_len,
                                         train_cfg.seed)
        self.step = 0

    def _own(self, tree):
        """`tree` on the trainer's device, each leaf in a buffer of its own.
        Committed to the device, as the step's outputs are (otherwise the
        second step compiles the step once more); a copy of its own, since
        the step donates it (a caller's array, or one leaf shared by two
        places of the tree - m and v start as the same zeros - would be
        donated from under them)."""
        return jax.tree.map(lambda a: jax.device_put(np.array(a), self.device), tree)

    def train_step(self) -> float:
        """One optimizer step on the next batch; returns its loss (before the step)."""
        return float(self._step())

    def train_steps(self, n: int) -> list[float]:
        """n optimizer steps; their losses. The host waits for the device
        once, at the end, not after each step as train_step does: it
        dispatches each step while the device still runs the last one, as
        a training loop that logs every n steps would."""
        losses = [self._step() for _ in range(n)]
        return [float(x) for x in jax.device_get(losses)]

    def _step(self) -> jax.Array:
        """One optimizer step; its loss, on the device (not waited for)."""
        batch = jax.device_put(self.sampler.next(), self.device)
        lr = np.float32(learning_rate(self.step, self.train_cfg))
        self.params, self.fp8_states, self.opt_state, loss = _train_step(
            self.params, self.fp8_states, self.opt_state, batch, lr, model_cfg=self.model_cfg,
            train_cfg=self.train_cfg, recipe=self.recipe, layers=self.layers,
            attention_impl=self.attention_impl)
        self.step += 1
        return loss

    def evaluate(self, batches) -> float:
        """Mean loss over NumPy batches [batch, seq_len + 1]; the FP8
        scaling states are read, not updated (nothing is differentiated)."""
        losses = [float(_loss(self.params, self.fp8_states, jax.device_put(b, self.device),
                              model_cfg=self.model_cfg, recipe=self.recipe,
                              layers=self.layers, attention_impl=self.attention_impl))
                  for b in batches]
        return sum(losses) / len(losses)

    # ------------------------------------------------------- checkpoints
    def _trees(self) -> dict:
        return {"params": self.params, "opt": self.opt_state, "fp8_states": self.fp8_states}

    def _description(self) -> dict:
        return checkpoint.run_description(self.model_cfg, self.train_cfg, self.recipe)

    def save(self, path) -> None:
        arrays = {jax.tree_util.keystr(k): np.asarray(v)
                  for k, v in jax.tree_util.tree_leaves_with_path(self._trees())}
        meta = {"format": checkpoint.FORMAT, "run": self._description(), "step": self.step,
                "sampler": self.sampler.state_dict()}
        arrays[_META] = np.array(json.dumps(meta))
        checkpoint.replace_atomically(lambda f: np.savez(f, **arrays), path)

    def load(self, path) -> None:
        checkpoint.check_file_format(path, (checkpoint.NPZ,), "JaxTrainer.load",
                                     "TorchTrainer.load")
        with np.load(path, allow_pickle=False) as f:
            stored = {k: f[k] for k in f.files}
        if _META not in stored:
            raise ValueError(f"checkpoint {path} is a NumPy .npz archive without the '{_META}' "
                             f"entry JaxTrainer.save writes (it holds {sorted(stored)[:5]}): it "
                             "is not a JaxTrainer checkpoint")
        meta = json.loads(str(stored.pop(_META)))
        checkpoint.check_format(meta.get("format"), path)
        checkpoint.check_compatible(meta["run"], self._description(), path)
        paths, tree = jax.tree_util.tree_flatten_with_path(self._trees())
        names = [jax.tree_util.keystr(k) for k, _ in paths]
        missing = [n for n in names if n not in stored]
        extra = sorted(set(stored) - set(names))
        if missing or extra:
            raise ValueError(f"checkpoint {path} does not hold this trainer's arrays: "
                             f"missing {missing[:5]}, unexpected {extra[:5]}")
        for name, (_, current) in zip(names, paths):
            a = stored[name]
            if a.shape != current.shape or a.dtype != current.dtype:
                raise ValueError(f"checkpoint {path}: {name} is {a.dtype}{list(a.shape)}, "
                                 f"the trainer's is {current.dtype}{list(current.shape)}")
        trees = jax.tree_util.tree_unflatten(tree, [stored[name] for name in names])
        _check_fp8_states(trees["fp8_states"], path)
        trees = jax.tree.map(lambda a: jax.device_put(a, self.device), trees)
        self.params, self.opt_state = trees["params"], trees["opt"]
        self.fp8_states = trees["fp8_states"]
        self.sampler.load_state_dict(meta["sampler"])
        self.step = int(meta["step"])


def _check_fp8_states(fp8_states, path) -> None:
    """The values of every fp8kit DelayedScalingState among the loaded
    (NumPy) FP8 states, as fp8kit.torch checks a Linear's saved state: a
    corrupt one is named, not trained on (a NaN or zero scale makes every
    loss NaN)."""
    is_state = lambda x: isinstance(x, fj.DelayedScalingState)  # noqa: E731
    for key, state in jax.tree_util.tree_flatten_with_path(fp8_states, is_leaf=is_state)[0]:
        if is_state(state):
            state.check_values(f"checkpoint {path}: ['fp8_states']{jax.tree_util.keystr(key)}.",
                               "the checkpoint is corrupt (resume from an earlier one)")
