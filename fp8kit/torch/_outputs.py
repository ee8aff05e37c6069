"""A layer's output in the input's leading shape, as a tensor that is not
a view.

The GEMMs compute a 2-D [tokens, features] output, which the layer
returns reshaped to the input's leading dimensions. Returned as a view
(its ._base the GEMM's output), an in-place op by the caller (a residual
`y += x`) would rewrite autograd's history through the base and drop the
hooks registered on the output: FSDP2's pre-backward hook among them (it
warns "returned a view tensor"), and backward would run with the weights
still sharded. aten::_unsafe_view, torch.matmul's own reshape of its output,
shares the storage without making an autograd view; that is safe because
no layer saves its output for backward (an in-place op on the output
cannot corrupt a saved tensor).
"""

from __future__ import annotations

import torch

_unsafe_view = torch.ops.aten._unsafe_view


def layer_output(y: torch.Tensor, input: torch.Tensor, features) -> torch.Tensor:
    """y [tokens, features] as [*input.shape[:-1], features], not a view."""
    return _unsafe_view(y, (*input.shape[:-1], features))
