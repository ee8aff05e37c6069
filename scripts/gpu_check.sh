#!/usr/bin/env bash
# shellcheck disable=SC2329  # the stage functions run through run_stage
# The whole GPU run on the H200, the one script everyone uses so numbers can
# be repeated: build with CMake (the pip path), print the device facts and
# the capability query, run the C++ and Python GPU tests, compute-sanitizer
# on every GPU test, then the benchmarks. Each stage writes a log to OUTDIR,
# and OUTDIR/run.txt says which tree ran, when, on which GPU and how.
#
#   scripts/gpu_check.sh [OUTDIR]          (default: out/gpu)
#   STAGES="build info cpp pytest sanitizer bench" scripts/gpu_check.sh
#   BENCH_SECTIONS=fused,linear STAGES=bench scripts/gpu_check.sh
#   (also, not by default: kprofile, the kernel times of one large Linear
#   step; models, the PyTorch decoder's tokens/s and memory at the 1b config,
#   8 sequences per step, and the 8b_slice, every recipe with
#   TransformerEngine where installed; models_jax, the same for the JAX
#   decoder (TE-JAX where installed); models_compile, the PyTorch 1b step
#   compiled whole next to torchao's (each of the three fills most of a
#   10-minute call); convergence, 1000 steps of the 1b decoder in FP8 and
#   bf16, with the FP8 runs' cast statistics every 50 steps and their
#   plots (CONVERGENCE_ARGS: more demo flags, e.g. "--seed 1");
#   step_profile, where a 1b step's GPU time goes and its 20 longest
#   kernels; fsdp, an FSDP2 step on every GPU (scripts/fsdp_bench.py,
#   FSDP_ARGS: its flags); power_cap,
#   the GPU's speed against its power cap (scripts/power_cap.py,
#   POWER_CAP_ARGS))
#   The sanitizer stage runs each (suite, tool) pair split into
#   SANITIZE_SHARDS processes (default 8; see sharded below), the pairs one
#   after another on one GPU and side by side on several (one lane of pairs
#   per GPU); SANITIZE_CPP_TOOLS / SANITIZE_PY_TOOLS pick the tools (see
#   sanitizer_py for the Python default); SANITIZE_TIMEOUT_S bounds each
#   sanitizer process (a C++ shard, one Python test file; default none), so
#   a cut one says so in its log; SANITIZE_DEADLINE_S bounds them all, from
#   the script's start (none starts after it), and the stage's log lists
#   every Python file's outcome
#   scripts/publish_results.py OUTDIR copies the run's results into
#   docs/results under fixed names (PUBLISH=1 does it at the end of the
#   run, for a GPU machine that holds the checkout).
# scripts/README.md lists this and the other tools.
#
# Needs: nvcc + cuBLASLt, python3 with torch and jax (the GPU machine's
# image). GoogleTest: libgtest-dev, or Debian's googletest source copied to
# .gpu_deps/googletest (see README, "Building on a CUDA machine").
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:-${OUT:-$REPO/out/gpu}}
# The settings this run was given, as a command that repeats it (run.txt):
# the environment variables this script reads, before the defaults below.
KNOBS=(STAGES BENCH_SECTIONS PYTEST_ARGS KPROFILE_ARGS MODEL_RECIPES MODEL_CONFIGS MODELS_ARGS
  CONVERGENCE_ARGS STEP_PROFILE_FRAMEWORKS STEP_PROFILE_ARGS FSDP_ARGS POWER_CAP_ARGS
  COMPUTE_SANITIZER SANITIZE_CPP_TOOLS SANITIZE_PY_TOOLS SANITIZE_SHARDS SANITIZE_TIMEOUT_S
  SANITIZE_DEADLINE_S SANITIZE_FLAGS SANITIZE_PY_FILES SANITIZE_XLA_ALLOCATOR
  SANITIZE_TARGET_PROCESSES)
INVOCATION=""
for knob in "${KNOBS[@]}"; do
  [ -n "${!knob+x}" ] && INVOCATION+="$knob=\"${!knob}\" "
done
INVOCATION+="scripts/gpu_check.sh"
STAGES=${STAGES:-build info cpp pytest sanitizer bench demo}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUTDIR"
: >"$OUTDIR/summary.log"
cd "$REPO" || exit 1
gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU'; }
# What scripts/publish_results.py writes into the header of each file it
# publishes from this run. The tree is named by git describe; where this
# checkout has no git (a copy of a working tree), RUN_STATE names it: the
# describe of the tree that was copied. repo and outdir let the publisher
# take this machine's paths out of the logs.
run_facts() {
  local state gpus
  state=${RUN_STATE:-$(git -C "$REPO" describe --always --dirty 2>/dev/null)}
  # Each model of GPU once, with its count: "NVIDIA H200", "2 x NVIDIA H200".
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
    awk '{n = $1; sub(/^ *[0-9]+ /, "")
          printf "%s%s%s", (NR > 1 ? ", " : ""), (n > 1 ? n " x " : ""), $0}')
  {
    echo "state: ${state:-unknown}"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "gpu: ${gpus:-none}"
    echo "command: $INVOCATION"
    echo "repo: $REPO"
    echo "outdir: $(cd "$OUTDIR" && pwd)"
  } >"$OUTDIR/run.txt"
}
run_facts
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
    return 1
  fi
}
has() { [[ " $STAGES " == *" $1 "* ]]; }
# Prints a command, then runs it: a benchmark's log starts with what ran.
show() { echo "\$ $*"; "$@"; }

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
# shellcheck disable=SC2086  # PYTEST_ARGS: zero or more arguments
pytests() { (cd /tmp && "$PY" -m pytest -q -p no:cacheprovider -rs ${PYTEST_ARGS:-} "$REPO/tests"); }
# compute-sanitizer over the whole GPU test suite, one stage and one log per
# (suite, tool): sanitizer-cpp-<tool> runs every test of fp8kit_core_test
# (no --gtest_filter) under memcheck, racecheck, synccheck and initcheck;
# sanitizer-py-<tool> runs every Python GPU test (pytest -m gpu: the GPU
# tests of tests/jax, tests/torch and tests/hardening, whose child processes
# --target-processes all follows) under each tool of SANITIZE_PY_TOOLS.
SANITIZER=${COMPUTE_SANITIZER:-compute-sanitizer}
# Set to "" to skip a suite (unset: the default tools).
SANITIZE_CPP_TOOLS=${SANITIZE_CPP_TOOLS-memcheck racecheck synccheck initcheck}
SANITIZE_PY_TOOLS=${SANITIZE_PY_TOOLS-memcheck synccheck initcheck}
SANITIZE_TIMEOUT_S=${SANITIZE_TIMEOUT_S:-0}   # 0: no limit
# SANITIZE_FLAGS: more compute-sanitizer flags for every tool, e.g.
# "--force-blocking-launches" (serial launches, a smaller footprint in the
# tool; it also runs fp8kit's programmatic dependent launches one after
# the other). SANITIZE_PY_FILES: test files (paths from the repo root) to
# run instead of every file with GPU tests, e.g. to rerun the ones whose
# sanitizer process crashed. SANITIZE_TARGET_PROCESSES: "all" (the
# default: child processes are checked too) or "application-only".
SANITIZE_FLAGS=${SANITIZE_FLAGS:-}
SANITIZE_PY_FILES=${SANITIZE_PY_FILES:-}
# SANITIZE_DEADLINE_S (0: none): seconds after this script started past
# which no sanitizer process starts and a running one is cut, so that a run
# under a wall-clock limit (a device call) still ends with every log
# written; each file or shard left out says so in its log.
SANITIZE_DEADLINE_S=${SANITIZE_DEADLINE_S:-0}
SCRIPT_START=$(date +%s)
process_limit() {  # prints the next sanitizer process's limit (0: none); fails past the deadline
  local limit=$SANITIZE_TIMEOUT_S left
  if ((SANITIZE_DEADLINE_S > 0)); then
    left=$((SCRIPT_START + SANITIZE_DEADLINE_S - $(date +%s)))
    ((left > 0)) || return 1
    ((limit == 0 || left < limit)) && limit=$left
  fi
  echo "$limit"
}
NOT_RUN=125   # sanitize's status for a process not started (past the deadline)
sanitize() {  # tool, extra sanitizer flags (one string, may be empty), command...
  local tool=$1 extra=$2 rc limit; shift 2
  limit=$(process_limit) ||
    { echo "NOT RUN: past SANITIZE_DEADLINE_S=$SANITIZE_DEADLINE_S s"; return $NOT_RUN; }
  # cuBLASLt's Hopper GEMMs move their operands and results with TMA bulk
  # copies, which memcheck and initcheck leave unchecked by default. Even
  # with this flag initcheck does not see those stores: the Python stage
  # reports each read of a GEMM's output (the bias add after an fp32 GEMM,
  # the activation kernel after the first MLP GEMM, the copy to the host)
  # as uninitialised, in tests whose results match their references.
  # tests/torch/test_torch_written_outputs.py answers without the tool
  # whether fp8kit writes every byte of its outputs (filled new memory).
  case $tool in memcheck|initcheck) extra="--check-bulk-copy yes${extra:+ $extra}" ;; esac
  # Kept to one process, the tool waits only 10 s (its default) for that
  # process to connect; a large test file still collecting while other
  # shards start took longer, and the process, left unattached, ran until
  # cut. Each process has its own limit, so the tool may wait as long.
  [ "${SANITIZE_TARGET_PROCESSES:-all}" = application-only ] && extra="--launch-timeout 0${extra:+ $extra}"
  extra="$extra${SANITIZE_FLAGS:+ $SANITIZE_FLAGS}"
  # shellcheck disable=SC2086  # $extra: zero or more flags, split on purpose
  timeout --kill-after=20 "$limit" "$SANITIZER" --tool "$tool" --error-exitcode 1 \
    --target-processes "${SANITIZE_TARGET_PROCESSES:-all}" --require-cuda-init no \
    --print-limit 200 $extra "$@"
  rc=$?
  [ "$rc" = 124 ] && echo "CUT: $tool ran past its limit of $limit s (SANITIZE_TIMEOUT_S=${SANITIZE_TIMEOUT_S}, SANITIZE_DEADLINE_S=${SANITIZE_DEADLINE_S}; no result)"
  return $rc
}
# N shards of one suite run at once, each writing <log>.<i>; the stage fails
# when any shard does. The C++ suite shards through GoogleTest's own
# GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX; the Python GPU tests by test file,
# round robin, one process per file (sanitize_py_shard). A sanitizer's report names the test, so nothing is lost by
# splitting.
SANITIZE_SHARDS=${SANITIZE_SHARDS:-8}
sharded() {  # command... (run with SHARD and SHARDS set, output to the shard's log)
  local pids=() rc=0 i
  for ((i = 0; i < SANITIZE_SHARDS; i++)); do
    SHARD=$i SHARDS=$SANITIZE_SHARDS "$@" >"$OUTDIR/$STAGE_NAME.$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "shard $i failed: $STAGE_NAME.$i.log"; rc=1; }
  done
  return $rc
}
sanitizer_cpp() {  # tool
  # Every test runs under every tool. memcheck and racecheck check every
  # kernel (restricted to fp8kit's kernels racecheck fails on cuBLASLt's
  # with "failed to handle a hardware exception"); synccheck and initcheck
  # check fp8kit's own kernels (kns=fp8kit). memcheck runs the GEMM
  # autotuner as users do (its scratch output and fallbacks included); the
  # other tools run with FP8KIT_GEMM_AUTOTUNE=0: autotuning a new GEMM
  # shape launches cuBLASLt up to 8 x 41 times (no fp8kit kernel among
  # them), a second or more each under racecheck, which made racecheck
  # alone outlast a 10-minute call.
  # Under racecheck the cuBLASLt many-threads test runs 4 iterations per
  # thread instead of 40 (FP8KIT_STRESS_ITERATIONS): its plan-cache races
  # happen at each thread's first calls, and 8 x 40 GEMMs at a second or
  # more each outlasted the stage (cut at 150-185 s).
  local only_ours="" tune=0 stress=""
  case $1 in synccheck|initcheck) only_ours="--kernel-name kns=fp8kit" ;; esac
  [ "$1" = memcheck ] && tune=1
  [ "$1" = racecheck ] && stress=4
  FP8KIT_STRESS_ITERATIONS=$stress FP8KIT_GEMM_AUTOTUNE=$tune \
    STAGE_NAME=sanitizer-cpp-$1 sharded env_shard_gtest \
    sanitize "$1" "$only_ours" "$REPO"/build/gpu-cpp/fp8kit_core_test --gtest_color=no
}
env_shard_gtest() { GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$SHARD "$@"; }
# The test files that hold GPU tests, "count path" a line, most tests
# first: collected once, without a sanitizer (a file with none would only
# start torch and jax under the tool to deselect everything). The
# memory-growth test is left out: it bounds the host RSS of a process with
# nothing injected into it, and a sanitizer's agent in the process
# allocates as the kernels run; the kernels it calls (quantizers, Linear
# steps) are the ones every other file runs here.
gpu_test_files() {
  (cd /tmp && "$PY" -m pytest --collect-only -q -p no:cacheprovider -m gpu "$REPO/tests") |
    sed -n 's/::.*//p' | grep -v 'hardening/test_memory_growth.py' | sort | uniq -c | sort -rn
}
# The files of shard SHARD of SHARDS: round robin down that list, so each
# shard gets a share of the large files.
py_shard_files() {
  local i=0 count f
  while read -r count f; do
    ((i++ % SHARDS == SHARD)) && echo "$REPO/$f"
  done <"$OUTDIR/sanitizer-py-files.txt"
}
# Python + torch + jax processes, and which tools are practical there:
#  - memcheck checks every kernel (fp8kit's, cuBLASLt's, the frameworks').
#    The frameworks' pooling allocators would hide an out-of-bounds access
#    inside a pooled block, so both allocate each buffer on its own here
#    (PYTORCH_NO_CUDA_MEMORY_CACHING=1, XLA_PYTHON_CLIENT_ALLOCATOR=platform):
#    memcheck then sees every fp8kit output's true bounds.
#    SANITIZE_XLA_ALLOCATOR picks another XLA allocator (bfc, cuda_async):
#    compute-sanitizer's own process has segfaulted in some JAX test
#    files (signal 11, no Python stack) under each of the three, and with
#    XLA's command buffers off, a different set of files each run. It does
#    so on a bf16 JAX decoder that runs no fp8kit kernel too. It dies only
#    while following child processes (with --target-processes-filter
#    python3 too); kept to the test process the same programs run clean,
#    so such a file runs again that way (sanitize_py_shard). The H200 runs
#    that showed this: git log -- 'docs/results/sanitizer*.txt'.
#  - --force-blocking-launches for every tool: with asynchronous launches
#    that crash hit 4-5 JAX test files under each tool; with serialized
#    ones two of four such files ran clean under synccheck (two still
#    crash it: a vmap'd dense and the demo's JAX-and-torch run). Each
#    tool's checks are within a kernel, so serializing loses none.
#  - synccheck checks fp8kit's kernels only (--kernel-name kns=fp8kit:
#    every fp8kit kernel lives in namespace fp8kit).
#  - initcheck checks every kernel: under a kernel filter it does not track
#    the writes of the kernels it skips, so every fp8kit read of a tensor
#    torch wrote (torch.randn's output, say) was reported. XLA's autotuner,
#    which runs candidates on buffers it never initialises, is off (below).
#    It prints no backtrace (--show-backtrace no): each read of a GEMM's
#    output is a report per access (the blind spot noted in sanitize), and
#    a host backtrace for each made one test of test_torch_gemm outlast
#    150 s; without them the file ran in 36 s. A report then names the API
#    call or the device function that read, which for a load inlined from
#    a helper is the helper (fp8kit's 16-byte __ldg), not the kernel; the
#    verbose log names the test.
#  - racecheck is not in the default list: restricted to fp8kit's kernels
#    it stops with "failed to handle a hardware exception" (as in the C++
#    suite), and over every kernel of torch and XLA it would take hours.
#    fp8kit's kernels are racechecked by the C++ stage, which runs each
#    of them (SANITIZE_PY_TOOLS can still name it).
#  - --report-api-errors no: torch and XLA probe the driver with calls that
#    are expected to fail (pointer attributes of host memory, optional
#    symbols) and handle the result; reported, each would fail the stage.
#    The device-side checks are unaffected; the C++ stages keep the
#    default, where a failing API call is fp8kit's own bug.
#  - Slower kernels: the hardening suite's hypothesis deadline is turned off
#    and its child timeout raised; its example counts are quartered.
#  - Threads: the tool deadlocks in the CUDA driver when the autograd
#    engine's thread launches while another thread allocates, so the
#    thread-stress checks that run backward on several threads skip here
#    (FP8KIT_HARDENING_UNDER_SANITIZER=1; tests/hardening/stress_threads.py).
#  - No autotuning, fp8kit's (FP8KIT_GEMM_AUTOTUNE=0; the C++ memcheck
#    stage covers it) or XLA's (--xla_gpu_autotune_level=0): both time many
#    candidate kernels per new shape, each slowed by the tool, and none of
#    them is an fp8kit kernel.
sanitizer_py() {  # tool
  local flags="--report-api-errors no --force-blocking-launches"
  case $1 in
    synccheck|racecheck) flags="$flags --kernel-name kns=fp8kit" ;;
    initcheck) flags="$flags --show-backtrace no" ;;
  esac
  if [ -n "$SANITIZE_PY_FILES" ]; then
    # shellcheck disable=SC2086  # a list of paths, split on purpose
    printf '1 %s\n' $SANITIZE_PY_FILES >"$OUTDIR/sanitizer-py-files.txt"
  else
    [ -s "$OUTDIR/sanitizer-py-files.txt" ] || gpu_test_files >"$OUTDIR/sanitizer-py-files.txt"
  fi
  [ -s "$OUTDIR/sanitizer-py-files.txt" ] || { echo "no GPU test collected"; return 1; }
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    XLA_PYTHON_CLIENT_ALLOCATOR=${SANITIZE_XLA_ALLOCATOR:-platform} \
    FP8KIT_GEMM_AUTOTUNE=0 XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0" \
    FP8KIT_HARDENING_DEADLINE_MS=none FP8KIT_HARDENING_TIMEOUT_S=3600 \
    FP8KIT_HARDENING_EXAMPLES=0.25 FP8KIT_HARDENING_UNDER_SANITIZER=1 \
    STAGE_NAME=sanitizer-py-$1 sharded sanitize_py_shard "$1" "$flags")
  local rc=$?
  # Every file's outcome in the stage's own log, the shards' logs in turn.
  grep -h '^#### .* rc=' "$OUTDIR/sanitizer-py-$1".*.log | sed "s|$REPO/||"
  return $rc
}
sanitize_py_shard() {  # tool, flags
  # One sanitizer process per test file, verbose: a file whose process
  # crashes (compute-sanitizer itself has segfaulted under torch + jax
  # here) or is cut costs only that file, and the log names the file and
  # the test that was running; -X faulthandler prints the Python stack of
  # a crash in the test process (none: the tool itself crashed). The shard
  # fails when any file does.
  # A file whose tool died (signal 11: following child processes, see
  # sanitizer_py's notes) runs again with the tool kept to the test
  # process (application-only), and its result line says so: the rerun
  # does not check its children's GPU work (all of it in the hardening,
  # distributed and sharding files). A crash of the test process itself
  # would repeat in the rerun.
  local f rc shard_rc=0 cmd rerun
  for f in $(py_shard_files); do
    echo "#### $f"
    cmd=("$PY" -X faulthandler -m pytest -v -p no:cacheprovider -rs -m gpu "$f")
    sanitize "$1" "$2" "${cmd[@]}"
    rc=$? rerun=""
    if ((rc == 139)); then
      rerun=" (rerun after the tool died: the test process checked, not its children)"
      echo "#### $f: the tool died (signal 11); rerun with the tool kept to the test process"
      SANITIZE_TARGET_PROCESSES=application-only sanitize "$1" "$2" "${cmd[@]}"
      rc=$?
    fi
    [ $rc = 5 ] && rc=0   # pytest: no GPU test in this file
    echo "#### $f rc=$rc$rerun$( ((rc > 128)) && echo " (signal $((rc - 128)))"
      ((rc == NOT_RUN)) && echo " (not run: past the deadline)")"
    ((rc == 0)) || shard_rc=1
  done
  return $shard_rc
}
# BENCH_SECTIONS picks the suite's sections (python -m fp8kit.bench
# --sections; default all): the whole suite takes longer than one device call.
# Each stage that writes files besides its log first removes those of an
# earlier run into the same OUTDIR, which publish_results.py would take for
# this run's.
bench() {
  # The suite (python -m fp8kit.bench) measures every anchor in the same run.
  local sections=()
  rm -rf "$OUTDIR/bench"
  [ -n "${BENCH_SECTIONS:-}" ] && sections=(--sections "$BENCH_SECTIONS")
  (cd /tmp && with_torch_cudnn show "$PY" -m fp8kit.bench --full --out "$OUTDIR/bench" \
    --plain-progress "${sections[@]}")
}
demo() {
  rm -f "$OUTDIR"/demo_loss.*
  (cd /tmp && show "$PY" -m fp8kit.demo --out "$OUTDIR/demo_loss.png")
}
# Kernel times of one large Linear step (not a measurement of record);
# KPROFILE_ARGS: the tool's flags, e.g. "--frameworks torch --layers compile".
kprofile() {
  local extra=()
  read -r -a extra <<<"${KPROFILE_ARGS:-}"
  (cd /tmp && with_torch_cudnn show "$PY" "$REPO/scripts/kernel_profile.py" "${extra[@]}")
}
# The decoder (python -m fp8kit.models.bench; each compile of the 1b step
# takes 1.5-2 minutes on the H200).
# MODEL_RECIPES: the recipes the models stages run; MODELS_ARGS: more
# models.bench flags for them (e.g. "--float32-seams": fp8kit's fused
# layers read the float32 residual stream, instead of the default bf16
# seams).
# MODEL_CONFIGS: which of the two configs they run (the JAX 1b alone, five
# recipes, outlasts a 10-minute call: "8b_slice" runs the other alone).
MODEL_RECIPES=${MODEL_RECIPES:-bf16,delayed,current,te-delayed,te-current}
MODEL_CONFIGS=${MODEL_CONFIGS:-1b 8b_slice}
models_in() {  # framework
  local extra=() config batch
  read -r -a extra <<<"${MODELS_ARGS:-}"
  rm -f "$OUTDIR"/models_*_"$1".json
  for config in $MODEL_CONFIGS; do
    batch=1
    [ "$config" = 1b ] && batch=8   # the 1b is measured at 8 x 2048 tokens per step
    (cd /tmp && show "$PY" -m fp8kit.models.bench --config "$config" --batch "$batch" \
      --frameworks "$1" --recipes "$MODEL_RECIPES" "${extra[@]}" \
      --json "$OUTDIR/models_${config}_$1.json") || return 1
  done
}
# Two cuDNNs on the GPU machine: torch's (.../nvidia/cudnn/lib) and the
# system's. The PyTorch stages run with torch's first on LD_LIBRARY_PATH:
# without it TransformerEngine, imported before torch first used cuDNN,
# brought the system's, and TE's decoder step spent 7.40 ms a step in
# attention against 4.24 ms with it (H100, 8b_slice, the same SDPA call),
# a slowdown of the peer that is no part of what the rows compare; TE-JAX,
# imported after torch, fails on cuDNN symbols without it. The JAX-only
# stages run without it: with it the JAX decoder's cuDNN attention fails to
# build (CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED) once TE-JAX is imported.
with_torch_cudnn() {
  local folder
  folder=$("$PY" -c 'from fp8kit.bench.te_peer import torch_cudnn_lib
print(torch_cudnn_lib() or "")' 2>/dev/null)
  LD_LIBRARY_PATH=${folder:+$folder${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-} "$@"
}
without_torch_cudnn() {
  local kept
  kept=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v -e '/nvidia/cudnn/lib' -e '^$' | paste -sd:)
  (
    unset LD_LIBRARY_PATH
    [ -n "$kept" ] && export LD_LIBRARY_PATH=$kept
    "$@"
  )
}
models() { with_torch_cudnn models_in torch; }
models_jax() { without_torch_cudnn models_in jax; }
# torchao first: its compilation takes the longest (for the 1b decoder it
# had not finished after 150 s, twice), and a call's time limit should cut
# fp8kit's rows, which other stages measure too, rather than the peer's.
# Compiled runs only: the eager rows are the models stage's, and each run
# spends minutes compiling.
models_compile() {
  local extra=()
  read -r -a extra <<<"${MODELS_ARGS:-}"
  rm -f "$OUTDIR/models_1b_compile.json"
  (cd /tmp && with_torch_cudnn show "$PY" -m fp8kit.models.bench --config 1b --batch 8 \
    --frameworks torch --recipes torchao,bf16,delayed --compile-only --steps 15 "${extra[@]}" \
    --json "$OUTDIR/models_1b_compile.json")
}
# CONVERGENCE_ARGS: more demo flags, one run per OUTDIR. "--seed 1" (other
# initial weights and batch order) shows how far two bf16 runs differ, the
# scale against which FP8's difference from bf16 is read; "--float32-seams"
# has the FP8 model's fused layers read the float32 residual stream instead
# of the bf16 model's seams (the default, where only FP8's casts tell the
# two apart).
convergence() {
  local extra=()
  read -r -a extra <<<"${CONVERGENCE_ARGS:-}"
  rm -f "$OUTDIR"/convergence_1b.* "$OUTDIR"/convergence_1b_fp8_*
  (cd /tmp && show "$PY" -m fp8kit.demo --config 1b --steps 1000 --batch 1 "${extra[@]}" \
    --out "$OUTDIR/convergence_1b.png")
}
# STEP_PROFILE_FRAMEWORKS: the decoders profiled (torch, jax or torch,jax;
# default torch); STEP_PROFILE_ARGS: more step_profile flags, after the
# defaults so they replace them (e.g. "--config 8b_slice --batch 1
# --recipes delayed,te-delayed --kernels 25").
step_profile() {
  local extra=()
  read -r -a extra <<<"${STEP_PROFILE_ARGS:-}"
  local framework env frameworks=${STEP_PROFILE_FRAMEWORKS:-torch}
  # One process per framework, each with its cuDNN (with_torch_cudnn says why).
  for framework in ${frameworks//,/ }; do
    env=with_torch_cudnn
    [ "$framework" = jax ] && env=without_torch_cudnn
    (cd /tmp && $env show "$PY" -m fp8kit.models.step_profile --config 1b --batch 8 \
      --frameworks "$framework" --recipes bf16,delayed,te-current --kernels 20 \
      "${extra[@]}") || return 1
  done
}
# FSDP2 with one rank per GPU of the machine; FSDP_ARGS: more fsdp_bench.py
# flags (after --ranks, so they may replace it), e.g. "--model decoder".
fsdp() {
  local extra=()
  read -r -a extra <<<"${FSDP_ARGS:-}"
  (cd /tmp && show "$PY" "$REPO/scripts/fsdp_bench.py" --ranks "$(gpu_count)" "${extra[@]}")
}
# Is the GPU's FP8 speed set by its power cap? POWER_CAP_ARGS: power_cap.py's flags.
power_cap() {
  local extra=()
  read -r -a extra <<<"${POWER_CAP_ARGS:-}"
  (cd /tmp && show "$PY" "$REPO/scripts/power_cap.py" "${extra[@]}")
}

has build && run_stage build build
has info && run_stage info info
has cpp && run_stage cpp cpp
has pytest && run_stage pytest pytests
# The sanitizer's (suite, tool) pairs in lanes, one lane per GPU (pair i in
# lane i mod GPUs), each lane's pairs one after another on its GPU. On one
# GPU all pairs at once slowed each other far past the sum of their times
# (the processes share the GPU by time slicing); a lane's shards share it.
# A lane sees only its GPU, so under the sanitizer the tests that need two
# GPUs skip (their kernels are the one-GPU tests' kernels).
sanitizer_lanes() {
  local pairs=() gpus lane i pids=() rc=0
  for tool in $SANITIZE_CPP_TOOLS; do pairs+=("cpp $tool"); done
  for tool in $SANITIZE_PY_TOOLS; do pairs+=("py $tool"); done
  gpus=$(gpu_count)
  ((gpus >= 1)) || gpus=1
  ((gpus > ${#pairs[@]})) && gpus=${#pairs[@]}
  for ((lane = 0; lane < gpus; lane++)); do
    (
      lane_rc=0
      ((gpus > 1)) && export CUDA_VISIBLE_DEVICES=$lane
      for ((i = lane; i < ${#pairs[@]}; i += gpus)); do
        read -r suite tool <<<"${pairs[$i]}"
        run_stage "sanitizer-$suite-$tool" "sanitizer_$suite" "$tool" || lane_rc=1
      done
      exit $lane_rc
    ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}
if has sanitizer; then sanitizer_lanes || status=1; fi
has bench && run_stage bench bench
has demo && run_stage demo demo
has kprofile && run_stage kprofile kprofile
has models && run_stage models models
has models_jax && run_stage models_jax models_jax
has models_compile && run_stage models_compile models_compile
has convergence && run_stage convergence convergence
has step_profile && run_stage step_profile step_profile
has fsdp && run_stage fsdp fsdp
has power_cap && run_stage power_cap power_cap
if [ "${PUBLISH:-0}" = 1 ]; then
  "$PY" "$REPO/scripts/publish_results.py" "$OUTDIR" || status=1
fi
exit $status
