"""Shared test set-up: every Ray test gets its own RAY_TMPDIR and a private namespace, and the
test process ends with pytest's own status."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

# Short Unix socket paths: Ray's socket names must stay under ~107 bytes.
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rck"))
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

_exit_status = 0


@pytest.fixture
def ray_tmpdir(monkeypatch: pytest.MonkeyPatch) -> str:
    path = tempfile.mkdtemp(prefix="rck")
    monkeypatch.setenv("RAY_TMPDIR", path)
    return path


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Exit with the tests' status once pytest is done, skipping the interpreter's teardown.

    This one process loads Ray's core worker, pyarrow (through Ray Train) and torch for half an
    hour. Their native exit-time destructors have crashed it (signal 11, no Python frame, after
    every test passed), which would report a green suite as red. Ray is shut down first so no
    local Ray processes outlive the run.
    """
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)
