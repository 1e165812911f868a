"""Persistent backups: each rank's checkpoint blob on a local path or any pyarrow.fs URI.

Layout under ``<uri>/<job>/``::

    step-000000000120/rank-00003.blob   the rank's blob (see ray_ckpt.blob), raw bytes
    step-000000000120/rank-00003.json   its commit marker: {"format", "step", "rank",
                                        "world_size", "size", "checksum"}, written last

A blob counts only once its marker exists and its size and XXH3-64 checksum match, so a crash
mid-write never yields a partial backup. A step is complete when every rank of its world size
has a valid marker. Readable with no cluster running: ``load(uri, job, rank)``. No pickle.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ray_ckpt import blob, metrics, snapshot
from ray_ckpt.checksum import checksum
from ray_ckpt.errors import ConfigError, CorruptShardError, NoCheckpointError

FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{12})$")
_CHUNK = 64 << 20


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if not isinstance(uri, str) or not uri:
        raise ConfigError(f"backup_uri must be a non-empty path or URI, got {uri!r}")
    if "://" not in uri:
        uri = os.path.abspath(uri)
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, ValueError) as error:
        raise ConfigError(f"backup_uri {uri!r} is not a path or URI pyarrow.fs understands: {error}") from None


def _step_dir(root: str, job: str, step: int) -> str:
    return f"{root.rstrip('/')}/{job}/step-{step:012d}"


def write(uri: str, job: str, step: int, rank: int, world_size: int, data: np.ndarray) -> None:
    """Write one rank's blob of ``step``, then its marker (the commit point)."""
    fs, root = _filesystem(uri)
    folder = _step_dir(root, job, step)
    fs.create_dir(folder, recursive=True)
    final = f"{folder}/rank-{rank:05d}.blob"
    temporary = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
    view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    with fs.open_output_stream(temporary) as out:
        for start in range(0, len(view), _CHUNK):
            out.write(view[start : start + _CHUNK])
    fs.move(temporary, final)
    marker = {
        "format": FORMAT,
        "step": step,
        "rank": rank,
        "world_size": world_size,
        "size": len(view),
        "checksum": checksum(data),
    }
    with fs.open_output_stream(f"{folder}/rank-{rank:05d}.json") as out:
        out.write(json.dumps(marker).encode())
    metrics.observe_backup(job, len(view))


def _marker(fs: pafs.FileSystem, folder: str, rank: int) -> dict[str, Any] | None:
    try:
        with fs.open_input_stream(f"{folder}/rank-{rank:05d}.json") as stream:
            marker = json.loads(stream.read().decode())
    except (FileNotFoundError, OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT:
        return None
    return marker


def steps(uri: str, job: str) -> list[int]:
    """Steps that have a backup folder (complete or not), oldest first."""
    fs, root = _filesystem(uri)
    selector = pafs.FileSelector(f"{root.rstrip('/')}/{job}", allow_not_found=True)
    found = []
    for info in fs.get_file_info(selector):
        match = _STEP_DIR.match(info.base_name)
        if match and info.type == pafs.FileType.Directory:
            found.append(int(match.group(1)))
    return sorted(found)


def complete_steps(uri: str, job: str) -> list[int]:
    """Steps whose every rank wrote its marker, oldest first."""
    fs, root = _filesystem(uri)
    complete = []
    for step in steps(uri, job):
        folder = _step_dir(root, job, step)
        first = _marker(fs, folder, 0)
        if first is None:
            continue
        world_size = int(first["world_size"])
        if all(_marker(fs, folder, r) is not None for r in range(1, world_size)):
            complete.append(step)
    return complete


def saved_world_size(uri: str, job: str, step: int) -> int | None:
    """The world size ``step`` was backed up at (rank 0's marker), or None without a marker."""
    fs, root = _filesystem(uri)
    marker = _marker(fs, _step_dir(root, job, step), 0)
    return None if marker is None else int(marker["world_size"])


def read(uri: str, job: str, step: int, rank: int) -> np.ndarray:
    """One rank's blob of ``step``, checked against its marker."""
    fs, root = _filesystem(uri)
    folder = _step_dir(root, job, step)
    marker = _marker(fs, folder, rank)
    if marker is None:
        raise NoCheckpointError(f"no backup of job {job!r} step {step} rank {rank} under {uri}", job=job, step=step)
    size = int(marker["size"])
    out = np.empty(size, dtype=np.uint8)
    with fs.open_input_file(f"{folder}/rank-{rank:05d}.blob") as stream:
        if stream.size() != size:
            raise CorruptShardError(
                f"backup blob of job {job!r} step {step} rank {rank} has {stream.size()} bytes, its marker says {size}"
            )
        stream.readinto(out.data)
    if checksum(out) != int(marker["checksum"]):
        raise CorruptShardError(f"backup blob of job {job!r} step {step} rank {rank} fails its checksum")
    return out


def prune(uri: str, job: str, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` complete steps (and incomplete ones older than
    them). Returns the steps deleted."""
    complete = complete_steps(uri, job)
    if len(complete) <= keep:
        return []
    oldest_kept = complete[-keep]
    fs, root = _filesystem(uri)
    doomed = [s for s in steps(uri, job) if s < oldest_kept]
    for step in doomed:
        fs.delete_dir(_step_dir(root, job, step))
    return doomed


def load(uri: str, job: str, rank: int, step: int | None = None) -> tuple[int, Any]:
    """``(step, state)`` of one rank from a backup (default: the newest complete step),
    without a cluster. NoCheckpointError if there is none."""
    if step is None:
        complete = complete_steps(uri, job)
        if not complete:
            raise NoCheckpointError(f"no complete backup of job {job!r} under {uri}", job=job)
        step = complete[-1]
    data = read(uri, job, step, rank)
    header, payload = blob.split(data)
    return step, snapshot.restore(header, payload, copy=False)
