"""Shared test set-up: every Ray test gets its own RAY_TMPDIR and a private namespace."""

from __future__ import annotations

import os
import tempfile

import pytest

# Short Unix socket paths: Ray's socket names must stay under ~107 bytes.
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rck"))
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")


@pytest.fixture
def ray_tmpdir(monkeypatch: pytest.MonkeyPatch) -> str:
    path = tempfile.mkdtemp(prefix="rck")
    monkeypatch.setenv("RAY_TMPDIR", path)
    return path
