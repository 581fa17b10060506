# HPC-DS1 — `make run` serves the product on its embedded default; `make test` runs every check.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# tests/console/ saves a full-page screenshot of each console section here
export CONSOLE_SCREENS ?= $(CURDIR)/build/console-screens
SCREENS := $(CONSOLE_SCREENS)

.DEFAULT_GOAL := help
.PHONY: help install browser slurm apps tcpdump run test lint format typecheck pytest schemas bench bench-eventlog bench-year bench-decide-http bench-kernels bench-soak bench-faults bench-placement bench-fleet-sim bench-fleet-faults bench-longpoll bench-console bench-replicas bench-serve-modes bench-probe bench-tls clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) browser slurm apps tcpdump ## create .venv and install the project with its dev tools

browser: ## Debian's chromium for the console's browser tests (apt, as root; quiet when present)
	@deploy/install-browser.sh

slurm: ## Debian's Slurm and munge for the Slurm tests (apt, as root; quiet when present)
	@deploy/install-slurm.sh

apps: ## Debian's hpcc and its Open MPI for the real-application tests (apt, as root; quiet when present)
	@deploy/install-apps.sh

tcpdump: ## Debian's tcpdump for the fleet's TLS capture test (apt, as root; quiet when present)
	@deploy/install-tcpdump.sh

run: $(STAMP) ## serve the product (embedded NATS + Postgres under $$HPC_DS1_HOME)
	$(BIN)/hpc-ds1 serve

test: $(STAMP) browser slurm apps tcpdump lint typecheck pytest ## everything CI runs: lint, types, the test suite

lint: $(STAMP) ## ruff lint and format check, schemas in sync, the docs site built strict
	$(BIN)/ruff check libs services migrations tests benchmarks
	$(BIN)/ruff format --check libs services migrations tests benchmarks
	$(BIN)/python -m hpc_ds1.events.schemas --check schemas
	@$(MAKE) --no-print-directory lint-imports docs

# import-linter reads the package as installed: services/ and migrations/ sit inside hpc_ds1
# there (pyproject.toml's package-dir), which an editable install does not show on disk.
IMPORT_LAYOUT := build/import-layout
.PHONY: lint-imports
lint-imports: $(STAMP) ## the import layers (.importlinter): libs never import services, one-way layers, no circles
	@rm -rf $(IMPORT_LAYOUT) && mkdir -p $(IMPORT_LAYOUT)
	@cp -r libs/hpc_ds1 $(IMPORT_LAYOUT)/ && cp -r services $(IMPORT_LAYOUT)/hpc_ds1/services && cp -r migrations $(IMPORT_LAYOUT)/hpc_ds1/migrations
	cd $(IMPORT_LAYOUT) && PYTHONPATH=. $(abspath $(BIN))/lint-imports --no-cache $(abspath .importlinter)

typecheck: $(STAMP) ## mypy over libs and services
	$(BIN)/mypy

PYTEST_WORKERS ?= 2
pytest: $(STAMP) ## the test suite alone, in two pytest-xdist workers (PYTEST_WORKERS=n to change)
	@status=0; $(BIN)/pytest -q -rs --durations=30 -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder || status=$$?; \
	if [ -d "$(SCREENS)" ]; then echo "console screenshots (one per section, tests/console): $(SCREENS)"; fi; \
	exit $$status

# The tiers (docs/contributing.md): `slow` is left out of every run but test-slow's
# (pyproject.toml's addopts); test-fast leaves out the folders that start real machines too,
# and the modules that took longest in the last recorded run (`heavy`, tests/durations.json).
UNTIERED := not slow and not e2e and not browser and not netns and not slurm and not cluster and not compose
FAST_MARKERS := $(UNTIERED) and not heavy
.PHONY: test-fast test-slow test-durations docs
test-fast: $(STAMP) ## the inner loop: the suite without slow, heavy, e2e, browser, netns, slurm and cluster tests
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "$(FAST_MARKERS)"

test-durations: $(STAMP) ## rerecord tests/durations.json (each module's seconds) from a run of the tests no folder tier holds
	rm -f build/test-reports.jsonl && mkdir -p build
	HPC_DS1_RECORD_DURATIONS=$(abspath build/test-reports.jsonl) $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "$(UNTIERED)"

test-slow: $(STAMP) ## only the long forms of the checks marked slow (their small forms run in pytest)
	$(BIN)/pytest -q -rs --durations=10 -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder -m slow

docs: $(STAMP) ## the docs site (mkdocs, Material) into build/site; a broken link or anchor fails it
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

.PHONY: test-compose
test-compose: $(STAMP) ## as root: docker-compose.yml under podman-compose, driven through the gateway (no registry needed)
	deploy/test-compose.sh

format: $(STAMP) ## apply ruff's formatting and fixes
	$(BIN)/ruff format libs services migrations tests benchmarks
	$(BIN)/ruff check --fix libs services migrations tests benchmarks

schemas: $(STAMP) ## regenerate schemas/ from the event models
	$(BIN)/python -m hpc_ds1.events.schemas schemas

bench: bench-eventlog bench-kernels bench-faults bench-placement bench-fleet-sim ## every benchmark

bench-eventlog: $(STAMP) ## events/s publish→row and projection lag, both sync settings
	$(BIN)/python benchmarks/bench_eventlog.py

bench-year: $(STAMP) ## a generated year (10M events, 1,000 devices): rebuild, reads, bytes per million, archive
	$(BIN)/python benchmarks/bench_year.py

bench-decide-http: $(STAMP) ## POST /v1/decide through `serve`: p50/p99 (1 client), requests/s (8), CPU per request
	@deploy/install-wrk.sh
	$(BIN)/python benchmarks/bench_decide_http.py

bench-kernels: $(STAMP) ## the numba kernels against library baselines
	$(BIN)/python benchmarks/bench_kernels.py

bench-faults: $(STAMP) ## kill -9 each server and service, cut a link, 10 times each: what survived
	$(BIN)/python benchmarks/bench_faults.py

bench-placement: $(STAMP) ## placement time per task at 10 / 100 / 1,000 / 10,000 devices (p50/p99)
	$(BIN)/python benchmarks/bench_placement.py

bench-fleet-sim: $(STAMP) ## 1,000 tasks on a simulated fleet of measured runtimes: placement vs baselines
	$(BIN)/python benchmarks/bench_fleet_sim.py

bench-fleet-faults: $(STAMP) ## as root: kill -9 an agent / cut its link mid-task, 10 times each, on a 3-namespace fleet (not in `bench`)
	$(BIN)/python benchmarks/bench_fleet_faults.py

bench-longpoll: $(STAMP) ## one gateway, 1,000 long-polling agents: dispatch latency p50/p99 and CPU
	$(BIN)/python benchmarks/bench_longpoll.py

bench-replicas: $(STAMP) ## two gateways, decisions, projectors as processes: kill -9 one of each mid-load, 10 rounds: nothing lost or doubled
	$(BIN)/python benchmarks/bench_replicas.py --rounds 10

bench-serve-modes: $(STAMP) ## `serve` with its services in one process vs each its own: decide p50/p99, requests/s (1 and 8 clients)
	@deploy/install-wrk.sh
	$(BIN)/python benchmarks/bench_serve_modes.py 1000 --rounds 2

bench-tls: $(STAMP) ## HTTPS against HTTP in one run: long-poll dispatch p50 (<= x1.10) and decide requests/s (>= 90 %)
	@deploy/install-wrk.sh
	$(BIN)/python benchmarks/bench_longpoll.py --tls both --rounds 2 --agents 200 --items 400 --rate 50 --idle 3
	$(BIN)/python benchmarks/bench_decide_http.py --tls both --rounds 2 --seconds 10
	$(BIN)/python benchmarks/bench_tls_overhead.py

bench-probe: $(STAMP) ## issue 41's probe as a device credential's holder against a fresh `serve`: what holds now
	$(BIN)/python benchmarks/probe_devices.py

bench-console: $(STAMP) ## the console's first view with 100,000 events in the log (HTTP and a real browser)
	$(BIN)/python benchmarks/bench_console.py 100000

bench-soak: $(STAMP) ## 30 min of mixed load on `serve`: RSS and projection lag over time (not in `bench`)
	$(BIN)/python benchmarks/bench_soak.py --minutes 30

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
