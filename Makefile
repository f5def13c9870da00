# The two commands a newcomer needs: `make demo` and `make test`. Everything else is plumbing.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,trainer,dspy
# Arbor's DSPy provider (the client of client-rollout jobs), without the server it would drag in.
ARBOR := arbor-ai==0.2.17
# Keyed by pyproject.toml and the extras: a dependency edit makes a new venv stamp and a new wheelhouse.
DEPS_KEY := $(shell (cat pyproject.toml; echo "$(EXTRAS) $(ARBOR)") | sha256sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(DEPS_KEY)
# The package index here answers without cache headers, so pip's own cache stays empty and a fresh
# clone would download torch and the CUDA wheels (several GB) again. Keep the wheels ourselves, outside
# the repository; installs then run offline from them.
WHEELHOUSE ?= $(HOME)/.cache/grpo-wheels/$(DEPS_KEY)

.PHONY: venv prometheus testbins cluster-up cluster-down generate lint test test-unit demo gpu-check images smoke clean

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@if [ ! -f $(WHEELHOUSE)/.complete ]; then \
	  echo "[venv] downloading the wheels of grpo-operator[$(EXTRAS)] into $(WHEELHOUSE) (once; torch and CUDA wheels: several GB, ~10 min)"; \
	  $(BIN)/pip download -q -d $(WHEELHOUSE) '.[$(EXTRAS)]' setuptools==80.9.0 && \
	  $(BIN)/pip download -q --no-deps -d $(WHEELHOUSE) '$(ARBOR)' && touch $(WHEELHOUSE)/.complete; \
	fi
	@echo "[venv] installing grpo-operator[$(EXTRAS)] from $(WHEELHOUSE)"
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) -e '.[$(EXTRAS)]'
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) --no-deps '$(ARBOR)'
	@rm -f $(VENV)/.installed-*; touch $@

# Control-plane binaries built from Go modules, cached in ~/.cache/grpo-testbins (see docs/development.md).
testbins:
	bash hack/testbins.sh

cluster-up: venv testbins
	PATH=$(CURDIR)/$(BIN):$$PATH bash hack/cluster.sh up

cluster-down:
	bash hack/cluster.sh down

generate: venv
	$(BIN)/python -m hack.generate

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy operator trainer_image tests hack bench examples
	$(BIN)/python hack/check_layers.py

# promtool and a Prometheus server for the alert-rule and dashboard tests (Debian package; service not started).
prometheus:
	bash hack/helm/ensure-prometheus.sh

# Everything it needs is installed above, so a skipped test is a failure here (tests/conftest.py).
test: venv testbins prometheus lint
	PATH=$(CURDIR)/$(BIN):$$PATH GRPO_NO_SKIPS=1 $(BIN)/pytest -ra $(PYTEST_ARGS)

# Pure tests only (no cluster, no torch, no helm): seconds.
test-unit: venv
	$(BIN)/pytest -ra -m "not cluster and not trainer" tests/unit $(PYTEST_ARGS)

demo: venv testbins
	PATH=$(CURDIR)/$(BIN):$$PATH bash hack/demo.sh

# The trainer for real on a CUDA machine: learning, SIGKILL + resume, bf16/fp16/fp32, LoRA, overhead against
# bare TRL; writes out/gpu-check.json. Without CUDA it says so and exits 0 (GPU_CHECK_ARGS=--cpu-smoke runs
# the same code paths on the CPU with tiny sizes).
gpu-check: venv
	$(BIN)/python -m bench.gpu_check $(GPU_CHECK_ARGS)

# Every container image (operator, trainer, example metrics), tagged with the package's version, built with
# docker, podman or buildah (CONTAINER_ENGINE picks one); fails saying what is missing where none is installed.
images:
	$(PY) hack/images.py build

# Validate a real GPU cluster (the current kubectl context): examples/smoke/smoke.sh, see docs/quickstart.md.
smoke:
	bash examples/smoke/smoke.sh

clean: cluster-down
	rm -rf $(VENV)
