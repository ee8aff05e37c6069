"""The models benchmark's report (fp8kit/models/bench.py): the table of
its runs, the lines under it, and a run's one-line summary."""

from __future__ import annotations


def table(rows) -> str:
    """One line per run; 'acc' is how its FP8 GEMMs accumulate
    (bench_peers.accumulation), 'x bf16' its tokens/s over that of the bf16
    run of the same framework and mode."""
    header = f"{'framework':<9} {'recipe':<12} {'mode':<7} {'device':<8} {'acc':<8} | " \
             f"{'tokens/s':>10} {'x bf16':>6} {'step ms':>9} {'peak GiB':>8} | {'loss':>7}"
    lines = [header, "-" * len(header)]
    bf16 = {(r["framework"], r["mode"]): r["tokens_per_s"] for r in rows
            if r["recipe"] == "bf16" and "error" not in r}
    for r in rows:
        name = f"{r['framework']:<9} {r['recipe']:<12} {r['mode']:<7}"
        if "error" in r:
            lines.append(f"{name} not run: {r['error']}")
            continue
        peak = r["peak_memory_bytes"]
        peak = f"{peak / 2**30:8.2f}" if peak is not None else f"{'n/a':>8}"
        base = bf16.get((r["framework"], r["mode"]))
        ratio = f"{r['tokens_per_s'] / base:6.2f}" if base else f"{'-':>6}"
        acc = r.get("accumulation") or "-"
        lines.append(f"{name} {r['device']:<8} {acc:<8} | "
                     f"{r['tokens_per_s']:10.0f} {ratio} {r['step_ms']:9.1f} {peak} | "
                     f"{r['last_loss']:7.3f}" + (" diverged" if r["diverged"] else ""))
    return "\n".join(lines + _inspection_costs(rows) + _routing_balances(rows)
                     + _cudnn_versions(rows))


def _routing_balances(rows) -> list[str]:
    """For a mixture of experts, how evenly each run's router spread the
    tokens over its timed steps: the load-balancing loss per layer
    (moe_torch.load_balancing_loss), 1 when even, up to E / top_k when
    every token goes to the same top_k experts. A run whose routing
    collapsed times one expert's GEMM doing every token's work."""
    timed = [r for r in rows if "routing_balance" in r]
    if not timed:
        return []
    return ["routing balance over the timed steps (load-balancing loss per layer; 1 is "
            "even): " + ", ".join(f"{r['framework']} {r['recipe']} {r['mode']} "
                                  f"{r['routing_balance']:.2f}" for r in timed)]


def _cudnn_versions(rows) -> list[str]:
    """A line when the PyTorch runs did not all use one cuDNN: different
    versions, or libraries mapped from more than one folder. A peer
    imported before torch first used cuDNN can bring the system's, and the
    attention and other cuDNN kernels then differ between the runs, which
    is no part of what the rows compare (TE's decoder step on an H100 spent
    7.40 ms a step in attention that way, against 4.24 ms on torch's)."""
    runs = [r for r in rows if r.get("cudnn")]
    versions = {f"{r['recipe']} {r['mode']}": r["cudnn"] for r in runs}
    folders = sorted({f for r in runs for f in r.get("cudnn_folders", ())})
    if len(set(versions.values())) < 2 and len(folders) < 2:
        return []
    from fp8kit.bench.te_peer import torch_cudnn_first
    found = (f"different cuDNN versions ({', '.join(f'{run} {v}' for run, v in versions.items())})"
             if len(set(versions.values())) > 1
             else f"cuDNN libraries from {len(folders)} folders ({', '.join(folders)})")
    return [f"the PyTorch runs loaded {found}: {torch_cudnn_first()}, so that every run "
            "uses torch's own"]


def _inspection_costs(rows) -> list[str]:
    """A line per inspected run: its tokens/s over the plain run's."""
    plain = {(r["framework"], r["recipe"], r["mode"]): r["tokens_per_s"] for r in rows
             if "error" not in r and "inspect_every" not in r}
    lines = []
    for r in rows:
        if "inspect_every" not in r or "error" in r:
            continue
        base_recipe = r["recipe"].rsplit("/", 1)[0]
        base = plain.get((r["framework"], base_recipe, r["mode"]))
        if base:
            lines.append(f"statistics every {r['inspect_every']} steps: {r['framework']} "
                         f"{base_recipe} {r['mode']} runs at {r['tokens_per_s'] / base:.3f} "
                         "of its tokens/s without them")
    return lines


def summary(run: dict) -> str:
    if "error" in run:
        return f"not run: {run['error']}"
    return (f"{run['tokens_per_s']:.0f} tokens/s, {run['step_ms']:.1f} ms/step"
            + (f", DIVERGED (loss {run['last_loss']:.3g}, first {run['first_loss']:.3g})"
               if run["diverged"] else ""))
