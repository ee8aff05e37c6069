"""Training the decoder in JAX: the same run as fp8kit/models/train_torch.py
(AdamW on float32 master weights, global-norm clipping, warmup + cosine
learning rate, the same batches) as one jit-compiled step.

    trainer = JaxTrainer(LlamaConfig(), TrainConfig(), DelayedScaling())
    loss = trainer.train_step()
    trainer.save("ckpt.safetensors")     # later: trainer.load(...)

As in train_torch.py the losses reported are the cross-entropy; a
mixture-of-experts model trains on that plus router_aux_loss_coef times
its load-balancing loss, whose values for the last steps are in
`aux_losses`.

The step differentiates the loss with respect to the params and, under
delayed scaling, the FP8 states, whose "gradient" is their updated value
(fp8kit.jax.dense's convention): it replaces the states rather than being
applied by the optimizer.

With a `statistics` log (fp8kit.inspect.StatsLog), the steps it logs
also differentiate with respect to zeroed statistics rows
(llama_jax.create_statistics_rows): their cotangent is the statistics of
every FP8 cast fp8kit.jax records, read to the host and written at those
steps only. The other steps run the step compiled without them.

A checkpoint (fp8kit/models/checkpoint.py) holds the params, the
optimizer's moments and the FP8 states in init's layout, the same file a
TorchTrainer writes and reads: a run moves between the frameworks.
Loading checks that the file is one of this run, that every name, shape
and dtype matches, and that every FP8 scaling state's values are valid
(the rule fp8kit.torch applies to its saved state).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fp8kit.models import checkpoint, data, llama_jax
from fp8kit.models.config import LlamaConfig
from fp8kit.models.init import init_params
from fp8kit.models.schedule import TrainConfig, decays, learning_rate

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


def _step_loss(params, fp8_states, statistics, batch, model_cfg, recipe, layers, attention_impl):
    """(the loss a step differentiates, (the cross-entropy, aux)): aux the
    load-balancing loss (llama_jax.forward_and_aux's, None for a dense
    model), added times router_aux_loss_coef (TorchTrainer.objective's rule)."""
    logits, aux = llama_jax.forward_and_aux(params, fp8_states, batch[:, :-1], model_cfg,
                                            recipe, layers, attention_impl, statistics)
    loss = llama_jax.cross_entropy(logits, batch[:, 1:])
    coef = model_cfg.router_aux_loss_coef
    if aux is None or coef == 0:
        return loss, (loss, aux)
    return loss + coef * aux, (loss, aux)


@functools.partial(jax.jit, static_argnames=("model_cfg", "recipe", "layers", "attention_impl"))
def _loss(params, fp8_states, batch, model_cfg, recipe, layers, attention_impl):
    """The cross-entropy (evaluate's loss)."""
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
def _train_step(params, fp8_states, opt, batch, lr, statistics=None, *, model_cfg, train_cfg,
                recipe, layers, attention_impl):
    """The step; its loss and load-balancing loss (None for a dense model);
    with statistics rows, also their filled values (else None)."""
    model = (batch, model_cfg, recipe, layers, attention_impl)
    (_, (loss, aux)), (grads, new_states, statistics) = jax.value_and_grad(
        _step_loss, argnums=(0, 1, 2), has_aux=True)(params, fp8_states, statistics, *model)
    if fp8_states is not None:  # the states' cotangent is their next value
        fp8_states = new_states
    grads = _clip_by_global_norm(grads, train_cfg.clip_norm)
    params, opt = _adamw(params, grads, opt, lr, train_cfg)
    return params, fp8_states, opt, loss, aux, statistics


class JaxTrainer:
    """One training run. recipe None trains in bf16; params (NumPy, as
    init_params makes them) default to init_params(model_cfg, train_cfg.seed);
    layers: the FP8 calls (llama_jax.JaxLayers), fp8kit.jax's by default;
    statistics: an fp8kit.inspect.StatsLog that the FP8 casts' statistics
    are written to at the steps it logs (fp8kit's layers, a recipe)."""

    framework = "jax"

    def __init__(self, model_cfg: LlamaConfig, train_cfg: TrainConfig, recipe=None,
                 params: dict | None = None, device=None,
                 layers: llama_jax.JaxLayers = llama_jax.FP8KIT_LAYERS, statistics=None):
        self.model_cfg, self.train_cfg, self.recipe = model_cfg, train_cfg, recipe
        self.layers = layers
        fp8kit_layers = llama_jax.records_statistics(layers)
        if statistics is not None and (recipe is None or not fp8kit_layers):
            raise ValueError("JaxTrainer: statistics are the casts of fp8kit's FP8 layers; "
                             "pass a recipe and the default layers, or statistics=None")
        self.statistics = statistics
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
        # The load-balancing losses of the last train_step / train_steps call.
        self.aux_losses: list[float] = []
        # The last logged step and its statistics rows, on the device until
        # a later step is queued behind it (_write_statistics).
        self._logged = None

    def _own(self, tree):
        """`tree` on the trainer's device, each leaf in a buffer of its own.
        Committed to the device, as the step's outputs are (otherwise the
        second step compiles the step once more); a copy of its own, since
        the step donates it (a caller's array, or one leaf shared by two
        places of the tree - m and v start as the same zeros - would be
        donated from under them)."""
        return jax.tree.map(lambda a: jax.device_put(np.array(a), self.device), tree)

    def train_step(self) -> float:
        """One optimizer step on the next batch; returns its loss (the
        cross-entropy, before the step; a MoE model's load-balancing loss
        goes to aux_losses)."""
        return self._read([self._step()])[0]

    def train_steps(self, n: int) -> list[float]:
        """n optimizer steps; their losses (as train_step's). The host waits
        for the device once, at the end, not after each step as train_step
        does: it dispatches each step while the device still runs the last
        one, as a training loop that logs every n steps would."""
        return self._read([self._step() for _ in range(n)])

    def _read(self, steps: list) -> list[float]:
        """_step's results read to the host at once: the losses, returned,
        and the load-balancing losses, kept in aux_losses."""
        steps = jax.device_get(steps)
        self._write_statistics()
        self.aux_losses = [float(a) for _, a in steps if a is not None]
        return [float(loss) for loss, _ in steps]

    def _step(self):
        """One optimizer step; its loss and load-balancing loss (None for a
        dense model), on the device (not waited for)."""
        batch = jax.device_put(self.sampler.next(), self.device)
        lr = np.float32(learning_rate(self.step, self.train_cfg))
        log = self.statistics
        rows = (llama_jax.create_statistics_rows(self.model_cfg)
                if log is not None and log.should_log(self.step) else None)
        self.params, self.fp8_states, self.opt_state, loss, aux, rows = _train_step(
            self.params, self.fp8_states, self.opt_state, batch, lr, rows,
            model_cfg=self.model_cfg, train_cfg=self.train_cfg, recipe=self.recipe,
            layers=self.layers, attention_impl=self.attention_impl)
        self._write_statistics()  # an earlier logged step's: this one is queued behind it
        if rows is not None:
            self._logged = (self.step, rows)
        self.step += 1
        return loss, aux

    def _write_statistics(self) -> None:
        """Writes the last logged step's statistics, if not yet written.
        Reading them waits for that step to finish, so _step calls this only
        once the next step is queued (the device stays busy while the host
        waits and writes), and _read when it has waited for the device
        anyway."""
        if self._logged is None:
            return
        step, rows = self._logged
        self._logged = None
        self.statistics.write(step, self.framework, type(self.recipe).__name__,
                              llama_jax.tensor_statistics(rows))

    def evaluate(self, batches) -> float:
        """Mean loss over NumPy batches [batch, seq_len + 1]; the FP8
        scaling states are read, not updated (nothing is differentiated)."""
        losses = [float(_loss(self.params, self.fp8_states, jax.device_put(b, self.device),
                              model_cfg=self.model_cfg, recipe=self.recipe,
                              layers=self.layers, attention_impl=self.attention_impl))
                  for b in batches]
        return sum(losses) / len(losses)

    # ------------------------------------------------------- checkpoints
    def _description(self) -> dict:
        return checkpoint.run_description(self.model_cfg, self.train_cfg, self.recipe)

    def save(self, path) -> None:
        """One fp8kit.models.checkpoint file, which a TorchTrainer of the
        same run loads as well."""
        checkpoint.save(path, framework=self.framework, **self._checkpoint())

    def load(self, path) -> None:
        """Resumes from a checkpoint of this run that save() or
        TorchTrainer.save() wrote; every FP8 scaling state's values are
        checked (the rule fp8kit.torch applies to its saved state)."""
        saved = self._checkpoint()
        like = checkpoint.to_arrays(saved["params"], saved["moments"], saved["fp8_states"])
        arrays, meta = checkpoint.load(path, run=saved["run"], like=like)
        model = lambda flat: llama_jax.model_params(  # noqa: E731
            checkpoint.unflatten(flat, self.model_cfg), self.recipe)
        params = model(checkpoint.section(arrays, "params."))
        m, v = (model(checkpoint.section(arrays, f"adamw.{w}.")) for w in ("m", "v"))
        fp8_states = None
        if self.fp8_states is not None:
            try:
                fp8_states = llama_jax.fp8_states_from_arrays(checkpoint.fp8_states(arrays),
                                                              self.model_cfg)
            except ValueError as e:
                raise ValueError(f"checkpoint {path}: {e}") from None
        step = int(meta["step"])
        self.params = self._own(params)
        self.opt_state = self._own({"count": np.int32(step), "m": m, "v": v})
        self.fp8_states = self._own(fp8_states)
        self.sampler.load_state_dict(meta["sampler"])
        self.step = step

    def _checkpoint(self) -> dict:
        """checkpoint.save's arguments for this trainer's state now."""
        flat = lambda tree: checkpoint.flatten(  # noqa: E731
            llama_jax.init_layout(tree, self.model_cfg, self.recipe))
        fp8 = None
        if self.fp8_states is not None:
            fp8 = llama_jax.fp8_state_arrays(self.fp8_states)
        return {"run": self._description(), "step": self.step,
                "sampler": self.sampler.state_dict(), "params": flat(self.params),
                "moments": (flat(self.opt_state["m"]), flat(self.opt_state["v"])),
                "fp8_states": fp8}
