"""fp8kit.torch.Linear and autocast: numerics against a float64 reference of
the same quantized math and against torch.nn.Linear, drop-in compatibility,
FP8 activations saved for backward, state save/restore and resume, pickling,
bad input."""

import copy
import dataclasses
import gc
import inspect
import io
import pickle
import threading
import weakref

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling, Format
from torch_reference import (assert_fp8_equal_reference, cuda_or_skip, current_scale, decode,
                             to_numpy_f32)

CURRENT = CurrentScaling(fp8_format=Format.HYBRID)
# A quantization's saved scalars: scale, scale_inv, amax at 16-byte offsets.
SCALE, SCALE_INV = 0, 4
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
def test_matches_float64_reference_of_the_quantized_math(tokens, bias):
    lin, _ = make_pair(64, 48, bias=bias)
    torch.manual_seed(1)
    x = (torch.randn(tokens, 64) * 3).requires_grad_()
    g = torch.randn(tokens, 48) * 1e-3
    with SavedTensors() as rec, ft.autocast(recipe=CURRENT):
        y = lin(x)
    y.backward(g)

    # What was saved: the input's and the weight's columnwise FP8 copies and
    # their [scale, scale_inv, amax] triples. Nothing in high precision.
    fp8 = [t for t in rec.saved if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)]
    assert len(fp8) == 2
    assert all(t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or t.numel() <= 12
               for t in rec.saved)
    x_t, w_t = fp8
    x_sb, w_sb = [t for t in rec.saved if t.dtype == torch.float32]
    assert x_t.shape == (64, tokens) and w_t.shape == (64, 48)
    # What backward keeps is carved from one allocation (carve.h).
    assert x_t.untyped_storage().data_ptr() == w_t.untyped_storage().data_ptr()

    # Quantization: current scaling of x and w, bit-exact.
    sx = current_scale(x.abs().max().item(), "e4m3")
    sw = current_scale(lin.weight.abs().max().item(), "e4m3")
    assert x_sb[SCALE].item() == sx and w_sb[SCALE].item() == sw
    assert_fp8_equal_reference(x_t.t(), x.detach(), float(sx), "e4m3")
    assert_fp8_equal_reference(w_t.t(), lin.weight.detach(), float(sw), "e4m3")

    # GEMMs against float64 of the dequantized operands.
    xq = decode(x_t).T * np.float64(x_sb[SCALE_INV].item())
    wq = decode(w_t).T * np.float64(w_sb[SCALE_INV].item())
    y_ref = xq @ wq.T + (to_numpy_f32(lin.bias) if bias else 0)
    np.testing.assert_allclose(y.detach().numpy(), y_ref, rtol=1e-5, atol=1e-5)
    sg = current_scale(g.abs().max().item(), "e5m2")
    gq_bits = ft.quantize(g, float(sg), "e5m2")[0]
    gq = decode(gq_bits) / np.float64(sg)
    np.testing.assert_allclose(x.grad.numpy(), gq @ wq, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(lin.weight.grad.numpy(), gq.T @ xq, rtol=1e-5, atol=1e-9)
    if bias:
        np.testing.assert_allclose(lin.bias.grad.numpy(), to_numpy_f32(g).sum(0), rtol=1e-6)


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
    # two column tiles. Delayed scaling sums dy inside its cast (no
    # reduction op of its own); current scaling runs one reduction.
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
    want = g.double().sum(0)
    # float32 sums of 300 terms, then rounded to the bias dtype.
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 0.0
    tol = 300 * 2.0 ** -24 * g.double().abs().sum(0) + eps * want.abs() + 1e-30
    assert lin.bias.grad.dtype == dtype
    assert ((lin.bias.grad.double() - want).abs() <= tol).all()
    ops = {e.key for e in prof.key_averages()}
    assert ("aten::sum" in ops) == (recipe is CURRENT), sorted(ops)


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
        sinv_used.append(rec.saved[1][SCALE_INV].item())  # the input's scale_inv this step
    st = lin.fp8_state
    a = [x.abs().max().item() for x in xs]
    # Step 0 seeds the history from the input's own amax; step i > 0 uses the
    # max of the amaxes recorded so far (history length 3), margin 1.
    want0 = np.float32(448.0) / np.float32(a[0]) * np.float32(0.5)
    assert sinv_used[0] == np.float32(1) / want0
    want1 = np.float32(448.0) / np.float32(max(a[0], a[0])) * np.float32(0.5)
    assert sinv_used[1] == np.float32(1) / want1
    want2 = np.float32(448.0) / np.float32(max(a[0], a[1])) * np.float32(0.5)
    assert sinv_used[2] == np.float32(1) / want2
    assert st.seeded == [True, True, True]
    # History of the input slot, newest first: each step's amax is rolled in
    # when it is measured, after the seed: [a2, a1, a0] (history length 3).
    assert st.amax_history[0].tolist() == pytest.approx([a[2], a[1], a[0]])
    assert st.amax.tolist() == [0.0, 0.0, 0.0]  # accumulators back at 0
    # grad_output slot: seeded from g0, then g0, g1, g2 rolled in.
    ga = [g.abs().max().item() for g in gs]
    assert st.amax_history[2].tolist() == pytest.approx([ga[2], ga[1], ga[0]])
    assert st.scale[2].item() == pytest.approx(57344.0 / max(ga) / 2)


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
        sa, sb = la.get_extra_state(), lb.get_extra_state()
        assert sa["params"] == sb["params"]
        for k in ("amax_history", "amax", "scale", "scale_inv"):
            assert torch.equal(sa[k], sb[k]), k
        assert sa["pending"] == sb["pending"] and sa["seeded"] == sb["seeded"]


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


def test_extra_state_round_trip_and_bad_state():
    lin, _ = make_pair(32, 16)
    assert lin.get_extra_state() == {"format": 1}
    with ft.autocast(recipe=DELAYED):
        lin(torch.randn(16, 32))
    st = lin.get_extra_state()
    other, _ = make_pair(32, 16)
    other.set_extra_state(st)
    assert other.fp8_state.seeded == lin.fp8_state.seeded
    assert torch.equal(other.fp8_state.amax_history, lin.fp8_state.amax_history)
    with pytest.raises(ValueError, match="not an fp8kit Linear FP8 state"):
        other.set_extra_state({"format": 99})


def test_extra_state_with_a_pending_amax_rolls_it_in():
    # Checkpoints from before the fused quantize+update kept the last amax
    # "pending" until the next forward; loading one rolls it in at once.
    lin, _ = make_pair(32, 16)
    with ft.autocast(recipe=DELAYED):
        lin(torch.randn(16, 32))
    st = lin.get_extra_state()
    assert st["pending"] == [False, False, False] and st["amax"].tolist() == [0.0, 0.0, 0.0]
    st["pending"] = [True, False, False]
    st["amax"] = torch.tensor([5.0, 7.0, 0.0])
    lin.set_extra_state(st)
    h = lin.fp8_state.amax_history
    assert h[0, 0].item() == 5.0 and h[0, 1:].tolist() == st["amax_history"][0, :-1].tolist()
    assert torch.equal(h[1], st["amax_history"][1])  # not pending: not rolled
    assert lin.fp8_state.amax.tolist() == [0.0, 0.0, 0.0]
    assert lin.fp8_state.scale[0].item() == pytest.approx(448.0 / max(h[0].tolist()))


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
        lin(x)
    assert lin.fp8_state.forward_fast_accumulation is False   # accurate by default
    fast = dataclasses.replace(DELAYED, forward_fast_accumulation=True)
    st = lin.fp8_state
    with ft.autocast(recipe=fast):
        y = lin(x)
    # Same scaling parameters: the state (and its history) is kept, only
    # the forward GEMM's accumulation changes.
    assert lin.fp8_state is st and st.forward_fast_accumulation is True
    assert ((y - ref(x)).norm() / ref(x).norm()).item() < 0.1
    with ft.autocast(recipe=DELAYED):
        lin(x)
    assert st.forward_fast_accumulation is False


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
