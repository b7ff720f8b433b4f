# Everything a fresh machine needs: Python 3.11 with pip, and make. No venv required beforehand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest

.PHONY: all venv sysdeps test lint typecheck unit benchcheck check bench regen clean

all: test

# Exact versions of every dependency live in requirements/constraints.txt (the tested set);
# pyproject.toml keeps the ranges a user's own install resolves against. The editable install
# also compiles the delta codec's C extension in place (codecs/_delta_accel.*.so): an edited
# source reinstalls, so no target runs a stale build.
#
# tritonclient comes last and without its dependencies: its grpc extra pins protobuf<7, which
# the schemas' generated modules cannot run on, and tritonclient.grpc runs on protobuf 7. Its
# runtime dependencies are in the dev extra, resolved with everything else
# (requirements/tritonclient.txt says more).
$(STAMP): pyproject.toml setup.py requirements/constraints.txt requirements/tritonclient.txt \
		codecs/_delta_accel.c codecs/_scan.c codecs/_flatbuffers_accel.c codecs/_protobuf_accel.c \
		codecs/_openai_accel.c codecs/_extension.h codecs/_model_slots.h codecs/_wire_buf.h \
		bench/measure/_callgrind.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements/constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -c requirements/constraints.txt \
		-r requirements/tritonclient.txt
	$(BIN)/python -m pip check
	touch $@

venv: $(STAMP)

# The type checker resolves `inferwire.*` through this link tree: the folders are mapped under
# the namespace by setuptools' import hook, which mypy does not run.
.typecheck/inferwire: Makefile | $(STAMP)
	mkdir -p .typecheck/inferwire
	for d in _runtime codecs schemas workloads engine serving transports load observe bench cli; do ln -sfn ../../$$d .typecheck/inferwire/$$d; done
	ln -sfn ../tests .typecheck/tests
	ln -sfn ../examples .typecheck/examples

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Run from inside the link tree: from the checkout's root, mypy would take the top-level
# codecs/ folder for the standard library's codecs module and misread numpy's stubs.
typecheck: $(STAMP) .typecheck/inferwire
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml \
		-p inferwire.codecs -p inferwire.schemas -p inferwire.workloads -p inferwire.engine \
		-p inferwire.serving \
		-p inferwire.transports -p inferwire.load -p inferwire.observe \
		-p inferwire.bench -p inferwire.cli -p inferwire._runtime
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml tests examples

# Two processes, one test file each at a time (pytest-xdist, --dist loadfile keeps a file's
# module fixtures in one process): most tests wait on sockets and sleeps, so this halves the
# wall time on the two cores of this machine.
unit: $(STAMP)
	$(PYTEST) tests -n 2 --dist loadfile --durations=20

# Every benchmark body once, untimed: a broken benchmark fails CI. Untimed, the bodies run in two
# processes too (a file's servers in one: --dist loadfile).
benchcheck: $(STAMP)
	$(PYTEST) bench --benchmark-disable -n 2 --dist loadfile

# System tools the tests drive, from Debian's packages, installed only when missing (so a second
# run changes nothing): h2load loads the HTTP/2 server; a C++ compiler builds the FlatBuffers
# reader that flatc generates; valgrind counts the codecs' instructions (bench_instructions.py);
# prometheus (the server and promtool) scrapes the servers in the live alert test and checks the
# shipped rules (observe/prometheus/); curl --compressed decodes the compressed streams.
# Needs root (a fresh machine here, and CI, are); elsewhere the tests that need a missing tool
# skip and say which.
sysdeps:
	@missing=""; \
	command -v h2load >/dev/null || missing="$$missing nghttp2-client"; \
	command -v c++ >/dev/null || missing="$$missing g++"; \
	command -v valgrind >/dev/null || missing="$$missing valgrind"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
		else \
			echo "not root: install$$missing for the tests that use them"; \
		fi; \
	fi

# The wheel a user installs: the sdist built from the checkout, the wheel from the sdist,
# installed into a fresh venv (base dependencies, then the bench extra) and tried from outside
# the checkout; it must hold every file of the tree (.ci/wheel_check.py says what it checks).
.PHONY: wheelcheck
wheelcheck: $(STAMP)
	$(BIN)/python .ci/wheel_check.py

# The tests and every benchmark body (untimed) in one session of three processes, a test file
# in one process (its module fixtures once): most tests wait on sockets, child processes and
# sleeps, so a third process fills the two cores' idle time (user+sys CPU was 1.4 cores of wall
# time with two), and one session ends in one tail, not two.
check: $(STAMP)
	$(PYTEST) tests bench --benchmark-disable -n 3 --dist loadfile --durations=20

# The type checks, the wheel check and the tests side by side: mypy keeps one core busy for a
# minute or two and the wheel check mostly waits on pip and the compiler, while the tests leave
# a share of the two cores idle (user+sys CPU was 1.5 cores of the wall time with the checks
# before them). Each target's output is printed whole when it ends.
test: sysdeps lint $(STAMP) .typecheck/inferwire
	$(MAKE) -j3 --output-sync=target typecheck wheelcheck check

# The main job: the standard benchmark matrix, written to results/. Three repeats of every
# timing suite, each in a fresh process (medians and their spread are published, and each
# verdict is judged per repeat), with rounds short enough that the whole run takes under
# twenty-five minutes on a 2-core machine. Exit status 3: the run was unstable and the published
# one is not; nothing was overwritten (see `inferwire bench --help`).
BENCH_REPEATS ?= 3
BENCH_MAX_TIME ?= 0.1
bench: sysdeps $(STAMP)
	$(BIN)/inferwire bench --out results --repeat $(BENCH_REPEATS) --max-time $(BENCH_MAX_TIME)

regen: $(STAMP)
	$(BIN)/python -m inferwire.schemas.generate

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache .benchmarks

# Opt-in, not part of `make test`: `inferwire load` beside guidellm on one inferwire server
# (results/load-agreement.md). guidellm brings torch and CUDA libraries (about 6 GB), so it gets
# an environment of its own, pinned to the version whose JSON the comparison reads; it runs
# offline with a small tokenizer built from the project's vocabulary.
GUIDELLM_VENV := .venv-guidellm
GUIDELLM_STAMP := $(GUIDELLM_VENV)/.installed

.PHONY: compare-guidellm

$(GUIDELLM_STAMP):
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GUIDELLM_VENV)/bin/python -m pip install --quiet guidellm==0.8.1 tokenizers==0.23.3
	touch $@

compare-guidellm: $(STAMP) $(GUIDELLM_STAMP)
	$(BIN)/python -m inferwire.load.local_tokenizer $(GUIDELLM_VENV)/tokenizer
	$(BIN)/python -m inferwire.load.guidellm_compare \
		--guidellm $(GUIDELLM_VENV)/bin/guidellm --tokenizer $(GUIDELLM_VENV)/tokenizer
	$(BIN)/python -m inferwire.bench.report.load_agreement
