"""python -m fp8kit.bench in its quick mode (the CPU default): every section
runs end to end, checks fp8kit's outputs against the anchors before timing,
writes the JSON and the PNGs and says its numbers are not performance
claims; the harness pieces (timing, targets, mismatch handling) on their
own. No timing assertions: CPU numbers mean nothing."""

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("matplotlib")

from fp8kit import bench  # noqa: E402
from fp8kit.bench import (act_cast, fused_torch, gemm_block, norm_backward, norm_cast,  # noqa: E402
                          progress, results, timing)
from fp8kit.bench.results import Row  # noqa: E402

SECTIONS = ("gemm", "quantize", "linear", "overhead", "fused", "grouped", "compile")
GPU = torch.cuda.is_available()
# TransformerEngine's rows (the P3 ones among them) run where it is installed, on a GPU.
TE = GPU and importlib.util.find_spec("transformer_engine") is not None
TE_JAX = TE   # its JAX half (P5-fwd, P5-fwd+bwd) comes with the same package


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = bench.main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    rc, out, err = _run(["--quick", "--out", str(d), "--plain-progress", "--profile"])
    return rc, out, err, d


def test_quick_suite_runs_every_section(suite):
    rc, out, err, d = suite
    doc = json.loads((d / "bench.json").read_text())
    assert doc["errors"] == [], doc["errors"]
    assert rc == 0, out + err
    assert doc["mode"] == "quick" and doc["performance_claims"] is False
    assert "NOT performance claims" in doc["note"] or "not a performance claim" in doc["note"]
    assert "not performance claims" in out.lower() or "not a performance claim" in out.lower()
    assert {r["section"] for r in doc["rows"]} == set(SECTIONS)
    for s in SECTIONS:
        png = d / f"bench_{s}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", s
    # Progress: one line per case and a final one.
    assert "done" in err and "fp8kit.bench [" in err


def test_rows_are_checked_and_measured_side_by_side(suite):
    _, out, _, d = suite
    doc = json.loads((d / "bench.json").read_text())
    for r in doc["rows"]:
        what = f"{r['section']} {r['group']} {r['case']}"
        assert r["error"] is None, what
        assert r["check"], what                      # checked before timing
        assert r["met"] is None, what                # quick mode: no claims
        if r["target"] == "P6-gemm" and not GPU:     # torch's block-scaled call: CUDA only
            assert r["fp8kit_s"] is None and "runs on CUDA only" in r["note"], what
            continue
        if r["target"] == "P11-te" and not TE:       # TE's GroupedLinear: where TE is
            assert r["fp8kit_s"] is None and "TE" in r["note"], what
            continue
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0, what
        assert r["ratio"] == pytest.approx(r["anchor_s"] / r["fp8kit_s"])
    checks = " ".join(r["check"] for r in doc["rows"])
    assert "bit-exact" in checks                     # quantization, bit for bit
    # Every target has rows (quick sizes stand in for the real ones).
    # P3, P5-fwd, P5-fwd+bwd, P7 and P10 need TransformerEngine or torchao
    # beside fp8kit: not in a CPU run.
    assert set(doc["targets"]) == {"P1", "P2", "P4", "P5-gemm", "P6-gemm", "P6-linear",
                                   "P6-quantize", "P7-norm", "P7-act", "P10-eager",
                                   "P11-bf16", "P11-te"} | \
        ({"P3"} if TE else set()) | ({"P5-fwd", "P5-fwd+bwd"} if TE_JAX else set())
    assert all(t["met"] is None for t in doc["targets"].values())
    # P6-gemm's peer, torch's block-scaled scaled_mm, runs on a GPU only;
    # P11-te's, TE's GroupedLinear, where TE is installed.
    assert all(t["complete"] == ((GPU or tid != "P6-gemm") and (TE or tid != "P11-te"))
               for tid, t in doc["targets"].items())
    assert "torch._scaled_mm" in out and "lax.dot_general e4m3" in out
    # P5-gemm is the [K, N]-layout lax.dot row (the plain lax.dot(a, b) call).
    kn = [r for r in doc["rows"] if r["anchor"] == "lax.dot e4m3 [K,N] b"]
    assert kn and all(r["fp8kit_s"] > 0 and r["anchor_s"] > 0 and not r["error"] for r in kn)
    assert {r["target"] for r in doc["rows"] if r["anchor"].startswith("lax.dot")} == \
        {"P5-gemm", None}
    assert all(r["target"] == "P5-gemm" for r in kn)


def test_linear_and_overhead_rows(suite):
    _, _, _, d = suite
    rows = json.loads((d / "bench.json").read_text())["rows"]
    torch_linear = [r for r in rows if r["group"].startswith("PyTorch Linear")]
    # fwd and fwd+bwd; delayed and current, weight re-quantized and cached.
    # fwd+bwd at the target size (every size in quick mode) is also timed sustained.
    for mode, extra in (("fwd", set()), ("fwd+bwd", {"delayed, sustained"})):
        cases = {r["case"].split(" ", 1)[1] for r in torch_linear
                 if r["group"].startswith(f"PyTorch Linear {mode},")}
        assert cases == {"delayed", "current", "delayed, weight cached",
                         "current, weight cached", "delayed, fast fwd acc", "block"} | extra, mode
    te_rows = [r for r in torch_linear if "TransformerEngine" in r["group"]]
    if TE:   # P3: delayed and current against TE's te.Linear, fwd+bwd
        p3 = [r for r in te_rows if r["target"] == "P3"]
        assert {r["case"].split()[1] for r in p3} == {"delayed", "current"}
        assert all("fwd+bwd" in r["group"] for r in p3)
    else:    # no TE: no TE rows, and the first bf16 row of each fwd+bwd case says why
        assert te_rows == []
        notes = [r["note"] for r in torch_linear if r["group"].startswith("PyTorch Linear "
                                                                          "fwd+bwd,")]
        assert sum("no TE rows: TransformerEngine" in n for n in notes) == 2   # QUICK_SIZES
    p6 = [r for r in torch_linear if r["target"] == "P6-linear"]
    assert p6 and all("fwd+bwd" in r["group"] and r["case"].endswith(" block") for r in p6)
    assert all(r["fp8kit_s"] > 0 and r["check"].startswith("rel err y") for r in p6)
    overhead = [r for r in rows if r["section"] == "overhead"]
    assert {r["case"] for r in overhead} >= {"delayed", "current", "current, weight cached",
                                             "delayed, autocast per call"}
    for r in overhead:   # host time per call, next to the device-side time
        assert r["timing"]["fp8kit_host_s"] > 0 and r["timing"]["anchor_host_s"] > 0
        assert "host " in r["note"]


def test_block_gemm_rows(suite):
    """The block-scaled GEMM group: fp8kit checked against a float64 product
    of the dequantized operands, then against torch's block-scaled call
    where that runs (a GPU); timed against bf16 torch.matmul everywhere."""
    _, out, _, d = suite
    rows = [r for r in json.loads((d / "bench.json").read_text())["rows"]
            if r["group"].startswith("block-scaled")]
    peer = [r for r in rows if r["target"] == "P6-gemm"]
    bf16 = [r for r in rows if r["anchor"] == "bf16 torch.matmul"]
    assert len(peer) == len(bf16) == len(gemm_block.QUICK_SHAPES)
    for r in peer:
        assert r["check"].startswith("vs float64: max rel diff"), r
        assert ("vs torch: max rel diff" in r["check"]) == GPU, r
    assert all(r["fp8kit_s"] > 0 and r["anchor_s"] > 0 for r in bf16)
    if not GPU:   # the table says why the P6-gemm rows have no numbers
        assert "runs on CUDA only" in out


def test_block_quantize_rows(suite):
    """Block quantization (P6-quantize): each mode's two copies checked by
    dequantizing them, then timed against a copy of the input."""
    from fp8kit.bench import quantize
    _, _, _, d = suite
    rows = [r for r in json.loads((d / "bench.json").read_text())["rows"]
            if r["group"] == quantize.G_BLOCK]
    assert {r["case"].split()[0] for r in rows} == set(quantize.BLOCK_MODES)
    assert len(rows) == len(quantize.BLOCK_MODES) * len(quantize.QUICK_SHAPES)
    for r in rows:
        assert r["target"] == "P6-quantize" and r["unit"] == "TB/s" and r["error"] is None
        assert r["check"].startswith("dequantized vs x: rowwise rel err")
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0


def _wrong_block_scale(monkeypatch):
    """fp8kit's block-scaled GEMM, reading one 128x128 weight block's scale
    twice as large: a scale bug."""
    from fp8kit import _torch_ext
    real = _torch_ext.gemm_block

    def wrong(a, a_si, a_col, a_col_si, a_mode, b, b_si, *args):
        b_si = b_si.clone()
        b_si[0, 0] *= 2
        return real(a, a_si, a_col, a_col_si, a_mode, b, b_si, *args)
    monkeypatch.setattr(_torch_ext, "gemm_block", wrong)


def test_wrong_block_scale_is_caught_and_not_timed(tmp_path, monkeypatch):
    _wrong_block_scale(monkeypatch)
    rc, out, _ = _run(["--quick", "--sections", "gemm_block", "--gemm-shapes", "32x256x256",
                       "--out", str(tmp_path), "--no-plots", "--plain-progress"])
    assert rc == 1
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert len(rows) == 2
    for r in rows:
        assert "fp8kit's output is wrong, not timed" in r["error"], r
        assert "vs float64" in r["error"] and r["fp8kit_s"] is None and r["ratio"] is None
    assert "ERROR" in out


def test_block_rows_say_why_where_fp8kit_has_no_block_gemm(tmp_path, monkeypatch):
    """A device without block-scaled FP8 GEMMs: the block rows (GEMM and
    Linear) say why instead of a number, and the other rows still run."""
    import fp8kit.torch as ft
    monkeypatch.setattr(ft, "supports_block_scaled_fp8_gemm", lambda device: False)
    rc, out, err = _run(["--quick", "--sections", "gemm_block,linear_torch", "--rounds", "1",
                         "--out", str(tmp_path), "--no-plots", "--plain-progress"])
    assert rc == 0, out + err
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    block = [r for r in rows if r["group"].startswith("block-scaled")
             or r["case"].endswith(" block")]
    assert {r["target"] for r in block} == {"P6-gemm", "P6-linear", None}
    for r in block:
        assert r["error"] is None and r["fp8kit_s"] is None, r
        assert "supports_block_scaled_fp8_gemm(" in r["note"] and "is False" in r["note"], r
    assert all(r["fp8kit_s"] > 0 for r in rows if r not in block)


@pytest.mark.parametrize("mode,shape", [("block_1x128", (40, 300)), ("block_128x128", (136, 520)),
                                        ("block_1x128", (3, 128))])
def test_bench_dequantizes_block_scales_as_the_core_does(mode, shape):
    """The bench's own reading of the scale layout (its float64 reference),
    edge tiles and blocks included, against fp8kit's dequantize_block."""
    import fp8kit.torch as ft
    x = torch.randn(*shape, dtype=torch.bfloat16) * torch.logspace(-3, 3, shape[1])
    q, si, _, _ = ft.quantize_block(x, "e4m3", mode)
    want = ft.dequantize_block(q, si, mode, torch.float32).double()
    assert torch.equal(gemm_block.dequantized(q, si, mode), want)


def test_scales_in_torchs_block_layout():
    """torch_scales gives torch.nn.functional.scaled_mm's Hopper layout
    (scale_a [M, K/128] strides (1, M); scale_b [round_up(K/128, 4), N/128]
    strides (1, round_up(K/128, 4))) and the entry each block reads."""
    import fp8kit.torch as ft
    m, n, k = 24, 256, 640                    # K/128 = 5 tiles, padded to 8 for scale_b
    a = torch.randn(m, k, dtype=torch.bfloat16) * torch.logspace(-2, 2, k)
    b = torch.randn(n, k, dtype=torch.bfloat16) * torch.logspace(2, -2, k)
    qa, sa, _, _ = ft.quantize_block(a, "e4m3", "block_1x128")
    qb, sb, _, _ = ft.quantize_block(b, "e4m3", "block_128x128")
    scale_a, scale_b = gemm_block.torch_scales(sa, sb, m)
    assert scale_a.shape == (m, 5) and scale_a.stride() == (1, m)
    assert scale_b.shape == (8, 2) and scale_b.stride() == (1, 8)
    # Element [r, c] of A uses scale_a[r, c // 128]; of B, scale_b[c // 128, r // 128].
    rows, cols = torch.meshgrid(torch.arange(m), torch.arange(k), indexing="ij")
    assert torch.equal(qa.double() * scale_a[rows, cols // 128].double(),
                       ft.dequantize_block(qa, sa, "block_1x128", torch.float32).double())
    rows, cols = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    assert torch.equal(qb.double() * scale_b[cols // 128, rows // 128].double(),
                       ft.dequantize_block(qb, sb, "block_128x128", torch.float32).double())


def test_fused_rows(suite):
    """The fused section: the MLP block (SwiGLU and GELU) and the QKV
    LayerNormLinear in PyTorch, the MLP block under jax.jit, each fp8kit
    variant checked against bf16 and timed."""
    _, _, _, d = suite
    fused = [r for r in json.loads((d / "bench.json").read_text())["rows"]
             if r["section"] == "fused"]
    jax_rows = [r for r in fused if r["group"].startswith("JAX jit: MLP block")]
    assert jax_rows and all(r["error"] is None and r["fp8kit_s"] > 0 for r in jax_rows)
    norm_rows = [r for r in fused if r["group"] == norm_cast.GROUP]
    assert {r["case"].split()[0] for r in norm_rows} == {"RMSNorm", "LayerNorm"}
    for r in norm_rows:   # the norm kernel alone, checked, against a copy
        assert r["target"] == "P7-norm" and r["error"] is None and r["unit"] == "TB/s"
        assert r["check"].startswith("columnwise = rowwise.T bit-exact; vs float64 rel err")
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0
    backward_rows = [r for r in fused if r["group"] == norm_backward.GROUP]
    assert {r["case"].split()[0] for r in backward_rows} == {"RMSNorm", "LayerNorm"}
    for r in backward_rows:   # the norm backward alone, checked, against a copy
        assert r["target"] is None and r["error"] is None and r["unit"] == "TB/s"
        assert r["check"].startswith("dx: rel err"), r["check"]
        assert "dgamma: rel err" in r["check"]
        assert ("dbeta: rel err" in r["check"]) == r["case"].startswith("LayerNorm")
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0
    act_rows = [r for r in fused if r["group"] == act_cast.GROUP]
    assert {" ".join(r["case"].split()[:2]) for r in act_rows} == {
        "swiglu forward", "swiglu backward", "gelu forward", "gelu backward"}
    for r in act_rows:   # the activation kernels alone, checked, against a copy
        assert r["target"] == "P7-act" and r["error"] is None and r["unit"] == "TB/s"
        assert r["check"].startswith("columnwise = rowwise.T bit-exact; vs float64 rel err")
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0
    # Peak memory rows need CUDA's allocator.
    assert any("extra peak memory" in r["group"] for r in fused) == GPU
    rows = [r for r in fused if r not in jax_rows and r not in norm_rows and r not in act_rows
            and r not in backward_rows and "extra peak memory" not in r["group"]]
    groups = {r["group"] for r in rows}
    assert any("LayerNormMLP" in g and "swiglu" in g for g in groups)
    assert any("LayerNormMLP" in g and "gelu" in g for g in groups)
    assert any("LayerNormLinear" in g for g in groups)
    variants = {r["case"].split(" ", 1)[1] for r in rows}
    assert variants == {"unfused delayed", "unfused current", "unfused block", "fused delayed",
                        "fused current", "fused block", "fused delayed, fast fwd acc",
                        "fused current, fast fwd acc"}
    for r in rows:
        assert r["error"] is None and r["check"].startswith("rel err"), r
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0


def test_jax_dense_rows_against_te(suite):
    """JAX dense: every recipe against bf16 (information); against TE-JAX's
    DenseGeneral with the same recipe where it is installed (P5-fwd and
    P5-fwd+bwd), else a note on the delayed fwd row says why."""
    _, _, _, d = suite
    rows = [r for r in json.loads((d / "bench.json").read_text())["rows"]
            if r["group"].startswith("JAX jit: dense")]
    te = [r for r in rows if "TransformerEngine" in r["group"]]
    assert all(r["target"] is None for r in rows if r not in te)
    if TE_JAX:
        assert {(r["target"], r["case"].split()[1]) for r in te} == {
            (t, rn) for t in ("P5-fwd", "P5-fwd+bwd") for rn in ("delayed", "current")}
    else:
        assert te == []
        notes = [r["note"] for r in rows if r["group"] == "JAX jit: dense fwd, fp8kit vs bf16"]
        assert sum(n.startswith("no TE-JAX rows: TransformerEngine (JAX)") for n in notes) == 2


def test_grouped_rows(suite):
    """The grouped section: GroupedLinear against the bf16 grouped GEMM
    (P11-bf16) and TE's GroupedLinear (P11-te), balanced and skewed counts,
    the fp8kit side checked against bf16 first."""
    _, _, _, d = suite
    rows = [r for r in json.loads((d / "bench.json").read_text())["rows"]
            if r["section"] == "grouped"]
    assert {r["target"] for r in rows} == {"P11-bf16", "P11-te"}
    assert {r["case"].split()[-1] for r in rows} == {"balanced", "skewed"}
    for r in rows:
        assert r["check"].startswith("rel err y"), r
        if r["target"] == "P11-bf16":
            assert r["fp8kit_s"] and r["anchor_s"], r


def test_skewed_counts_sum_to_the_tokens_and_leave_one_expert_empty():
    """Every count a multiple of 16 (TE's FP8 grouped GEMM refuses others),
    summing to the tokens; skewed: falling, the last expert empty."""
    from fp8kit.bench.grouped_torch import QUICK_SHAPES, SHAPES, counts
    for experts, tokens, _, _ in SHAPES + QUICK_SHAPES:
        assert counts(experts, tokens, False) == [tokens // experts] * experts
        assert tokens // experts % 16 == 0
        c = counts(experts, tokens, True)
        assert sum(c) == tokens and len(c) == experts and min(c) >= 0, c
        assert all(n % 16 == 0 for n in c), c
        assert c[-1] == 0 and c.count(0) == 1, c
        assert c == sorted(c, reverse=True), c
    assert counts(4, 96, True) == [64, 16, 16, 0]   # 52.4, 26.2, 17.5 rounded down


class _FakeGroupedTE:
    """transformer_engine.pytorch with a bf16 GroupedLinear that, as TE's
    FP8 one, refuses counts that are not multiples of 16, and raises on its
    calls from number `fail_from` on (None: never)."""

    fail_from = None

    class GroupedLinear(torch.nn.Module):
        def __init__(self, num_gemms, in_features, out_features, bias=True,
                     params_dtype=None, device=None):
            super().__init__()
            self.calls = 0
            for e in range(num_gemms):
                self.register_parameter(f"weight{e}", torch.nn.Parameter(torch.empty(
                    out_features, in_features, dtype=params_dtype, device=device)))

        def forward(self, x, m_splits):
            self.calls += 1
            fail_from = _FakeGroupedTE.fail_from
            if fail_from is not None and self.calls >= fail_from:
                raise RuntimeError("CanonicalizeGemmInput: Assertion failed (a fake)")
            if any(m % 16 for m in m_splits):
                raise RuntimeError(f"ret.lda % 16 == 0. Caller must pad. {m_splits}")
            return torch.cat([part @ getattr(self, f"weight{e}").t()
                              for e, part in enumerate(x.split(m_splits))])

    @staticmethod
    def autocast(enabled, recipe):
        return contextlib.nullcontext()


def _grouped_rows_with_fake_te(monkeypatch, tmp_path, fail_from):
    from fp8kit.bench import grouped_torch, te_peer
    monkeypatch.setattr(grouped_torch, "_te_for", lambda dev: (_FakeGroupedTE, None))
    monkeypatch.setattr(te_peer, "recipe", lambda name: name)
    monkeypatch.setattr(_FakeGroupedTE, "fail_from", fail_from)
    rc, out, err = _run(["--quick", "--sections", "grouped", "--rounds", "1", "--out",
                         str(tmp_path), "--no-plots"])
    assert rc == 0, out + err
    return [r for r in json.loads((tmp_path / "bench.json").read_text())["rows"]
            if r["section"] == "grouped"]


def test_grouped_rows_against_te_where_it_runs(tmp_path, monkeypatch):
    """With a TE GroupedLinear present, balanced and skewed counts alike
    (multiples of 16) give timed fp8kit vs TE rows."""
    rows = _grouped_rows_with_fake_te(monkeypatch, tmp_path, None)
    te = [r for r in rows if r["target"] == "P11-te"]
    assert len(te) == 3 * 2
    for r in rows:
        assert r["error"] is None and r["fp8kit_s"] > 0 and r["anchor_s"] > 0, r
        assert r["note"] == "", r


@pytest.mark.parametrize("fail_from,when", [(1, "GroupedLinear failed: RuntimeError"),
                                            (3, "not timed: RuntimeError"),
                                            (4, "failed while timed: RuntimeError")])
def test_a_failing_te_variant_costs_only_its_own_rows(tmp_path, monkeypatch, fail_from, when):
    """TE raising in its two warm-up calls (each in its own autocast, so
    that delayed scaling updates its scales), at its check (the third) or
    later, while it is timed: its rows say why in their note, fp8kit's and
    bf16's are timed."""
    rows = _grouped_rows_with_fake_te(monkeypatch, tmp_path, fail_from)
    assert {r["target"] for r in rows} == {"P11-bf16", "P11-te"}
    for r in rows:
        assert r["error"] is None, r
        assert r["check"].startswith("rel err y"), r
        if r["target"] == "P11-bf16":
            assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0 and r["note"] == "", r
        else:
            assert r["fp8kit_s"] is None and r["anchor_s"] is None, r
            assert when in r["note"] and "CanonicalizeGemmInput" in r["note"], r


def test_compile_rows(suite):
    """The compile section: fp8kit's Linear under torch.compile(fullgraph=True)
    against its eager self (P10-eager) and compiled bf16, checked against
    eager bf16 and timed; torchao's rows only where torchao runs."""
    _, _, _, d = suite
    rows = [r for r in json.loads((d / "bench.json").read_text())["rows"]
            if r["section"] == "compile"]
    anchors = {r["anchor"] for r in rows}
    assert {"fp8kit eager", "bf16 compiled"} <= anchors
    for r in rows:
        assert r["error"] is None and r["check"].startswith("rel err"), r
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0
    assert [r["target"] for r in rows if r["anchor"] == "fp8kit eager"] == ["P10-eager"]
    if not GPU:
        assert "torchao" not in " ".join(anchors) and "needs a GPU" in rows[0]["note"]


def test_sustained_rows(suite):
    """torch Linear and JAX dense fwd+bwd, bf16 vs delayed, in long batches,
    with the GPU's clock and power where nvidia-smi runs (not on CI)."""
    _, _, _, d = suite
    rows = [r for r in json.loads((d / "bench.json").read_text())["rows"]
            if r["case"].endswith("delayed, sustained")]
    assert {r["group"].split(",")[0] for r in rows} == {"PyTorch Linear fwd+bwd",
                                                        "JAX jit: dense fwd+bwd (random cotangent)"}
    for r in rows:
        assert r["target"] is None and r["error"] is None
        assert r["fp8kit_s"] > 0 and r["anchor_s"] > 0 and r["check"].startswith("rel err y")
        assert r["note"].startswith("GPU ")


def _fake_nvidia_smi(tmp_path, lines):
    script = tmp_path / "nvidia-smi"
    body = "".join(f"echo '{line}'\nsleep 0.05\n" for line in lines)
    script.write_text(f"#!/bin/sh\n{body}exec sleep 60\n")
    script.chmod(0o755)
    return str(tmp_path)


def test_gpu_sampler_averages_samples_inside_the_windows(tmp_path, monkeypatch):
    import time
    from fp8kit.bench.gpu_monitor import GpuSampler
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, ["1980, 120.5", "[N/A], 100",
                                                            "1400, 640", "1500, 620"]) +
                       os.pathsep + os.environ["PATH"])
    assert GpuSampler.available()
    start = time.monotonic()
    with GpuSampler() as sampler:
        time.sleep(1.0)
    end = time.monotonic()
    assert [(m, w) for _, m, w in sampler._samples] == [(1980, 120.5), (1400, 640),
                                                         (1500, 620)]
    everything = sampler.mean_over([(start, end)])
    assert everything == {"sm_mhz": round((1980 + 1400 + 1500) / 3),
                          "power_w": round((120.5 + 640 + 620) / 3), "samples": 3}
    t_last = sampler._samples[-1][0]
    assert sampler.mean_over([(t_last, end)]) == {"sm_mhz": 1500, "power_w": 620, "samples": 1}
    assert sampler.mean_over([(end + 1, end + 2)]) is None


def test_sampled_timing_note():
    kit = timing.Timing(1e-3, 1e-3, 3, 10, gpu={"sm_mhz": 1430, "power_w": 635, "samples": 30})
    anchor = timing.Timing(2e-3, 2e-3, 3, 10, gpu={"sm_mhz": 1560, "power_w": 634, "samples": 30})
    assert timing.gpu_note(kit, anchor) == ("GPU during fp8kit / anchor batches: "
                                            "SM 1430 / 1560 MHz, 635 / 634 W")
    assert "gpu" in kit.to_json() and "gpu" not in timing.Timing(1, 1, 1, 1).to_json()
    assert "not sampled" in timing.gpu_note(timing.Timing(1, 1, 1, 1), anchor)


def test_profile_of_the_per_call_path(suite):
    _, out, _, d = suite
    profiles = json.loads((d / "bench.json").read_text())["profiles"]
    assert len(profiles) == 2, list(profiles)
    (bf16_title, bf16), (kit_title, kit) = profiles.items()
    assert "bf16 nn.Linear" in bf16_title and "fp8kit delayed" in kit_title
    for title, table in profiles.items():
        assert "50 x fwd+bwd" in title and "Self CPU time total" in table
        assert title in out                       # printed too
    assert "fp8kit::" in kit and "fp8kit::" not in bf16   # fp8kit's own ops are named
    assert "Self CPU" in (d / "profile_overhead.txt").read_text()


def test_mismatch_is_reported_and_not_timed(tmp_path, monkeypatch):
    from fp8kit import _torch_ext

    real = _torch_ext.gemm

    def wrong_gemm(*args, **kwargs):
        return real(*args, **kwargs) * 1.5   # a scale bug

    monkeypatch.setattr(_torch_ext, "gemm", wrong_gemm)
    rc, out, _ = _run(["--quick", "--sections", "gemm", "--gemm-shapes", "16x32x32",
                       "--out", str(tmp_path), "--no-plots", "--plain-progress"])
    assert rc == 1
    doc = json.loads((tmp_path / "bench.json").read_text())
    p1 = [r for r in doc["rows"] if r["target"] == "P1"]
    assert len(p1) == 2
    for r in p1:
        assert "outputs disagree, not timed" in r["error"]
        assert r["fp8kit_s"] is None and r["ratio"] is None
    assert doc["targets"]["P1"]["complete"] is False
    assert "ERROR" in out
    assert doc["profiles"] == {}        # off by default in the quick mode


class _FakeClock(timing.Clock):
    """Seconds per call from a script, to test the measuring logic."""

    def __init__(self, per_call):
        self.per_call, self.calls = per_call, []

    def sync(self, out):
        pass

    def batch(self, fn, iters):
        name = fn(0)
        self.calls.append((name, iters))
        return self.per_call[name].pop(0)


def test_measure_alternates_and_takes_the_median():
    settings = timing.Settings(warmup=1, rounds=3, batch_seconds=1.0, min_iters=2,
                               max_iters=50)
    clock = _FakeClock({"a": [0.1, 5.0, 1.0, 3.0], "b": [0.5, 2.0, 2.0, 9.0]})
    t = timing.measure({"a": lambda i: "a", "b": lambda i: "b"}, clock, settings)
    assert t["a"].median_s == 3.0 and t["b"].median_s == 2.0
    assert t["a"].min_s == 1.0 and t["a"].rounds == 3
    assert t["a"].iters == 10 and t["b"].iters == 2   # 1.0 s / calibration time, clamped
    # Calibration of each, then one batch of each per round, in the rounds' orders.
    rounds = timing.round_orders(["a", "b"], 3)
    assert [c[0] for c in clock.calls] == ["a", "b"] + [n for r in rounds for n in r]


def test_rounds_vary_which_function_comes_before_which():
    names = ["bf16", "eager", "compiled", "peer"]
    orders = timing.round_orders(names, 7)
    assert len(orders) == 7 and orders[0] == names
    assert all(sorted(o) == sorted(names) for o in orders)
    assert orders == timing.round_orders(names, 7)   # the same every run
    before = {(o[i - 1], o[i]) for o in orders for i in range(1, len(o))}
    # "compiled" is not always timed right after "eager", as in the order given
    assert {(a, b) for a, b in before if b == "compiled"} != {("eager", "compiled")}
    assert timing.round_orders(names, 1) == [names]


def test_copies_for_l2():
    assert timing.copies_for_l2(1 << 30) == 1
    assert timing.copies_for_l2(64 << 20) == 4
    assert timing.copies_for_l2(1) == timing.MAX_COPIES


def _row(ratio, group="g", target="P1"):
    return Row("gemm", group, f"c{ratio}", 1.0, "TFLOP/s", "anchor", fp8kit_s=1.0,
               anchor_s=ratio, fp8kit_work=1e12, anchor_work=1e12, target=target)


def test_targets_per_row_and_geomean():
    rows = [_row(1.01), _row(1.02)]          # every row >= 1.00 but geomean < 1.03
    s = results.summarize_targets(rows, claims=True)
    assert s["P1"]["met"] is False and s["P1"]["geomean"]["g"] == pytest.approx(1.015, abs=1e-3)
    rows = [_row(1.05), _row(1.04)]
    assert results.summarize_targets(rows, claims=True)["P1"]["met"] is True
    rows = [_row(1.2), _row(0.99)]           # one shape below 1.00
    assert results.summarize_targets(rows, claims=True)["P1"]["met"] is False
    assert results.summarize_targets(rows, claims=False)["P1"]["met"] is None
    assert _row(0.99).met(claims=True) is False and _row(0.99).met(claims=False) is None
    # Time units: lower is better, the ratio is still anchor / fp8kit.
    r = Row("overhead", "g", "c", 0, "us", "bf16", fp8kit_s=30e-6, anchor_s=27e-6, target="P4")
    assert r.value("fp8kit") == pytest.approx(30.0) and r.ratio == pytest.approx(0.9)
    assert r.met(claims=True) is True        # 30 us <= 1.25 x 27 us


def test_plain_progress_bar():
    buf = io.StringIO()
    b = progress.bar(2, desc="x", stream=buf, plain=True)
    b.set_description("first")
    b.update()
    b.set_description("second")
    b.update()
    b.close()
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("x [") and "0/2" in lines[0] and "first" in lines[0]
    assert "2/2" in lines[-1] and "done" in lines[-1]


@pytest.mark.skipif(GPU, reason="--full is the real run on a GPU")
def test_full_mode_refuses_the_cpu(tmp_path):
    rc, _, err = _run(["--full", "--out", str(tmp_path)])
    assert rc == 2 and "--full needs a CUDA GPU" in err


def test_bad_section_is_reported(tmp_path):
    rc, _, err = _run(["--sections", "gemm,nope", "--out", str(tmp_path)])
    assert rc == 2 and "nope" in err


def _refused(argv) -> str:
    """The one error line of a run refused before anything is measured."""
    rc, out, err = _run(argv)
    assert rc == 2 and out == "", out
    (line,) = err.splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("args,message", [
    (["--gemm-shapes", "64x64"], "--gemm-shapes: expected MxNxK[,MxNxK...] of positive sizes"),
    (["--gemm-shapes", "64x64x100"], "--gemm-shapes: 64x64x100: the FP8 GEMMs need M and N "
                                     "multiples of 8 and K a multiple of 16"),
    (["--rounds", "0"], "--rounds=0 must be >= 1"),
    (["--out", "{file}"], "--out: {file} exists and is not a directory"),
    (["--no-plots", "--json", "{file}/b.json"], "--json: {file} exists and is not a directory"),
])
def test_bad_arguments_are_one_line_before_anything_runs(args, message, tmp_path):
    file = tmp_path / "a_file"
    file.write_text("")
    argv = ["--out", str(tmp_path)] + [a.format(file=file) for a in args]
    assert _refused(argv).startswith(f"error: {message.format(file=file)}")


def test_missing_matplotlib_is_named_before_anything_runs(tmp_path, monkeypatch):
    from fp8kit.bench import cli
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed
    assert _refused(["--out", str(tmp_path)]) == (
        "error: matplotlib is not installed (fp8kit.bench plots its results with it): "
        "pip install 'fp8kit[bench]', or run with --no-plots")
    # --no-plots does without it; --json naming a directory writes bench.json inside.
    args = cli._parser().parse_args(["--no-plots", "--json", str(tmp_path)])
    assert cli._checked(args)[2:] == (tmp_path / "bench.json", None)


def test_bench_extra_declares_matplotlib():
    """What the missing-package errors of fp8kit.bench and fp8kit.demo ask
    for: pip install 'fp8kit[bench]'."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = pathlib.Path(os.path.realpath(__file__)).parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("pyproject.toml is not next to the tests")
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert "matplotlib" in extras["bench"]


@pytest.mark.parametrize("half,group,section", [("gemm_block", "block-scaled", "gemm"),
                                                ("dense_jax", "JAX jit", "linear"),
                                                ("linear_torch", "PyTorch Linear", "linear"),
                                                ("mlp_jax", "JAX jit: MLP block", "fused")])
def test_sections_take_half_of_a_section(tmp_path, half, group, section):
    json_path = tmp_path / "elsewhere" / f"{half}.json"
    rc, out, err = _run(["--quick", "--sections", half, "--rounds", "1",
                         "--out", str(tmp_path), "--json", str(json_path), "--plain-progress"])
    assert rc == 0, out + err
    doc = json.loads(json_path.read_text())
    assert doc["sections"] == [half] and doc["errors"] == []
    assert doc["rows"] and all(r["group"].startswith(group) for r in doc["rows"])
    assert (tmp_path / f"bench_{section}.png").exists()     # plots go to --out


def _python(*args):
    """A new interpreter with this one's import path (the fp8kit under test)."""
    path = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path), timeout=300)


def test_module_entry_point():
    r = _python("-m", "fp8kit.bench", "--help")
    assert r.returncode == 0, r.stderr
    assert "--sections" in r.stdout and "--full" in r.stdout


SCRIPTS = pathlib.Path(os.path.realpath(__file__)).parents[1] / "scripts"
NO_SCRIPTS = "scripts/ is not next to the tests (a copy of tests/ alone)"


def _tool(name, *args):
    if not SCRIPTS.is_dir():
        pytest.skip(NO_SCRIPTS)
    return _python(str(SCRIPTS / name), *args)


def test_every_tool_is_documented():
    if not SCRIPTS.is_dir():
        pytest.skip(NO_SCRIPTS)
    readme = (SCRIPTS / "README.md").read_text()
    tools = sorted(p.name for p in SCRIPTS.iterdir() if p.suffix in (".py", ".sh"))
    assert tools and all(f"| `{t}` |" in readme for t in tools), tools


@pytest.mark.parametrize("tool", ["accumulation_error.py", "kernel_profile.py",
                                  "power_cap.py", "fsdp_bench.py"])
def test_tool_starts(tool):
    """--help imports everything the tool takes from fp8kit (the bench's
    helpers, the front ends), so a renamed helper fails here."""
    r = _tool(tool, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout


def test_accumulation_error_on_the_cpu():
    r = _tool("accumulation_error.py", "--m", "32", "--k", "64", "--n", "16", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "rel err" in ln]
    # 2 weight kinds x bias or not x split or fast
    assert len(lines) == 8 and all(float(ln.rsplit(" ", 1)[1]) < 1e-2 for ln in lines), r.stdout
    assert "bf16 rounding of the exact product" in r.stdout


def test_fsdp_bench_on_the_cpu(tmp_path):
    out = tmp_path / "fsdp.json"
    r = _tool("fsdp_bench.py", "--cpu", "--variants", "bf16,fp8kit,fp8kit-cs",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert sorted(rows) == ["bf16", "fp8kit", "fp8kit-cs"]
    assert all(row["check"] == "ok" for row in rows.values()), rows
    # No biases: the FP8 all-gathers move half of bf16's bytes.
    for fp8 in ("fp8kit", "fp8kit-cs"):
        assert 2 * rows[fp8]["all_gather_bytes_per_step"] == \
            rows["bf16"]["all_gather_bytes_per_step"]


def test_fsdp_bench_decoder_on_the_cpu(tmp_path):
    out = tmp_path / "fsdp.json"
    r = _tool("fsdp_bench.py", "--cpu", "--model", "decoder", "--variants", "bf16,fp8kit-cs",
              "--reshard-after-forward", "false", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert sorted(rows) == ["bf16", "fp8kit-cs"]
    assert all(row["check"] == "ok" for row in rows.values()), rows
    # The projections' weights go in FP8, the embedding, norms and lm_head in bf16.
    assert 0 < rows["fp8kit-cs"]["all_gather_bytes_per_step"] < \
        rows["bf16"]["all_gather_bytes_per_step"]


def test_fsdp_bench_refuses_an_unknown_variant():
    r = _tool("fsdp_bench.py", "--cpu", "--variants", "bf16,fp8")
    assert r.returncode == 2 and "--variants: unknown ['fp8']" in r.stderr, r.stderr


def test_memory_rows_compare_bytes_not_times():
    """The fused section's peak-memory rows: MiB, ratio = the anchor's bytes
    over fp8kit's (> 1: fp8kit needs less), every FP8 variant against bf16
    and fp8kit's fused layer against TE's per recipe."""
    mib = 2 ** 20
    peaks = {"bf16": 1472 * mib, "unfused delayed": 1552 * mib, "fused delayed": 1400 * mib,
             "fused current": 1500 * mib, "TE delayed": 2212 * mib, "TE current": 2348 * mib}
    rows = fused_torch.memory_rows("LayerNormMLP (swiglu)", "8192x4096x14336", peaks)
    by = {(r.group.rsplit(", ", 1)[1], r.case.split(" ", 1)[1]): r for r in rows}
    assert set(by) == {("fp8kit vs bf16", "fused current"), ("fp8kit vs bf16", "fused delayed"),
                       ("fp8kit vs bf16", "unfused delayed"),
                       ("fp8kit fused vs TransformerEngine", "fused delayed"),
                       ("fp8kit fused vs TransformerEngine", "fused current")}
    r = by[("fp8kit vs bf16", "unfused delayed")]
    assert (r.unit, r.value("fp8kit"), r.value("anchor")) == ("MiB", 1552, 1472)
    assert r.ratio == pytest.approx(1472 / 1552) and r.fp8kit_s is None
    assert by[("fp8kit fused vs TransformerEngine", "fused current")].ratio == \
        pytest.approx(2348 / 1500)
    assert "1.565" in results.table(rows, claims=True)   # 2348 / 1500
    # Without TE's peaks there are no TE rows.
    assert all("TransformerEngine" not in r.group for r in fused_torch.memory_rows(
        "LayerNormMLP (swiglu)", "8192x4096x14336", {"bf16": 1, "fused delayed": 1}))


class _FakeTorchTE:
    """Stands in for transformer_engine.pytorch where it is not installed: a
    bf16 te.Linear and an autocast that does nothing, so the TE rows'
    plumbing (layers from the bf16 weights, checks, timing, targets) runs."""

    class Linear(torch.nn.Linear):
        def __init__(self, in_features, out_features, bias=True, params_dtype=None,
                     device=None):
            super().__init__(in_features, out_features, bias=bias, dtype=params_dtype,
                             device=device)

    @staticmethod
    def autocast(enabled, recipe):
        return contextlib.nullcontext()


def _te_rows_of_section(section, tmp_path):
    """The TransformerEngine rows of one section's quick run."""
    json_path = tmp_path / f"{section}.json"
    rc, out, err = _run(["--quick", "--sections", section, "--rounds", "1", "--out",
                         str(tmp_path), "--json", str(json_path), "--no-plots"])
    assert rc == 0, out + err
    return [r for r in json.loads(json_path.read_text())["rows"]
            if "TransformerEngine" in r["group"]]


def test_linear_rows_against_te_where_it_runs(tmp_path, monkeypatch):
    """With a te.Linear present, each fwd+bwd case gets fp8kit vs TE rows
    for delayed and current scaling (P3) and block scaling (information),
    checked and timed in the same rounds."""
    from fp8kit.bench import te_peer, torch_layers
    monkeypatch.setattr(torch_layers, "_te_for", lambda dev: (_FakeTorchTE, None))
    monkeypatch.setattr(te_peer, "recipe", lambda name: name)
    rows = _te_rows_of_section("linear_torch", tmp_path)
    assert {(r["case"].split()[1], r["target"]) for r in rows} == {
        ("delayed", "P3"), ("current", "P3"), ("block", None)}
    assert len(rows) == 3 * 2   # QUICK_SIZES
    for r in rows:
        assert r["error"] is None and r["fp8kit_s"] > 0 and r["anchor_s"] > 0, r
        assert "; TE vs bf16: rel err y" in r["check"]
        assert r["anchor"] == f"TransformerEngine {r['case'].split()[1]}"


def test_jax_dense_rows_against_te_where_it_runs(tmp_path, monkeypatch):
    """With TE-JAX present (here flax's own DenseGeneral in its place, under
    an autocast that does nothing), the JAX dense rows gain fp8kit vs TE
    rows for both recipes, fwd (P5-fwd) and fwd+bwd (P5-fwd+bwd)."""
    import types
    flax_linen = pytest.importorskip("flax.linen")
    from fp8kit.bench import te_peer
    fake = types.SimpleNamespace(
        flax=types.SimpleNamespace(DenseGeneral=flax_linen.DenseGeneral),
        autocast=lambda enabled, recipe: contextlib.nullcontext())
    monkeypatch.setattr(te_peer, "jax_module", lambda: (fake, None))
    monkeypatch.setattr(te_peer, "recipe", lambda name: name)
    rows = _te_rows_of_section("dense_jax", tmp_path)
    assert sorted((r["target"], r["case"]) for r in rows) == sorted(
        (t, f"{s}^3 {rn}") for t in ("P5-fwd", "P5-fwd+bwd") for rn in ("delayed", "current")
        for s in (64, 128))
    for r in rows:
        assert r["error"] is None and r["fp8kit_s"] > 0 and r["anchor_s"] > 0, r
        assert "; TE rel err" in r["check"]


def test_te_jax_import_failing_on_cudnn_symbols_names_the_fix(monkeypatch):
    """TE-JAX imported after torch's cuDNN fails on the system cuDNN's
    symbols; the row's note then says which folder to put first on
    LD_LIBRARY_PATH. Other import errors are reported as they are."""
    import builtins
    from fp8kit.bench import te_peer
    error = ("/lib/x86_64-linux-gnu/libcudnn_heuristic.so.9: undefined symbol: "
             "_ZTVN5cudnn7backend12OperationSetE, version libcudnn_graph.so.9")
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name.startswith("transformer_engine"):
            raise OSError(error)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", failing_import)
    tej, missing = te_peer.jax_module()
    assert tej is None and error in missing
    assert "torch loaded its own cuDNN first" in missing and "first on LD_LIBRARY_PATH" in missing
    assert te_peer._cudnn_hint("No module named 'transformer_engine'") == ""
