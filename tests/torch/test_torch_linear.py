"""fp8kit.torch.Linear and autocast: numerics against a float64 reference of
the same quantized math and against torch.nn.Linear, drop-in compatibility,
FP8 activations saved for backward, state save/restore and resume, pickling,
bad input."""

import contextlib
import copy
import dataclasses
import gc
import inspect
import io
import pickle
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format
from fp8kit.torch._ext import ext
from torch_reference import (FP8_MAX, assert_fp8_equal_reference, column_sums_f32, cuda_or_skip,
                             current_scale, decode, ref_quantize_bits, to_numpy_f32)

CURRENT = CurrentScaling(fp8_format=Format.HYBRID)
DELAYED = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=4)


def make_pair(k=64, n=48, bias=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Linear(k, n, bias=bias, dtype=dtype)
    torch.manual_seed(seed)
    lin = ft.Linear(k, n, bias=bias, dtype=dtype)
    return lin, ref


class SavedTensors:
    """Records what autograd saves for backward (fp8kit saves through
    torch's saved-tensor machinery, so hooks see it)."""

    def __init__(self):
        self.saved = []

    def __enter__(self):
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.ctx.__enter__()
        return self

    def pack(self, t):
        self.saved.append(t)
        return t

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)


# ----------------------------------------------------------- drop-in ------
def test_same_constructor_parameters_and_init_as_nn_linear():
    assert (inspect.signature(ft.Linear.__init__).parameters.keys() ==
            inspect.signature(torch.nn.Linear.__init__).parameters.keys())
    lin, ref = make_pair(32, 16)
    assert isinstance(lin, torch.nn.Linear)
    assert [n for n, _ in lin.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    assert set(lin.state_dict()) == {"weight", "bias", "_extra_state"}
    lin2 = ft.Linear(32, 16, bias=False, device="cpu", dtype=torch.bfloat16)
    assert lin2.bias is None and lin2.weight.dtype == torch.bfloat16
    assert repr(lin2) == "Linear(in_features=32, out_features=16, bias=False)"


def test_outside_autocast_it_is_nn_linear_exactly():
    lin, ref = make_pair()
    x = torch.randn(5, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, y2 = lin(x), ref(x2)
    assert torch.equal(y, y2)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    assert torch.equal(x.grad, x2.grad) and torch.equal(lin.weight.grad, ref.weight.grad)
    with ft.autocast(enabled=False):
        assert torch.equal(lin(x), ref(x2))


def test_loads_plain_nn_linear_checkpoints():
    lin, ref = make_pair()
    other = torch.nn.Linear(64, 48)
    lin.load_state_dict(other.state_dict())  # strict: no _extra_state needed
    assert torch.equal(lin.weight, other.weight)
    with ft.autocast(recipe=CURRENT):
        lin(torch.randn(16, 64))
    ref.load_state_dict(lin.state_dict(), strict=False)
    assert torch.equal(ref.weight, lin.weight)


# ------------------------------------------------ numerics vs reference ----
@pytest.mark.parametrize("tokens", [32, 21])  # 21: wgrad pads the token dimension
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("recipe", [CURRENT, DELAYED])
def test_matches_float64_reference_of_the_quantized_math(tokens, bias, recipe):
    # A fresh layer's first step: current scaling and delayed scaling's
    # seeding both take each tensor's scale from its own amax
    # (fp8_max / amax, margin 0).
    lin, _ = make_pair(64, 48, bias=bias)
    torch.manual_seed(1)
    x = (torch.randn(tokens, 64) * 3).requires_grad_()
    g = torch.randn(tokens, 48) * 1e-3
    with SavedTensors() as rec, ft.autocast(recipe=recipe):
        y = lin(x)
    y.backward(g)

    # What was saved: the input's and the weight's columnwise FP8 copies and
    # their scale_inv. Nothing in high precision.
    fp8 = [t for t in rec.saved if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)]
    assert len(fp8) == 2
    assert all(t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or t.numel() == 1
               for t in rec.saved)
    x_cw, w_cw = fp8
    x_sb, w_sb = [t for t in rec.saved if t.dtype == torch.float32]
    assert x_cw.shape == (64, tokens) and w_cw.shape == (64, 48)
    # What backward keeps is carved from one allocation (carve.h).
    assert x_cw.untyped_storage().data_ptr() == w_cw.untyped_storage().data_ptr()

    # Quantization, bit-exact against ml_dtypes.
    sx = current_scale(x.abs().max().item(), "e4m3")
    sw = current_scale(lin.weight.abs().max().item(), "e4m3")
    assert x_sb.item() == np.float32(1) / sx
    assert w_sb.item() == np.float32(1) / sw
    assert_fp8_equal_reference(x_cw.t(), x.detach(), float(sx), "e4m3")
    assert_fp8_equal_reference(w_cw.t(), lin.weight.detach(), float(sw), "e4m3")

    # GEMMs against float64 of the dequantized operands.
    xq = decode(x_cw).T * np.float64(x_sb.item())
    wq = decode(w_cw).T * np.float64(w_sb.item())
    y_ref = xq @ wq.T + (to_numpy_f32(lin.bias) if bias else 0)
    np.testing.assert_allclose(y.detach().numpy(), y_ref, rtol=1e-5, atol=1e-5)
    sg = current_scale(g.abs().max().item(), "e5m2")
    gq_bits = torch.from_numpy(ref_quantize_bits(g, sg, "e5m2")).view(torch.float8_e5m2)
    gq = decode(gq_bits) / np.float64(sg)
    np.testing.assert_allclose(x.grad.numpy(), gq @ wq, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(lin.weight.grad.numpy(), gq.T @ xq, rtol=1e-5, atol=1e-9)
    if bias:
        assert np.array_equal(lin.bias.grad.numpy(), column_sums_f32(to_numpy_f32(g)))


@pytest.mark.parametrize("recipe", [CURRENT, DELAYED, CurrentScaling(fp8_format=Format.E4M3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_close_to_nn_linear(recipe, dtype):
    lin, ref = make_pair(128, 96, dtype=dtype, seed=2)
    torch.manual_seed(3)
    x = torch.randn(4, 8, 128, dtype=dtype)
    g = torch.randn(4, 8, 96, dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with ft.autocast(recipe=recipe):
        for _ in range(2):  # the second step runs on delayed-scaling history
            lin.zero_grad()
            xa.grad = None
            y = lin(xa)
            y.backward(g)
    yr = ref(xb)
    yr.backward(g)
    assert y.dtype == dtype and y.shape == (4, 8, 96)

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()
    assert rel(y, yr) < 0.08
    assert rel(xa.grad, xb.grad) < 0.15
    assert rel(lin.weight.grad, ref.weight.grad) < 0.15
    assert rel(lin.bias.grad, ref.bias.grad) < 1e-2


@pytest.mark.parametrize("recipe", [CURRENT, DELAYED])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_grad_is_the_column_sum_of_dy(recipe, dtype):
    # 300 tokens: three 128-row tiles, the last one partial; 208 outputs:
    # two column tiles. Both recipes sum dy inside its cast (no reduction op
    # of its own), in the core's documented order.
    lin, _ = make_pair(64, 208, dtype=dtype, seed=5)
    torch.manual_seed(6)
    x = torch.randn(300, 64, dtype=dtype, requires_grad=True)
    g = torch.randn(300, 208, dtype=dtype)
    with ft.autocast(recipe=recipe):
        lin(x).backward(g)  # seeds the delayed scales
        lin.zero_grad()
        y = lin(x)
        with torch.profiler.profile() as prof:
            y.backward(g)
    want = column_sums_f32(to_numpy_f32(g))
    assert lin.bias.grad.dtype == dtype
    if dtype == torch.bfloat16:  # rounded to the bias dtype (RNE)
        want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(to_numpy_f32(lin.bias.grad), want)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::sum" not in ops, sorted(ops)


def test_one_dimensional_input_and_frozen_weight():
    lin, ref = make_pair(32, 16)
    lin.weight.requires_grad_(False)
    x = torch.randn(32, requires_grad=True)
    with ft.autocast(recipe=CURRENT):
        y = lin(x)
    assert y.shape == (16,)
    y.sum().backward()
    assert x.grad.shape == (32,) and lin.weight.grad is None and lin.bias.grad is not None
    with torch.no_grad(), ft.autocast(recipe=CURRENT):
        z = lin(torch.randn(3, 32))
    assert not z.requires_grad and z.grad_fn is None


def test_empty_batch():
    lin, _ = make_pair(32, 16)
    x = torch.zeros(0, 32, requires_grad=True)
    with ft.autocast(recipe=DELAYED):
        y = lin(x)
    assert y.shape == (0, 16)
    y.sum().backward()
    assert x.grad.shape == (0, 32) and torch.count_nonzero(lin.weight.grad) == 0


def test_backward_frees_the_saved_fp8_tensors():
    # The autograd node releases what it saved once backward has run (no
    # retain_graph), so a training step does not hold last step's FP8
    # activations.
    lin, _ = make_pair(64, 48)
    x = torch.randn(32, 64, requires_grad=True)
    refs = []

    def pack(t):
        refs.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            ft.autocast(recipe=DELAYED):
        y = lin(x)
    assert len(refs) == 4 and all(r() is not None for r in refs)
    y.backward(torch.randn_like(y))
    gc.collect()
    assert all(r() is None for r in refs)
    assert x.grad is not None and lin.weight.grad is not None and lin.bias.grad is not None


def test_grad_of_some_inputs_only():
    # torch.autograd.grad for the weight alone: the node computes what is asked.
    lin, ref = make_pair(64, 48)
    x = torch.randn(32, 64, requires_grad=True)
    with ft.autocast(recipe=CURRENT):
        y = lin(x)
    (dw,) = torch.autograd.grad(y, [lin.weight], torch.ones_like(y))
    assert dw.shape == lin.weight.shape and x.grad is None
    want = torch.ones(32, 48).t() @ x.detach()
    assert ((dw - want).norm() / want.norm()).item() < 0.1


# --------------------------------------------------------- delayed state ----
def test_delayed_scaling_state_follows_the_rule():
    lin, _ = make_pair(32, 32)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=3, margin=1)
    xs = [torch.randn(16, 32) * s for s in (1.0, 4.0, 0.5)]
    gs = [torch.randn(16, 32) * s for s in (1e-3, 1e-2, 1e-4)]
    sinv_used = []
    for x, g in zip(xs, gs):
        with SavedTensors() as rec, ft.autocast(recipe=recipe):
            y = lin(x.requires_grad_())
        y.backward(g)
        sinv_used.append(rec.saved[1].item())  # the input's scale_inv this step
    st = lin.fp8_state
    a = [x.abs().max().item() for x in xs]
    # Step 0 casts with the input's own amax (the seed); step i > 0 uses the
    # max of the amaxes recorded so far (history length 3), margin 1.
    e4m3_max = np.float32(FP8_MAX["e4m3"])
    want0 = e4m3_max / np.float32(a[0]) * np.float32(0.5)
    assert sinv_used[0] == np.float32(1) / want0
    want1 = e4m3_max / np.float32(a[0]) * np.float32(0.5)
    assert sinv_used[1] == np.float32(1) / want1
    want2 = e4m3_max / np.float32(max(a[0], a[1])) * np.float32(0.5)
    assert sinv_used[2] == np.float32(1) / want2
    assert st.seeded == [True, True, True]
    # History of the input slot, newest first: each step's amax is rolled in
    # once, when it is measured: [a2, a1, a0] (history length 3).
    assert st.amax_history[0].tolist() == pytest.approx([a[2], a[1], a[0]])
    assert st.amax.tolist() == [0.0, 0.0, 0.0]  # accumulators back at 0
    # grad_output slot: g0 (its seed), g1, g2 rolled in.
    ga = [g.abs().max().item() for g in gs]
    assert st.amax_history[2].tolist() == pytest.approx([ga[2], ga[1], ga[0]])
    assert st.scale[2].item() == pytest.approx(FP8_MAX["e5m2"] / max(ga) / 2)


def decode_e4m3(bits: np.ndarray) -> np.ndarray:
    return bits.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _state_snapshot(st):
    return {k: getattr(st, k).clone() for k in ("amax_history", "amax", "scale", "scale_inv")} | {
        "seeded": st.seeded}


def test_first_step_seeds_each_slot_from_its_own_amax():
    # A fresh slot is unseeded; its first recorded quantization uses the
    # scale its own amax gives (not 1) and rolls that amax into the history
    # once.
    lin, _ = make_pair(32, 48)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=3, margin=2)
    torch.manual_seed(8)
    x = (torch.randn(16, 32) * 5).requires_grad_()
    g = torch.randn(16, 48) * 1e-2
    with SavedTensors() as rec, ft.autocast(recipe=recipe):
        y = lin(x)
    st = lin.fp8_state
    assert st.seeded == [True, True, False]  # dy is quantized in backward
    y.backward(g)
    assert st.seeded == [True, True, True]
    amaxes = [x.abs().max().item(), lin.weight.abs().max().item(), g.abs().max().item()]
    fmts = ["e4m3", "e4m3", "e5m2"]
    seed = [np.float32(FP8_MAX[f]) / np.float32(a) * np.float32(0.25)
            for f, a in zip(fmts, amaxes)]
    x_sb, w_sb = [t for t in rec.saved if t.dtype == torch.float32]
    assert x_sb.item() == np.float32(1) / seed[0]
    assert w_sb.item() == np.float32(1) / seed[1]
    hist = st.amax_history.numpy()
    assert np.array_equal(hist[:, 0], np.float32(amaxes)) and not hist[:, 1:].any()
    assert np.array_equal(st.scale.numpy(), np.float32(seed))
    assert st.amax.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "nothing_requires_grad"])
def test_forward_without_gradients_leaves_the_state_unchanged(how):
    # Inference casts with the layer's current scales (or, unseeded, the
    # tensor's own) and records nothing. (Earlier versions recorded every
    # forward; the protocol records only passes that compute gradients.)
    lin, _ = make_pair(32, 16)
    x = torch.randn(16, 32)
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
           "nothing_requires_grad": contextlib.nullcontext}[how]
    if how == "nothing_requires_grad":
        for p in lin.parameters():
            p.requires_grad_(False)
    with ctx(), ft.autocast(recipe=DELAYED):
        y0 = lin(x)  # unseeded: cast with x's own scale, and still unseeded after
    st = lin.fp8_state
    assert st.seeded == [False, False, False] and not st.amax_history.any()
    assert st.scale.tolist() == [1.0, 1.0, 1.0]
    if how == "nothing_requires_grad":
        for p in lin.parameters():
            p.requires_grad_(True)
    with ft.autocast(recipe=DELAYED):  # a training step: seeds and records
        lin(x.clone().requires_grad_()).sum().backward()
    before = _state_snapshot(st)
    if how == "nothing_requires_grad":
        for p in lin.parameters():
            p.requires_grad_(False)
    with ctx(), ft.autocast(recipe=DELAYED):
        y1 = lin(x * 100)  # a far larger amax, cast with the recorded scale
    after = _state_snapshot(st)
    for k in before:
        assert (before[k] == after[k]) if k == "seeded" else torch.equal(before[k], after[k]), k
    # y0 used the tensors' own amaxes (the seed scales), y1 the recorded
    # scales: each is the float64 product of its quantized operands.
    w = lin.weight.detach()
    own = (lambda t: current_scale(t.abs().max().item(), "e4m3"))
    for y, xs, sx, sw in ((y0, x, own(x), own(w)),
                          (y1, x * 100, st.scale[0].item(), st.scale[1].item())):
        xq = decode_e4m3(ref_quantize_bits(xs, sx, "e4m3")) / np.float64(np.float32(sx))
        wq = decode_e4m3(ref_quantize_bits(w, sw, "e4m3")) / np.float64(np.float32(sw))
        y_ref = xq @ wq.T + to_numpy_f32(lin.bias)
        np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-5, atol=1e-4)


def test_weight_cache_follows_weight_updates():
    # Current scaling: the FP8 weight depends only on the weight's values, so
    # the cached and the uncached layer must agree exactly. (Under delayed
    # scaling the cache also means one history entry per weight version.)
    lin, _ = make_pair(32, 32)
    nocache = copy.deepcopy(lin)
    assert not nocache.cache_fp8_weight  # off by default
    lin.cache_fp8_weight = True
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(nocache.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    with ft.autocast(recipe=CURRENT):
        for step in range(4):
            for m, o in ((lin, opt), (nocache, opt2)):
                o.zero_grad()
                y = m(x)
                y.square().sum().backward()
                o.step()
            assert torch.equal(lin(x), nocache(x))  # cache hit: same weight version
            assert lin.fp8_state.weight_cache_valid and not nocache.fp8_state.weight_cache_valid
    assert torch.equal(lin.weight, nocache.weight)


# --------------------------------------------------- save / load / resume ---
def _train(model, opt, batches, recipe):
    for x, t in batches:
        opt.zero_grad()
        with ft.autocast(recipe=recipe):
            loss = torch.nn.functional.mse_loss(model(x), t)
        loss.backward()
        opt.step()


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(ft.Linear(32, 64), torch.nn.GELU(), ft.Linear(64, 16))


@pytest.mark.parametrize("recipe", [DELAYED, CURRENT])
def test_resume_from_checkpoint_continues_exactly(recipe):
    torch.manual_seed(0)
    batches = [(torch.randn(16, 32), torch.randn(16, 16)) for _ in range(8)]
    a = _mlp(1)
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2)
    _train(a, opt_a, batches[:4], recipe)
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": opt_a.state_dict()}, buf)
    _train(a, opt_a, batches[4:], recipe)

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    b = _mlp(2)  # different init: everything must come from the checkpoint
    b.load_state_dict(ckpt["model"])
    opt_b = torch.optim.Adam(b.parameters(), lr=1e-2)
    opt_b.load_state_dict(ckpt["opt"])
    _train(b, opt_b, batches[4:], recipe)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    for la, lb in ((a[0], b[0]), (a[2], b[2])):
        (sa,), (sb,) = la.get_extra_state()["states"], lb.get_extra_state()["states"]
        assert sa["recipe"] == sb["recipe"] and torch.equal(sa["seeded"], sb["seeded"])
        for k in ("amax_history", "scale"):
            assert torch.equal(sa[k], sb[k]), k


def test_pickle_deepcopy_and_torch_save_of_the_module():
    m = _mlp(3)
    x = torch.randn(16, 32)
    _train(m, torch.optim.SGD(m.parameters(), lr=0.1), [(x, torch.randn(16, 16))], DELAYED)
    with torch.no_grad(), ft.autocast(recipe=DELAYED):
        copies = [copy.deepcopy(m), pickle.loads(pickle.dumps(m))]
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        copies.append(torch.load(buf, weights_only=False))
        want = m(x)
        for c in copies:
            assert c[0].fp8_state is not None
            assert torch.equal(c(x), want)


@pytest.mark.parametrize("recipe", [DELAYED, CurrentScaling(amax_epsilon=0.5,
                                                              power_2_scale=True)])
def test_extra_state_round_trip_and_bad_state(recipe):
    lin, _ = make_pair(32, 16)
    assert lin.get_extra_state() == {"format": 3, "states": []}
    torch.manual_seed(7)
    xs = [torch.randn(16, 32) * s for s in (1.0, 3.0, 0.25, 2.0)]
    with ft.autocast(recipe=recipe):
        for x in xs[:2]:
            lin(x.requires_grad_()).sum().backward()
    st = lin.get_extra_state()
    # Plain values and tensors only: it loads with weights_only=True.
    buf = io.BytesIO()
    torch.save(st, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert set(saved) == {"format", "states"} and len(saved["states"]) == 1
    st = saved["states"][0]
    assert set(st) == {"recipe", "amax_history", "scale", "seeded"}   # fp8kit.jax's arrays
    assert all(type(v) in (str, int, float, bool) for v in st["recipe"].values())
    other, _ = make_pair(32, 16)
    other.load_state_dict(lin.state_dict())
    assert other.fp8_state.recipe == lin.fp8_state.recipe
    assert other.fp8_state.seeded == lin.fp8_state.seeded
    for k in ("amax_history", "scale", "scale_inv"):
        assert torch.equal(getattr(other.fp8_state, k), getattr(lin.fp8_state, k)), k
    # The restored state carries on exactly as the original (same recipe:
    # the state is kept, not made fresh).
    restored = other.fp8_state
    outs = []
    for m in (lin, other):
        with ft.autocast(recipe=recipe):
            for x in xs[2:]:
                x = x.detach().requires_grad_()
                y = m(x)
                y.sum().backward()
        outs.append((y, x.grad, m.fp8_state.amax_history.clone(), m.fp8_state.scale.clone()))
    assert other.fp8_state is restored
    for a, b in zip(*outs):
        assert torch.equal(a, b)

    # Files written when the formats were named fwd_dtype / bwd_dtype load alike.
    old = lin.get_extra_state()
    old["states"][0]["recipe"] = {("fwd_dtype" if k == "forward_dtype" else
                                   "bwd_dtype" if k == "backward_dtype" else k): v
                                  for k, v in old["states"][0]["recipe"].items()}
    renamed, _ = make_pair(32, 16)
    renamed.set_extra_state(old)
    assert renamed.fp8_state.recipe == lin.fp8_state.recipe

    with pytest.raises(ValueError, match="not an fp8kit Linear FP8 state of format 3 "
                                         r"\(got format 99\)"):
        other.set_extra_state({"format": 99})
    with pytest.raises(ValueError, match=r"got format 1\)"):  # the positional-tuple format
        other.set_extra_state({"format": 1, "params": ["delayed", "e4m3", "e5m2", 4, 0, "max",
                                                       0.0, False]})
    def with_state(**entries):
        return {"format": 3, "states": [dict(st, **entries)]}

    where = r"_extra_state\['states'\]\[0\]: "
    bad = with_state(recipe=dict(st["recipe"], scaling="block"))
    with pytest.raises(ValueError, match=where + "the saved recipe's 'scaling' is 'block'"):
        other.set_extra_state(bad)
    key = "margin" if recipe is DELAYED else "power_2_scale"
    bad = with_state(recipe={k: v for k, v in st["recipe"].items() if k != key})
    with pytest.raises(ValueError, match=where + f"the saved recipe has no '{key}'"):
        other.set_extra_state(bad)
    bad = with_state(scale=torch.ones(4))
    with pytest.raises(ValueError, match=where + r"saved 'scale' is torch.float32 of shape \[4\]"):
        other.set_extra_state(bad)
    assert other.fp8_state is restored  # a failed load changes nothing


def _with(recipe, **fields):
    """A copy of a frozen recipe with fields set past its own validation
    (as a subclass or a pickled object from elsewhere could)."""
    r = copy.copy(recipe)
    for k, v in fields.items():
        object.__setattr__(r, k, v)
    return r


@pytest.mark.parametrize("recipe, field, value, error, match", [
    (DELAYED, "margin", "1", TypeError, r"recipe.margin is '1' \(str\); it must be an int"),
    (DELAYED, "margin", True, TypeError, r"recipe.margin is True \(bool\)"),
    (DELAYED, "margin", 500, ValueError, r"recipe.margin is 500; it must be in \[0, 126\]"),
    (DELAYED, "amax_history_len", 2.0, TypeError, "recipe.amax_history_len is 2.0"),
    (DELAYED, "amax_reduction", "max", TypeError,
     "recipe.amax_reduction is 'max' .*; it must be an fp8kit.recipe.AmaxReduction"),
    (DELAYED, "fp8_format", "hybrid", TypeError,
     "recipe.fp8_format is 'hybrid' .*; it must be an fp8kit.recipe.Format"),
    (DELAYED, "forward_fast_accumulation", 1, TypeError,
     r"recipe.forward_fast_accumulation is 1 \(int\); it must be a bool"),
    (CURRENT, "amax_epsilon", "0", TypeError, "recipe.amax_epsilon is '0'"),
    (CURRENT, "amax_epsilon", float("nan"), ValueError, "recipe.amax_epsilon is nan"),
    (CURRENT, "power_2_scale", 0, TypeError, r"recipe.power_2_scale is 0 \(int\)"),
])
def test_recipe_fields_are_type_checked_in_cpp(recipe, field, value, error, match):
    lin, _ = make_pair(32, 16)
    with pytest.raises(error, match=match):
        ext.LinearState(_with(recipe, **{field: value}))
    with ft.autocast(recipe=_with(recipe, **{field: value})):
        with pytest.raises(error, match=match):
            lin(torch.randn(16, 32))
    with pytest.raises(TypeError, match=r"recipe is 'fp8' \(str\); use "
                                        "fp8kit.recipe.DelayedScaling"):
        ext.LinearState("fp8")


def test_recipe_is_read_into_the_state():
    r = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=5, margin=2,
                       amax_reduction=AmaxReduction.MOST_RECENT, forward_fast_accumulation=True)
    st = ext.LinearState(r)
    plain = {"scaling": "delayed", "forward_dtype": "e4m3", "backward_dtype": "e4m3",
             "amax_history_len": 5, "margin": 2, "amax_reduction": "most_recent"}
    assert st.recipe == plain
    assert st.delayed and tuple(st.amax_history.shape) == (3, 5)
    c = ext.LinearState(CurrentScaling(amax_epsilon=1e-3, power_2_scale=True))
    assert c.recipe == {"scaling": "current", "forward_dtype": "e4m3", "backward_dtype": "e5m2",
                        "amax_epsilon": np.float32(1e-3).item(), "power_2_scale": True}
    # The scaling parameters (which pick a layer's state) and, apart, the
    # forward GEMM's accumulation (passed with each call).
    assert ext.linear_recipe(r) == (plain, True)
    assert ext.linear_recipe(dataclasses.replace(r, forward_fast_accumulation=False)) == (
        plain, False)
    assert ext.linear_recipe(dataclasses.replace(r, margin=3))[0] != plain


# -------------------------------------------------------------- autocast ---
def test_autocast_nesting_threads_and_recipe_changes():
    lin, _ = make_pair(32, 16)
    x = torch.randn(16, 32)
    assert ft.current_recipe() is None
    with ft.autocast(recipe=CURRENT):
        assert ft.current_recipe() is CURRENT
        with ft.autocast(enabled=False):
            assert ft.current_recipe() is None
        with ft.autocast(recipe=DELAYED):
            lin(x)
            assert lin.fp8_state.delayed
        lin(x)
        assert not lin.fp8_state.delayed
        seen = []
        t = threading.Thread(target=lambda: seen.append(ft.current_recipe()))
        t.start()
        t.join()
        assert seen == [None]  # per thread
    assert ft.current_recipe() is None
    with pytest.raises(TypeError, match="recipe must be an fp8kit.recipe.DelayedScaling"):
        with ft.autocast(recipe="fp8"):
            pass


def test_recipe_forward_fast_accumulation_reaches_the_state():
    lin, ref = make_pair(32, 16)
    x = torch.randn(16, 32)
    with ft.autocast(recipe=DELAYED):
        lin(x.requires_grad_()).sum().backward()
    st = lin.fp8_state
    history = st.amax_history
    fast = dataclasses.replace(DELAYED, forward_fast_accumulation=True)
    with ft.autocast(recipe=fast), torch.no_grad():  # records nothing
        y = lin(x)
    # Same scaling parameters: the same state (and its history); only the
    # forward GEMM's accumulation differs, passed with the call.
    assert lin.fp8_state_for(fast) is st and lin.fp8_state is st
    assert torch.equal(st.amax_history, history)
    assert ((y - ref(x)).norm() / ref(x).norm()).item() < 0.1
    assert len(lin.fp8_states) == 1
    with pytest.raises(TypeError, match=r"recipe.forward_fast_accumulation is 1 \(int\)"):
        ext.linear_forward(st, x, lin.weight, lin.bias, 1)


# ---------------------------------------------------------------- errors ---
def test_bad_input_raises_clear_errors():
    x = torch.randn(16, 32)
    with ft.autocast(recipe=CURRENT):
        with pytest.raises(ValueError, match="in_features is 20 but the FP8 GEMM needs "
                                             "in_features to be a multiple of 16"):
            ft.Linear(20, 16)(torch.randn(4, 20))
        with pytest.raises(ValueError, match="out_features is 24"):
            ft.Linear(32, 24)(x)
        lin = ft.Linear(32, 16)
        with pytest.raises(TypeError, match="input has dtype torch.float64"):
            lin(x.double())
        with pytest.raises(TypeError, match="input has dtype torch.int32"):
            lin(torch.ones(4, 32, dtype=torch.int32))
        with pytest.raises(ValueError, match=r"input has shape \[16, 31\] but in_features is 32"):
            lin(torch.randn(16, 31))
        with pytest.raises(ValueError, match="input is on meta but weight is on cpu"):
            lin(torch.randn(16, 32, device="meta"))
        f8 = ft.Float8CurrentScalingQuantizer("e4m3")(x)
        with pytest.raises(TypeError, match=r"input is a tensor without dense storage"):
            lin(f8)


# ------------------------------------------------------------------ CUDA ---
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [CURRENT, DELAYED])
@pytest.mark.parametrize("tokens", [64, 37])
def test_cuda_matches_cpu(recipe, tokens):
    dev = cuda_or_skip()
    cpu, _ = make_pair(128, 64, dtype=torch.bfloat16, seed=4)
    gpu = copy.deepcopy(cpu).to(dev)
    torch.manual_seed(5)
    x = torch.randn(tokens, 128, dtype=torch.bfloat16)
    g = torch.randn(tokens, 64, dtype=torch.bfloat16)
    outs = []
    for m, d in ((cpu, "cpu"), (gpu, dev)):
        xi = x.to(d).detach().requires_grad_()  # a leaf on d, so xi.grad is filled
        with ft.autocast(recipe=recipe):
            for _ in range(3):
                m.zero_grad()
                xi.grad = None
                y = m(xi)
                y.backward(g.to(d))
        outs.append([y, xi.grad, m.weight.grad, m.bias.grad])
    for a, b in zip(*outs):
        b = b.cpu().float()
        assert ((a.float() - b).norm() / a.float().norm()).item() < 1e-2
    assert gpu.fp8_state.device == dev
    for k in ("scale", "scale_inv", "amax_history", "amax"):  # bit for bit, 3 steps on
        assert torch.equal(getattr(cpu.fp8_state, k), getattr(gpu.fp8_state, k).cpu()), k


@pytest.mark.gpu
def test_cuda_module_to_moves_fp8_state():
    dev = cuda_or_skip()
    lin, _ = make_pair(64, 32)
    with ft.autocast(recipe=DELAYED):
        lin(torch.randn(16, 64))
        lin.to(dev)
        assert lin.fp8_state.device == dev
        y = lin(torch.randn(16, 64, device=dev))
    assert y.is_cuda


@pytest.mark.parametrize("recipe", [DELAYED, CURRENT])
def test_concurrent_use_from_threads_does_not_deadlock(recipe):
    # Forward takes the layer's state lock and releases the GIL around CPU
    # kernels; backward takes it on autograd's thread. Neither may deadlock.
    lin, _ = make_pair(64, 64)
    errors = []

    def work(seed):
        try:
            torch.manual_seed(seed)
            for _ in range(15):
                x = torch.randn(32, 64, requires_grad=True)
                with ft.autocast(recipe=recipe):
                    y = lin(x)
                y.sum().backward()
                lin.get_extra_state()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors


def test_bias_that_is_an_offset_view():
    # The GEMM epilogue reads a 16-byte aligned bias; a view at an odd offset
    # is copied first rather than rejected.
    lin = ft.Linear(32, 16, dtype=torch.bfloat16)
    big = torch.randn(17, dtype=torch.bfloat16)
    lin.bias = torch.nn.Parameter(big[1:])
    assert lin.bias.data_ptr() % 16 != 0
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    with ft.autocast(recipe=CURRENT):
        y = lin(x)
    lin.bias = torch.nn.Parameter(big[1:].clone())
    with ft.autocast(recipe=CURRENT):
        assert torch.equal(y, lin(x))
