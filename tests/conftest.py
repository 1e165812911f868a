"""Shared test set-up: every Ray test gets its own RAY_TMPDIR and a private namespace, and the
test process ends with pytest's own status."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import pytest
from hypothesis import Phase, settings
from support import pace

# Short Unix socket paths: Ray's socket names must stay under ~107 bytes.
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rck"))
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

# No explain phase in any property test: its tracer (sys.settrace) makes pytest-timeout take the
# run for a debugger session and stand down, so a failing test would run unbounded, not fail.
# No deadline either: `make test` runs the unit tests beside the cluster tests, two processes
# sharing the machine's cores, and an example slowed by the other process proves nothing.
settings.register_profile("bounded", phases=[phase for phase in Phase if phase is not Phase.explain], deadline=None)
settings.load_profile("bounded")

_exit_status = 0


@pytest.fixture
def ray_tmpdir(monkeypatch: pytest.MonkeyPatch) -> str:
    path = tempfile.mkdtemp(prefix="rck")
    monkeypatch.setenv("RAY_TMPDIR", path)
    return path


def _needs_pace(item: pytest.Item) -> bool:
    """Tests that start Ray (the cluster and actor folders) wait on the machine's speed."""
    return item.path.parent.name in ("cluster", "actors")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stretch the per-test timeouts of the tests that start Ray, and the simulated cluster's
    waits for nodes, to this machine's pace."""
    slow = [item for item in items if _needs_pace(item)]
    if not slow or pace.pace() == 1.0:
        return
    import ray_ckpt.testing

    ray_ckpt.testing.JOIN_TIMEOUT_S = pace.bound(ray_ckpt.testing.JOIN_TIMEOUT_S)
    ray_ckpt.testing.DEAD_TIMEOUT_S = pace.bound(ray_ckpt.testing.DEAD_TIMEOUT_S)
    default_s = float(config.getini("timeout"))
    for item in slow:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker and marker.args else default_s
        item.add_marker(pytest.mark.timeout(pace.bound(seconds)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if pace.measured() is not None:
        terminalreporter.write_line(f"machine pace {pace.measured():.2f}: bounds that depend on speed stretched by it")


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
