"""The decoder's mixture-of-experts block with TransformerEngine's
GroupedLinear for its experts: the models benchmark's TE peer of
moe_torch.MoEMLP, with the same RMSNorm, router, routing and
load-balancing loss, and te.GroupedLinear for the experts' two grouped
GEMMs (gate and up, then down) in place of fp8kit's.

TE's FP8 grouped GEMM needs every expert's row count to be a multiple of
16 (it refuses others: "Caller must pad"). The block pads once per call:
the (token, expert) pairs, sorted by expert, go to a buffer in which each
expert's group is its pairs followed by zero rows up to a multiple of 16;
both grouped layers and the SwiGLU between them run on that buffer (a
zero row stays zero: no bias, silu(0) * 0 = 0, and it changes no amax
and adds nothing to a weight gradient), and the real rows are taken back
out before the outputs are summed. The rows' places are computed on the
device from the counts there.

convert(te, model) swaps the experts of every MoE block of a built
llama_torch.Llama (its weights loaded) for TE's: TorchTrainer's `convert`.
The converted model is for timing: its TE experts have no place in the
checkpoint layout (llama_torch.weight_layout), and the benchmark saves
none.
"""

from __future__ import annotations

import torch

from fp8kit.bench import te_peer
from fp8kit.models.moe_torch import MoEMLP

# TE's FP8 grouped GEMM takes only row counts that are multiples of this.
COUNT_MULTIPLE = 16


def padded_rows(expert: torch.Tensor, counts: torch.Tensor, multiple: int = COUNT_MULTIPLE):
    """(each pair's row in the padded buffer, the padded counts), on the
    device, for pairs sorted by expert (route()'s `expert`) and the pairs
    per expert: expert e's group starts where the groups before it, each
    rounded up to `multiple` rows, end."""
    padded = (counts + multiple - 1) // multiple * multiple
    start = torch.cumsum(counts, 0) - counts
    padded_start = torch.cumsum(padded, 0) - padded
    rank = torch.arange(expert.numel(), device=expert.device) - start[expert]
    return padded_start[expert] + rank, padded


class TEMoEMLP(MoEMLP):
    """An MoEMLP (its norm and router) with TE's GroupedLinear experts."""

    def __init__(self, te, mlp: MoEMLP):
        torch.nn.Module.__init__(self)
        self.cfg, self.norm, self.router = mlp.cfg, mlp.norm, mlp.router
        self.w_gate_up = te_peer.torch_grouped_linear(te, mlp.w_gate_up)
        self.w_down = te_peer.torch_grouped_linear(te, mlp.w_down)

    def experts(self, pairs: torch.Tensor, expert: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        rows, padded = padded_rows(expert, counts)
        # TE takes the group sizes (m_splits) as a Python list: one read of
        # the padded counts to the host per block call is inherent to TE. It
        # is the block's only one (MoEMLP reads its counts once as well).
        m_splits = padded.tolist()
        buffer = pairs.new_zeros(sum(m_splits), pairs.shape[-1]).index_copy(0, rows, pairs)
        return self.swiglu(buffer, m_splits)[rows]


def convert(te, model):
    """`model` (a llama_torch.Llama) with each MoE block's experts TE's (TEMoEMLP)."""
    for layer in model.layers:
        if type(layer.mlp) is MoEMLP:
            layer.mlp = TEMoEMLP(te, layer.mlp)
    return model
