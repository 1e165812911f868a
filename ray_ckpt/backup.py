"""Persistent backups: each rank's checkpoint blob on slow, durable storage, behind one protocol.

``Backup`` is what the checkpointer needs from a backend; ``ArrowBackup`` implements it on a
local path or any pyarrow.fs URI (s3://, gs://, hdfs://, ...), resolving the filesystem once.
A new backend is one class with these five methods (see docs/design.md, "Where it goes").

ArrowBackup's layout under ``<root>/<job segment>/``::

    step-000000000120/rank-00003.blob   the rank's blob (see ray_ckpt.core.blob), raw bytes
    step-000000000120/rank-00003.json   its commit marker: {"format", "step", "rank",
                                        "world_size", "size", "checksum"}, written last

The job segment is the job's name with every character but ASCII letters, digits, '.', '_'
and '-' written as %XX (each byte of its UTF-8), and a name of only dots ("." or "..") written
whole as %2E...: ``job_segment("exp-1")`` is ``exp-1``, ``job_segment("team%2Fa")`` is
``team%252Fa``. Distinct jobs get distinct segments, and every path stays under the root;
a job whose segment would pass 255 bytes (the longest file name most filesystems hold) is
refused with ConfigError.

A blob counts only once its marker exists and its size and XXH3-64 checksum match, so a crash
mid-write never yields a partial backup. A marker is at most 4 KiB of JSON whose step and rank
are those of its place, whose world size is that of rank 0's marker, and whose numbers are
ints in range; anything else is a corrupt marker (CorruptShardError on ``read``), checked
before the blob is opened. A step is complete when every rank of its world size has a valid
marker. Readable with no cluster running: ``load(uri, job, rank)``. No pickle. Metrics are
the caller's business: nothing here records any.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ray_ckpt.core import blob, snapshot
from ray_ckpt.core.checksum import checksum
from ray_ckpt.errors import ConfigError, CorruptShardError, NoCheckpointError

FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{12,})$")  # zero-padded to 12 digits; larger steps take more
_CHUNK = 64 << 20
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
SEGMENT_MAX_BYTES = 255  # NAME_MAX of ext4, xfs, btrfs, zfs; S3 and GCS hold longer ones
MARKER_MAX_BYTES = 4096  # a marker is about 120 bytes


def job_segment(job: str) -> str:
    """The one path segment that holds ``job``'s backups (see the module docstring); ConfigError
    for a name that is not a non-empty str of valid Unicode, or whose segment is too long."""
    if not isinstance(job, str) or not job:
        raise ConfigError(f"job must be a non-empty str, got {job!r}")
    try:
        raw = job.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"job {job!r} is not valid Unicode text (it has a lone surrogate)") from None
    if set(job) == {"."}:  # "." and ".." are not names on a filesystem
        segment = "%2E" * len(job)
    else:
        segment = "".join(chr(b) if chr(b) in _SAFE else f"%{b:02X}" for b in raw)
    if len(segment) > SEGMENT_MAX_BYTES:
        raise ConfigError(
            f"job {job[:64]!r}... cannot hold backups: its folder name would be {len(segment)} bytes, more "
            f"than the {SEGMENT_MAX_BYTES} a filesystem holds in one name (characters other than ASCII "
            "letters, digits, '.', '_' and '-' take 3 bytes per UTF-8 byte); use a shorter job name",
            job=job,
        )
    return segment


@runtime_checkable
class Backup(Protocol):
    """A persistent backend for whole blobs. Every method may be called from any rank. A
    ``Checkpointer`` takes one as ``backup=`` (an ``ArrowBackup`` on ``backup_uri`` by default)."""

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

    def _under_root(self, *parts: str) -> str:
        """``<root>/<parts...>``, refusing a part that could lead out of the root or into
        another folder (empty, '.', '..', or holding '/')."""
        for part in parts:
            if not part or part in (".", "..") or "/" in part or "\\" in part:
                raise ConfigError(f"backup path segment {part!r} would not stay one folder under {self.uri}")
        return "/".join((self._root.rstrip("/"), *parts))

    def _job_dir(self, job: str) -> str:
        return self._under_root(job_segment(job))

    def _step_dir(self, job: str, step: int) -> str:
        return self._under_root(job_segment(job), f"step-{step:012d}")

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

    def _marker(self, job: str, step: int, rank: int) -> dict[str, Any] | None:
        """Rank ``rank``'s marker of ``step``, checked on its own (not against rank 0's), or
        None if there is none; CorruptShardError if it is not a marker of that step and rank."""

        def corrupt(why: str) -> CorruptShardError:
            return CorruptShardError(
                f"backup marker of job {job!r} step {step} rank {rank} under {self.uri} {why}",
                job=job,
                step=step,
                rank=rank,
            )

        path = f"{self._step_dir(job, step)}/rank-{rank:05d}.json"
        try:
            with self._fs.open_input_stream(path) as stream:
                raw = stream.read(MARKER_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as error:
            if self._fs.get_file_info(path).type == pafs.FileType.NotFound:
                return None
            raise corrupt(f"cannot be read: {error}") from None
        if len(raw) > MARKER_MAX_BYTES:
            raise corrupt(f"is larger than {MARKER_MAX_BYTES} bytes")
        try:
            marker = json.loads(raw.decode())
        except (ValueError, RecursionError):
            raise corrupt("is not JSON") from None
        if not isinstance(marker, dict):
            raise corrupt("is not a JSON object")
        if marker.get("format") != FORMAT:
            raise corrupt(f"has format {marker.get('format')!r}, not {FORMAT}")
        for key, low, high in (
            ("step", None, None),
            ("rank", 0, None),
            ("world_size", 1, None),
            ("size", 0, None),
            ("checksum", 0, (1 << 64) - 1),
        ):
            value = marker.get(key)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or (low is not None and value < low)
                or (high is not None and value > high)
            ):
                raise corrupt(f"has {key} {value!r}")
        if marker["step"] != step or marker["rank"] != rank:
            raise corrupt(f"names step {marker['step']} rank {marker['rank']}")
        if rank >= marker["world_size"]:
            raise corrupt(f"has world_size {marker['world_size']}, not more than its rank")
        return marker

    def _valid_marker(self, job: str, step: int, rank: int, world_size: int | None) -> dict[str, Any] | None:
        """The marker if it exists, is valid and (``world_size`` given) agrees with it; else None."""
        try:
            marker = self._marker(job, step, rank)
        except CorruptShardError:
            return None
        if marker is None or (world_size is not None and marker["world_size"] != world_size):
            return None
        return marker

    def steps(self, job: str) -> list[int]:
        """Steps that have a backup folder (complete or not), oldest first."""
        selector = pafs.FileSelector(self._job_dir(job), allow_not_found=True)
        found = []
        for info in self._fs.get_file_info(selector):
            match = _STEP_DIR.match(info.base_name)
            if match and info.type == pafs.FileType.Directory:
                found.append(int(match.group(1)))
        return sorted(found)

    def complete_steps(self, job: str) -> list[int]:
        """A step whose markers are missing, corrupt or disagree on the world size is not complete."""
        complete = []
        for step in self.steps(job):
            first = self._valid_marker(job, step, 0, None)
            if first is None:
                continue
            world_size = first["world_size"]
            if all(self._valid_marker(job, step, r, world_size) is not None for r in range(1, world_size)):
                complete.append(step)
        return complete

    def saved_world_size(self, job: str, step: int) -> int | None:
        """CorruptShardError if rank 0's marker is there but not valid."""
        marker = self._marker(job, step, 0)
        return None if marker is None else int(marker["world_size"])

    def read(self, job: str, step: int, rank: int) -> np.ndarray:
        """The marker is checked (its step, rank, world size against rank 0's, and the blob's
        size against the file's) before anything of the blob's size is allocated."""
        marker = self._marker(job, step, rank)
        if marker is None:
            raise NoCheckpointError(
                f"no backup of job {job!r} step {step} rank {rank} under {self.uri}", job=job, step=step
            )
        details = {"job": job, "step": step, "rank": rank}
        what = f"backup of job {job!r} step {step} rank {rank} under {self.uri}"
        first = marker if rank == 0 else self._marker(job, step, 0)
        if first is not None and first["world_size"] != marker["world_size"]:
            raise CorruptShardError(
                f"{what}: its marker says world size {marker['world_size']}, rank 0's {first['world_size']}",
                **details,
            )
        size = marker["size"]
        try:
            stream = self._fs.open_input_file(f"{self._step_dir(job, step)}/rank-{rank:05d}.blob")
        except FileNotFoundError:
            raise CorruptShardError(f"{what}: its marker is there, its blob is not", **details) from None
        with stream:
            if stream.size() != size:
                raise CorruptShardError(
                    f"{what}: the blob has {stream.size()} bytes, its marker says {size}", **details
                )
            out = np.empty(size, dtype=np.uint8)
            if stream.readinto(out.data) != size:
                raise CorruptShardError(f"{what}: the blob shrank while it was read", **details)
        if checksum(out) != marker["checksum"]:
            raise CorruptShardError(f"{what}: the blob fails its checksum", **details)
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
