"""The demo model in PyTorch (eager): the MLP blocks' projections are
fp8kit.torch.Linear layers, which run in FP8 inside
fp8kit.torch.autocast(recipe=...) and as torch.nn.Linear outside it. The
bf16 run uses the same modules outside fp8kit's autocast, with the
projections computed in bf16 (weights cast per call, as torch.autocast
would), so the two runs differ only in the FP8 GEMMs.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
import torch.nn.functional as F

import fp8kit.torch as ft
from fp8kit.demo.result import RunResult
from fp8kit.demo.task import Config, Data

BF16 = torch.bfloat16
ADAM_BETAS, ADAM_EPS = (0.9, 0.99), 1e-8


class Block(torch.nn.Module):
    """x + down(gelu(up(layer_norm(x)))), projections in FP8 or bf16."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.up = ft.Linear(d, hidden)
        self.down = ft.Linear(hidden, d)

    @staticmethod
    def _project(layer: ft.Linear, x: torch.Tensor, fp8: bool) -> torch.Tensor:
        if fp8:  # inside fp8kit.torch.autocast: FP8 GEMMs, bf16 out
            # torch.autocast casts the float32 weights to x's bf16, as
            # nn.Linear needs (fp8kit's Linear refuses mixed dtypes too).
            with torch.autocast(x.device.type, dtype=BF16):
                return layer(x)
        return F.linear(x, layer.weight.to(BF16), layer.bias.to(BF16))

    def forward(self, x: torch.Tensor, fp8: bool) -> torch.Tensor:
        h = self.ln(x).to(BF16)
        u = F.gelu(self._project(self.up, h, fp8), approximate="tanh")
        return x + self._project(self.down, u, fp8).float()


class CharModel(torch.nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.embed)
        self.blocks = torch.nn.ModuleList(Block(cfg.d_model, cfg.hidden) for _ in range(cfg.blocks))
        self.ln_f = torch.nn.LayerNorm(cfg.d_model)
        self.head = torch.nn.Linear(cfg.d_model, cfg.vocab)

    def load_numpy(self, p: dict) -> None:
        """The shared initial weights (kernels [in, out] -> weights [out, in])."""
        def put(param, value, transpose=False):
            v = torch.from_numpy(np.ascontiguousarray(value.T if transpose else value))
            param.data.copy_(v)

        put(self.embed.weight, p["embed"])
        for blk, bp in zip(self.blocks, p["blocks"]):
            put(blk.ln.weight, bp["ln_scale"])
            put(blk.ln.bias, bp["ln_bias"])
            put(blk.up.weight, bp["up_kernel"], transpose=True)
            put(blk.up.bias, bp["up_bias"])
            put(blk.down.weight, bp["down_kernel"], transpose=True)
            put(blk.down.bias, bp["down_bias"])
        put(self.ln_f.weight, p["ln_f_scale"])
        put(self.ln_f.bias, p["ln_f_bias"])
        put(self.head.weight, p["head_kernel"], transpose=True)
        put(self.head.bias, p["head_bias"])

    def forward(self, ctx: torch.Tensor, fp8: bool) -> torch.Tensor:
        x = self.embed(ctx).flatten(1)  # float32 residual stream
        for blk in self.blocks:
            x = blk(x, fp8)
        h = self.ln_f(x).to(BF16)
        return F.linear(h, self.head.weight.to(BF16), self.head.bias.to(BF16)).float()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(cfg: Config, data: Data, params_np: dict, recipe, progress,
          device: torch.device | None = None) -> RunResult:
    """One run; recipe None trains in bf16. progress(step, loss) is called
    every step with the loss as a Python float."""
    t0 = time.perf_counter()
    device = device or default_device()
    torch.manual_seed(cfg.seed)
    model = CharModel(cfg)
    model.load_numpy(params_np)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=ADAM_BETAS, eps=ADAM_EPS)
    fp8 = recipe is not None

    def fp8_context():
        return ft.autocast(recipe=recipe) if fp8 else contextlib.nullcontext()

    ctx_all = torch.from_numpy(data.train_ctx).long()
    tgt_all = torch.from_numpy(data.train_tgt).long()
    losses = []
    for i in range(cfg.steps):
        ctx = ctx_all[i].to(device, non_blocking=True)
        tgt = tgt_all[i].to(device, non_blocking=True)
        with fp8_context():
            loss = F.cross_entropy(model(ctx, fp8), tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the backward pass uses the recipe its forward used
        opt.step()
        losses.append(loss.item())  # syncs each step: the progress line is live
        progress(i + 1, losses[-1])

    @torch.no_grad()
    def logits_fn(ctx_np: np.ndarray) -> np.ndarray:
        with fp8_context():
            return model(torch.from_numpy(ctx_np).long().to(device), fp8).cpu().numpy()

    logits = logits_fn(data.val_ctx)
    val_loss = F.cross_entropy(torch.from_numpy(logits),
                               torch.from_numpy(data.val_tgt).long()).item()
    seconds = time.perf_counter() - t0
    return RunResult(framework="torch", precision="fp8" if fp8 else "bf16", device=str(device),
                     losses=losses, val_loss=val_loss, seconds=seconds, logits_fn=logits_fn)
