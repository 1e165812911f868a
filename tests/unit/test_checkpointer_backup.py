"""``Checkpointer(backup=...)``: the persistent backend a caller hands in is the one saves write
to and restores fall back to; without it, as before, an ``ArrowBackup`` on ``backup_uri`` or none.
The Checkpointer is built with Ray, the registry client and the store directory stood in for."""

from __future__ import annotations

import pathlib
import types
from typing import Any

import numpy as np
import pytest

from ray_ckpt import CheckpointConfig, ConfigError
from ray_ckpt import checkpointer as checkpointer_module
from ray_ckpt.backup import ArrowBackup, Backup
from ray_ckpt.checkpointer import Checkpointer


class MemoryBackup:
    """A ``Backup`` in a dict (what a caller's own backend could be)."""

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, int, int], np.ndarray] = {}

    def write(self, job: str, step: int, rank: int, world_size: int, data: np.ndarray) -> None:
        self.blobs[(job, step, rank)] = np.array(data, copy=True)

    def complete_steps(self, job: str) -> list[int]:
        return sorted({step for j, step, _ in self.blobs if j == job})

    def saved_world_size(self, job: str, step: int) -> int | None:
        return 1 if (job, step, 0) in self.blobs else None

    def read(self, job: str, step: int, rank: int) -> np.ndarray:
        return self.blobs[(job, step, rank)]

    def prune(self, job: str, keep: int) -> list[int]:
        return []


@pytest.fixture
def connected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray looks connected; the registry client and the store directory are inert stand-ins."""
    context = types.SimpleNamespace(get_node_id=lambda: "node-0")
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context)
    monkeypatch.setattr(checkpointer_module, "ray", fake_ray)
    monkeypatch.setattr(checkpointer_module, "RegistryClient", lambda namespace: types.SimpleNamespace())
    monkeypatch.setattr(checkpointer_module, "StoreDirectory", lambda namespace: types.SimpleNamespace())


def built(**kwargs: Any) -> Checkpointer:
    return Checkpointer(job="job", rank=0, world_size=1, **kwargs)


def test_memory_backup_is_a_backup() -> None:
    assert isinstance(MemoryBackup(), Backup)


@pytest.mark.usefixtures("connected")
def test_the_given_backup_is_the_one_saves_and_restores_use() -> None:
    backup = MemoryBackup()
    ckpt = built(config=CheckpointConfig(backup_every=2), backup=backup)  # no backup_uri needed
    try:
        assert ckpt._saves.backup is backup and ckpt._restorer.backup is backup
    finally:
        ckpt._background.shutdown()


@pytest.mark.usefixtures("connected")
def test_without_one_the_backup_is_arrow_on_backup_uri_or_none(tmp_path: pathlib.Path) -> None:
    ckpt = built(config=CheckpointConfig(backup_every=2, backup_uri=str(tmp_path)))
    plain = built()
    try:
        assert isinstance(ckpt._saves.backup, ArrowBackup) and ckpt._restorer.backup is ckpt._saves.backup
        assert ckpt._saves.backup.uri == str(tmp_path)
        assert plain._saves.backup is None and plain._restorer.backup is None
    finally:
        ckpt._background.shutdown()
        plain._background.shutdown()
    with pytest.raises(ConfigError, match="backup_every=2 needs a backup_uri"):
        built(config=CheckpointConfig(backup_every=2))


def test_a_backup_that_is_not_one_or_comes_with_a_backup_uri_is_refused_before_ray(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"backup must implement ray_ckpt\.backup\.Backup"):
        built(backup=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not both"):
        built(config=CheckpointConfig(backup_uri=str(tmp_path)), backup=MemoryBackup())
