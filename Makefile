# The lab's entry points. `make up` and `make test` install what is missing first.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install install-lab up down status test lint typecheck protos check-protos unit \
	integration clean test-compose compose-config toxiproxy-regression lock check-lock jaeger test-tracing \
	scenario-plots test-wire-per-request test-slow test-all test-check-servers

# Everything: the lab tool, plots and the dev tools (what the tests need).
install:
	@bash scripts/install.sh

# Only what the lab runs; `make up PLOT=1` adds matplotlib for `bench --plot`.
comma := ,
install-lab:
	@STREAMLAB_EXTRAS=lab$(if $(PLOT),$(comma)plot) bash scripts/install.sh

up: install-lab
	@$(BIN)/streamlab up

down:
	@if [ -x $(BIN)/streamlab ]; then $(BIN)/streamlab down; fi

status:
	@$(BIN)/streamlab status

protos:
	$(BIN)/python scripts/gen_protos.py

check-protos:
	$(BIN)/python scripts/gen_protos.py --check

# The lock files under requirements/ (what install.sh, the images and CI
# install), compiled from pyproject.toml with uv, which lives in a venv of its
# own under .tools/ (it is no dependency of the project; requirements/uv.lock
# pins it with its hashes). `check-lock` is offline: tests/unit/test_lock.py
# runs it too.
lock:
	@[ -x .tools/uv/bin/uv ] || { python3 -m venv .tools/uv && .tools/uv/bin/pip install -q -r requirements/uv.lock; }
	python3 scripts/lock.py --uv .tools/uv/bin/uv

check-lock:
	$(BIN)/python scripts/lock.py --check

# docs/results/scenario-plots/: a scenario of each family, broken above fixed,
# on a lab of its own (free ports; `scenario run NAME --plot`).
scenario-plots: install
	$(BIN)/python scripts/scenario_plots.py

# ruff, then the import contract ([tool.importlinter] in pyproject.toml: the
# lab tool above the services above the protocol, the services apart).
lint:
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

typecheck:
	$(BIN)/mypy

# Lint, types, fresh generated code, then the whole suite (unit + the real topology,
# which the tests start on free ports and stop themselves).
# Tests marked `slow` (pyproject.toml) are left out: `make test-slow` runs them.
test: install lint typecheck check-protos check-lock
	@rc=0; $(BIN)/pytest -m "not slow" $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): nothing was tested" >&2; rc=0; fi; \
	exit $$rc

test-slow: install
	@rc=0; $(BIN)/pytest -m slow $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): nothing was tested" >&2; rc=0; fi; \
	exit $$rc

test-all: test test-slow

# `streamlab check` on servers nobody here wrote that take minutes to install:
# llama.cpp's server (compiled for the CPU, ~4 min the first time, then cached)
# and LiteLLM's proxy (a venv of its own, ~500 MB). Not in CI; `make test-slow`
# skips these tests when they are not installed, saying how to install them.
test-check-servers: install
	bash scripts/install_llama_server.sh
	bash scripts/install_litellm.sh
	$(BIN)/pytest tests/integration/test_check_llama.py \
		tests/integration/test_check_litellm.py tests/integration/test_llama_server_smoke.py $(PYTEST_ARGS)

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

# The cancellation, resume, re-attach, replica and drain tests on the
# per_request engine wire, the one that is not the default
# (docs/cancellation-and-backpressure.md); any other test file runs on it the
# same way, with STREAMLAB_GATEWAY_ENGINE_WIRE=per_request set.
WIRE_TESTS := test_engine_wire test_cancellation test_resume test_reattach test_replicas \
	test_replica_loss test_drain
test-wire-per-request: install
	STREAMLAB_GATEWAY_ENGINE_WIRE=per_request $(BIN)/pytest -p no:cacheprovider \
		$(foreach t,$(WIRE_TESTS),tests/integration/$(t).py) $(PYTEST_ARGS)

# The integration suite against compose.yaml's containers (builds the images,
# brings the project up on free ports, always takes it down). See docs/compose.md.
test-compose: install
	@bash scripts/compose_test.sh $(PYTEST_ARGS)

# The compose lab with each other edge proxy in nginx's service
# (compose.<proxy>.yaml, docs/proxies.md), a smoke file each: the proxy is the
# one named, `/` streams, `/buffered/` and `/short-timeout/` do what that proxy
# does. Not in CI (time); `make test-compose-proxies COMPOSE_PROXIES=haproxy`
# runs one.
COMPOSE_PROXIES ?= haproxy caddy traefik
.PHONY: test-compose-proxies
test-compose-proxies: install
	@for proxy in $(COMPOSE_PROXIES); do \
		STREAMLAB_COMPOSE_PROXY=$$proxy \
		STREAMLAB_COMPOSE_TESTS=tests/integration/test_compose_edge_proxy.py \
		bash scripts/compose_test.sh $(PYTEST_ARGS) || exit 1; \
	done

# Jaeger for `streamlab up --tracing` (docs/tracing.md): built once (~5 min on
# 2 cores), then copied from the user cache. The tracing tests skip without it.
jaeger:
	bash scripts/build_jaeger.sh

# The tracing tests, the per-proxy ones (slow) included, with Jaeger built first.
test-tracing: install jaeger
	$(BIN)/pytest tests/integration/test_tracing.py tests/unit/test_tracing.py -m "slow or not slow" $(PYTEST_ARGS)

# The compose lab with its `tracing` profile and compose.tracing.yaml (Jaeger
# in a container; docs/tracing.md): one smoke test. Not in CI (time).
.PHONY: test-compose-tracing
test-compose-tracing: install
	@STREAMLAB_COMPOSE_TRACING=1 STREAMLAB_COMPOSE_TESTS=tests/integration/test_tracing_compose.py \
		bash scripts/compose_test.sh $(PYTEST_ARGS)

# The lab's Toxiproxy patch (scripts/build_toxiproxy.sh): its Go regression test
# passes on the patched source and hangs (fails on its deadline) on the
# unpatched one, which is what shows the test sees the wedge.
toxiproxy-regression:
	bash scripts/build_toxiproxy.sh --test
	bash scripts/build_toxiproxy.sh --show-wedge

# The wheel as a user outside the clone gets it (~1 min; CI runs it): sdist and
# wheel built and `twine check`ed, installed into a fresh venv in a temporary
# directory, then from there --version, install toxiproxy, up, check, the
# plugin's fixtures and the docs' example plugin test (scripts/check_wheel.sh).
.PHONY: check-wheel
check-wheel: install
	bash scripts/check_wheel.sh

# The README's promise on a Debian 12 as shipped (scripts/fresh_debian.sh, ~4 min;
# not in CI): a debootstrap'd bookworm container with Debian's Python and Go
# (1.19) only, a copy of this working tree, `make up`, `streamlab chat`,
# `make down`, as root and then as a user who is not root (no Redis: one gateway
# on the memory store). FRESH_DEBIAN_AS=root (or user) runs one. Needs root and podman.
.PHONY: fresh-debian
fresh-debian:
	@bash scripts/fresh_debian.sh

# Regenerate the compose lab's Toxiproxy and nginx configs from lab.env.
compose-config:
	$(BIN)/streamlab compose config

clean: down
	rm -rf .run .mypy_cache .ruff_cache .pytest_cache

# Every edge proxy x every edge probe (docs/proxy-matrix.md, ~10 min): the
# result into docs/results/, then its table, to paste into the page.
.PHONY: proxy-matrix
proxy-matrix: install
	@for proxy in haproxy caddy traefik; do bash scripts/install_proxies.sh $$proxy; done
	$(BIN)/streamlab scenario matrix --json --plot docs/results/proxy-matrix.png \
		> docs/results/proxy-matrix.json
	$(BIN)/streamlab scenario matrix --from-json docs/results/proxy-matrix.json --markdown
