# The two set-up commands (see README): `make demo` and `make test`. Each creates or refreshes
# the virtual environment first, so both work from a clean clone.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py ray_ckpt/core/_gf256.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: the CPU build (a plain requirement would pull a multi-GB CUDA build)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: lint
	# Two pytest processes at once: the tests that start Ray (tests/cluster, tests/actors) one
	# after the other in one, never two clusters at once; the unit tests beside them in the other,
	# its report printed when both are done. A native crash prints every thread's stack; the
	# slowest tests are listed. The unit tests run at the lowest CPU priority (nice 19): they wait
	# on nothing, so they fill the idle moments of the Ray tests instead of slowing their clusters.
	# It must be below Ray's own workers, which Ray starts at niceness 15 (at 10 the unit tests
	# still took three quarters of a core from a busy worker). A unit test's deadline must
	# therefore hold when its threads are starved for seconds. Fails if either fails.
	PYTHONFAULTHANDLER=1 nice -n 19 $(PY) -m pytest tests/unit --durations=10 > $(VENV)/unit-tests.log 2>&1 & unit=$$!; \
	PYTHONFAULTHANDLER=1 $(PY) -m pytest tests/cluster tests/actors --durations=40; ray=$$?; \
	wait $$unit; units=$$?; cat $(VENV)/unit-tests.log; \
	echo "tests that start Ray: exit $$ray; unit tests: exit $$units"; test $$ray -eq 0 -a $$units -eq 0

bench: $(STAMP)
	$(PY) scripts/bench_codec.py --json artifacts/bench_codec.json

clean:
	rm -rf $(VENV) build *.egg-info ray_ckpt/core/*.so artifacts
