"""How fast is an FSDP2 training step with fp8kit's FP8 weight all-gather,
and how many bytes does it all-gather, next to bf16 and torchao?

Two models (--model), each FSDP2-sharded one unit per layer and once at
the root, fp32 master weights, a bf16 MixedPrecisionPolicy (fp32 gradient
reduction), fused AdamW; a step is forward, loss, backward, the optimizer
and each variant's per-step scaling work:
  stack    `--layers` Linear(H, H) (no bias), `--tokens` tokens per rank,
           an MSE loss against a random target
  decoder  the Llama-style decoder of fp8kit.models (`--config`, `--batch`
           sequences per rank), next-token cross-entropy; its residual
           stream runs in bf16 under the bf16 policy
Variants:
  bf16       torch.nn.Linear (the decoder: its bf16 projections), bf16 all-gather
  fp8kit     fp8kit's layers under DelayedScaling, FP8 all-gather
             (enable_fp8_all_gather), AmaxSync after each backward
  fp8kit-cs  the same under CurrentScaling
  torchao    torchao.float8's Float8Linear (tensorwise dynamic scaling) with
             its FSDP2 float8 all-gather and, after each optimizer step, its
             precompute_float8_dynamic_scale_for_fsdp (one all-reduce for
             every weight's scale, as torchao's documentation asks), when
             torchao is installed
Each variant's first step is checked against bf16's (same weights and
inputs): the stack's output within FP8 rounding of an L-layer chain,
||y - y_bf16|| / ||y_bf16|| < 0.05 sqrt(L) (each layer's two FP8 operands
add about 4% and the layers' errors add up as independent ones); the
decoder's loss within 2% of bf16's. The row says whether it passed.
Reported per variant: the median step time over `--steps` timed steps
(after `--warmup`), and the bytes this rank hands to all-gathers in one
step (counted at the collective FSDP2 calls for its all-gathers).
--compile compiles each layer (module.compile(), so FSDP2's hooks stay
outside the graphs), for information; fp8kit's layers then all-gather
their weights in bf16, since a layer with an FP8-gathered weight does not
trace. --profile adds, per variant, where
the GPU time of one more step goes on rank 0 (GEMMs, NCCL, fp8kit's
kernels, the rest; and the time the compute stream waits). Ranks are
spawned here (one per GPU, NCCL; or `--cpu`: gloo, tiny sizes, a smoke run
whose numbers are no claim).

    python scripts/fsdp_bench.py [--ranks 2 --hidden 8192 --tokens 8192 --layers 8]
    python scripts/fsdp_bench.py --model decoder --config 1b --batch 4
    python scripts/fsdp_bench.py --cpu          # checks the script works
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ("bf16", "fp8kit", "fp8kit-cs", "torchao")
STACK_TOLERANCE_PER_LAYER = 0.05
DECODER_LOSS_TOLERANCE = 0.02


def _recipe(variant):
    from fp8kit.recipe import CurrentScaling, DelayedScaling
    return {"fp8kit": DelayedScaling(), "fp8kit-cs": CurrentScaling()}.get(variant)


def _to_torchao(model, skip=()):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    return convert_to_float8_training(
        model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True),
        module_filter_fn=lambda module, fqn: fqn not in skip)


def _stack(variant, a, device):
    """(model, its FSDP units, inputs, loss(model, inputs)) of the Linear stack."""
    import fp8kit.torch as ft
    torch.manual_seed(0)
    make = ft.Linear if _recipe(variant) else torch.nn.Linear
    model = torch.nn.Sequential(*[make(a.hidden, a.hidden, bias=False)
                                  for _ in range(a.layers)]).to(device)
    if variant == "torchao":
        model = _to_torchao(model)
    g = torch.Generator(device).manual_seed(dist.get_rank())
    x = torch.randn(a.tokens, a.hidden, device=device, generator=g).to(torch.bfloat16)
    target = torch.randn(a.tokens, a.hidden, device=device, generator=g) * 0.1

    def loss(model, inputs):
        y = model(inputs[0])
        return torch.nn.functional.mse_loss(y.float(), inputs[1]), y.detach().float()
    return model, list(model), (x, target), loss


def _decoder(variant, a, device, params):
    """The same for the decoder (params: init_params of its config)."""
    from fp8kit.models import data
    from fp8kit.models.config import CONFIGS
    from fp8kit.models.llama_torch import Llama, load_params
    cfg = CONFIGS[a.config]
    model = Llama(cfg, _recipe(variant), device)
    load_params(model, params)
    if variant == "torchao":
        model = _to_torchao(model, skip=("lm_head",))
    tokens, _ = data.split(data.corpus())
    sampler = data.BatchSampler(tokens, a.batch, cfg.seq_len, seed=dist.get_rank())
    batch = torch.from_numpy(sampler.next()).long().to(device)

    def loss(model, inputs):
        logits = model(inputs[:, :-1])
        value = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                  inputs[:, 1:].reshape(-1))
        return value, value.detach().float()
    return model, list(model.layers), batch, loss


def _shard(model, units, reshard_after_forward):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in units:
        fully_shard(unit, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)


def _step_fn(variant, model, inputs, loss_fn, opt):
    import fp8kit.torch as ft
    from fp8kit.torch.distributed import AmaxSync
    recipe = _recipe(variant)
    sync = AmaxSync(model) if variant == "fp8kit" else None
    precompute = None
    if variant == "torchao":
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp as precompute

    def step():
        with ft.autocast(recipe=recipe) if recipe else contextlib.nullcontext():
            loss, out = loss_fn(model, inputs)
        loss.backward()
        if sync is not None:
            sync.sync()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if precompute is not None:
            precompute(model)
        return out
    return step


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_variant(variant, a, device, sent, params):
    if a.model == "stack":
        model, units, inputs, loss_fn = _stack(variant, a, device)
    else:
        model, units, inputs, loss_fn = _decoder(variant, a, device, params)
    # A layer with an FP8-gathered weight does not trace (fp8kit.torch's
    # error says so): compiled, fp8kit's layers gather their weights in bf16.
    if _recipe(variant) and not a.compile:
        from fp8kit.torch.distributed import enable_fp8_all_gather
        enable_fp8_all_gather(model)
    if a.compile:
        # Each variant compiles anew; and fp8kit's layers compile one graph
        # per layer (their scaling state is a constant of the graph), so
        # the layers of one model need as many compilations of the same code.
        torch._dynamo.reset()
        torch._dynamo.config.recompile_limit = max(8, 2 * len(units))
        for unit in units:
            unit.compile()
    _shard(model, units, a.reshard_after_forward)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    step = _step_fn(variant, model, inputs, loss_fn, opt)
    first = step()
    for _ in range(a.warmup - 1):
        step()
    times = []
    for _ in range(a.steps):
        sent.clear()
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    row = {"step_ms": 1e3 * statistics.median(times), "all_gather_bytes_per_step": sum(sent)}
    if a.profile and device.type == "cuda":
        row["profile"] = _profile(step, device)
    return first, row


# Kernel-name pieces of each kind of GPU work in --profile's summary.
KERNEL_KINDS = (("nccl", ("nccl",)), ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "sm90_")),
                ("fp8kit", ("fp8kit",)))


def _profile(step, device) -> dict:
    """ms of GPU time per kind of kernel in one step (nccl overlaps the
    others on its own stream), the step's wall time, and the compute
    streams' idle time (wall minus the non-NCCL kernels' sum)."""
    from torch.profiler import ProfilerActivity, profile
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        _sync(device)
    wall_ms = 1e3 * (time.perf_counter() - t0)
    kinds, top = {}, {}
    for event in prof.key_averages():
        ms = event.self_device_time_total / 1e3
        if ms <= 0:
            continue
        name = event.key
        kind = next((k for k, pieces in KERNEL_KINDS
                     if any(p in name.lower() for p in pieces)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
        top[name[:90]] = top.get(name[:90], 0.0) + ms
    compute = sum(ms for k, ms in kinds.items() if k != "nccl")
    return {"wall_ms_profiled": wall_ms, "kinds_ms": kinds,
            "compute_idle_ms": wall_ms - compute,
            "top_kernels_ms": dict(sorted(top.items(), key=lambda kv: -kv[1])[:12])}


def _check(a, first, reference) -> tuple:
    """(relative error vs bf16, whether it passes)."""
    if a.model == "stack":
        error = float((first - reference).norm() / reference.norm())
        return error, error < STACK_TOLERANCE_PER_LAYER * math.sqrt(a.layers)
    error = abs(float(first) - float(reference)) / abs(float(reference))
    return error, error < DECODER_LOSS_TOLERANCE


def _count_all_gathers(sent):
    """Counts the bytes handed to FSDP2's all-gathers (all_gather_single, or
    all_gather_into_tensor in a torch from before it, 2.11) into `sent`."""
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    all_gather = getattr(dist, name)

    def counting(output, input, *args, **kwargs):
        sent.append(input.numel() * input.element_size())
        return all_gather(output, input, *args, **kwargs)
    setattr(dist, name, counting)


def _rank_main(rank, world_size, port, a, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cpu") if a.cpu else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if a.cpu else "nccl", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    sent = []
    _count_all_gathers(sent)
    params = None
    if a.model == "decoder":
        from fp8kit.models.config import CONFIGS
        from fp8kit.models.init import init_params
        params = init_params(CONFIGS[a.config], seed=0)
    rows, reference = {}, None
    # bf16 first: the others are checked against it.
    variants = ["bf16"] + [v for v in a.variants.split(",") if v != "bf16"]
    try:
        for variant in variants:
            if variant == "torchao":
                try:
                    import torchao.float8  # noqa: F401
                except ImportError:
                    rows[variant] = {"skipped": "torchao is not installed"}
                    continue
            first, row = _run_variant(variant, a, device, sent, params)
            if reference is None:
                reference = first
            error, ok = _check(a, first, reference)
            row["first_step_rel_error_vs_bf16"] = error
            row["check"] = "ok" if ok else "FAILED"
            rows[variant] = row
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def _print(a, rows):
    what = (f"{a.layers} x Linear({a.hidden}, {a.hidden}), {a.tokens} tokens per rank"
            if a.model == "stack" else f"decoder {a.config}, {a.batch} sequences per rank")
    checked = "output" if a.model == "stack" else "loss"
    print(f"FSDP2 step, {what}, {a.ranks} ranks, reshard_after_forward="
          f"{a.reshard_after_forward}" + (", compiled layers (fp8kit's gathered in bf16)" if a.compile else "")
          + (" (CPU smoke run: not a claim)" if a.cpu else ""))
    base = rows.get("bf16", {}).get("step_ms")
    for variant, row in rows.items():
        if "skipped" in row:
            print(f"  {variant:10s} skipped: {row['skipped']}")
            continue
        speedup = f"{base / row['step_ms']:5.3f}x bf16" if base else ""
        print(f"  {variant:10s} {row['step_ms']:9.2f} ms/step {speedup}  "
              f"{row['all_gather_bytes_per_step'] / 2**20:9.2f} MiB all-gathered/step/rank  "
              f"first-step {checked} vs bf16: {row['first_step_rel_error_vs_bf16']:.3f} "
              f"({row['check']})")
    for variant, row in rows.items():
        if "profile" in row:
            p = row["profile"]
            kinds = ", ".join(f"{k} {ms:.2f}" for k, ms in sorted(p["kinds_ms"].items()))
            print(f"  profile {variant}: step {p['wall_ms_profiled']:.2f} ms; GPU ms by kind: "
                  f"{kinds}; compute streams idle {p['compute_idle_ms']:.2f} ms")
            for name, ms in p["top_kernels_ms"].items():
                print(f"      {ms:8.3f} ms  {name}")


def _parser():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--model", choices=("stack", "decoder"), default="stack")
    ap.add_argument("--hidden", type=int, default=8192, help="stack")
    ap.add_argument("--tokens", type=int, default=8192, help="stack: per rank")
    ap.add_argument("--layers", type=int, default=8, help="stack")
    ap.add_argument("--config", default="1b", help="decoder: a fp8kit.models config")
    ap.add_argument("--batch", type=int, default=4, help="decoder: sequences per rank")
    ap.add_argument("--reshard-after-forward", type=lambda s: s.lower() == "true",
                    default=True, metavar="{true,false}")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--compile", action="store_true", help="compile each layer (information)")
    ap.add_argument("--profile", action="store_true", help="GPU time by kind, one step each")
    ap.add_argument("--cpu", action="store_true",
                    help="gloo on the CPU with tiny sizes: checks the script, no claim")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    return ap


def _wait_for_rows(results, procs):
    """Rank 0's rows; raises as soon as a rank exits without them (its
    traceback is above) instead of waiting for a queue no rank will fill."""
    import queue
    while True:
        try:
            return results.get(timeout=5)
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or all(p.exitcode is not None for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit(f"fsdp_bench: a rank exited with {failed or 0} before "
                                 "rank 0 reported; see its output above")


def main():
    ap = _parser()
    a = ap.parse_args()
    bad = set(a.variants.split(",")) - set(VARIANTS)
    if bad:
        ap.error(f"--variants: unknown {sorted(bad)}; choose from {', '.join(VARIANTS)}")
    if a.cpu:
        a.hidden, a.tokens, a.layers, a.warmup, a.steps = 64, 32, 2, 1, 2
        a.config, a.batch = "tiny", 2
    elif torch.cuda.device_count() < a.ranks:
        ap.error(f"--ranks {a.ranks} needs as many CUDA GPUs (found "
                 f"{torch.cuda.device_count()}); --cpu runs the smoke mode")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, a.ranks, port, a, results))
             for r in range(a.ranks)]
    for p in procs:
        p.start()
    rows = _wait_for_rows(results, procs)
    for p in procs:
        p.join()
    _print(a, rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
