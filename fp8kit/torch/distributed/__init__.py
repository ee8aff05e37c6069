"""fp8kit.torch on torch.distributed's own engines.

- AmaxSync(model, group=None): after each step, one coalesced all-reduce
  (MAX) of every fp8kit layer's delayed-scaling amax history over the
  data-parallel group, after which every rank holds bit-identical scales
  (DistributedDataParallel and FSDP2 alike).
"""

from fp8kit.torch.distributed.amax_sync import AmaxSync, PendingAmaxSync

__all__ = ["AmaxSync", "PendingAmaxSync"]
