"""ArrowBackup on a local folder: job names as one path segment under the root, and markers
checked before a blob is trusted (step, rank, world size, size) so a bad one is corrupt, fast."""

from __future__ import annotations

import json
import pathlib
import time
import tracemalloc
import urllib.parse
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_ckpt.backup import SEGMENT_MAX_BYTES, ArrowBackup, job_segment
from ray_ckpt.errors import ConfigError, CorruptShardError, NoCheckpointError

WORLD = 2


def blob_of(step: int, rank: int) -> np.ndarray:
    return np.full(1000 + rank, (step * 10 + rank) % 256, dtype=np.uint8)


def write_step(backup: ArrowBackup, job: str, step: int, world_size: int = WORLD) -> None:
    for rank in range(world_size):
        backup.write(job, step, rank, world_size, blob_of(step, rank))


def files_under(folder: pathlib.Path) -> set[pathlib.Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


# ---- job names --------------------------------------------------------------------------


@pytest.mark.parametrize("job", ["exp-1", "TorchTrainer_2024-05-01_12-00-00", "a.b", "x" * SEGMENT_MAX_BYTES])
def test_ordinary_job_names_keep_the_paths_backups_always_had(tmp_path: pathlib.Path, job: str) -> None:
    """Letters, digits, '.', '_' and '-' are the folder name as they were: old backups stay found."""
    ArrowBackup(str(tmp_path)).write(job, 7, 0, 1, blob_of(7, 0))
    assert files_under(tmp_path) == {
        tmp_path / job / "step-000000000007" / "rank-00000.blob",
        tmp_path / job / "step-000000000007" / "rank-00000.json",
    }


def test_job_dot_dot_cannot_write_outside_the_backup_uri(tmp_path: pathlib.Path) -> None:
    """Job '..' gets a folder of its own under the root, and reads back from it."""
    root = tmp_path / "backups"
    backup = ArrowBackup(str(root))
    write_step(backup, "..", 1)
    assert files_under(tmp_path) == files_under(root)
    assert {p.relative_to(root).parts[0] for p in files_under(root)} == {"%2E%2E"}
    assert backup.complete_steps("..") == [1]
    assert np.array_equal(backup.read("..", 1, 1), blob_of(1, 1))


def test_job_dot_cannot_prune_another_jobs_backup(tmp_path: pathlib.Path) -> None:
    """Job '.' pruning to one step leaves the job named like a step folder whole."""
    backup = ArrowBackup(str(tmp_path))
    write_step(backup, "step-000000000001", 1)
    for step in (2, 3, 4):
        write_step(backup, ".", step)
        backup.prune(".", keep=1)
    assert backup.complete_steps(".") == [4]
    assert backup.complete_steps("step-000000000001") == [1]
    assert np.array_equal(backup.read("step-000000000001", 1, 0), blob_of(1, 0))


@pytest.mark.parametrize(
    ("job", "segment"),
    [
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("a b", "a%20b"),
        ("team%2Fexp", "team%252Fexp"),
        ("é", "%C3%A9"),
        ("a\\b", "a%5Cb"),
    ],
)
def test_other_characters_are_percent_encoded(job: str, segment: str) -> None:
    assert job_segment(job) == segment


@given(st.text(min_size=1, max_size=40))
def test_a_segment_is_one_safe_name_that_decodes_back_to_its_job(job: str) -> None:
    """Injective (it decodes back), one name (no '/'), never '.' or '..'."""
    try:
        segment = job_segment(job)
    except ConfigError as error:  # lone surrogates (no file name has them), or too long for one name
        try:
            job.encode("utf-8")
        except UnicodeEncodeError:
            return
        assert "shorter job name" in str(error)
        return
    assert urllib.parse.unquote(segment, errors="strict") == job
    assert "/" not in segment and segment not in (".", "..")
    assert set(segment) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-%")


def test_a_job_too_long_for_one_file_name_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    """86 'é' are 172 bytes of UTF-8 and 516 once encoded: more than a filesystem's 255."""
    backup = ArrowBackup(str(tmp_path))
    with pytest.raises(ConfigError, match="shorter job name") as raised:
        backup.write("é" * 86, 1, 0, 1, blob_of(1, 0))
    assert raised.value.details["job"] == "é" * 86
    with pytest.raises(ConfigError, match="shorter job name"):
        backup.complete_steps("x" * (SEGMENT_MAX_BYTES + 1))
    assert files_under(tmp_path) == set()


@pytest.mark.parametrize("job", ["", None, 3])
def test_a_job_that_is_not_a_name_is_refused(tmp_path: pathlib.Path, job: Any) -> None:
    with pytest.raises(ConfigError, match="non-empty str"):
        ArrowBackup(str(tmp_path)).read(job, 1, 0)


# ---- markers -----------------------------------------------------------------------------


def marker_path(root: pathlib.Path, job: str, step: int, rank: int) -> pathlib.Path:
    return root / job / f"step-{step:012d}" / f"rank-{rank:05d}.json"


def edit_marker(root: pathlib.Path, at: tuple[int, int], **changes: Any) -> None:
    """Change fields of the marker of (step, rank) ``at``."""
    path = marker_path(root, "job", *at)
    marker = json.loads(path.read_text())
    marker.update(changes)
    path.write_text(json.dumps(marker))


@pytest.fixture
def written(tmp_path: pathlib.Path) -> ArrowBackup:
    """Job 'job' with steps 1 and 2 complete at world size 2."""
    backup = ArrowBackup(str(tmp_path))
    write_step(backup, "job", 1)
    write_step(backup, "job", 2)
    return backup


def read_fast(backup: ArrowBackup, step: int, rank: int) -> None:
    """Reading raises CorruptShardError within seconds (5: the unit tests may run starved beside
    the cluster tests), without allocating a blob's worth."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(CorruptShardError):
            backup.read("job", step, rank)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 5.0
    assert peak < 1 << 20


@pytest.mark.parametrize("size", [1 << 30, 1 << 70, -1, 1e30, "1000", True])
def test_a_marker_size_that_is_not_the_files_is_corrupt_before_anything_is_allocated(
    tmp_path: pathlib.Path, written: ArrowBackup, size: Any
) -> None:
    edit_marker(tmp_path, (2, 0), size=size)
    read_fast(written, 2, 0)


@pytest.mark.parametrize(
    ("source", "target", "moved"),
    [((1, 0), (2, 0), True), ((2, 0), (2, 1), False)],
    ids=["moved-to-another-step", "copied-to-another-rank"],
)
def test_a_marker_moved_to_another_step_or_copied_to_another_rank_is_corrupt_not_that_ones_data(
    tmp_path: pathlib.Path, written: ArrowBackup, source: tuple[int, int], target: tuple[int, int], moved: bool
) -> None:
    """Step 1's files replayed into step 2's folder, or rank 0's copied over rank 1's: never a
    restore of the one as the other."""
    for suffix in ("blob", "json"):
        old = marker_path(tmp_path, "job", *source).with_suffix(f".{suffix}")
        new = marker_path(tmp_path, "job", *target).with_suffix(f".{suffix}")
        if moved:
            old.replace(new)
        else:
            new.write_bytes(old.read_bytes())
    read_fast(written, *target)


@pytest.mark.parametrize("world_size", [3, 1, 0, "2", 2.0])
def test_a_marker_whose_world_size_is_not_the_steps_is_corrupt(
    tmp_path: pathlib.Path, written: ArrowBackup, world_size: Any
) -> None:
    """Rank 1's marker disagrees with rank 0's (or cannot hold rank 1): corrupt, and the step
    is no longer complete."""
    edit_marker(tmp_path, (2, 1), world_size=world_size)
    read_fast(written, 2, 1)
    assert written.complete_steps("job") == [1]


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b"[" * 3000 + b"]" * 3000, b" " * (8 << 20) + b"{}", json.dumps({"format": 2}).encode()],
)
def test_a_marker_that_is_not_one_is_corrupt_and_its_step_incomplete(
    tmp_path: pathlib.Path, written: ArrowBackup, content: bytes
) -> None:
    marker_path(tmp_path, "job", 2, 0).write_bytes(content)
    read_fast(written, 2, 0)
    assert written.complete_steps("job") == [1]
    with pytest.raises(CorruptShardError):
        written.saved_world_size("job", 2)


@pytest.mark.parametrize("field", ["checksum", "step", "rank"])
def test_marker_numbers_must_be_ints(tmp_path: pathlib.Path, written: ArrowBackup, field: str) -> None:
    path = marker_path(tmp_path, "job", 2, 0)
    edit_marker(tmp_path, (2, 0), **{field: float(json.loads(path.read_text())[field])})
    read_fast(written, 2, 0)


def test_a_marker_without_its_blob_is_corrupt(tmp_path: pathlib.Path, written: ArrowBackup) -> None:
    marker_path(tmp_path, "job", 2, 0).with_suffix(".blob").unlink()
    read_fast(written, 2, 0)


def test_intact_backups_read_back_and_missing_ones_are_absent(written: ArrowBackup) -> None:
    assert written.complete_steps("job") == [1, 2] and written.saved_world_size("job", 2) == WORLD
    assert np.array_equal(written.read("job", 2, 1), blob_of(2, 1))
    assert written.saved_world_size("job", 3) is None
    with pytest.raises(NoCheckpointError):
        written.read("job", 3, 0)


def test_steps_past_twelve_digits_are_found_and_pruned(tmp_path: pathlib.Path) -> None:
    """A step of 10**12 or more (a millisecond timestamp) takes more than the 12 padded digits:
    it is listed, read back and pruned like any other."""
    backup = ArrowBackup(str(tmp_path))
    big = [10**12 - 1, 10**12, 1_764_000_000_000]
    for step in big:
        write_step(backup, "job", step)
    assert backup.complete_steps("job") == big
    assert np.array_equal(backup.read("job", big[-1], 1), blob_of(big[-1], 1))
    backup.prune("job", keep=1)
    assert backup.complete_steps("job") == big[-1:]
