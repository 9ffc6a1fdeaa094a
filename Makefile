# Everything a fresh machine needs: a virtual environment from the lock file, the
# anon binary from its npm package, and (at run time) an embedded PostgreSQL.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install anon chromium systemd-analyze run test ruff-check docs soak chaos lint bench mutants fuzz screenshots clean

# uv installs the lock file, bytecode compiled on both cores (21 s against pip's 33 s
# here); the venv keeps its pip for you. Without that bytecode the test workers and the
# CLI processes they start compiled what they import, several at once, on the first run.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv==0.13.9
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/uv pip install -q --compile-bytecode -r requirements.lock
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/uv pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

anon: $(STAMP)
	$(BIN)/comfyveil anon install

# The tests' copy of anon lives in the venv, so a clean checkout tests the pinned binary.
$(VENV)/anon/anon: $(STAMP)
	$(BIN)/comfyveil anon install --dir $(VENV)/anon

# The browser tests drive Debian's chromium through Playwright (whose own browser download
# is not used); installed only when missing, with sudo unless run as root. Without its
# recommends (printer, Samba, avahi, mesa, perl's web libraries: 115 packages against 19,
# 28 s against 13 s on a fresh machine here) but with the fonts the pages are laid out in.
CHROMIUM_PACKAGES := chromium fonts-liberation
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -q --no-install-recommends $(CHROMIUM_PACKAGES); }

# deploy/systemd's units are checked with `systemd-analyze verify` and `security`, from
# Debian's systemd package; installed only when missing, as chromium is, and after it:
# two apt-get at once would fight over dpkg's lock.
systemd-analyze: chromium
	@command -v systemd-analyze >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y systemd; \
	  else sudo apt-get update && sudo apt-get install -y systemd; fi; }

run: install anon
	$(BIN)/comfyveil run

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# pytest-xdist workers: more than the 2 cores of the reference machine, since most tests
# wait on a server, a subprocess or a timer; the anon-network and browser tests keep to
# one worker each (GROUPED_FILES in tests/conftest.py).
TEST_WORKERS ?= 8
PYTEST_ARGS := -q -p no:cacheprovider -n $(TEST_WORKERS)
TEST_ENV := COMFYVEIL_ANON_DIR=$(abspath $(VENV)/anon) scripts/loopback-only
# Compiled bytecode is kept (__pycache__, ignored by git): with it off, every worker and
# every CLI subprocess a test starts compiles the sources and rewrites the tests again.
unexport PYTHONDONTWRITEBYTECODE

# Bytecode of the sources and of the tests (as pytest rewrites them), compiled once by one
# collection before the workers start: eight workers starting at once would each compile
# the same modules.
BYTECODE := $(VENV)/.bytecode
$(BYTECODE): $(STAMP)
	$(TEST_ENV) $(BIN)/pytest -q -p no:cacheprovider --collect-only > /dev/null
	touch $(BYTECODE)

# The docs site (mkdocs.yml) into site/; --strict fails on a broken internal link, a
# missing page or a page left out of the navigation. A few seconds.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# What runs before the suite, side by side: Debian's packages install while uv builds the
# venv (a fresh machine has no chromium: apt takes 10-25 s of mostly waiting on the
# network and dpkg), then one compiles, one downloads, two read files.
test:
	$(MAKE) --no-print-directory -j 4 chromium systemd-analyze $(VENV)/anon/anon $(BYTECODE) \
		ruff-check docs
	$(TEST_ENV) $(BIN)/pytest $(PYTEST_ARGS) --durations=15

ruff-check: install
	$(BIN)/ruff check src tests benchmarks

# The whole suite 5 times in a row: every failure with its test id (scripts/soak.py);
# then 5 minutes of chaos (below), whatever the suite's runs gave.
soak: install $(VENV)/anon/anon chromium systemd-analyze
	$(TEST_ENV) $(BIN)/python scripts/soak.py --runs 5 -- $(PYTEST_ARGS); suite=$$?; \
	$(TEST_ENV) $(BIN)/python -W ignore -m tests.chaos --minutes 5 --seed $(CHAOS_SEED); \
	chaos=$$?; test $$suite = 0 && test $$chaos = 0

# Users on every front end while faults strike at random (tests/chaos): every request
# ends in one result or one sentence, no prompt runs twice, nothing is left on a GPU host.
# HOURS=1 for the long run; the soak runs 5 minutes of it after its suite runs.
# CHAOS_ANON=1 (or COMFYVEIL_CHAOS_ANON=1 in the environment): one backend behind a
# hidden service on a private Anyone network, and anon killed and restarted among the faults.
# CHAOS_ARGS: the load and the faults; the defaults give an hour at least 5 000 jobs and
# 300 faults (a request every half second, a fault every 5-10 s).
HOURS ?= 0.1
CHAOS_SEED ?= $(shell date +%s)
CHAOS_ARGS ?= --rate 2 --fault-min 5 --fault-max 10
CHAOS_ANON ?= $(COMFYVEIL_CHAOS_ANON)
chaos: install $(VENV)/anon/anon
	COMFYVEIL_CHAOS_ANON=$(CHAOS_ANON) $(TEST_ENV) $(BIN)/python -W ignore -m tests.chaos \
		--hours $(HOURS) --seed $(CHAOS_SEED) $(CHAOS_ARGS)

# The docs' screenshots, taken again by the browser tests into docs/.
screenshots: install chromium
	COMFYVEIL_SCREENSHOTS=docs $(TEST_ENV) $(BIN)/pytest -q -p no:cacheprovider tests/web/test_web_browser.py

# Deliberate bugs (tests/mutants.toml), each tried in a copy of the tree: every one must
# fail its tests. Minutes, not seconds; not part of `make test`.
mutants: install
	$(BIN)/python scripts/mutants.py

# A long fuzzing campaign over every parser of a stranger's input (scripts/fuzz.py): a
# million inputs by default (FUZZ_INPUTS=...), tens of minutes; not part of `make test`,
# which runs each target briefly with a fixed seed (tests/fuzz).
FUZZ_INPUTS ?= 1000000
fuzz: install
	$(TEST_ENV) $(BIN)/python scripts/fuzz.py --total $(FUZZ_INPUTS)

clean:
	rm -rf $(VENV) build dist site src/*.egg-info
