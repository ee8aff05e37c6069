"""Training the decoder in PyTorch: AdamW on float32 master weights,
global-norm gradient clipping, warmup + cosine learning rate
(fp8kit/models/schedule.py), batches from fp8kit/models/data.py, and
checkpoints that resume exactly.

    trainer = TorchTrainer(LlamaConfig(), TrainConfig(), DelayedScaling())
    for _ in range(100):
        loss = trainer.train_step()
    trainer.save("ckpt.safetensors")     # later: trainer.load(...)

The losses reported (train_step, train_steps, evaluate) are the language
model's: the next-token cross-entropy. A mixture-of-experts model trains
on that plus router_aux_loss_coef times its load-balancing loss (summed
over the layers, moe_torch.py), whose values for the last steps are in
`aux_losses`.

A checkpoint (fp8kit/models/checkpoint.py) holds the weights, AdamW's
moments and each FP8 Linear's scaling state in init's layout, the step and
the batch sampler's state (data position and generator state; the model
has no dropout, so that generator is the run's only randomness): the same
file a JaxTrainer writes and reads, so a run moves between the frameworks.

TorchTrainer(..., compile=True) runs the forward and the loss through
torch.compile(fullgraph=True): the whole decoder is one graph (fp8kit's
layers are dispatcher ops that dynamo traces; their scaling-state updates
are mutations inside it), and AOTAutograd compiles its backward with it.
The optimizer step (clipping, AdamW) stays eager: the learning rate is a
Python float that changes every step, which a compiled optimizer step
would recompile for unless it were held in a tensor, and on a GPU AdamW
already runs as PyTorch's fused kernels. evaluate() runs eagerly (a
no-grad forward would be a second compiled graph).

With a `statistics` log (fp8kit.inspect.StatsLog), fp8kit.torch.inspect
records the cast statistics of every FP8 GEMM operand at the steps the log
logs (the trainer's step numbers, a resumed run's included), named as the
checkpoint names the Linears (layers.<i>.qkv, layers.<i>.mlp.fc1, ...), as
JaxTrainer names them; train_step and train_steps write them before they
return (they wait for the device then anyway). Eager mode only.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from fp8kit.models import checkpoint, data
from fp8kit.models.config import LlamaConfig
from fp8kit.models.init import init_params
from fp8kit.models.llama_torch import (FP8KIT_LAYERS, FP8Layers, Llama, fp8_linear_names,
                                       fp8_state_arrays, load_fp8_state_arrays, load_params,
                                       put_layout, take_layout, weight_layout)
from fp8kit.models.schedule import TrainConfig, decays, learning_rate
from fp8kit.recipe import DelayedScaling
from fp8kit.torch.inspection import inspect


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchTrainer:
    """One training run. recipe None trains in bf16; params (NumPy, as
    init_params makes them) default to init_params(model_cfg, train_cfg.seed);
    layers: the FP8 layer classes (fp8kit's; the benchmark's TE peer swaps
    in TransformerEngine's with a TE recipe); convert: applied to the model
    once its weights are loaded, before the optimizer takes its parameters
    (the benchmark's torchao peer swaps the bf16 model's projections for
    torchao's with it); compile: the forward and loss through torch.compile
    (fullgraph=True) with compile_backend (tests pass "aot_eager", which
    runs eager mode's kernels); statistics: an fp8kit.inspect.StatsLog that
    the FP8 casts' statistics are written to at the steps it logs (fp8kit's
    layers, a recipe, eager mode)."""

    framework = "torch"

    def __init__(self, model_cfg: LlamaConfig, train_cfg: TrainConfig, recipe=None,
                 params: dict | None = None, device=None, layers: FP8Layers = FP8KIT_LAYERS,
                 convert: Callable[[Llama], Llama] | None = None, compile: bool = False,
                 compile_backend="inductor", statistics=None):
        self.model_cfg, self.train_cfg, self.recipe = model_cfg, train_cfg, recipe
        self.device = torch.device(device) if device is not None else default_device()
        self.model = Llama(model_cfg, recipe, self.device, layers)
        load_params(self.model, params if params is not None
                    else init_params(model_cfg, train_cfg.seed))
        if convert is not None:
            self.model = convert(self.model)
        self.statistics, self.inspection = statistics, None
        if statistics is not None:
            if recipe is None or compile:
                raise ValueError("TorchTrainer: statistics are the casts of the eager model's "
                                 "FP8 layers; pass a recipe and leave out compile=True, or "
                                 "statistics=None")
            self.inspection = inspect(self.model, log=statistics,
                                      names=fp8_linear_names(self.model).__getitem__)
        # What train_step calls: the objective, compiled or not.
        self.step_loss = (torch.compile(self.objective, fullgraph=True, backend=compile_backend)
                          if compile else self.objective)
        params = list(self.model.parameters())
        groups = [{"params": [p for p in params if decays(p.ndim)],
                   "weight_decay": train_cfg.weight_decay},
                  {"params": [p for p in params if not decays(p.ndim)], "weight_decay": 0.0}]
        # On a GPU, PyTorch's fused AdamW: one pass over each parameter's
        # master weight, gradient and moments. The multi-tensor (foreach)
        # default's kernels (clipping included) took 20 ms of a 1B step on an
        # H200, about a quarter of an FP8 step, for every recipe alike.
        self.optimizer = torch.optim.AdamW(groups, lr=train_cfg.lr, eps=train_cfg.eps,
                                           betas=(train_cfg.beta1, train_cfg.beta2),
                                           fused=self.device.type == "cuda")
        train_tokens, _ = data.split(data.corpus())
        self.sampler = data.BatchSampler(train_tokens, train_cfg.batch, model_cfg.seq_len,
                                         train_cfg.seed)
        self.step = 0
        # The load-balancing losses of the last train_step / train_steps call.
        self.aux_losses: list[float] = []

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of a batch of tokens [batch, seq_len + 1]
        (eager): the language model's loss, which evaluate averages."""
        logits = self.model(batch[:, :-1])
        return self._cross_entropy(logits, batch)

    @staticmethod
    def _cross_entropy(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def objective(self, batch: torch.Tensor):
        """(the loss a step differentiates, the cross-entropy, aux): aux the
        model's load-balancing loss (Llama.forward's, None for a dense
        model), which the objective adds times the config's
        router_aux_loss_coef (a dense model's objective is the cross-entropy)."""
        logits, aux = self.model(batch[:, :-1], return_aux_loss=True)
        loss = self._cross_entropy(logits, batch)
        coef = self.model_cfg.router_aux_loss_coef
        if aux is None or coef == 0:
            return loss, loss, aux
        return loss + coef * aux, loss, aux

    def _tensor(self, batch) -> torch.Tensor:
        tokens = torch.from_numpy(batch).long()
        if self.device.type != "cuda":
            return tokens.to(self.device)
        # From pageable memory a copy to the GPU waits for the stream to
        # drain, which would make every step wait for the previous one;
        # from pinned memory it is queued behind it.
        return tokens.pin_memory().to(self.device, non_blocking=True)

    def train_step(self) -> float:
        """One optimizer step on the next batch; returns its loss (the
        cross-entropy, before the step; a MoE model's load-balancing loss
        goes to aux_losses)."""
        loss = self._read([self._step()])[0]
        self._write_statistics()
        return loss

    def train_steps(self, n: int) -> list[float]:
        """n optimizer steps; their losses (as train_step's). The host waits
        for the device once, at the end, not after each step as train_step
        does: it queues each step's kernels while the device still runs the
        last one's, as a training loop that logs every n steps would."""
        losses = self._read([self._step() for _ in range(n)])
        self._write_statistics()
        return losses

    def _read(self, steps: list) -> list[float]:
        """_step's results read to the host at once: the losses, returned,
        and the load-balancing losses, kept in aux_losses."""
        aux = [a for _, a in steps if a is not None]
        values = torch.stack([loss for loss, _ in steps] + aux).tolist() if steps else []
        self.aux_losses = values[len(steps):]
        return values[:len(steps)]

    def _write_statistics(self) -> None:
        """Writes the logged steps' statistics (after the host waited for
        the device anyway)."""
        if self.inspection is not None:
            self.inspection.flush()

    def _step(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimizer step; its loss and load-balancing loss (None for a
        dense model), on the device (not waited for)."""
        batch = self._tensor(self.sampler.next())
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, self.train_cfg)
        if self.inspection is not None:  # the forwards that follow are this step's
            self.inspection.step(self.step)
        objective, loss, aux = self.step_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.clip_norm)
        self.optimizer.step()
        self.step += 1
        return loss.detach(), None if aux is None else aux.detach()

    @torch.no_grad()
    def evaluate(self, batches) -> float:
        """Mean loss over NumPy batches [batch, seq_len + 1]; the FP8
        scaling state is read, not updated (no gradients are computed)."""
        losses = [self.loss(self._tensor(b)).item() for b in batches]
        return sum(losses) / len(losses)

    def _description(self) -> dict:
        return checkpoint.run_description(self.model_cfg, self.train_cfg, self.recipe)

    def save(self, path) -> None:
        """One fp8kit.models.checkpoint file, which a JaxTrainer of the
        same run loads as well."""
        checkpoint.save(path, framework=self.framework, **self._checkpoint())

    def load(self, path) -> None:
        """Resumes from a checkpoint of this run that save() or
        JaxTrainer.save() wrote."""
        saved = self._checkpoint()
        like = checkpoint.to_arrays(saved["params"], saved["moments"], saved["fp8_states"])
        arrays, meta = checkpoint.load(path, run=saved["run"], like=like)
        params = checkpoint.section(arrays, "params.")
        moments = [checkpoint.section(arrays, f"adamw.{w}.") for w in ("m", "v")]
        if isinstance(self.recipe, DelayedScaling):
            load_fp8_state_arrays(self.model, self.recipe, checkpoint.fp8_states(arrays))
        load_params(self.model, params)
        self.optimizer.load_state_dict(self._optimizer_state(moments, int(meta["step"])))
        self.sampler.load_state_dict(meta["sampler"])
        self.step = int(meta["step"])

    def _checkpoint(self) -> dict:
        """checkpoint.save's arguments for this trainer's state now."""
        params, m, v = {}, {}, {}
        for p, names, kernel in weight_layout(self.model):
            params.update(take_layout(p, names, kernel, self.model_cfg))
            state = self.optimizer.state.get(p, {})
            for out, key in ((m, "exp_avg"), (v, "exp_avg_sq")):
                moment = state.get(key, torch.zeros_like(p))
                out.update(take_layout(moment, names, kernel, self.model_cfg))
        fp8 = None
        if isinstance(self.recipe, DelayedScaling):
            fp8 = fp8_state_arrays(self.model, self.recipe)
        return {"run": self._description(), "step": self.step,
                "sampler": self.sampler.state_dict(), "params": params, "moments": (m, v),
                "fp8_states": fp8}

    def _optimizer_state(self, moments, step: int) -> dict:
        """The optimizer's state_dict with the moments (init's layout) and step."""
        index = {id(p): i for i, p in enumerate(
            p for group in self.optimizer.param_groups for p in group["params"])}
        state = {}
        if step > 0:
            for p, names, kernel in weight_layout(self.model):
                m, v = (torch.empty_like(p, device="cpu") for _ in range(2))
                put_layout(m, [moments[0][n] for n in names], kernel)
                put_layout(v, [moments[1][n] for n in names], kernel)
                state[index[id(p)]] = {"step": torch.tensor(float(step)), "exp_avg": m,
                                       "exp_avg_sq": v}
        return {"state": state, "param_groups": self.optimizer.state_dict()["param_groups"]}

