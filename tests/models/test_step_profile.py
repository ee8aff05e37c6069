"""The step profile's split of kernel time: kinds by kernel name, overlap
and idle time from the kernels' intervals, and the CLI's refusal without
a GPU."""

import pytest

from fp8kit.bench import kernel_times
from fp8kit.models import step_profile


@pytest.mark.parametrize("name,kind", [
    ("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_bias_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void fp8kit::cuda::(anonymous namespace)::act_kernel<1, true>", "fp8kit"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("loop_add_fusion", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", "other"),
])
def test_kernels_are_sorted_by_name(name, kind):
    assert kernel_times.kind_of(name) == kind


def test_breakdown_sums_kinds_and_takes_idle_from_the_union():
    kernels = [("nvjet_a", 0, 40), ("fp8kit::cast", 30, 50),   # overlapping: both count
               ("loop_fusion", 70, 80),                         # 20 us gap before it
               ("nvjet_b", 100, 140)]                           # 20 us gap before it
    t = kernel_times.breakdown(kernels, steps=2)
    assert t["gemm"] == 40.0 and t["fp8kit"] == 10.0 and t["other"] == 5.0
    assert t["window"] == 70.0 and t["idle"] == 20.0
    assert t["attention"] == t["optimizer"] == 0.0
    lines = kernel_times.table(t).splitlines()
    assert lines[1].split() == ["gemm", "0.04", "57.1%"]
    assert lines[-2].split() == ["idle", "0.02", "28.6%"] and lines[-1].split() == ["step", "0.07"]


def test_cli_refuses_a_machine_without_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert step_profile.main(["--config", "tiny"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert step_profile.main(["--recipes", "fp4"]) == 2
    assert "--recipes: unknown ['fp4']" in capsys.readouterr().err
