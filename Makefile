# fp8kit's two commands (see README.md):
#   make demo   installs what it needs, builds fp8kit, trains in FP8 and bf16
#   make test   installs what it needs, runs every test (Bazel + pip install)
# Both work on a fresh Debian machine with no GPU and only package
# registries reachable. Everything Python goes into $(VENV).

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
JOBS ?= $(shell nproc)
# The pinned stack: torch's CPU build on CI machines; the rest from PyPI.
# flax (optional for fp8kit) is here for the tests of fp8kit.jax.flax.
PY_DEPS := torch==2.13.0 jax flax ml_dtypes numpy pybind11 scikit-build-core ninja \
           pytest pytest-xdist hypothesis absl-py matplotlib

.PHONY: demo test venv system-deps install bazel-test bazel-consumer-test pip-test \
        cuda-compile-check clean

# Run from outside the source tree so `import fp8kit` is the installed
# package (with its compiled extensions), not ./fp8kit.
demo: install
	cd /tmp && "$(abspath $(PY))" -m fp8kit.demo --out "$(CURDIR)/out/demo_loss.png"

test: system-deps venv cuda-compile-check bazel-test bazel-consumer-test pip-test
	@echo "make test: all passed"

$(VENV)/.deps-stamp: Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(PY_DEPS)
	touch $@

venv: $(VENV)/.deps-stamp

# Bazel (Debian's bazel-bootstrap) and GoogleTest (libgtest-dev).
system-deps:
	@if ! command -v bazel >/dev/null || [ ! -f /usr/include/gtest/gtest.h ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q bazel-bootstrap libgtest-dev; \
	fi

# pip install . (CPU build; the CUDA part is compile-checked separately).
install: venv
	$(PIP) install -q --no-build-isolation --force-reinstall --no-deps \
	  -Ccmake.define.FP8KIT_CUDA=OFF -Cbuild-dir=build/pip .

# Every test target under Bazel: GoogleTest of the core, py_tests of both
# front ends, the build-sync check. FP8KIT_PYTHON tells the configure rule
# which interpreter (with jax and torch) to take headers and run tests from.
BAZEL_ENV := PATH="$(abspath $(VENV))/bin:$$PATH" FP8KIT_PYTHON="$(abspath $(PY))"
bazel-test: venv
	$(BAZEL_ENV) bazel test --jobs=$(JOBS) //...

# fp8kit as another workspace's dependency (examples/bazel_consumer, which
# builds fp8kit as an external repository): its tests on the CPU, then with
# nvcc present its C API test against the CUDA core (compile and link only).
bazel-consumer-test: venv
	cd examples/bazel_consumer && $(BAZEL_ENV) bazel test --jobs=$(JOBS) //...
	@if command -v nvcc >/dev/null; then \
	  $(CUBLAS_WHEEL); \
	  cd examples/bazel_consumer && $(BAZEL_ENV) \
	    bazel build --jobs=$(JOBS) --@fp8kit//:cuda=true //:c_api_test; \
	  echo "bazel-consumer-test: C API test built against the CUDA core"; \
	else echo "bazel-consumer-test: no nvcc, CUDA build skipped"; fi

# The installed package passes the whole Python suite. Run from outside the
# source tree so `import fp8kit` finds the installed package. pytest-xdist
# spreads the test files over JOBS workers; --dist loadfile keeps each file
# in one worker, so that its module-scoped fixtures are set up once.
pip-test: install
	cd /tmp && "$(abspath $(VENV))/bin/pytest" -q -p no:cacheprovider -n $(JOBS) --dist loadfile \
	  "$(CURDIR)/tests"

# cuBLASLt for CUDA builds on a machine whose toolkit has none.
CUBLAS_WHEEL = $(PY) -c "import nvidia.cu13" 2>/dev/null || $(PIP) install -q nvidia-cublas

# With nvcc on the machine (no GPU needed), compile every CUDA source for
# sm_90, and build the GoogleTest binary with its CUDA tests, so that a CUDA
# build break in the core or in its tests cannot land unnoticed. cuBLASLt's
# headers come from the nvidia-cublas wheel when the toolkit has none.
cuda-compile-check: venv
	@mkdir -p build; if command -v nvcc >/dev/null; then \
	  $(CUBLAS_WHEEL); \
	  cmake -S . -B build/cuda-check -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	    -DPython_EXECUTABLE=$(abspath $(PY)) -DFP8KIT_CUDA=ON -DFP8KIT_JAX=OFF -DFP8KIT_TORCH=OFF \
	    -DFP8KIT_CUDA_ARCHITECTURES=90 -DFP8KIT_CPP_TESTS=ON >build/cuda-check.log 2>&1 || { cat build/cuda-check.log; exit 1; }; \
	  grep -q "building with CUDA" build/cuda-check.log || { cat build/cuda-check.log; echo "CUDA not enabled"; exit 1; }; \
	  cmake --build build/cuda-check -j $(JOBS) --target fp8kit_core fp8kit_core_test; \
	  echo "cuda-compile-check: every CUDA source and the CUDA GoogleTest binary built for sm_90"; \
	else echo "cuda-compile-check: no nvcc, skipped"; fi

clean:
	rm -rf build $(VENV)
	-bazel clean --expunge 2>/dev/null
	-cd examples/bazel_consumer && bazel clean --expunge 2>/dev/null
