# The two commands: `make demo` and `make test`. Each creates .venv and installs on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint docs bench mutation clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[binary,django,embedded,test]' --group dev
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/duejobs demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The documentation site (MkDocs), built strictly: a broken link or reference fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d site

test: lint docs
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[binary,django,embedded,test,bench]' --group dev
	$(BIN)/python -m bench

# The modules that carry the guarantees (pyproject's only_mutate: of the store, the claim and
# the attempts), or the mutants named here.
MUTANTS ?=

# One mutant at a time: the tests share the Redis database they flush.
mutation: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/mutmut results

clean:
	rm -rf $(VENV) .duejobs .mypy_cache .ruff_cache .pytest_cache mutants site
