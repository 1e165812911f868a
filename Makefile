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
	# two processes: one runs the tests that start Ray, one after the other; the other runs the rest
	# (tests/conftest.py). A native crash prints every thread's stack; the slowest tests are listed.
	PYTHONFAULTHANDLER=1 $(PY) -m pytest -n 2 --dist loadgroup --durations=25

bench: $(STAMP)
	$(PY) scripts/bench_codec.py --json artifacts/bench_codec.json

clean:
	rm -rf $(VENV) build *.egg-info ray_ckpt/core/*.so artifacts
