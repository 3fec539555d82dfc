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

# The unit, fakenccl and fuzz tests (in-process, no daemons, no timing: a
# fuzz target runs for a fixed time and only finds fewer inputs beside
# another) run side by side on every core; the others, which start real
# daemons and measure real processes, one at a time.
PARALLEL_LABELS = ^(unit|fakenccl|fuzz)$$
test: build
	@cd $(BUILD) && status=0; \
	  ctest --output-on-failure --timeout 600 -L '$(PARALLEL_LABELS)' -j$(JOBS) || status=1; \
	  ctest --output-on-failure --timeout 600 -LE '$(PARALLEL_LABELS)' || status=1; \
	  exit $$status

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	@scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD)
