"""FSDP2 (fully_shard) with the GEMM weights of fp8kit's layers (Linear,
LayerNormLinear, LayerNormMLP's fc1 and fc2) all-gathered in FP8, on 2, 3
and 4 ranks (gloo on the CPU; nccl on GPUs, marked gpu).

Each rank's output must be bit-identical to the unsharded model's on that
rank's batch (each weight is cast from the whole weight's scale, as one
process casts it), the gradients the ranks' average, and the all-gathers
must move FP8 weights and the other parameters (biases, the norms' gamma
and beta) as they are: the bytes handed to the all-gather are counted."""

import copy

import pytest
import torch
import torch.distributed as dist

import fp8kit.torch as ft
from distributed_harness import BACKENDS, gemm_states, run_ranks
from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch.distributed import AmaxSync, enable_fp8_all_gather

TOKENS = 8
RECIPES = {"delayed": DelayedScaling(), "current": CurrentScaling()}
FP8_LAYERS = (ft.Linear, ft.LayerNormLinear, ft.LayerNormMLP)  # each one FSDP2 group
GEMM_WEIGHTS = ("weight", "fc1_weight", "fc2_weight")  # what FP8 all-gather casts


def _model(device, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        ft.Linear(32, 64), torch.nn.GELU(),
        ft.LayerNormLinear(64, 48),  # LayerNorm: gamma and beta
        ft.LayerNormMLP(48, 32, normalization="RMSNorm", activation="swiglu"),
    ).to(device, dtype)


def _batch(step, micro, rank, device):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return (torch.randn(TOKENS, 32, generator=g) * (rank + 1)).to(device)


# The collective FSDP2's all-gather calls: all_gather_single in newer
# torch, all_gather_into_tensor before it existed (torch 2.11).
_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") \
    else "all_gather_into_tensor"


def _count_all_gather_bytes(log: list) -> None:
    """Records the bytes of every all-gather input FSDP2 sends."""
    send = getattr(dist, _ALL_GATHER)

    def counting(output, input, *args, **kwargs):
        log.append(input.numel() * input.element_size())
        return send(output, input, *args, **kwargs)
    setattr(dist, _ALL_GATHER, counting)


def _shard(model, reshard: bool, bf16: bool):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if bf16 else MixedPrecisionPolicy()
    for m in model:
        if isinstance(m, FP8_LAYERS):
            fully_shard(m, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=mp)


def _fsdp_worker(rank, world_size, device, recipe_name, reshard, bf16, micro_batches, fp8):
    recipe = RECIPES[recipe_name]
    model = _model(device)
    if bf16:
        # Weights that bf16 holds exactly: FSDP2 casts the fp32 shards to FP8
        # and the bf16 reference its bf16 copies, the same values.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.bfloat16())
    reference = copy.deepcopy(model)
    if fp8:
        enable_fp8_all_gather(model)
    sent = []
    _count_all_gather_bytes(sent)
    _shard(model, reshard, bf16)
    sync = AmaxSync(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = {"y": [], "sent": [], "scales": []}
    for step in range(2):
        sent.clear()
        for micro in range(micro_batches):
            with ft.autocast(recipe=recipe):
                y = model(_batch(step, micro, rank, device))
            y.float().pow(2).mean().backward()
            if step == 0:
                out["y"].append(y.detach().float())
        sync.sync()
        out["sent"].append(list(sent))
        if step == 0:
            out["grads"] = [p.grad.full_tensor() for p in model.parameters()]
            # In the order of the GEMMs (a LayerNormMLP's fc1 before its fc2).
            out["weight_amax"] = [getattr(m, w).full_tensor().abs().max() for m in model
                                  for w in GEMM_WEIGHTS if hasattr(m, w)]
        out["scales"].append([(st.amax_history, st.scale) for st in gemm_states(model)])
        out["recipes"] = [st.recipe["scaling"] for st in gemm_states(model)]
        opt.step()
        opt.zero_grad()
    # The unsharded reference of step 0 on every rank's batches: a fresh
    # copy per rank, as each rank's fresh state seeds from its own tensors.
    ref_dtype = torch.bfloat16 if bf16 else torch.float32
    ref_y, ref_grads = [], None
    for r in range(world_size):
        layer = copy.deepcopy(reference).to(ref_dtype)
        for micro in range(micro_batches):
            with ft.autocast(recipe=recipe):
                y = layer(_batch(0, micro, r, device).to(ref_dtype))
            y.float().pow(2).mean().backward()
            ref_y.append(y.detach().float())
        grads = [p.grad.float() / world_size for p in layer.parameters()]
        ref_grads = grads if ref_grads is None else [a + b for a, b in zip(ref_grads, grads)]
    out["ref_y"] = ref_y[rank * micro_batches:(rank + 1) * micro_batches]
    out["ref_grads"] = ref_grads
    return out


def _expected_bytes(world_size, weight_bytes, other_bytes) -> list:
    """Bytes of each layer's all-gather input: the shard of each of its
    parameters, padded to FSDP2's shard size (ceil(rows / world_size)
    rows), GEMM weights in weight_bytes per element, the others in
    other_bytes."""
    return [sum(-(-p.shape[0] // world_size) * p[0].numel()
                * (weight_bytes if name in GEMM_WEIGHTS else other_bytes)
                for name, p in m.named_parameters())
            for m in _model("cpu") if isinstance(m, FP8_LAYERS)]


CASES = [  # recipe, reshard_after_forward, bf16 MixedPrecisionPolicy, micro-batches, FP8
    ("delayed", True, False, 1, True),
    ("current", False, False, 1, True),
    ("current", True, False, 2, True),
    ("delayed", False, True, 1, True),
    ("delayed", False, True, 1, False),  # the same bf16 model gathering bf16 weights
]


def _cases_worker(rank, world_size, device, cases):
    # Every case in one spawn of the ranks: starting processes is most of
    # what these tests cost.
    return [_fsdp_worker(rank, world_size, device, *case) for case in cases]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [2, 3, 4])  # 3: shards of uneven rows, padded
def test_fsdp_fp8_all_gather(backend, world_size):
    cases = CASES if world_size == 2 else CASES[:1]
    results = run_ranks(_cases_worker, world_size, backend, args=(cases,))
    for i, case in enumerate(cases):
        recipe, reshard, bf16, micro, fp8 = case
        ranks = [r[i] for r in results]
        param_bytes = 2 if bf16 else 4
        per_gather = _expected_bytes(world_size, 1 if fp8 else param_bytes, param_bytes)
        # Forward gathers each layer; backward again when resharded after it.
        gathers = per_gather * micro + (per_gather[::-1] * micro if reshard else [])
        for rank in ranks:
            for sent in rank["sent"]:
                assert sorted(sent) == sorted(gathers), case
            if not fp8:
                continue
            # Backward runs outside the autocast: its re-gathers cast with the
            # forward's recipe and make no state of the default one.
            assert rank["recipes"] == [recipe] * 4, case
            # One weight cast for the whole weight: each rank's output is the
            # unsharded model's on its batch, bit for bit.
            for y, ref in zip(rank["y"], rank["ref_y"]):
                assert torch.equal(y, ref), case
            # The gradients: the ranks' average, which FSDP2 takes in bf16 for
            # a bf16 model (a rounding of the sum, 2**-8 relative at most).
            rtol = 2**-7 if bf16 else 1e-5
            for g, ref in zip(rank["grads"], rank["ref_grads"]):
                torch.testing.assert_close(g.float(), ref, rtol=rtol, atol=1e-7,
                                           msg=lambda m: f"{case}: {m}")
        if recipe == "delayed" and fp8:
            # One entry per step in each weight's history, the whole weight's
            # amax (the max of the shards' after AmaxSync), for each of the
            # four GEMMs.
            assert len(ranks[0]["scales"][0]) == len(ranks[0]["weight_amax"]) == 4
            for (history, _), amax in zip(ranks[0]["scales"][0], ranks[0]["weight_amax"]):
                assert history[1, 0] == amax and not history[1, 1:].any(), case
        for other in ranks[1:]:
            for a, b in zip(ranks[0]["scales"], other["scales"]):
                for (ha, sa), (hb, sb) in zip(a, b):
                    assert torch.equal(ha, hb) and torch.equal(sa, sb), case
    if world_size == 2:
        # The bf16 model with and without FP8 all-gather: the weights' share
        # of the all-gathered bytes halves; the other parameters' stays.
        fp8, plain = (results[0][i]["sent"][0] for i in (3, 4))
        other_bytes = sum(_expected_bytes(world_size, 0, 2))
        assert 2 * (sum(fp8) - other_bytes) == sum(plain) - other_bytes
