# The two commands a newcomer needs: `make demo` and `make test`. Everything else is plumbing.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,trainer,dspy,metric
# Arbor's DSPy provider (the client of client-rollout jobs), without the server it would drag in.
ARBOR := arbor-ai==0.2.17
# The installer: uv links every file of the venv from its cache (hard links) instead of copying it, so a
# venv of torch, its CUDA wheels and the rest costs ~50 MB of disk and ~5 s per checkout instead of
# 5.7 GB and 2-3 min (each clone CI makes has a venv of its own).
UV := uv==0.13.9
UV_CACHE ?= $(HOME)/.cache/grpo-uv
# Keyed by pyproject.toml, the extras and the installer: a dependency edit makes a new venv stamp and a
# new wheelhouse.
DEPS_KEY := $(shell (cat pyproject.toml; echo "$(EXTRAS) $(ARBOR) $(UV)") | sha256sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(DEPS_KEY)
# The package index here answers without cache headers, so pip's own cache stays empty and a fresh
# clone would download torch and the CUDA wheels (several GB) again. Keep the wheels ourselves, outside
# the repository; installs then run offline from them.
WHEELHOUSE ?= $(HOME)/.cache/grpo-wheels/$(DEPS_KEY)

.PHONY: venv vllm prometheus testbins cluster-up cluster-down generate lint check test test-unit demo gpu-check images images-engine test-images smoke package chart-package plugin-package krew-package clean

# The venv, then bytecode for every module in it and in the project's own packages, once per install
# (hack/compile-bytecode.sh: where PYTHONDONTWRITEBYTECODE is set, every process of the suite otherwise
# compiles torch, transformers and the rest from source at each start).
venv: $(STAMP)
	@bash hack/compile-bytecode.sh $(VENV) operator trainer_image
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@bash hack/disk-check.sh \
	  $$([ -f $(WHEELHOUSE)/.complete ] || echo "$(WHEELHOUSE) 3500 the_downloaded_wheels") \
	  $$([ -d $(UV_CACHE) ] || echo "$(UV_CACHE) 6000 the_unpacked_wheels_every_venv_links_to")
	@if [ ! -f $(WHEELHOUSE)/.complete ]; then \
	  echo "[venv] downloading the wheels of grpo-operator[$(EXTRAS)] into $(WHEELHOUSE) (once; torch and CUDA wheels: ~3 GB, 2-10 min)"; \
	  $(BIN)/pip download -q -d $(WHEELHOUSE) '.[$(EXTRAS)]' setuptools==80.9.0 && \
	  $(BIN)/pip download -q --no-deps -d $(WHEELHOUSE) '$(ARBOR)' '$(UV)' && touch $(WHEELHOUSE)/.complete; \
	fi
	@echo "[venv] installing grpo-operator[$(EXTRAS)] from $(WHEELHOUSE), linked from $(UV_CACHE)"
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) '$(UV)'
	$(BIN)/uv pip install -q --python $(BIN)/python --cache-dir $(UV_CACHE) --link-mode hardlink --offline \
	  --no-index --find-links $(WHEELHOUSE) -e '.[$(EXTRAS)]'
	$(BIN)/uv pip install -q --python $(BIN)/python --cache-dir $(UV_CACHE) --link-mode hardlink --offline \
	  --no-index --find-links $(WHEELHOUSE) --no-deps '$(ARBOR)'
	@rm -f $(VENV)/.installed-* $(VENV)/.bytecode-compiled; touch $@

# PyPI's CPU build of vLLM in a venv of its own (~/.cache/grpo-vllm): the local cluster runs a job's generation
# pod with it (tests/harness/vllm_server.py). Kept out of .venv: TRL imports vllm eagerly when it is installed.
# The overlay beside it adds the trainer's packages, for trainers with vLLM inside (generation mode Colocate).
vllm: venv
	bash hack/vllm-env.sh
	bash hack/vllm-colocate-env.sh

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

# The feedback tiers, fastest first; each stops `make test` at its first failing tier (docs/development.md,
# "Test tiers"). The markers `unit`, `trainer` and `cluster` are set in tests/conftest.py; the three
# expressions below cover every collected test exactly once, so no tier can drop a test silently.
TIER_UNIT := unit
TIER_TRAINER := trainer and not cluster and not unit
TIER_CLUSTER := not unit and not (trainer and not cluster)
PYTEST := PATH=$(CURDIR)/$(BIN):$$PATH GRPO_NO_SKIPS=1 $(BIN)/pytest -ra --durations=15

# Lint, types, import layers and the pure unit tests: what to run before every commit (about a minute).
check: venv lint
	$(PYTEST) -m "$(TIER_UNIT)" $(PYTEST_ARGS)

# Everything, tier by tier: a break in the unit tier shows in minutes, before the control plane is built.
# Everything each tier needs is installed first, so a skipped test is a failure here (tests/conftest.py).
# The trainer and cluster tiers on two workers: each trainer process runs one thread (tests/trainer/toy.py),
# and a file's tests stay on one worker (--dist loadgroup, tests/conftest.py), so a module's shared vLLM
# server or operator is started once; the modules that start vLLM servers all run on one worker, one after
# the other, so no two servers compete for the two cores. Each cluster-tier worker starts a local cluster
# of its own (tests/harness/kube.py): most of those tests wait on the API server and the operator rather
# than compute, so two overlap well.
test: check testbins prometheus vllm test-images
	$(PYTEST) -n 2 --dist loadgroup -m "$(TIER_TRAINER)" $(PYTEST_ARGS)
	$(PYTEST) -n 2 --dist loadgroup -m "$(TIER_CLUSTER)" $(PYTEST_ARGS)

# The pure tests alone, without lint (seconds).
test-unit: venv
	$(BIN)/pytest -ra -m "$(TIER_UNIT)" $(PYTEST_ARGS)

# Only what the demo starts: etcd, kwok and Kubernetes (not helm, kubeconform or Kueue, ~10 min of cold build).
demo: venv
	bash hack/testbins.sh etcd kwok k8s
	PATH=$(CURDIR)/$(BIN):$$PATH bash hack/demo.sh

# The trainer for real on a CUDA machine: learning, SIGKILL + resume, bf16/fp16/fp32, LoRA, overhead against
# bare TRL; writes out/gpu-check.json. Without CUDA it says so and exits 0 (GPU_CHECK_ARGS=--cpu-smoke runs
# the same code paths on the CPU with tiny sizes).
gpu-check: venv
	$(BIN)/python -m bench.gpu_check $(GPU_CHECK_ARGS)

# The container images (operator, trainer, example metrics), tagged with the package's version, built with
# docker, podman or buildah (CONTAINER_ENGINE picks one); fails saying what is missing where none is installed.
# IMAGES="operator metric-tiny" builds a subset; where a registry base is unreachable the Python images are
# built FROM a base made from Debian's packages (hack/images.py; IMAGE_BASE=registry|debian decides).
IMAGES ?=
images:
	$(PY) hack/images.py build --only "$(IMAGES)"

# Podman, Buildah, runc and mmdebstrap from the system's packages (apt-get), where they are missing.
images-engine:
	$(PY) hack/images.py install-engine

# The images the cluster tier runs in containers (tests/helm/test_operator_container.py), with Podman, which
# those tests run them with (a Docker daemon's store is not Podman's); Podman is installed when missing, and
# its layer cache and the Debian base's tarball make a rebuild take seconds.
TEST_IMAGES := operator metric-tiny
test-images: images-engine
	$(PY) hack/images.py build --engine podman --only "$(TEST_IMAGES)"

# Release artifacts into dist/ (docs/release.md): the packaged chart and its repository index
# (CHART_REPO_URL: where dist/charts is served), the kubectl-grpo wheel, the krew launcher archive (fails
# when krew's manifest does not name it). Each refuses a version other than the operator's __version__.
package: chart-package plugin-package krew-package

chart-package:
	bash hack/testbins.sh helm
	$(PY) hack/package.py chart --out dist/charts $(if $(CHART_REPO_URL),--url $(CHART_REPO_URL))

# With the venv's setuptools, the version the plugin's build-system pins: the build runs offline.
plugin-package: venv
	$(BIN)/python hack/package.py plugin --out dist/plugin

krew-package:
	$(PY) hack/package.py krew --out dist/krew

# Validate a real GPU cluster (the current kubectl context): examples/smoke/smoke.sh, see docs/quickstart.md.
smoke:
	bash examples/smoke/smoke.sh

clean: cluster-down
	rm -rf $(VENV)
