"""Persistent backups: each rank's checkpoint blob on slow, durable storage, behind one protocol.

``Backup`` is what the checkpointer needs from a backend; ``ArrowBackup`` implements it on a
local path or any pyarrow.fs URI (s3://, gs://, hdfs://, ...), resolving the filesystem once.
A new backend is one class with these five methods (see docs/design.md, "Where it goes").

ArrowBackup's layout under ``<root>/<job>/``::

    step-000000000120/rank-00003.blob   the rank's blob (see ray_ckpt.blob), raw bytes
    step-000000000120/rank-00003.json   its commit marker: {"format", "step", "rank",
                                        "world_size", "size", "checksum"}, written last

A blob counts only once its marker exists and its size and XXH3-64 checksum match, so a crash
mid-write never yields a partial backup. A step is complete when every rank of its world size
has a valid marker. Readable with no cluster running: ``load(uri, job, rank)``. No pickle.
Metrics are the caller's business: nothing here records any.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ray_ckpt import blob, snapshot
from ray_ckpt.checksum import checksum
from ray_ckpt.errors import ConfigError, CorruptShardError, NoCheckpointError

FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{12})$")
_CHUNK = 64 << 20


class Backup(Protocol):
    """A persistent backend for whole blobs. Every method may be called from any rank."""

    def write(self, job: str, step: int, rank: int, world_size: int, data: np.ndarray) -> None:
        """Store one rank's blob of ``step`` atomically: visible whole or not at all."""

    def complete_steps(self, job: str) -> list[int]:
        """Steps that every rank of their world size wrote, oldest first."""

    def saved_world_size(self, job: str, step: int) -> int | None:
        """The world size ``step`` was written at, or None if rank 0's part is missing."""

    def read(self, job: str, step: int, rank: int) -> np.ndarray:
        """One rank's blob, checked (CorruptShardError if not intact, NoCheckpointError if absent)."""

    def prune(self, job: str, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` complete steps; returns the steps deleted."""


class ArrowBackup:
    """``Backup`` on a local path or a pyarrow.fs URI; the filesystem is resolved once."""

    def __init__(self, uri: str) -> None:
        if not isinstance(uri, str) or not uri:
            raise ConfigError(f"backup_uri must be a non-empty path or URI, got {uri!r}")
        self.uri = uri
        if "://" not in uri:
            uri = os.path.abspath(uri)
        try:
            self._fs, self._root = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowInvalid, ValueError) as error:
            raise ConfigError(f"backup_uri {uri!r} is not a path or URI pyarrow.fs understands: {error}") from None

    def _step_dir(self, job: str, step: int) -> str:
        return f"{self._root.rstrip('/')}/{job}/step-{step:012d}"

    def write(self, job: str, step: int, rank: int, world_size: int, data: np.ndarray) -> None:
        """Write the blob to a temporary name, move it in place, then write its marker (the
        commit point)."""
        folder = self._step_dir(job, step)
        self._fs.create_dir(folder, recursive=True)
        final = f"{folder}/rank-{rank:05d}.blob"
        temporary = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
        view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
        with self._fs.open_output_stream(temporary) as out:
            for start in range(0, len(view), _CHUNK):
                out.write(view[start : start + _CHUNK])
        self._fs.move(temporary, final)
        marker = {
            "format": FORMAT,
            "step": step,
            "rank": rank,
            "world_size": world_size,
            "size": len(view),
            "checksum": checksum(data),
        }
        with self._fs.open_output_stream(f"{folder}/rank-{rank:05d}.json") as out:
            out.write(json.dumps(marker).encode())

    def _marker(self, folder: str, rank: int) -> dict[str, Any] | None:
        try:
            with self._fs.open_input_stream(f"{folder}/rank-{rank:05d}.json") as stream:
                marker = json.loads(stream.read().decode())
        except (FileNotFoundError, OSError, ValueError):
            return None
        if not isinstance(marker, dict) or marker.get("format") != FORMAT:
            return None
        return marker

    def steps(self, job: str) -> list[int]:
        """Steps that have a backup folder (complete or not), oldest first."""
        selector = pafs.FileSelector(f"{self._root.rstrip('/')}/{job}", allow_not_found=True)
        found = []
        for info in self._fs.get_file_info(selector):
            match = _STEP_DIR.match(info.base_name)
            if match and info.type == pafs.FileType.Directory:
                found.append(int(match.group(1)))
        return sorted(found)

    def complete_steps(self, job: str) -> list[int]:
        complete = []
        for step in self.steps(job):
            folder = self._step_dir(job, step)
            first = self._marker(folder, 0)
            if first is None:
                continue
            world_size = int(first["world_size"])
            if all(self._marker(folder, r) is not None for r in range(1, world_size)):
                complete.append(step)
        return complete

    def saved_world_size(self, job: str, step: int) -> int | None:
        marker = self._marker(self._step_dir(job, step), 0)
        return None if marker is None else int(marker["world_size"])

    def read(self, job: str, step: int, rank: int) -> np.ndarray:
        folder = self._step_dir(job, step)
        marker = self._marker(folder, rank)
        if marker is None:
            raise NoCheckpointError(
                f"no backup of job {job!r} step {step} rank {rank} under {self.uri}", job=job, step=step
            )
        size = int(marker["size"])
        out = np.empty(size, dtype=np.uint8)
        with self._fs.open_input_file(f"{folder}/rank-{rank:05d}.blob") as stream:
            if stream.size() != size:
                raise CorruptShardError(
                    f"backup blob of job {job!r} step {step} rank {rank} has {stream.size()} bytes, "
                    f"its marker says {size}"
                )
            stream.readinto(out.data)
        if checksum(out) != int(marker["checksum"]):
            raise CorruptShardError(f"backup blob of job {job!r} step {step} rank {rank} fails its checksum")
        return out

    def prune(self, job: str, keep: int) -> list[int]:
        """Also deletes incomplete steps older than the oldest kept one."""
        complete = self.complete_steps(job)
        if len(complete) <= keep:
            return []
        oldest_kept = complete[-keep]
        doomed = [s for s in self.steps(job) if s < oldest_kept]
        for step in doomed:
            self._fs.delete_dir(self._step_dir(job, step))
        return doomed


def complete_steps(uri: str, job: str) -> list[int]:
    """The complete backup steps of ``job`` under ``uri``, oldest first."""
    return ArrowBackup(uri).complete_steps(job)


def load(uri: str, job: str, rank: int, step: int | None = None) -> tuple[int, Any]:
    """``(step, state)`` of one rank from a backup (default: the newest complete step),
    without a cluster. NoCheckpointError if there is none."""
    store = ArrowBackup(uri)
    if step is None:
        complete = store.complete_steps(job)
        if not complete:
            raise NoCheckpointError(f"no complete backup of job {job!r} under {uri}", job=job)
        step = complete[-1]
    header, payload = blob.split(store.read(job, step, rank))
    return step, snapshot.restore(header, payload, copy=False)
