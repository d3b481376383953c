# deepseek-ultrafast: top-level commands.
#   make build   configure + build (binaries in build/bin/)
#   make test    install what the tests need, build, run every test that needs no GPU
#   make run     install what is needed, build, make the tiny demo checkpoint, serve it on :8000
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := cmake ninja-build g++ pkg-config nlohmann-json3-dev libgtest-dev libgmock-dev \
  libpcre2-dev libicu-dev python3 python3-venv python3-pip libboost1.81-dev \
  libhiredis-dev redis-server libxxhash-dev libssl-dev libucx-dev ucx-utils
VENV := .venv
PY_PACKAGES := numpy safetensors tokenizers==0.22.2 deepseek-recipe==0.2.0 pytest==9.2.0 openai==3.57.0 \
  kubernetes-validate==1.37.0 yamllint==1.38.0 nvidia-cuda-cuobjdump==13.5.37 \
  nvidia-cuda-nvdisasm==13.5.37

.PHONY: deps pydeps configure build test run clean format

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

pydeps: deps
	@[ -x $(VENV)/bin/python ] || python3 -m venv $(VENV)
	@$(VENV)/bin/python -c "import numpy, safetensors, tokenizers, deepseek_recipe, pytest, openai, kubernetes_validate, yamllint, glob, nvidia; assert any(glob.glob(d + '/cu*/bin/nvdisasm') for d in nvidia.__path__)" 2>/dev/null || \
	  $(VENV)/bin/pip install -q $(PY_PACKAGES)

configure: deps
	@[ -f $(BUILD)/build.ninja ] || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: pydeps build
	cd $(BUILD) && DSUF_PYTHON=$(CURDIR)/$(VENV)/bin/python ctest --output-on-failure -j $(JOBS) -LE gpu

DEMO_CKPT := $(BUILD)/demo-ckpt
run: build
	@echo "serving the tiny demo model (random weights) on http://localhost:8000/v1 -- Ctrl-C stops it"
	$(BUILD)/bin/serve --demo --ckpt $(DEMO_CKPT) $(SERVE_ARGS)

clean:
	rm -rf $(BUILD)

format:
	find src tools tests bench -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i
