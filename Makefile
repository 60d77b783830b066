# mqhub: `make run` sets up and runs the broker; `make test` sets up and runs the whole suite.
# python3.11 when the machine has it (python3 may be another version), else python3 (>= 3.11).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
NATIVE := $(VENV)/.native
DATA   ?= ./var

.PHONY: venv bytecode run test test-fast lint typecheck bench clean node web browser reliability fuzz

venv: $(STAMP) $(NATIVE)

# The NATS frame scanner's C loop (setup.py, mqhub/protocols/nats/_scan.c): built by the
# editable install, and again here when its source changes in an existing venv.
$(NATIVE): $(STAMP) setup.py mqhub/protocols/nats/_scan.c
	$(PY) setup.py -q build_ext --inplace
	touch $@

$(STAMP): setup.cfg setup.py pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel setuptools
	$(PIP) install -q -e '.[dev,export,spark]' --config-settings editable_mode=compat
	# eventmq 0.3.13 pins a pyzmq that does not build on 3.11: its needs come from the dev extra.
	$(PIP) install -q --no-deps eventmq
	# Rebuild the plugin caches now (site-packages may be read-only at run time) and fail
	# loudly if twistd cannot see the mqhub drop-in.
	$(PY) -c "from twisted.application.service import IServiceMaker; from twisted.plugin import getPlugins; assert 'mqhub' in {m.tapname for m in getPlugins(IServiceMaker)}, 'twistd cannot find the mqhub plugin'"
	$(PY) -c "import mqhub.plugins; from mqhub.interfaces import IProtocolPlugin; from twisted.plugin import getPlugins; list(getPlugins(IProtocolPlugin, mqhub.plugins))"
	touch $(STAMP)
	$(MAKE) --no-print-directory bytecode

# Byte-compile the checkout as an installed package is: with PYTHONDONTWRITEBYTECODE set, a
# source tree would compile every module on every start (docs/operations.md, Fast start).
bytecode:
	$(PY) -m compileall -q -j 0 mqhub twisted

node: venv
	@if [ -f tests/interop/node/package.json ]; then cd tests/interop/node && npm install --no-audit --no-fund --silent; fi

# The admin page's chart library (uPlot, pinned in mqhub/web/package-lock.json), installed from
# npm into mqhub/web/node_modules and served by the admin listener itself (no CDN). Separate from
# tests/interop/node: this one is what the broker serves, that one holds test clients.
WEB_STAMP := mqhub/web/node_modules/.installed
web: $(WEB_STAMP)

$(WEB_STAMP): mqhub/web/package.json mqhub/web/package-lock.json
	cd mqhub/web && npm ci --no-audit --no-fund --silent
	touch $@

# The admin page's end-to-end test drives Debian's headless Chromium through chromedriver;
# the manhole test logs in with OpenSSH's client. Installed (as root) only when missing.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/ssh ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver openssh-client; \
	fi

run: venv web bytecode
	mkdir -p $(DATA)
	$(VENV)/bin/twistd -n --pidfile= mqhub --protocols all --data-dir $(DATA)

test: venv node web browser
	$(PY) -m pytest -q tests

# The reliability suite's long runs (the short versions run in `make test`): crash cycles per
# durable protocol, then every figure as a table (docs/guarantees.md quotes them).
# RELIABILITY_K selects tests by pytest -k (e.g. RELIABILITY_K="mqks or vibemq").
CYCLES ?= 100
FIGURES ?= var/reliability-figures.jsonl
RELIABILITY_K ?=
reliability: venv
	mkdir -p var && rm -f $(FIGURES)
	MQHUB_CRASH_CYCLES=$(CYCLES) MQHUB_RELIABILITY_FIGURES=$(abspath $(FIGURES)) \
		$(PY) -m pytest -q -p no:randomly --timeout=7200 tests/reliability \
		$(if $(RELIABILITY_K),-k "$(RELIABILITY_K)"); \
		status=$$?; $(PY) -m tests.reliability.report $(FIGURES); exit $$status

# Fuzz every codec: atheris (coverage-guided) for FUZZ_SECONDS each, then FUZZ_INPUTS random
# mutations each; prints inputs per codec, fails on any crash (inputs go to var/fuzz-crashes/).
FUZZ_SECONDS ?= 30
FUZZ_INPUTS ?= 1000000
FUZZ_CODECS ?=
fuzz: venv
	mkdir -p var
	MQHUB_RELIABILITY_FIGURES=$(abspath var/fuzz-figures.jsonl) \
		$(PY) -m tests.reliability.fuzz.main --seconds $(FUZZ_SECONDS) --inputs $(FUZZ_INPUTS) \
		$(foreach c,$(FUZZ_CODECS),--codec $(c))

test-fast: venv
	$(PY) -m pytest -q -x -m "not interop and not slow" tests

lint: venv
	$(VENV)/bin/ruff check mqhub tests benchmarks plugins

typecheck: venv
	$(VENV)/bin/mypy

bench: venv
	$(VENV)/bin/mqhub bench --help

clean:
	rm -rf $(VENV) build *.egg-info mqhub/protocols/nats/_scan.*.so
