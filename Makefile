# Developer and CI entry points. `make test` works from a fresh clone on Debian.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps, so each install re-runs only when its lock or pyproject.toml changes: the project
# alone (what `make run` needs), and the project with its test extra (pytest, the lint, the
# kit's tools).
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# Every dependency comes from a lock (requirements/), with its hashes; `make lock` refreshes them.
RUN_LOCK := requirements/run.lock
TEST_LOCK := requirements/test.lock
# Tools the tests take from Debian packages without installing them (gitignored).
TOOLS := .tools
# CI runs as root without sudo installed; developers usually need it.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: venv venv-test lock redis-server chromium prometheus test check lint run worker bench \
	bench-sse bench-many-jobs bench-chat bench-control bench-control-flood soak reliability-report image bench-record bench-scaling fmt clean \
	nodejs ts-deps ts-check ts-bundle ts-pack demo-fonts

venv: $(RUN_STAMP)

venv-test: $(TEST_STAMP)

# The locks hold every dependency with its hashes; the project itself follows without them.
$(RUN_STAMP): pyproject.toml $(RUN_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --require-hashes -r $(RUN_LOCK)
	$(BIN)/python -m pip install --no-deps -e .
	touch $(RUN_STAMP)

# The test lock holds the run dependencies too, so this install stands for the run one.
$(TEST_STAMP): pyproject.toml $(TEST_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --require-hashes -r $(TEST_LOCK)
	$(BIN)/python -m pip install --no-deps -e .
	touch $(TEST_STAMP) $(RUN_STAMP)

# Resolves requirements/run.lock and test.lock again from pyproject.toml (Linux x86_64, Python
# 3.11, with hashes), keeping the versions already locked while they still fit; UPGRADE=1 takes
# the newest of everything. uv resolves them: it is needed here alone, never to install, and this
# version of it is kept in .tools/ (gitignored).
UV_VERSION := 0.13.9
UV := $(TOOLS)/uv-$(UV_VERSION)/bin/uv

lock: $(UV)
	$(PYTHON) requirements/lock.py --uv $(UV) $(if $(UPGRADE),--upgrade)

$(UV):
	rm -rf $(TOOLS)/uv-$(UV_VERSION)
	$(PYTHON) -m venv $(TOOLS)/uv-$(UV_VERSION)
	$(TOOLS)/uv-$(UV_VERSION)/bin/python -m pip install uv==$(UV_VERSION)

# Tests start their own redis-server processes; a service the package may start is never used.
redis-server:
	@if command -v redis-server >/dev/null 2>&1 || [ -x /usr/sbin/redis-server ]; then \
		echo "redis-server: $$(command -v redis-server || echo /usr/sbin/redis-server)"; \
	else \
		$(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server; \
	fi

# The browser tests drive Debian's chromium through Playwright; they never download a browser.
chromium:
	@if [ -x /usr/bin/chromium ]; then \
		echo "chromium: /usr/bin/chromium"; \
	else \
		$(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	fi

# The monitoring tests check the alerts with promtool and query a real prometheus. Both come
# out of Debian's package, downloaded and extracted into .tools/prometheus, never installed:
# installing it would pull 34 packages and enable services (prometheus, node-exporter, smartd).
# The binaries need nothing but libc. The package lists are refreshed only if the download fails.
PROMETHEUS_TOOLS := $(TOOLS)/prometheus

prometheus: $(PROMETHEUS_TOOLS)/promtool

$(PROMETHEUS_TOOLS)/promtool:
	rm -rf $(PROMETHEUS_TOOLS).part && mkdir -p $(PROMETHEUS_TOOLS).part
	cd $(PROMETHEUS_TOOLS).part && { apt-get download prometheus || \
		{ $(SUDO) apt-get update && apt-get download prometheus; }; }
	dpkg-deb -x $(PROMETHEUS_TOOLS).part/prometheus_*.deb $(PROMETHEUS_TOOLS).part/root
	$(PROMETHEUS_TOOLS).part/root/usr/bin/prometheus --version
	$(PROMETHEUS_TOOLS).part/root/usr/bin/promtool --version
	mkdir -p $(PROMETHEUS_TOOLS)
	mv $(PROMETHEUS_TOOLS).part/root/usr/bin/prometheus $(PROMETHEUS_TOOLS)/prometheus
	mv $(PROMETHEUS_TOOLS).part/root/usr/bin/promtool $(PROMETHEUS_TOOLS)/promtool
	rm -rf $(PROMETHEUS_TOOLS).part

# The TypeScript client (clients/typescript) needs Node.js and npm, from Debian's packages when
# missing; its packages come from its lock alone (`npm ci`, re-run when the lock changes), so
# nothing is downloaded later, when its tests run. `make run` needs none of it: the pages load
# the committed bundle.
TS := clients/typescript
TS_STAMP := $(TS)/node_modules/.installed

nodejs:
	@if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then \
		echo "node: $$(command -v node) $$(node --version), npm $$(npm --version)"; \
	else \
		$(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm; \
	fi

ts-deps: $(TS_STAMP)

$(TS_STAMP): $(TS)/package.json $(TS)/package-lock.json | nodejs
	cd $(TS) && npm ci --no-audit --no-fund
	touch $(TS_STAMP)

# Typecheck (tsc strict), lint and format (Biome), the package's build, and the committed
# browser bundle checked against what the sources make.
ts-check: ts-deps
	cd $(TS) && npm run --silent typecheck && npm run --silent lint && npm run --silent build
	cd $(TS) && npm run --silent bundle -- --check

# Writes the browser bundle the pages load (src/eco_router/entrypoints/http/static/); commit it.
ts-bundle: ts-deps
	cd $(TS) && npm run --silent bundle

# The npm package (clients/typescript/eco-router-client-<version>.tgz); npm builds it first (prepack).
ts-pack: ts-deps
	cd $(TS) && npm pack

# The AI SDK (`ai`, exact versions from its lock) for the tests that read eco-router's streams
# with it (tests/ai_sdk: tests/integration/test_ai_sdk_stream.py, tests/browser/
# test_ai_sdk_page.py); a package of its own, apart from the client's, installed again only
# when its lock changes. Nothing is fetched at test time.
AI_SDK_TESTS := tests/ai_sdk
AI_SDK_STAMP := $(AI_SDK_TESTS)/node_modules/.installed

$(AI_SDK_STAMP): $(AI_SDK_TESTS)/package.json $(AI_SDK_TESTS)/package-lock.json | nodejs
	cd $(AI_SDK_TESTS) && npm ci --no-audit --no-fund
	touch $(AI_SDK_STAMP)

# The demo page's Hangul and emoji fonts (tools/demo_fonts.py), made again after the demo's
# answers change; commit them. Debian's font packages and fontTools are downloaded and
# extracted into .tools/demo-fonts, never installed.
DEMO_FONTS_TOOLS := $(TOOLS)/demo-fonts
STATIC := src/eco_router/entrypoints/http/static

demo-fonts: venv
	rm -rf $(DEMO_FONTS_TOOLS) && mkdir -p $(DEMO_FONTS_TOOLS)
	cd $(DEMO_FONTS_TOOLS) && { apt-get download fonts-nanum fonts-noto-color-emoji python3-fonttools || \
		{ $(SUDO) apt-get update && apt-get download fonts-nanum fonts-noto-color-emoji python3-fonttools; }; }
	for deb in $(DEMO_FONTS_TOOLS)/*.deb; do dpkg-deb -x $$deb $(DEMO_FONTS_TOOLS)/root; done
	PYTHONPATH=$(DEMO_FONTS_TOOLS)/root/usr/lib/python3/dist-packages $(BIN)/python tools/demo_fonts.py \
		--hangul $(DEMO_FONTS_TOOLS)/root/usr/share/fonts/truetype/nanum/NanumGothic.ttf \
		--emoji $(DEMO_FONTS_TOOLS)/root/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf \
		--licenses $(DEMO_FONTS_TOOLS)/root/usr/share/doc/fonts-nanum/copyright \
		$(DEMO_FONTS_TOOLS)/root/usr/share/doc/fonts-noto-color-emoji/copyright \
		--out $(STATIC)

# Tests marked `parallel` (tests/unit, the contract suites on the in-memory adapters included,
# and the deployment kit's static checks) on every core, then the rest one at a time: they
# start servers and routers, and tests/faults measures timing under load.
test: venv-test redis-server chromium prometheus podman $(AI_SDK_STAMP) lint ts-check
	$(BIN)/pytest -q -n auto --durations=15 -m parallel tests/unit tests/deploy
	$(BIN)/pytest -q --durations=15 -m "not parallel"

# The fast tier, under a minute on 2 cores (about 25 s on an idle machine): the lint, the unit
# tests and the contract suites on the in-memory adapters. No redis-server, browser or prometheus.
check: venv-test lint
	$(BIN)/pytest -q -n auto tests/unit

lint: venv-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy src bench
	$(BIN)/lint-imports

# The operator console at /console and the gateway's /metrics are on here (both are off by
# default); EVENT_ROUTER_CONSOLE=false or EVENT_ROUTER_GATEWAY_METRICS=false turns them off.
# PORT=8010 serves on another port than 8000.
run: venv redis-server
	EVENT_ROUTER_CONSOLE=$${EVENT_ROUTER_CONSOLE:-true} \
	EVENT_ROUTER_GATEWAY_METRICS=$${EVENT_ROUTER_GATEWAY_METRICS:-true} \
		$(BIN)/eco-router serve --demo $(if $(REDIS_STREAMS_URL),,--embedded-redis) \
		$(if $(PORT),--port $(PORT))

worker: venv
	$(BIN)/eco-router worker

# The router's tables (throughput, latency, paced rates), then the gateway's (bench-sse).
# QUICK=1: smaller backlogs and fewer rounds, about five minutes. ONLY=topologies runs the
# topology comparison (standalone, Sentinel, Cluster) alone.
# Ends by naming the router figures that moved beyond the noise from bench/recorded/router.json.
bench: venv redis-server
	$(BIN)/python -m bench.router_bench $(if $(QUICK),--quick) $(if $(ONLY),--only $(ONLY))
	$(if $(ONLY),,$(BIN)/python -m bench.sse_bench $(if $(QUICK),--quick))
	$(BIN)/python -m bench.regression_guard

# Keeps the last `make bench` figures as the ones later runs are compared with.
bench-record:
	mkdir -p bench/recorded
	cp bench/results/router.json bench/recorded/router.json

# Events/s and Redis CPU per event by batch size and shard count; the worker's memory over
# 1 million events of 100,000 jobs (QUICK=1: 100,000 events).
bench-scaling: venv redis-server
	$(BIN)/python -m bench.scaling_curve $(if $(QUICK),--quick)

# QUICK=1: 2,000 connections, 1,000 viewers of one job, 5 s of events per scenario.
bench-sse: venv redis-server
	$(BIN)/python -m bench.sse_bench $(if $(QUICK),--quick)

# A dashboard's jobs on one connection against one connection per job (CPU, memory per job;
# QUICK=1: 4 dashboards of 50 jobs, 5 s).
bench-many-jobs: venv redis-server
	$(BIN)/python -m bench.many_jobs_bench $(if $(QUICK),--quick)

# Token streams: throughput, cost per token, resume, fan-out (QUICK=1: 100 answers, 3 s).
bench-chat: venv redis-server
	$(BIN)/python -m bench.chat_bench $(if $(QUICK),--quick)

# Control messages: POST → the worker's SDK latency, and the cost of the cancellation check.
bench-control: venv redis-server
	$(BIN)/python -m bench.control_bench $(if $(QUICK),--quick)

# One viewer's flood of control messages and messages to unknown jobs: answers, memory, CPU
# (QUICK=1: 1,000 and 200 posts).
bench-control-flood: venv redis-server
	$(BIN)/python -m bench.control_flood $(if $(QUICK),--quick)

# Ten minutes of paced load and SSE clients; for operators, not CI (MINUTES=2 for a quick one).
soak: venv-test redis-server
	$(BIN)/python -m bench.soak $(if $(MINUTES),--minutes $(MINUTES))

# Results of an earlier run are removed first, so the report describes this run only.
reliability-report: venv-test redis-server
	rm -rf tests/faults/results
	$(BIN)/pytest -q tests/faults
	$(BIN)/python -m tests.faults.report

# The container image (Dockerfile) with the first engine that answers: docker, then podman.
# IMAGE=registry.example/eco-router:tag names it; ENGINE=podman picks one. PYTHON_IMAGE=… builds
# on another base than python:3.11-slim-bookworm; STAND_IN=1 on the stand-in made from Debian's
# packages (`make stand-in-base`), where no image registry is reachable. With podman, the
# machine's pip settings (a proxy's CA bundle, a local index) are lent to the build and kept out
# of the image (deploy/podman/host_pip.py), and podman reads deploy/podman/containers.conf unless
# CONTAINERS_CONF names another file.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= eco-router:$(VERSION)
# The stand-in base is in podman's storage alone.
ENGINES := $(or $(ENGINE),$(if $(STAND_IN),podman,docker podman))
STAND_IN_BASE := localhost/eco-router-base:bookworm
PYTHON_IMAGE ?= $(if $(STAND_IN),$(STAND_IN_BASE))
PODMAN_CONF := $(CURDIR)/deploy/podman/containers.conf

.PHONY: podman stand-in-base

# podman and what the container tests use (tests/container), from Debian's packages: only the
# missing ones are installed, and the machine's container configuration is left as it is.
podman:
	@deploy/podman/install.sh

# The stand-in base (python3 on Debian bookworm) and Redis images, made with mmdebstrap and
# kept once made; REBUILD=1 makes them again.
stand-in-base: podman
	@deploy/podman/stand-in-base.sh $(if $(REBUILD),--rebuild)

image: $(if $(STAND_IN),stand-in-base)
	@export CONTAINERS_CONF="$${CONTAINERS_CONF:-$(PODMAN_CONF)}"; \
	engine=""; \
	for candidate in $(ENGINES); do \
		if command -v $$candidate >/dev/null 2>&1 && $$candidate info >/dev/null 2>&1; then \
			engine=$$candidate; break; \
		fi; \
	done; \
	if [ -z "$$engine" ]; then \
		echo "make image: no container engine is available ($(ENGINES): none installed whose" \
			"daemon or socket answers); the image cannot be built here" >&2; \
		exit 1; \
	fi; \
	lent=""; \
	if [ "$$engine" = podman ]; then \
		pipdir=$$(mktemp -d); trap 'rm -rf "$$pipdir"' EXIT; \
		python=$(BIN)/python; [ -x "$$python" ] || python=python3; \
		lent=$$($$python deploy/podman/host_pip.py "$$pipdir"); \
	fi; \
	echo "building $(IMAGE) with $$engine$(if $(PYTHON_IMAGE), on $(PYTHON_IMAGE))"; \
	$$engine build --tag $(IMAGE) \
		--build-arg VERSION=$(VERSION) \
		--build-arg REVISION=$$(git rev-parse --verify --quiet HEAD || echo unknown) \
		--build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
		$(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
		$$lent \
		.

# Fixes first, so the formatter has the last word on layout.
fmt: venv-test
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Keeps .venv: rebuilding it is slow and `make venv` refreshes it when pyproject.toml changes.
clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis \
		.import_linter_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
