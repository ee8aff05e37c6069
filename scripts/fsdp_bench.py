"""How fast is an FSDP2 training step with fp8kit's FP8 weight all-gather,
and how many bytes does it all-gather, next to bf16 and torchao?

A stack of `--layers` Linear(H, H) layers (no bias), each its own FSDP2
unit, fp32 master weights, bf16 MixedPrecisionPolicy (fp32 gradient
reduction), `--tokens` tokens per rank; a step is forward, an MSE loss,
backward, AdamW and (fp8kit delayed scaling) AmaxSync. Variants:
  bf16         torch.nn.Linear, bf16 all-gather
  fp8kit       fp8kit.torch.Linear under DelayedScaling, FP8 all-gather
               (enable_fp8_all_gather), AmaxSync each step
  fp8kit-cs    the same under CurrentScaling
  torchao      torchao.float8 Float8Linear (tensorwise dynamic scaling)
               with enable_fsdp_float8_all_gather, when torchao is installed
Each variant's first-step output is checked against bf16's (same weights
and inputs; ||y - y_bf16|| / ||y_bf16|| below CHECK_TOLERANCE, FP8's
rounding) and the row says whether it passed. Reported per variant: the median step time over
`--steps` timed steps (after `--warmup`), and the bytes this rank hands to
all-gathers in one step (counted at the collective FSDP2 calls for its
all-gathers). Ranks are spawned here (one per GPU, NCCL; or
`--cpu`: gloo, tiny sizes, a smoke run whose numbers are no claim).

    python scripts/fsdp_bench.py [--ranks 2 --hidden 8192 --tokens 8192 --layers 8]
    python scripts/fsdp_bench.py --cpu          # checks the script works
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ("bf16", "fp8kit", "fp8kit-cs", "torchao")
CHECK_TOLERANCE = 0.1


def _model(variant, hidden, layers, device):
    import fp8kit.torch as ft
    torch.manual_seed(0)
    make = torch.nn.Linear if variant in ("bf16", "torchao") else ft.Linear
    model = torch.nn.Sequential(*[make(hidden, hidden, bias=False) for _ in range(layers)])
    model = model.to(device)
    if variant == "torchao":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(
            model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    elif variant != "bf16":
        from fp8kit.torch.distributed import enable_fp8_all_gather
        enable_fp8_all_gather(model)
    return model


def _shard(model):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)


def _step_fn(variant, model, opt):
    import contextlib

    import fp8kit.torch as ft
    from fp8kit.recipe import CurrentScaling, DelayedScaling
    from fp8kit.torch.distributed import AmaxSync
    recipe = {"fp8kit": DelayedScaling(), "fp8kit-cs": CurrentScaling()}.get(variant)
    sync = AmaxSync(model) if variant == "fp8kit" else None

    def step(x, target):
        context = ft.autocast(recipe=recipe) if recipe else contextlib.nullcontext()
        with context:
            y = model(x)
        torch.nn.functional.mse_loss(y.float(), target).backward()
        if sync is not None:
            sync.sync()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return y.detach().float()
    return step


def _run_variant(variant, a, rank, device, sent):
    model = _model(variant, a.hidden, a.layers, device)
    _shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    step = _step_fn(variant, model, opt)
    g = torch.Generator(device).manual_seed(rank)
    x = torch.randn(a.tokens, a.hidden, device=device, generator=g).to(torch.bfloat16)
    target = torch.randn(a.tokens, a.hidden, device=device, generator=g) * 0.1
    first = step(x, target)
    for _ in range(a.warmup - 1):
        step(x, target)
    times = []
    for _ in range(a.steps):
        sent.clear()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        step(x, target)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return first, {"step_ms": 1e3 * statistics.median(times),
                   "all_gather_bytes_per_step": sum(sent)}


def _rank_main(rank, world_size, port, a, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cpu") if a.cpu else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if a.cpu else "nccl", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    sent = []
    # FSDP2's all-gather: all_gather_single, or all_gather_into_tensor in a
    # torch from before it (2.11).
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    all_gather = getattr(dist, name)

    def counting(output, input, *args, **kwargs):
        sent.append(input.numel() * input.element_size())
        return all_gather(output, input, *args, **kwargs)
    setattr(dist, name, counting)
    rows, reference = {}, None
    # bf16 first: the others' outputs are checked against it.
    variants = ["bf16"] + [v for v in a.variants.split(",") if v != "bf16"]
    try:
        for variant in variants:
            if variant == "torchao":
                try:
                    import torchao.float8  # noqa: F401
                except ImportError:
                    rows[variant] = {"skipped": "torchao is not installed"}
                    continue
            first, row = _run_variant(variant, a, rank, device, sent)
            if reference is None:
                reference = first
            error = float((first - reference).norm() / reference.norm())
            row["output_rel_error_vs_bf16"] = error
            row["output_check"] = "ok" if error < CHECK_TOLERANCE else "FAILED"
            rows[variant] = row
    finally:
        dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=8192, help="per rank")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cpu", action="store_true",
                    help="gloo on the CPU with tiny sizes: checks the script, no claim")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    a = ap.parse_args()
    if a.cpu:
        a.hidden, a.tokens, a.layers, a.warmup, a.steps = 64, 32, 2, 1, 2
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
    rows = results.get(timeout=3600)
    for p in procs:
        p.join()
    print(f"FSDP2 step, {a.layers} x Linear({a.hidden}, {a.hidden}), {a.tokens} tokens per "
          f"rank, {a.ranks} ranks" + (" (CPU smoke run: not a claim)" if a.cpu else ""))
    for variant, row in rows.items():
        if "skipped" in row:
            print(f"  {variant:10s} skipped: {row['skipped']}")
            continue
        print(f"  {variant:10s} {row['step_ms']:9.2f} ms/step  "
              f"{row['all_gather_bytes_per_step'] / 2**20:9.2f} MiB all-gathered/step/rank  "
              f"output vs bf16: {row['output_rel_error_vs_bf16']:.3f} "
              f"({row['output_check']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
