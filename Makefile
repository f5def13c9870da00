# The two commands a newcomer needs: `make demo` and `make test`. Everything else is plumbing.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The stamp changes when pyproject.toml changes, so dependency edits reinstall automatically.
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
EXTRAS ?= dev,trainer

.PHONY: venv prometheus testbins cluster-up cluster-down generate lint test test-unit demo clean

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "[venv] installing grpo-operator[$(EXTRAS)] (first time downloads torch; cached by pip afterwards)"
	$(BIN)/pip install --disable-pip-version-check -q -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.installed-*; touch $@

# Control-plane binaries built from Go modules, cached in ~/.cache/grpo-testbins (see docs/development.md).
testbins:
	bash hack/testbins.sh

cluster-up: venv testbins
	PATH=$(CURDIR)/$(BIN):$$PATH bash hack/cluster.sh up

cluster-down:
	bash hack/cluster.sh down

generate: venv
	$(BIN)/python -m grpo_operator.api.generate

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy operator trainer_image tests hack bench examples
	$(BIN)/python hack/check_layers.py

# promtool and a Prometheus server for the alert-rule and dashboard tests (Debian package; service not started).
prometheus:
	bash hack/helm/ensure-prometheus.sh

test: venv testbins prometheus lint
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest -ra $(PYTEST_ARGS)

# Pure tests only (no cluster, no torch, no helm): seconds.
test-unit: venv
	$(BIN)/pytest -ra -m "not cluster and not trainer" tests/unit $(PYTEST_ARGS)

demo: venv testbins
	PATH=$(CURDIR)/$(BIN):$$PATH bash hack/demo.sh

clean: cluster-down
	rm -rf $(VENV)
