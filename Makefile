# yolo-train: `make run` trains the embedded demo under the supervisor, `make test` runs every test.
# Both do all set-up themselves on a fresh machine.
#
# The torch build is yours to choose:
#   make install TORCH_REQ='torch torchvision --index-url https://download.pytorch.org/whl/rocm6.4'
#   make install SYSTEM_TORCH=1     # reuse the torch already installed in the system Python
PYTHON      ?= python3
VENV        ?= .venv
TORCH_REQ   ?= torch==2.14.1 torchvision==0.29.1
SYSTEM_TORCH ?=
# Running needs what systemd-python compiles against (libsystemd, pkg-config, a compiler and Python's headers).
RUN_DEB_PACKAGES = libsystemd-dev pkg-config gcc python3-dev
# The tests add: promtool and prometheus for the metrics tests, systemd booted in a namespace for the unit's tests,
# systemd-journal-remote for real journal files, chromium to open the page `report` writes, libfuse3-3 for a state
# directory on a real FUSE mount and a dataset read one holds (tests/helpers/fuse_passthrough.py and
# fuse_held_read.py, through mfusepy).
TEST_DEB_PACKAGES = prometheus systemd systemd-journal-remote chromium libfuse3-3
FAULT       ?=
PYTEST_ARGS ?=
TEST_JOBS   ?= 3

BIN = $(VENV)/bin
STAMP = $(VENV)/.installed
TEST_STAMP = $(VENV)/.installed-test

.PHONY: install install-test deb run test durations unit bench install-service clean

# What `make run` needs: the venv with torch and yolo-train.
install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(MAKE) --no-print-directory deb DEB_PACKAGES="$(RUN_DEB_PACKAGES)"
	$(PYTHON) -m venv $(if $(SYSTEM_TORCH),--system-site-packages) $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(SYSTEM_TORCH),,$(BIN)/pip install -q $(TORCH_REQ))
	$(BIN)/pip install -q -e .
	touch $@

# What `make test` adds: the test packages of Debian and of PyPI.
install-test: $(TEST_STAMP)

$(TEST_STAMP): $(STAMP)
	@$(MAKE) --no-print-directory deb DEB_PACKAGES="$(TEST_DEB_PACKAGES)"
	$(BIN)/pip install -q -e '.[test,dashboards]'
	touch $@

# Debian packages (DEB_PACKAGES): installed when root, otherwise the exact command is printed.
deb:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else \
		echo "missing Debian packages; run: sudo apt-get install -y $$missing"; exit 1; \
	fi

# Each demo run gets a state directory of its own under runs/, so a second `make run` trains again.
DEMO_STATE ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

run: install
	$(BIN)/yolo-train run --state-dir $(DEMO_STATE) $(if $(FAULT),--fault $(FAULT))

# Three at a time (most tests wait on a real hang's detection, half a core each; an idle worker steals queued tests:
# 10:16 against 16:30 with two on this 2-core VM, the same 1,110 tests), then the few marked serial alone: they write
# into the real /dev/kmsg, which a supervisor beside them would read.
test: install-test
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist worksteal -m 'not serial' $(PYTEST_ARGS); rc=$$?; \
	$(BIN)/python -m pytest -q -m serial $(PYTEST_ARGS); serial=$$?; \
	if [ $$rc = 5 ] && [ $$serial = 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; \
	if [ $$rc != 0 ] && [ $$rc != 5 ]; then exit $$rc; fi; if [ $$serial != 5 ]; then exit $$serial; fi

# tests/durations.txt, the order `make test` hands tests out in (slowest first): measured anew by a full run.
durations: install-test
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist worksteal -m 'not serial' --durations=0 $(PYTEST_ARGS) \
		| awk '/^[0-9.]+s (setup|call|teardown) /{sub(/s$$/, "", $$1); t[$$3] += $$1} \
		END {for (n in t) if (t[n] >= 3) printf "%.0f %s\n", t[n], n}' | sort -rn > tests/durations.txt

unit: install-test
	$(BIN)/python -m pytest -q -m 'not e2e' $(PYTEST_ARGS)

bench: install-test
	$(BIN)/python -m bench.recovery
	$(BIN)/python -m bench.heartbeat
	$(BIN)/python -m bench.footprint

# Installs the unit, /etc/yolo-train/config.toml (never overwritten), the yolo-train user; then:
#   systemctl enable --now yolo-train
install-service: install
	$(BIN)/yolo-train install-service

clean:
	rm -rf $(VENV) build *.egg-info
