# rankscope: two commands set everything up on a fresh Debian 12 machine.
#   make demo   installs what is missing, builds, runs the demo job, shows the findings
#   make test   installs what is missing, builds, runs the whole test suite
# Everything else is CMake (see CMakePresets.json).

BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps build test demo bench clean

all: build

deps:
	@scripts/install-deps.sh test

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 600

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	@scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD)
