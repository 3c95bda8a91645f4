# Thin wrapper around CMake. `make` builds build/slideformer; `make demo` and `make test` first
# install any missing Debian packages (tools/install-deps.sh), then build, then run.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# New build trees use Ninja where it is installed (tools/install-deps.sh installs it): it compiles a
# target's sources while the libraries it links are still building (Make waits for each library),
# so that -j keeps every core busy through the targets' boundaries. Existing trees keep theirs.
GENERATOR ?= $(if $(shell command -v ninja 2>/dev/null),-G Ninja)

.PHONY: all deps configure build demo test gpu-test asan-test tsan-test fuzz fuzz-smoke format clean

all: build

deps:
	@bash tools/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs only the binary: not the test suite, the fuzz replays or the benchmarks.
demo: deps
	@$(MAKE) --no-print-directory configure
	cmake --build $(BUILD) -j $(JOBS) --target slideformer
	$(BUILD)/slideformer demo

# ctest: JOBS `cpu` slots (one a core) for the CPU-bound tests, TEST_JOBS tests at a time in all: the
# sliding-vs-resident cases take no slot (they sleep through the cpu device's injected delays:
# CMakeLists.txt), so they run beside the others instead of holding a core each.
# OPENBLAS_NUM_THREADS=1: OpenBLAS starts its thread pool when it is loaded, before main, and the
# cpu backend sets it to one thread before its first product anyway (backend/cpu/matmul.cpp), so the
# pool was only a start-up cost of each test process (ASan+UBSan sf_tests: 0.45 -> 0.31 s of CPU).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) * 4 )))
CTEST = printf '{"version":{"major":1,"minor":0},"local":[{"cpu":[{"id":"0","slots":%s}]}]}\n' $(JOBS) \
          >cpu_slots.json && OPENBLAS_NUM_THREADS=1 $(1) ctest --output-on-failure -j $(or $(2),$(TEST_JOBS)) --resource-spec-file cpu_slots.json
# The TSan run is mostly sleepers (~0.15 core each there), its CPU-bound tests done in ~70 s: twice
# as many at once keeps the cores busy to its end (CMakeLists.txt also starts its longest first).
TSAN_TEST_JOBS ?= $(shell echo $$(( $(JOBS) * 8 )))

test: deps
	@$(MAKE) --no-print-directory build
	cd $(BUILD) && $(call CTEST)

gpu-test: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

# Sanitizer builds of the CPU backend (-O1 -g, every finding fatal). ASan+UBSan: the whole CPU
# suite; TSan: the tests of the threads (sf_engine_tests: the engines, the NVMe store, the thread pool,
# a `train --offload` run; CMakeLists.txt picks them).
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
ASAN_TEST_EXCLUDE ?= ^$$
# Extra CMake flags of the sanitizer and fuzz trees (CI: -DSF_WERROR=ON).
SAN_CMAKE_FLAGS ?=

asan-test: deps
	@test -f $(ASAN_BUILD)/CMakeCache.txt || cmake -S . -B $(ASAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DSF_CUDA=OFF \
	  -DSF_SANITIZE=address,undefined $(SAN_CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target sf_tests slideformer $(FUZZ_TARGETS:%=fuzz_replay_%)
	cd $(ASAN_BUILD) && $(call CTEST,$(SAN_ENV)) -LE gpu -E '$(ASAN_TEST_EXCLUDE)'

tsan-test: deps
	@test -f $(TSAN_BUILD)/CMakeCache.txt || cmake -S . -B $(TSAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DSF_CUDA=OFF \
	  -DSF_SANITIZE=thread $(SAN_CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target sf_engine_tests slideformer
	cd $(TSAN_BUILD) && $(call CTEST,$(SAN_ENV),$(TSAN_TEST_JOBS))

# libFuzzer (clang): `make fuzz` runs every target FUZZ_SECONDS (default 1800) in turn, keeping what it
# finds in build-fuzz/corpus/<target> and crashes in build-fuzz/artifacts/<target>/ (copy those to
# fuzz/regressions/<target>/ once fixed: ctest replays them). `make fuzz-smoke`: 10 s each (CI: the
# harnesses build and run; the long runs are `make fuzz`).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 1800
FUZZ_TARGETS = safetensors config jsonl tokenizer yaml chat_template normalizer

$(FUZZ_BUILD)/CMakeCache.txt:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSF_CUDA=OFF -DSF_FUZZ=ON \
	  $(SAN_CMAKE_FLAGS)

# FUZZ_JOBS targets at a time (each fuzzer is one process on one core; the smoke runs JOBS at once,
# each target's output held in build-fuzz/fuzz_<target>.log and shown when it ends).
FUZZ_JOBS ?= 1
fuzz: deps $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@printf '%s\n' $(FUZZ_TARGETS) | xargs -P $(FUZZ_JOBS) -I{} sh -c 't={}; \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t $(FUZZ_BUILD)/artifacts/$$t; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  run() { $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -max_len=$$( [ $$t = tokenizer ] && echo 20000 || echo 4096 ) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$t/ $(FUZZ_BUILD)/corpus/$$t fuzz/corpus/$$t fuzz/regressions/$$t; }; \
	  if [ $(FUZZ_JOBS) -eq 1 ]; then run; else run >$(FUZZ_BUILD)/fuzz_$$t.log 2>&1; rc=$$?; \
	    cat $(FUZZ_BUILD)/fuzz_$$t.log; echo "fuzz_$$t: exit $$rc"; exit $$rc; fi' || exit 1

fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10 FUZZ_JOBS=$(JOBS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
