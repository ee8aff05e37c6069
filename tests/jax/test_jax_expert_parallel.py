"""Expert parallelism (fp8kit.jax.expert_parallel): the models' MoE block
run inside jax.shard_map with its 8 experts sharded over an "ep" axis of 2
and 4 CPU devices (and the tokens over the same axis), against the
unsharded block, under each recipe and in bf16, its load-balancing loss
included; and dispatch / combine on
their own: the pairs beyond an expert's capacity dropped (zero rows back),
the others returned in place, and bad arguments refused by name.

As in test_jax_sharding.py, the cases run in a child process started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (this file run as a
script), once per mesh; each parametrized test asserts one case.

Checks: with no pair dropped the experts' kernel gradients and
(DelayedScaling) each expert's new scaling state are bit for bit the
unsharded block's on the CPU under every FP8 recipe: each expert sees the
same tokens in the same order (the zero rows of unfilled capacity slots
change no amax and add only zeros), except BlockScaling's kernel
gradients, whose 1x128 tiles along the tokens the empty slots shift;
those, the router's gradient (a sum over every device's tokens), the bf16
block (XLA's ragged_dot may group its sums otherwise), and the output and
the tokens' gradient to rounding. The last two also pass through XLA's
router and combine (a dot whose blocking may follow the per-device token
count, a scatter-add), whose float32 rounding differs between the sharded
and the whole program on some CPUs (an AMD EPYC without AVX-512: a bf16
step in a few outputs, then FP8 casts in the backward that round the
other way; the two agreed bit for bit on the machines before it).
The load-balancing loss is the whole batch's on every device, its value
and the router's gradient the unsharded block's to float32 rounding (each
device sums its tokens' router probabilities before the axis sums the
devices'), its gradient of the bf16 tokens equal or one bf16 rounding
step apart.
"""

import sys

import pytest

from sharding_child import assert_case_ok, run_cases

RECIPES = ["current", "delayed", "block", "bf16"]
CASES = [*(f"moe_{r}" for r in RECIPES), "capacity_drops", "refused"]
MESHES = ["1x2", "1x4"]


# ------------------------------------------------------------------ child side --

def _child(platform: str, mesh_shape: tuple[int, int]):
    # One function, so that the parent module imports no jax.
    import dataclasses
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    import fp8kit.jax as fj
    from fp8kit.models.config import CONFIGS
    from fp8kit.models.moe_jax import moe_mlp
    from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

    devices = jax.devices(platform)[:mesh_shape[1]]
    assert len(devices) == mesh_shape[1], jax.devices()
    mesh = Mesh(np.array(devices), ("ep",))
    jax.config.update("jax_default_device", devices[0])
    exact = platform == "cpu"
    experts, ffn = 8, 128
    cfg = dataclasses.replace(CONFIGS["moe_tiny"], experts=experts, ffn=ffn)
    hidden, tokens = cfg.hidden, 32 * len(devices)
    rng = np.random.default_rng(0)
    normal = lambda *shape, s=1.0: jnp.asarray(rng.standard_normal(shape) * s,  # noqa: E731
                                               jnp.float32)
    h = normal(tokens, hidden).astype(jnp.bfloat16)
    dy = normal(tokens, hidden).astype(jnp.bfloat16)
    w_gate_up = normal(experts, hidden, 2 * ffn, s=0.1)
    base = {"router": normal(hidden, experts), "w_gate_up": w_gate_up,
            "w_down": normal(experts, ffn, hidden, s=0.1)}
    recipes = {"current": CurrentScaling(), "delayed": DelayedScaling(),
               "block": BlockScaling(), "bf16": None}

    def within_one_bf16_step(got, want, what):
        """bf16 arrays equal to float32 rounding of their sums (1e-5 of the
        largest |want|, as for the router's float32 gradient), or one bf16
        rounding step apart: the float32 sums before the rounding run in
        another order sharded (and in another again where XLA's CPU code is
        vectorized otherwise), which moves a value near a rounding boundary
        by one step."""
        def ordered(a):  # bf16 bits as integers in value order (-0 and +0 both 0)
            assert a.dtype.itemsize == 2, f"{what}: {a.dtype}, not bf16"
            bits = a.view(np.uint16).astype(np.int32)
            return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)
        got, want = np.asarray(got), np.asarray(want)
        steps = np.abs(ordered(got) - ordered(want))
        diff = np.abs(got.astype(np.float32) - want.astype(np.float32))
        bad = (steps > 1) & (diff > 1e-5 * np.abs(want.astype(np.float32)).max())
        assert not bad.any(), (
            f"{what}: {int(bad.sum())} elements beyond float32 rounding and more than one "
            f"bf16 step apart, up to {int(steps[bad].max())} steps")

    def check(what, got, want, exact_here):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        if exact_here:
            np.testing.assert_array_equal(got, want, err_msg=what)
        else:
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max(),
                                       err_msg=what)

    def moe_case(name):
        recipe = recipes[name]
        # fp8kit's CPU kernels sum each expert's rows in order whatever the
        # padding; XLA's bf16 ragged_dot may group its sums otherwise.
        exact_fp8 = exact and recipe is not None
        p = dict(base)
        if recipe is None:
            p["w_gate"], p["w_up"] = jnp.split(p.pop("w_gate_up"), 2, axis=-1)
        states = None
        if isinstance(recipe, DelayedScaling):
            states = {k: fj.GroupedDelayedScalingState.create(recipe, experts)
                      for k in ("gate_up", "down")}

        def loss(fn, p, h, states):
            return jnp.sum(fn(p, h, states)[0].astype(jnp.float32) * dy.astype(jnp.float32))

        whole = functools.partial(moe_mlp, cfg=cfg, recipe=recipe)
        p_specs = {k: P() if k == "router" else P("ep") for k in p}
        state_specs = None if states is None else jax.tree.map(lambda _: P("ep"), states)
        sharded = jax.shard_map(
            lambda p, h, states: moe_mlp(p, h, cfg, recipe, states, expert_axis="ep"),
            mesh=mesh, in_specs=(p_specs, P("ep"), state_specs), out_specs=(P("ep"), P()))
        argnums = (0, 1) if states is None else (0, 1, 2)
        want_y, want_aux = jax.jit(whole)(p, h, states=states)
        got_y, got_aux = jax.jit(sharded)(p, h, states)
        np.testing.assert_allclose(float(got_aux), float(want_aux), rtol=1e-6, err_msg="aux")
        aux_grad = lambda fn: jax.jit(jax.grad(  # noqa: E731
            lambda p, h: fn(p, h, states)[1], argnums=(0, 1)))(p, h)
        want_aux_grad = aux_grad(lambda p, h, s: whole(p, h, states=s))
        got_aux_grad = aux_grad(sharded)
        router_got = np.asarray(got_aux_grad[0]["router"], np.float32)
        router_want = np.asarray(want_aux_grad[0]["router"], np.float32)
        assert np.abs(router_want).max() > 0
        np.testing.assert_allclose(router_got, router_want, rtol=1e-5,
                                   atol=1e-5 * np.abs(router_want).max(), err_msg="aux drouter")
        assert np.abs(np.asarray(want_aux_grad[1], np.float32)).max() > 0
        within_one_bf16_step(got_aux_grad[1], want_aux_grad[1], "aux dh")
        want = jax.jit(jax.grad(functools.partial(loss, lambda p, h, s: whole(p, h, states=s)),
                                argnums))(p, h, states)
        got = jax.jit(jax.grad(functools.partial(loss, sharded), argnums))(p, h, states)
        # y and dh also carry XLA's router and combine arithmetic (see the
        # module doc): to rounding under every recipe.
        check("y", got_y, want_y, False)
        check("dh", got[1], want[1], False)
        for k in p:
            # Under BlockScaling the weight gradient reads the tokens in 1x128
            # tiles along the token axis, which the capacity slots shift.
            tiles_move = isinstance(recipe, BlockScaling) and k != "router"
            check(f"d{k}", got[0][k], want[0][k], exact_fp8 and k != "router" and not tiles_move)
        if states is not None:
            for k in states:
                for field in ("amax_history", "scale", "seeded"):
                    check(f"{k} state {field}", getattr(got[2][k], field),
                          getattr(want[2][k], field), True)

    def capacity_drops():
        # Identity experts: combine(dispatch(x)) returns each kept pair's row
        # and zero for the pairs beyond an expert's capacity on its device.
        pairs, capacity = 24, 2
        x = normal(pairs * len(devices), 16)
        expert = jnp.asarray(rng.integers(0, experts, pairs * len(devices)), jnp.int32)

        def round_trip(x, expert):
            rows, plan = fj.expert_parallel.dispatch(x, expert, num_experts=experts,
                                                     capacity=capacity, axis_name="ep")
            assert rows.shape == (experts // len(devices) * len(devices) * capacity, 16)
            return fj.expert_parallel.combine(rows, plan), plan.kept
        got, kept = jax.jit(jax.shard_map(round_trip, mesh=mesh, in_specs=(P("ep"), P("ep")),
                                          out_specs=(P("ep"), P("ep"))))(x, expert)
        got, kept, x_np = np.asarray(got), np.asarray(kept), np.asarray(x)
        e_np = np.asarray(expert)
        for d in range(len(devices)):
            seen = np.zeros(experts, int)
            for i in range(d * pairs, (d + 1) * pairs):
                want_kept = seen[e_np[i]] < capacity
                seen[e_np[i]] += 1
                assert kept[i] == want_kept, (d, i)
                np.testing.assert_array_equal(got[i], x_np[i] if want_kept else 0 * x_np[i])
        assert not kept.all() and kept.any()

    def refused():
        x = normal(8, 16)
        expert = jnp.zeros(8, jnp.int32)
        for kwargs, error, message in (
                (dict(num_experts=3, capacity=4), ValueError, "does not split over"),
                (dict(num_experts=8, capacity=0), ValueError, "capacity is 0"),
                (dict(num_experts=8, capacity=4, expert=jnp.zeros(7, jnp.int32)), ValueError,
                 "expert has shape"),
                (dict(num_experts=8, capacity=4, expert=jnp.zeros(8)), TypeError,
                 "expert has dtype")):
            args = dict(kwargs)
            e = args.pop("expert", expert)

            def call(x, e=e, args=args):
                return fj.expert_parallel.dispatch(x, e, axis_name="ep", **args)[0]
            try:
                jax.shard_map(call, mesh=mesh, in_specs=P(), out_specs=P())(x)
            except error as err:
                assert message in str(err), str(err)
            else:
                raise AssertionError(f"{kwargs} was not refused")

    cases = {f"moe_{r}": (lambda r=r: moe_case(r)) for r in RECIPES}
    cases.update(capacity_drops=capacity_drops, refused=refused)
    run_cases(CASES, lambda name: cases[name]())


# ----------------------------------------------------------------- parent side --

@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("case", CASES)
def test_expert_parallel_matches_unsharded(case, mesh_shape):
    assert_case_ok(__file__, case, "cpu", mesh_shape)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_expert_parallel_on_gpus(case):
    assert_case_ok(__file__, case, "gpu", "1x2")


if __name__ == "__main__":
    _child(sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")))
