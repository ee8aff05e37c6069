"""The step profile's split of kernel time: kinds by kernel name, overlap
and idle time from the kernels' intervals, the longest kernels by their
short names, and the CLI's refusals."""

import pytest

from fp8kit.bench import kernel_times
from fp8kit.models import step_profile


@pytest.mark.parametrize("name,kind", [
    ("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_bias_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void fp8kit::cuda::(anonymous namespace)::act_kernel<1, true>", "fp8kit"),
    ("void transformer_engine::(anonymous namespace)::cast_transpose_kernel<8, 4>", "te"),
    ("cast_transpose_optimized_kernel", "te"),   # TE's NVRTC kernels: no namespace
    ("transpose_optimized_kernel", "te"),
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
    assert t["attention"] == t["optimizer"] == t["te"] == 0.0
    lines = kernel_times.table(t).splitlines()
    assert lines[1].split() == ["gemm", "0.04", "57.1%"]
    assert lines[-2].split() == ["idle", "0.02", "28.6%"] and lines[-1].split() == ["step", "0.07"]


@pytest.mark.parametrize("name,short", [
    ("void fp8kit::cuda::(anonymous namespace)::norm_forward_kernel<1, true, "
     "(fp8kit::cuda::FusedPass)1>(fp8kit::cuda::(anonymous namespace)::NormForwardParams)",
     "norm_forward_kernel<1, true, (FusedPass)1>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
     "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, array<char*, 3ul> >"),
    ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN",
     "nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN"),
    ("Memset (Device)", "Memset (Device)"),
    ("loop_add_fusion", "loop_add_fusion"),
])
def test_short_names_drop_return_type_parameters_and_qualifiers(name, short):
    assert kernel_times.short_name(name) == short


def test_top_kernels_merge_calls_of_one_kernel_and_sort_by_time():
    kernels = [("void f<1>(int)", 0, 10), ("void ns::f<1>(float)", 20, 40),   # one short name
               ("void f<2>(int)", 40, 45), ("nvjet_a", 50, 80), ("loop_fusion", 90, 91)]
    top = kernel_times.top_kernels(kernels, steps=2, count=3)
    assert top == [("f<1>", "other", 1.0, 15.0), ("nvjet_a", "gemm", 0.5, 15.0),
                   ("f<2>", "other", 0.5, 2.5)]
    lines = kernel_times.kernel_table(top, width=4).splitlines()
    assert lines[0].split() == ["us/step", "calls", "kind", "kernel"]
    assert lines[1].split() == ["15.0", "1.0", "other", "f<1>"]
    assert lines[2].split() == ["15.0", "0.5", "gemm", "n..."]   # cut to the width
    assert kernel_times.top_kernels(kernels, steps=1, count=0) == []


def test_cli_refuses_a_machine_without_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert step_profile.main(["--config", "tiny"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert step_profile.main(["--recipes", "fp4"]) == 2
    assert "--recipes: unknown ['fp4']" in capsys.readouterr().err
    assert step_profile.main(["--kernels", "-1"]) == 2
    assert "--kernels=-1 must be >= 0" in capsys.readouterr().err
