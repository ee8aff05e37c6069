"""fp8kit.torch on torch.distributed's own engines.

- AmaxSync(model, group=None): after each step, one coalesced all-reduce
  (MAX) of every fp8kit layer's delayed-scaling amax history over the
  data-parallel group, after which every rank holds bit-identical scales
  (DistributedDataParallel and FSDP2 alike).
- enable_fp8_all_gather(model): before torch.distributed.fsdp.fully_shard,
  makes FSDP2 all-gather the GEMM weights of fp8kit's layers (Linear,
  LayerNormLinear, LayerNormMLP) in FP8 (through its fsdp_pre_all_gather /
  fsdp_post_all_gather extension points).

- FP8LoadPlanner: the planner for torch.distributed.checkpoint.load that
  loads the layers' scaling state (module extra state of tensors and plain
  values) whole, into a model that has not run yet and on any number of
  ranks, reading plain values with weights_only=True.
"""

from fp8kit.torch.distributed.amax_sync import AmaxSync, PendingAmaxSync
from fp8kit.torch.distributed.checkpoint import FP8LoadPlanner
from fp8kit.torch.distributed.fsdp import FP8AllGatherWeight, enable_fp8_all_gather

__all__ = ["AmaxSync", "PendingAmaxSync", "FP8AllGatherWeight", "enable_fp8_all_gather",
           "FP8LoadPlanner"]
