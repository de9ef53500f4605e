# slotplan: every target does its own set-up (idempotent) on a fresh machine.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.deps-installed
SLOTPLAN:= $(VENV)/bin/slotplan

# Python's byte-code cache on, whatever the caller's environment says: with
# PYTHONDONTWRITEBYTECODE set (this machine's default), every process compiles every module
# it imports again, and pytest rewrites the asserts of ~450 modules in every test worker and
# in every CLI or service process a test starts (collection alone: 27 s against 14 s cached).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install lattigo demo test test-all lint gocheck bench golden clean chromium orion orion-bench

install: $(STAMP) lattigo

# Set-up on a fresh clone (2 cores, measured in docs/testing.md): scripts/install_deps.sh
# installs with uv (pip where uv is not available: it took 90-190 s, one core), byte-compiles
# the venv on every core and builds the Lattigo extension beside both.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	bash scripts/install_deps.sh $(VENV)
	touch $(STAMP)

# Builds the Lattigo extension with gopy into .venv (skips when up to date).
lattigo: $(STAMP)
	bash backends/lattigo/build.sh

# A private inference of a digits MLP (examples/digits/demo.py): train, plan, keygen,
# encrypt, evaluate in a separate process without the secret key, decrypt, accuracy.
demo: install
	$(PY) examples/digits/demo.py --out $(VENV)/demo-digits

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The plan page's browser test (tests/api/test_plan_page.py) needs Chromium: install Debian's
# package when it is missing and we may (root, apt-get present); otherwise say so and go on
# (the test then skips with the same advice).
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	    || command -v google-chrome >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	    || echo "make: could not install chromium; the browser test will be skipped"; \
	else echo "make: chromium is not installed and cannot be installed here (needs root and apt-get);" \
	    "the browser test will be skipped"; fi

# The Go side of the Lattigo backend: go vet and its own tests. `make test` runs them with
# -short (docs/testing.md: the Go tests skipped there and the cheaper tests that cover them);
# `make gocheck` and `make test-all` run every one.
GO := $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
GO_TEST_FLAGS ?=
SLOTPLAN_REQUIRE_LATTIGO ?=
gocheck: lattigo
	$(MAKE) --no-print-directory gocheck-run

# The same without the build step: `make test` builds the extension (install) before its
# parallel part, so nothing there rebuilds it while pytest's workers start and import it.
.PHONY: gocheck-run
gocheck-run:
	cd backends/lattigo && $(GO) vet . && $(GO) test -count=1 $(GO_TEST_FLAGS) .

# The default tier (docs/testing.md): every stage and back-end path, minutes. `make test-all`
# adds the tests marked slow (tests/conftest.py SLOW_TESTS: the largest goldens, the
# n14boot Lattigo runs but one, the full random sweeps).
# lint (mypy: one core), the Go tests (mostly one core) and pytest (a worker per core) run
# side by side, so the cores stay busy while lint and the Go tests are short of work; each
# one's output is printed whole when it ends (--output-sync); any failure fails the target.
# `make test` has just built the Lattigo extension, so its tests must not skip for want of it:
# SLOTPLAN_REQUIRE_LATTIGO=1 makes pytest stop with the import's error instead
# (tests/conftest.py) of passing with the backend's tests skipped.
test: install chromium
	$(MAKE) --no-print-directory -j3 --output-sync=target lint gocheck-run pytest-default GO_TEST_FLAGS=-short \
	    SLOTPLAN_REQUIRE_LATTIGO=1

.PHONY: pytest-default
pytest-default: $(STAMP)
	SLOTPLAN_REQUIRE_LATTIGO=$(SLOTPLAN_REQUIRE_LATTIGO) $(VENV)/bin/pytest -m "not slow"

test-all: install chromium
	$(MAKE) --no-print-directory -j2 --output-sync=target lint gocheck-run
	SLOTPLAN_REQUIRE_LATTIGO=1 $(VENV)/bin/pytest

golden: install
	$(SLOTPLAN) golden

bench: install
	$(SLOTPLAN) bench data/suites/metakernel.json --params n16

# Orion (PyPI orion-fhe, with torch: ~6 GB) in its own venv, for `slotplan orion-bench`.
# Not part of `make test`.
ORION_VENV := .venv-orion
ORION_PIN  := orion-fhe==1.0.2
orion: $(ORION_VENV)/.installed
$(ORION_VENV)/.installed:
	python3 -m venv $(ORION_VENV)
	$(ORION_VENV)/bin/python -m pip install -q --upgrade pip
	$(ORION_VENV)/bin/python -m pip install -q '$(ORION_PIN)'
	touch $@

orion-bench: install orion
	$(SLOTPLAN) orion-bench --repeat 3

clean:
	rm -rf $(VENV) $(ORION_VENV) .mypy_cache .pytest_cache .ruff_cache
