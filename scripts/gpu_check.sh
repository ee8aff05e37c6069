#!/usr/bin/env bash
# The whole GPU run on the H200, the one script everyone uses so numbers can
# be repeated: build with CMake (the pip path), print the device facts and
# the capability query, run the C++ and Python GPU tests, compute-sanitizer
# on the kernels, then the benchmarks. Each stage writes a log to OUTDIR.
#
#   scripts/gpu_check.sh [OUTDIR]          (default: out/gpu)
#   STAGES="build info cpp pytest sanitizer bench" scripts/gpu_check.sh
#   (also: kprofile, the kernel times of one large Linear step)
# scripts/README.md lists this and the other tools.
#
# Needs: nvcc + cuBLASLt, python3 with torch and jax (the GPU machine's
# image). GoogleTest: libgtest-dev, or Debian's googletest source copied to
# .gpu_deps/googletest (see README, "Building on a CUDA machine").
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:-${OUT:-$REPO/out/gpu}}
STAGES=${STAGES:-build info cpp pytest sanitizer bench demo}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUTDIR"
: >"$OUTDIR/summary.log"
cd "$REPO"
# JAX takes 75% of GPU memory by default; torch shares the GPU in these runs.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
# Wheels of packages the GPU machine lacks (torchao for the anchors) travel
# in .whl/ (git-ignored) and are installed into a private target dir.
if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp8kit-wheels "$REPO"/.whl/*.whl &&
    export PYTHONPATH=/tmp/fp8kit-wheels${PYTHONPATH:+:$PYTHONPATH}
fi
status=0
run_stage() {  # name, command...
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUTDIR/summary.log"
  local t0=$SECONDS
  if "$@" >"$OUTDIR/$name.log" 2>&1; then
    echo "   $name ok ($((SECONDS - t0)) s)" | tee -a "$OUTDIR/summary.log"
  else
    echo "   $name FAILED ($((SECONDS - t0)) s); tail:" | tee -a "$OUTDIR/summary.log"
    tail -n 40 "$OUTDIR/$name.log" | tee -a "$OUTDIR/summary.log"
    status=1
  fi
}
has() { [[ " $STAGES " == *" $1 "* ]]; }

build() {
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  # The GPU image's default compiler (/opt/gcc) links libstdc++ statically;
  # an extension built that way shares the process with torch's and jaxlib's
  # shared libstdc++, and the first std::ostream use crashes (two copies of
  # the locale facets). Build with the system g++, which links it shared.
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
  "$PY" -m pip install --no-build-isolation --no-deps --force-reinstall -v \
    -Ccmake.define.FP8KIT_CUDA=ON -Ccmake.define.FP8KIT_CUDA_ARCHITECTURES=90 \
    -Cbuild-dir=build/gpu-pip-sysgcc . || return 1
  local gtest=()
  [ -d .gpu_deps/googletest ] && gtest=(-DFP8KIT_GTEST_SOURCE_DIR="$REPO/.gpu_deps/googletest")
  cmake -S . -B build/gpu-cpp -G Ninja -DPython_EXECUTABLE="$(command -v "$PY")" \
    -DFP8KIT_CUDA=ON -DFP8KIT_CUDA_ARCHITECTURES=90 -DFP8KIT_JAX=OFF -DFP8KIT_TORCH=OFF \
    -DFP8KIT_CPP_TESTS=ON "${gtest[@]}" && cmake --build build/gpu-cpp -j "$JOBS"
}
info() {
  nvidia-smi
  (cd /tmp && "$PY" - <<'PY'
import fp8kit.torch as ft, torch, jax
print("torch", torch.__version__, "jax", jax.__version__, "device", torch.cuda.get_device_name())
print("capability", torch.cuda.get_device_capability())
print("fp8kit built with CUDA:", ft.built_with_cuda())
print("supports non-TN FP8 GEMM on cuda:0 ->", ft.supports_non_tn_fp8_gemm(torch.device("cuda", 0)))
PY
  )
}
cpp() { "$REPO"/build/gpu-cpp/fp8kit_core_test --gtest_color=no; }
# PYTEST_ARGS="-m gpu" runs only the GPU tests.
pytests() { (cd /tmp && "$PY" -m pytest -q -p no:cacheprovider -rs ${PYTEST_ARGS:-} "$REPO/tests"); }
sanitizer() {
  local t="$REPO"/build/gpu-cpp/fp8kit_core_test
  compute-sanitizer --tool memcheck --error-exitcode 1 $t --gtest_filter='*Cuda*:*Gpu*:*GPU*' &&
  compute-sanitizer --tool racecheck --error-exitcode 1 $t --gtest_filter='*Cuda*Quant*:*Gpu*Quant*:*Cuda*Amax*:*Cuda*Transpose*:*CudaColumnSums*'
}
bench() {
  # The suite (python -m fp8kit.bench) measures every anchor in the same run.
  (cd /tmp && "$PY" -m fp8kit.bench --full --out "$OUTDIR/bench" --plain-progress)
}
demo() { (cd /tmp && "$PY" -m fp8kit.demo --out "$OUTDIR/demo_loss.png"); }
# Kernel times of one large Linear step (not a measurement of record).
kprofile() { (cd /tmp && "$PY" "$REPO/scripts/kernel_profile.py"); }

has build && run_stage build build
has info && run_stage info info
has cpp && run_stage cpp cpp
has pytest && run_stage pytest pytests
has sanitizer && run_stage sanitizer sanitizer
has bench && run_stage bench bench
has demo && run_stage demo demo
has kprofile && run_stage kprofile kprofile
exit $status
