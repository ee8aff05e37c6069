"""layernorm_mlp tensor parallel (Megatron's layout: kernel_1 sharded along
F, kernel_2 along its rows, the tokens over "dp") on ("dp", "tp") meshes
of 2 (1x2) and 4 (2x2) CPU devices, against the unsharded call (and on 2
GPUs when there are).

As in test_jax_sharding.py, the cases run in a child process started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (this file run as a
script), once per mesh; each parametrized test asserts one case.

Checks, per tensor: bit for bit on the CPU where no sum is split across
devices (h, the activation and dh are computed whole per element, each
cast with the global amax, so the weight and bias gradients of a mesh
whose "dp" has one device), to float32 rounding where a psum adds
partial sums (y and d_ln over "tp", the token sums over "dp"); the
delayed-scaling state bit for bit; no all-gather in the compiled program
and the activation running on each device's F / tp columns; under
Explicit axes the gradients typed as their primals. BlockScaling: the same
values (its bias gradient summed by XLA), no gather but of block scales.
Then the layouts
refused by name: SwiGLU's [hidden, 2F] kernel_1 split along its columns
(a device would hold gates without their ups), the paired kernel_1 split
along its pair dimension, and under BlockScaling an F slice that splits
a kernel's 128x128 block.
"""

import re
import sys

import pytest

from sharding_child import assert_case_ok, assert_matches, run_cases

TP_CASES = [f"{act}_{recipe}_{axes}" for act in ("gelu", "swiglu")
            for recipe in ("current", "delayed") for axes in ("auto", "explicit")]
BLOCK_CASES = [f"block_{act}_{axes}" for act in ("gelu", "swiglu")
               for axes in ("auto", "explicit")]
REFUSED = ["unpaired_swiglu_refused_auto", "unpaired_swiglu_refused_explicit",
           "pair_dim_refused_explicit", "block_split_refused_auto",
           "block_split_refused_explicit"]
CASES = [*TP_CASES, *BLOCK_CASES, *REFUSED]
MESHES = ["1x2", "2x2"]


# ------------------------------------------------------------------ child side --

def _child(platform: str, mesh_shape: tuple[int, int]):  # noqa: C901
    # One function, so that the parent module imports no jax.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    import fp8kit.jax as fj
    from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

    devices = jax.devices(platform)[:mesh_shape[0] * mesh_shape[1]]
    assert len(devices) == mesh_shape[0] * mesh_shape[1], jax.devices()
    meshes = {"auto": Mesh(np.array(devices).reshape(mesh_shape), ("dp", "tp")),
              "explicit": jax.make_mesh(mesh_shape, ("dp", "tp"), devices=devices,
                                        axis_types=(AxisType.Explicit,) * 2)}
    jax.config.update("jax_default_device", devices[0])
    exact = platform == "cpu"  # cuBLASLt may sum another M or N differently
    tokens_split = mesh_shape[0] > 1
    tp = mesh_shape[1]
    rng = np.random.default_rng(0)

    def weights(act, hidden, ffn, n, scale, paired):
        """SwiGLU's kernel_1 paired [hidden, 2, F] or [hidden, 2F]."""
        k1_shape, b1_shape = (hidden, ffn), (ffn,)
        if act == "swiglu":
            k1_shape, b1_shape = ((hidden, 2, ffn), (2, ffn)) if paired else \
                ((hidden, 2 * ffn), (2 * ffn,))
        return dict(
            gamma=jnp.asarray(1 + 0.1 * rng.standard_normal(hidden), jnp.bfloat16),
            beta=jnp.asarray(0.1 * rng.standard_normal(hidden), jnp.bfloat16),
            kernel_1=jnp.asarray(rng.standard_normal(k1_shape) * scale, jnp.float32),
            bias_1=jnp.asarray(rng.standard_normal(b1_shape) * 0.1, jnp.float32),
            kernel_2=jnp.asarray(rng.standard_normal((ffn, n)) * scale, jnp.float32),
            bias_2=jnp.asarray(rng.standard_normal(n) * 0.1, jnp.float32))

    def tp_specs(w):
        """Megatron's layout: kernel_1 and bias_1 split along F (their last
        dim), kernel_2 along its rows, the rest replicated."""
        last = lambda a: P(*([None] * (a.ndim - 1)), "tp")  # noqa: E731
        return dict(gamma=P(None), beta=P(None), kernel_1=last(w["kernel_1"]),
                    bias_1=last(w["bias_1"]), kernel_2=P("tp", None), bias_2=P(None))

    def program(act, recipe):
        def call(x, w, s):
            return fj.layernorm_mlp(x, w["gamma"], w["beta"], w["kernel_1"], w["kernel_2"],
                                    w["bias_1"], w["bias_2"], activation=act, state=s,
                                    recipe=recipe)

        @jax.jit
        def fwd_bwd(x, w, s, dy):
            y, vjp = jax.vjp(call, x, w, s)
            return y, vjp(dy)
        return fwd_bwd

    def run(act, recipe, axes, specs=None, hidden=64, ffn=64, n=32, lead=(4, 32), scale=0.2,
            paired=True):
        """fwd + bwd with the tokens over "dp" and the weights as `specs`
        (changes to Megatron's), and unsharded; returns both results, the
        compiled program's text and the weights' specs."""
        mesh = meshes[axes]
        w = weights(act, hidden, ffn, n, scale, paired)
        x = jnp.asarray(rng.standard_normal((*lead, hidden)), jnp.bfloat16)
        dy = jnp.asarray(rng.standard_normal((*lead, n)), jnp.bfloat16)
        state = (fj.DelayedScalingState.create(recipe, num_linears=2)
                 if isinstance(recipe, DelayedScaling) else None)
        fwd_bwd = program(act, recipe)
        ref = fwd_bwd(x, w, state, dy)
        specs = dict(tp_specs(w), **(specs or {}))
        with jax.set_mesh(mesh):
            put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
            tokens = P("dp", None, None)
            args = (put(x, tokens), {k: put(a, specs[k]) for k, a in w.items()}, state,
                    put(dy, tokens))
            got = fwd_bwd(*args)
            txt = fwd_bwd.lower(*args).compile().as_text()
        return ref, got, txt, specs

    def compare(ref, got, delayed, whole_sums=("kernel_1", "bias_1", "kernel_2", "bias_2")):
        (ref_y, (ref_dx, ref_dw, ref_ds)), (y, (dx, dw, ds)) = ref, got
        # y sums fc2's partial products over "tp", dx d_ln's; the weight and
        # bias gradients (whole_sums: those fp8kit sums) sum over the
        # tokens, split when "dp" is.
        checks = [("y", y, ref_y, False), ("dx", dx, ref_dx, False)]
        checks += [(f"d{k}", dw[k], ref_dw[k], k in whole_sums and not tokens_split)
                   for k in ref_dw]
        for name, a, want, bit_exact in checks:
            assert_matches(name, a, want, platform, bit_exact and exact)
        if delayed:  # every cast's amax is global: the state is the unsharded one
            for a, want in zip(jax.tree_util.tree_leaves(ds), jax.tree_util.tree_leaves(ref_ds)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(want))

    def activation_on_slices(txt, rows, f_local, act):
        """The activation custom calls read each device's h: [rows, F / tp]
        (SwiGLU [rows, 2F / tp], the device's gates and ups)."""
        width = 2 * f_local if act == "swiglu" else f_local
        calls = [ln for ln in txt.splitlines() if 'custom_call_target="fp8kit_activation_' in ln]
        assert calls, "no fused activation call in the program"
        for line in calls:
            operands = line.split("operand_layout_constraints=")[1].split("api_version")[0]
            h = re.findall(r"\w+\[[\d,]*\]", operands)[-1]  # the last operand
            assert h == f"bf16[{rows},{width}]", (h, line[:300])

    def tp_case(act, recipe_name, axes):
        recipe = CurrentScaling() if recipe_name == "current" else \
            DelayedScaling(amax_history_len=4)
        ref, got, txt, specs = run(act, recipe, axes)
        compare(ref, got, recipe_name == "delayed")
        assert "all-gather" not in txt, "the compiled program gathers an operand"
        activation_on_slices(txt, 4 * 32 // mesh_shape[0], 64 // tp, act)
        if axes == "explicit":
            y, (dx, dw, _) = got
            assert jax.typeof(y).sharding.spec == P("dp", None, None), jax.typeof(y)
            assert jax.typeof(dx).sharding.spec == P("dp", None, None), jax.typeof(dx)
            for k, spec in specs.items():
                assert jax.typeof(dw[k]).sharding.spec == spec, (k, jax.typeof(dw[k]))

    def block_case(act, axes):
        # Each device holds 512 columns of F (whole 128x128 blocks of the
        # kernels and of their 4-block scale padding) and, over "dp", 128
        # tokens (whole tiles of the wgrad's columnwise copies).
        ref, got, txt, _ = run(act, BlockScaling(), axes, hidden=256, ffn=512 * tp, n=128,
                             lead=(2, 64 * mesh_shape[0]), scale=1 / 16)
        # XLA sums the float32 dh into db_1 in an order of its own per shape.
        compare(ref, got, False, whole_sums=("kernel_1", "kernel_2", "bias_2"))
        # XLA may gather the block scales (_sharding_block.py says why): float32
        # arrays with a dim counting 128-blocks; never FP8 data or activations.
        for shape in re.findall(r"= (\w+\[[\d,]*\])\S* all-gather\(", txt):
            dims = [int(d) for d in shape[4:-1].split(",")]
            assert shape.startswith("f32[") and min(dims) <= 2048 // 128, shape

    def refused(expect, axes, **kw):
        try:
            run(axes=axes, **kw)
        except Exception as e:  # noqa: BLE001 - the message is the check
            for part in expect:
                assert part in str(e), e
            return e
        raise AssertionError(f"not refused: {expect}")

    def unpaired_swiglu_refused(axes):
        e = refused(["kernel_1 [hidden, 2F] = [gate | up]", "sharded over mesh axes ('tp',)",
                     "paired layout [hidden, 2, F]"], axes, act="swiglu",
                    recipe=CurrentScaling(), paired=False)
        if axes == "explicit":  # while tracing
            assert isinstance(e, ValueError), e

    def block_split_refused(axes):
        # 256 columns of F per device: half of kernel_1's 128x128 rowwise
        # copy's scale unit.
        e = refused(["sharded over mesh axes ('tp',)", "multiple of 512 columns"], axes,
                    act="gelu", recipe=BlockScaling(), hidden=256, ffn=256 * tp, n=128,
                    lead=(2, 64 * mesh_shape[0]), scale=1 / 16)
        if axes == "explicit":
            assert str(e).startswith("fp8kit.jax.layernorm_mlp: the kernel has shape"), e

    cases = {name: (lambda n=name: tp_case(*n.split("_"))) for name in TP_CASES}
    cases.update({name: (lambda n=name: block_case(*n.split("_")[1:])) for name in BLOCK_CASES})
    cases.update(
        unpaired_swiglu_refused_auto=lambda: unpaired_swiglu_refused("auto"),
        unpaired_swiglu_refused_explicit=lambda: unpaired_swiglu_refused("explicit"),
        pair_dim_refused_explicit=lambda: refused(
            ["pair dimension (dim 1: gate, up)", "sharded over mesh axes ('tp',)"], "explicit",
            act="swiglu", recipe=CurrentScaling(),
            specs=dict(kernel_1=P(None, "tp", None), bias_1=P(None, None))),
        block_split_refused_auto=lambda: block_split_refused("auto"),
        block_split_refused_explicit=lambda: block_split_refused("explicit"))
    run_cases(CASES, lambda name: cases[name]())


# ----------------------------------------------------------------- parent side --

@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", CASES)
def test_tensor_parallel_matches_unsharded(case, mesh_shape):
    assert_case_ok(__file__, case, "cpu", mesh_shape)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_tensor_parallel_on_gpus(case):
    assert_case_ok(__file__, case, "gpu", "1x2")


if __name__ == "__main__":
    _child(sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")))
