"""Where does the GPU time of one large training step of a layer go?

torch.profiler (CUPTI, which sees every kernel of the process, XLA's too)
over ITERS fwd+bwd calls, printed as tables of CUDA kernels sorted by total
GPU time, each followed by the GPU's busy and idle time per call. The
layers (--layers):
  linear  at tokens x features x features:
          torch  fp8kit.torch.Linear (delayed scaling, weight re-quantized
                 every call) and bf16 torch.nn.Linear, with bias;
          jax    the jit'd fwd+bwd of fp8kit.jax.dense (delayed) and of bf16
                 x @ w, as the bench times them (no bias), plus the ops of
                 the optimized HLO that are not fusions of elementwise work;
  block   (torch) the same Linear under BlockScaling, and bf16;
  compile (torch) the same delayed-scaling Linear eager and under
          torch.compile(fullgraph=True), each call in its own autocast as
          the bench's compile section times them: what compiling adds;
          then both timed as the bench times them (25 ms and 1.5 s
          batches) and their host time per call;
  mlp     the SwiGLU MLP block (RMSNorm, hidden = features, ffn) as the
          fused bench builds it: torch fp8kit.torch.LayerNormMLP and the
          unfused composition with delayed and current scaling, bf16, and
          TransformerEngine's LayerNormMLP when it is installed; jax
          fp8kit.jax.layernorm_mlp and the unfused dense calls, both
          recipes, and bf16;
  grouped (torch) fp8kit.torch.GroupedLinear over --experts balanced
          groups of the tokens, features -> ffn, in bf16 (torch._grouped_mm)
          and under delayed, current and block scaling, each next to
          TransformerEngine's GroupedLinear when it is installed.
The kernel times, not the wall time, are the point: which GEMM ran how
long, and what the casts, norms, activations, reductions and copies cost.
scripts/gpu_check.sh runs it as its kprofile stage.

    python scripts/kernel_profile.py [--tokens 8192 --features 8192 --iters 10]
        [--frameworks torch,jax] [--layers linear,block,mlp,grouped --ffn 14336]
        [--experts 8]
"""

import argparse
import re

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import fp8kit.torch as ft
from fp8kit.bench import timing, torch_layers
from fp8kit.bench.kernel_times import busy_and_span
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling


def kernel_table(fn, iters: int, sync) -> str:
    """The kernel table of `iters` calls, then the GPU's busy time against
    the profiled window: idle time is what the calls cost beyond their
    kernels (launch gaps, host-side waits)."""
    for i in range(3):
        fn(i)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            fn(i)
        sync()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20,
                                      max_name_column_width=90)
    busy, span = busy_and_span((e.time_range.start, e.time_range.end) for e in prof.events()
                               if e.device_type == DeviceType.CUDA)
    return (f"{table}\nGPU busy {busy / iters:.0f} us per call of a {span / iters:.0f} us "
            f"window per call (first kernel start to last kernel end): idle "
            f"{(span - busy) / iters:.0f} us per call")


def torch_linear_tables(t: int, f: int, iters: int, recipe) -> None:
    layers = torch_layers.make_layers(f, f, "cuda", seed=0)
    layers["fp8kit"].cache_fp8_weight = False
    data = torch_layers.inputs(t, f, f, "cuda", copies=1, seed=0)
    for name, layer in layers.items():
        fn = torch_layers.fwd_bwd_fn(layer, data)
        with ft.autocast(enabled=name == "fp8kit", recipe=recipe):
            label = f"fp8kit {type(recipe).__name__}" if name == "fp8kit" else name
            print(f"== torch {label}: {iters} x fwd+bwd, {t}x{f}x{f}, CUDA time per kernel")
            print(kernel_table(fn, iters, torch.cuda.synchronize))


def torch_compile_tables(t: int, f: int, iters: int) -> None:
    eager = torch_layers.make_layers(f, f, "cuda", seed=0)["fp8kit"]
    inner = torch_layers.make_layers(f, f, "cuda", seed=0)["fp8kit"]
    for layer in (eager, inner):
        layer.cache_fp8_weight = False
    data = torch_layers.inputs(t, f, f, "cuda", copies=1, seed=0)
    recipe = DelayedScaling()
    calls = {}
    for name, layer, params in (
            ("eager", eager, [eager.weight, eager.bias]),
            ("compiled", torch.compile(inner, fullgraph=True), [inner.weight, inner.bias])):
        def call(i, layer=layer, params=params):
            x, dy = data[i % len(data)]
            with ft.autocast(recipe=recipe):
                y = layer(x)
            return (y, *torch.autograd.grad(y, [x, *params], dy))
        print(f"== torch fp8kit DelayedScaling {name}: {iters} x fwd+bwd, {t}x{f}x{f}, "
              "CUDA time per kernel")
        print(kernel_table(call, iters, torch.cuda.synchronize))
        calls[name] = call
    # The same two calls timed as the bench times them, to tell the kernels'
    # share of a gap between the two from the timing's: interleaved 25 ms
    # batches, 1.5 s batches, and the host's time per call.
    clock = timing.torch_clock("cuda")
    for label, got in (("25 ms batches", timing.measure(calls, clock, timing.Settings())),
                       ("1.5 s batches", timing.measure_sustained(calls, clock, quick=False))):
        print(f"   timed in {label}: " + ", ".join(
            f"{n} {v.median_s * 1e3:.3f} ms" for n, v in got.items()) + " per call")
    host = timing.host_seconds(calls, clock, iters)
    print("   host time per call (no wait for the GPU): " + ", ".join(
        f"{n} {v * 1e6:.0f} us" for n, v in host.items()))


def torch_mlp_tables(t: int, hidden: int, ffn: int, iters: int) -> None:
    from fp8kit.bench import fused_torch, te_peer
    layers = fused_torch.make_layers("swiglu", hidden, ffn, "cuda", seed=0)
    x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    data = [(x, torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16))]
    steps = {"bf16": (fused_torch._fwd_bwd(layers["bf16"], data), None)}
    for kind in ("fused", "unfused"):
        for rname, recipe in (("delayed", DelayedScaling()), ("current", CurrentScaling())):
            steps[f"fp8kit {kind} {rname}"] = (fused_torch._fwd_bwd(layers[kind], data),
                                               lambda recipe=recipe: ft.autocast(recipe=recipe))
    te, missing = te_peer.torch_module()
    if te is None:
        print(f"== torch TE LayerNormMLP: not profiled: {missing}")
    else:
        b = layers["bf16"]
        for rname in ("delayed", "current"):
            layer = te_peer.torch_layer(te, b.norm, b.fc1, b.fc2, b.activation)
            steps[f"TE {rname}"] = (fused_torch._fwd_bwd(layer, data),
                                    te_peer.torch_autocast(te, rname))
    for name, (fn, enter) in steps.items():
        # Each call in its own autocast, as a training step runs it (TE
        # updates its delayed scales as the autocast exits).
        def call(i, fn=fn, enter=enter):
            if enter is None:
                return fn(i)
            with enter():
                return fn(i)
        print(f"== torch MLP {name}: {iters} x fwd+bwd, {t}x{hidden}x{ffn} SwiGLU, "
              "CUDA time per kernel")
        print(kernel_table(call, iters, torch.cuda.synchronize))


def torch_grouped_tables(t: int, hidden: int, ffn: int, iters: int, experts: int) -> None:
    """GroupedLinear over `experts` balanced groups of t tokens in all, as
    the grouped bench builds it: bf16 (torch._grouped_mm), fp8kit under each
    recipe, and TransformerEngine's GroupedLinear when it is installed."""
    import copy
    from fp8kit.bench import grouped_torch, te_peer
    sizes = torch.tensor(grouped_torch.counts(experts, t, skewed=False))
    data = [(torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16).requires_grad_(),
             torch.randn(t, ffn, device="cuda", dtype=torch.bfloat16))]
    layer = ft.GroupedLinear(experts, hidden, ffn, bias=False, device="cuda",
                             dtype=torch.bfloat16)
    te, _ = te_peer.torch_module()
    for rname, recipe in (("bf16", None), ("delayed", DelayedScaling()),
                          ("current", CurrentScaling()), ("block", BlockScaling())):
        steps = [(f"fp8kit {rname}" if recipe else "bf16", copy.deepcopy(layer),
                  ft.autocast(recipe=recipe) if recipe else None)]
        if te is not None and recipe is not None:
            steps.append((f"TE {rname}", grouped_torch._te_layer(te, layer),
                          te_peer.torch_autocast(te, rname)()))
        for label, module, ctx in steps:
            fn = grouped_torch._fwd_bwd(module, data, sizes)
            print(f"== torch {label} GroupedLinear: {iters} x fwd+bwd, {experts} experts, "
                  f"{t}x{hidden}x{ffn}, CUDA time per kernel")
            if ctx is None:
                print(kernel_table(fn, iters, torch.cuda.synchronize))
            else:
                with ctx:
                    print(kernel_table(fn, iters, torch.cuda.synchronize))


def torch_tables(t: int, f: int, ffn: int, iters: int, layers, experts: int = 8) -> None:
    if "linear" in layers:
        torch_linear_tables(t, f, iters, DelayedScaling())
    if "block" in layers:
        torch_linear_tables(t, f, iters, BlockScaling())
    if "compile" in layers:
        torch_compile_tables(t, f, iters)
    if "mlp" in layers:
        torch_mlp_tables(t, f, ffn, iters)
    if "grouped" in layers:
        torch_grouped_tables(t, f, ffn, iters, experts)


def _jax_fwd_bwd(fn):
    """jit of (*args, dy) -> (fn(*args), its vjp at dy)."""
    import jax

    def run(*args):
        *inputs, dy = args
        y, vjp = jax.vjp(fn, *inputs)
        return y, vjp(dy)
    return jax.jit(run)


def _trained_state(jf, args):
    """args with a delayed-scaling state replaced by the state after one
    step (the vjp's cotangent of the state, as the fused bench takes it):
    a fresh state is unseeded and would make every profiled call pay the
    first step's extra amax pass."""
    import fp8kit.jax as fj
    *inputs, dy = args
    def is_state(a):
        return isinstance(a, fj.DelayedScalingState) or (
            isinstance(a, tuple) and a and all(isinstance(e, fj.DelayedScalingState) for e in a))
    slots = [i for i, a in enumerate(inputs) if is_state(a)]
    if not slots:
        return args
    grads = jf(*args)[1]
    return tuple(grads[i] if i in slots else a for i, a in enumerate(inputs)) + (dy,)


def _jax_mlp_cases(t, hidden, ffn, dy, keys):
    """The MLP block's jax cases as the fused bench builds them."""
    import jax
    import jax.numpy as jnp
    from fp8kit.bench import mlp_jax
    kx, k1, k2 = keys
    x = jax.random.normal(kx, (t, hidden), jnp.bfloat16)
    gamma = jnp.ones((hidden,), jnp.bfloat16)
    w1 = (jax.random.normal(k1, (hidden, 2 * ffn), jnp.float32) / hidden ** 0.5).astype(
        jnp.bfloat16)
    w2 = (jax.random.normal(k2, (ffn, hidden), jnp.float32) / ffn ** 0.5).astype(jnp.bfloat16)
    cases = {"MLP bf16": (_jax_fwd_bwd(mlp_jax._bf16_block("swiglu")),
                          (x, gamma, w1, w2, None, dy))}
    for kind, make in (("fused", mlp_jax._fused_block), ("unfused", mlp_jax._unfused_block)):
        for rname, recipe in (("delayed", DelayedScaling()), ("current", CurrentScaling())):
            cases[f"MLP fp8kit {kind} {rname}"] = (
                _jax_fwd_bwd(make("swiglu", recipe)),
                (x, gamma, w1, w2, mlp_jax._fresh_state(kind, recipe), dy))
    return cases


def jax_tables(t: int, f: int, ffn: int, iters: int, layers) -> None:
    import jax  # here, not at the top: --frameworks torch runs without JAX
    import jax.numpy as jnp
    import fp8kit.jax as fj
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    dy = jax.random.normal(k3, (t, f), jnp.bfloat16)
    cases = {}  # name: (jitted fwd+bwd, its arguments)
    if "linear" in layers:
        x = jax.random.normal(k1, (t, f), jnp.bfloat16)
        w = (jax.random.normal(k2, (f, f), jnp.float32) / f ** 0.5).astype(jnp.bfloat16)
        recipe = DelayedScaling()
        cases["fp8kit delayed"] = (
            _jax_fwd_bwd(lambda x, w, st: fj.dense(x, w, state=st, recipe=recipe)),
            (x, w, fj.DelayedScalingState.create(recipe), dy))
        cases["bf16"] = (_jax_fwd_bwd(lambda x, w, st: x @ w), (x, w, None, dy))
    if "mlp" in layers:
        cases.update(_jax_mlp_cases(t, f, ffn, dy, (k1, k2, k4)))
    for name, (jf, args) in cases.items():
        args = _trained_state(jf, args)
        hlo = jf.lower(*args).compile().as_text()
        entry = hlo[hlo.index("\nENTRY"):]
        print(f"== jax {name}: ops of the optimized HLO's entry computation")
        for line in entry.splitlines()[1:]:
            m = re.search(r"= (\(.*?\)|\S+) ([\w-]+)\(", line)
            if m and m.group(2) not in ("parameter", "get-tuple-element", "tuple",
                                        "constant", "bitcast"):
                what = re.search(r'custom_call_target="([^"]+)"|kind=(k\w+)', line)
                print("  ", m.group(2), what.group(what.lastindex) if what else "", m.group(1))
        print(f"== jax {name}: {iters} x jit'd fwd+bwd, CUDA time per kernel")
        last = []  # the newest output: sync waits for it without another call

        def call(i, jf=jf, args=args, last=last):
            last[:] = [jf(*args)]
        print(kernel_table(call, iters, lambda last=last: jax.block_until_ready(last[0])))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--features", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=14336, help="the MLP's ffn width (--layers mlp)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--frameworks", default="torch,jax")
    ap.add_argument("--layers", default="linear",
                    help="comma-separated: linear, block, compile, mlp, grouped")
    ap.add_argument("--experts", type=int, default=8, help="the groups of --layers grouped")
    args = ap.parse_args()
    layers = set(args.layers.split(","))
    known = {"linear", "block", "compile", "mlp", "grouped"}
    if not layers <= known:
        ap.error(f"--layers: unknown {sorted(layers - known)}; "
                 f"choose from {', '.join(sorted(known))}")
    for fw in args.frameworks.split(","):
        if fw == "torch":
            torch_tables(args.tokens, args.features, args.ffn, args.iters, layers, args.experts)
        elif layers - {"grouped"}:  # GroupedLinear is profiled in PyTorch only
            jax_tables(args.tokens, args.features, args.ffn, args.iters, layers - {"grouped"})


if __name__ == "__main__":
    main()
