"""The process group a collective of fp8kit.torch.distributed runs over,
and the check that every rank of it runs the same FP8 layers and recipes.

The check travels inside the collective it guards: a signature of the
layers and their recipes (a 64-bit hash, as four 16-bit pieces, each exact
in float32) goes into the float32 MAX all-reduce twice, as +pieces and
-pieces, so that afterwards every rank holds the largest and the smallest
signature of the group. They differ on every rank at once when any two
ranks differ: all raise together, and none waits for a collective that the
others never start.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

SIGNATURE_FLOATS = 8  # +4 pieces, -4 pieces


def resolve_group(fn: str, group):
    """The group to reduce over: `group`, or the default process group when
    None. None when torch.distributed is not initialized and no group was
    named (a single process: nothing to reduce)."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise RuntimeError(f"{fn}: group was given but torch.distributed is not "
                               "initialized; call torch.distributed.init_process_group first")
        return None
    if group is None:
        return dist.group.WORLD
    fix = "pass a group that contains every rank calling it, e.g. the data-parallel group"
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns to non-members
        raise ValueError(f"{fn}: this rank ({dist.get_rank()}) is not in the group "
                         f"(torch.distributed.new_group gave it NON_GROUP_MEMBER); {fix}")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{fn}: group must be a torch.distributed.ProcessGroup or None (the "
                        f"default group), got {type(group).__name__}")
    ranks = dist.get_process_group_ranks(group)
    if dist.get_rank() not in ranks:
        raise ValueError(f"{fn}: this rank ({dist.get_rank()}) is not in the group (ranks "
                         f"{ranks}); {fix}")
    return group


def signature(items) -> torch.Tensor:
    """float32 [SIGNATURE_FLOATS]: +pieces then -pieces of a hash of
    `items` (plain values whose repr is the same on every rank)."""
    digest = hashlib.blake2b(repr(items).encode(), digest_size=8).digest()
    pieces = [float(int.from_bytes(digest[i:i + 2], "little")) for i in range(0, 8, 2)]
    return torch.tensor(pieces + [-p for p in pieces], dtype=torch.float32)


def check_signature(fn: str, reduced: torch.Tensor, what: str) -> None:
    """Raises on every rank when the MAX-reduced signature shows that ranks
    differ (their largest and smallest pieces differ)."""
    half = SIGNATURE_FLOATS // 2
    reduced = reduced.cpu()
    if not torch.equal(reduced[:half], -reduced[half:]):
        raise RuntimeError(
            f"{fn}: the ranks of the group run different {what}; every rank must run the same "
            "model (the same fp8kit layers, in the same order) under the same fp8kit recipe, or "
            "the FP8 scales would differ between ranks")
