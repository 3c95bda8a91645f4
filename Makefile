# Thin wrapper around CMake. `make` builds build/slideformer; `make demo` and `make test` first
# install any missing Debian packages (tools/install-deps.sh), then build, then run.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test gpu-test format clean

all: build

deps:
	@bash tools/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: deps
	@$(MAKE) --no-print-directory build
	$(BUILD)/slideformer demo

test: deps
	@$(MAKE) --no-print-directory build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

gpu-test: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
