# fp8kit's two commands (see README.md):
#   make demo   installs what it needs, builds fp8kit, trains in FP8 and bf16
#   make test   installs what it needs, runs every test once
# Both work on a fresh Debian machine with no GPU and only package
# registries reachable. Everything Python goes into $(VENV).
#
# Which runner runs which tests (docs/testing.md has the counts):
#   Bazel  every Bazel test target of fp8kit (GoogleTest of the core, the
#          JAX, PyTorch and hardening suites, the build-sync check), run
#          from examples/bazel_consumer, where fp8kit is another
#          workspace's dependency, so they also prove that use works;
#   pip    the tests of what the installed wheel offers beyond the
#          libraries (the decoder and its trainers, the demo and bench
#          CLIs) and of the documentation (every README and docs/ example
#          runs), against `pip install .`.
# Bazel caches test results and the pip stage keeps a stamp, so a re-run
# repeats only what a change touched.

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
JOBS ?= $(shell nproc)
# The pinned stack: torch's CPU build on CI machines; the rest from PyPI.
# flax (optional for fp8kit) is here for the tests of fp8kit.jax.flax.
PY_DEPS := torch==2.13.0 jax flax ml_dtypes numpy safetensors pybind11 scikit-build-core ninja \
           pytest pytest-xdist hypothesis absl-py matplotlib

# The tests run against the installed wheel (the rest run under Bazel).
WHEEL_TESTS := tests/models tests/test_bench.py tests/test_demo.py \
               tests/test_ab_bench.py tests/test_compare_bench.py tests/test_docs_examples.py \
               tests/test_results_table.py
# What the wheel is built from, and what its tests read: a change to any
# of these files runs the install, or the tests, again.
# (wildcard: a tracked file deleted in the working tree is no input.)
WHEEL_SOURCES := $(wildcard $(shell git ls-files -- CMakeLists.txt cmake pyproject.toml common \
                   jax_ext torch_ext fp8kit 2>/dev/null))
WHEEL_TEST_INPUTS := $(wildcard $(shell git ls-files -- $(WHEEL_TESTS) tests/conftest.py README.md \
                       docs scripts 2>/dev/null))
INSTALLED := build/wheel-installed.stamp
WHEEL_TESTED := build/wheel-tests-passed.stamp

.PHONY: demo test venv system-deps install bazel-test bazel-cuda-build pip-test clean

# Run from outside the source tree so `import fp8kit` is the installed
# package (with its compiled extensions), not ./fp8kit.
demo: install
	cd /tmp && "$(abspath $(PY))" -m fp8kit.demo --out "$(CURDIR)/out/demo_loss.png"

test: system-deps venv bazel-test bazel-cuda-build pip-test
	@echo "make test: all passed"

$(VENV)/.deps-stamp: Makefile
	@echo "venv: installing Python packages into $(VENV) (about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install --progress-bar off $(PY_DEPS) | awk '/^(Collecting|Successfully)/{print "  " $$0; fflush()}'
	touch $@

venv: $(VENV)/.deps-stamp

# Bazel (Debian's bazel-bootstrap) and GoogleTest (libgtest-dev).
system-deps:
	@if ! command -v bazel >/dev/null || [ ! -f /usr/include/gtest/gtest.h ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q bazel-bootstrap libgtest-dev; \
	fi

# pip install . (CPU build; the CUDA part is compile-checked by
# bazel-cuda-build). The compiler's progress is shown line by line; the
# whole log is in build/pip-install.log.
install: $(INSTALLED)
$(INSTALLED): $(VENV)/.deps-stamp $(WHEEL_SOURCES)
	@mkdir -p build/pip
	@echo "install: compiling fp8kit's core and its two extensions (about 1.5 minutes on 2 cores)"
	@$(PIP) install -v --no-build-isolation --force-reinstall --no-deps \
	  -Ccmake.define.FP8KIT_CUDA=OFF -Cbuild-dir=build/pip . 2>&1 \
	  | tee build/pip-install.log \
	  | awk '/^ *\[[0-9]+\/[0-9]+\] /{print "  " $$0; fflush()}' \
	  || { tail -n 60 build/pip-install.log; echo "install: failed (build/pip-install.log)"; exit 1; }
	@touch $@

# Every Bazel test target of fp8kit, from a workspace that depends on it
# (examples/bazel_consumer: its own tests, then all of fp8kit's). In
# fp8kit's own workspace every BUILD file is loaded and every target
# analysed, without compiling the same sources a second time.
# FP8KIT_PYTHON tells the configure rule which interpreter (with jax and
# torch) to take headers and run tests from.
BAZEL_ENV := PATH="$(abspath $(VENV))/bin:$$PATH" FP8KIT_PYTHON="$(abspath $(PY))"
bazel-test: venv
	$(BAZEL_ENV) bazel build --nobuild //...
	cd examples/bazel_consumer && $(BAZEL_ENV) bazel test --jobs=$(JOBS) //... @fp8kit//...

# cuBLASLt for CUDA builds on a machine whose toolkit has none.
CUBLAS_WHEEL = $(PY) -c "import nvidia.cu13" 2>/dev/null || $(PIP) install -q nvidia-cublas

# With nvcc on the machine (no GPU needed), compile every CUDA source of
# the core for sm_90 and link against it the consumer's C test, fp8kit's
# GoogleTest binary with its CUDA tests, and the package's shared core
# (libfp8kit.so, CUDA's runtime inside) with the JAX module that links it,
# so that a CUDA build break cannot land unnoticed (nothing runs there;
# the GPU run is scripts/gpu_check.sh). Its own output tree
# (--platform_suffix), so the CPU build's outputs stay cached.
bazel-cuda-build: venv
	@if command -v nvcc >/dev/null; then \
	  $(CUBLAS_WHEEL); \
	  cd examples/bazel_consumer && $(BAZEL_ENV) bazel build --jobs=$(JOBS) \
	    --@fp8kit//:cuda=true --platform_suffix=cuda //:c_api_test @fp8kit//tests/cpp:fp8kit_core_test \
	    @fp8kit//fp8kit:libfp8kit.so @fp8kit//fp8kit:_jax_ext.so; \
	  echo "bazel-cuda-build: the CUDA core, the C API test, the CUDA GoogleTest binary, libfp8kit.so and the JAX module built for sm_90"; \
	else echo "bazel-cuda-build: no nvcc, skipped"; fi

# The wheel's tests, run from outside the source tree so `import fp8kit`
# finds the installed package. pytest-xdist spreads the test files over
# JOBS workers; --dist loadfile keeps each file in one worker, so that its
# module-scoped fixtures are set up once.
pip-test: $(WHEEL_TESTED)
$(WHEEL_TESTED): $(INSTALLED) $(WHEEL_TEST_INPUTS)
	cd /tmp && "$(abspath $(VENV))/bin/pytest" -q -p no:cacheprovider -n $(JOBS) --dist loadfile \
	  $(addprefix $(CURDIR)/,$(WHEEL_TESTS))
	@touch $@

clean:
	rm -rf build $(VENV)
	-bazel clean --expunge 2>/dev/null
	-cd examples/bazel_consumer && bazel clean --expunge 2>/dev/null
