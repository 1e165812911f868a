"""What a replacement reads ahead of its restores is held bounded: by bytes (the oldest read is
dropped first; one larger than the bound is not held), by age (dropped once
RAY_CKPT_PREFETCH_MAX_AGE_S old unclaimed), and not at all once claimed. A dropped read is as if
none was begun: ``claim`` gives None and the restore reads for itself. No Ray, no stores."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from ray_ckpt import prefetch, settings
from ray_ckpt.prefetch import ReadsAhead


@pytest.fixture
def reads() -> Iterator[ReadsAhead]:
    """The reads of a process of their own (the test's)."""
    reads = ReadsAhead()
    yield reads
    reads.clear()


def blob_read(size: int) -> Callable[[str], prefetch.Planned]:
    def read(job: str) -> prefetch.Planned:
        return 7, f"record of {job}", np.full(size, ord(job[-1]), dtype=np.uint8)  # type: ignore[return-value]

    return read


def until(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def claimed_blob(reads: ReadsAhead, job: str) -> bytes | None:
    read = reads.claim(job, "a", 1)
    blob = None if read is None else read.blob_of(7, f"record of {job}", timeout_s=5.0)  # type: ignore[arg-type]
    return None if blob is None else blob.tobytes()


def test_past_the_byte_bound_the_oldest_read_is_dropped_first(reads: ReadsAhead) -> None:
    with settings.override(RAY_CKPT_PREFETCH_MAX_BYTES=250):
        reads.begin("a", 1, lambda: ["job1", "job2", "job3"], blob_read(100))
        until(lambda: [job for _, _, job in reads._held] == ["job2", "job3"])
        assert reads.held_bytes() == 200
    assert claimed_blob(reads, "job1") is None  # dropped: its restore reads for itself
    assert claimed_blob(reads, "job2") == b"2" * 100 and claimed_blob(reads, "job3") == b"3" * 100
    assert reads.held_bytes() == 0
    until(lambda: not reads._begun)  # every read claimed or dropped: nothing left here


def test_a_read_larger_than_the_bound_is_not_held(reads: ReadsAhead) -> None:
    with settings.override(RAY_CKPT_PREFETCH_MAX_BYTES=50):
        reads.begin("a", 1, lambda: ["job1"], blob_read(100))
        until(lambda: not reads._begun)
    assert reads.held_bytes() == 0 and claimed_blob(reads, "job1") is None


def test_a_read_not_claimed_in_time_is_dropped(reads: ReadsAhead) -> None:
    with settings.override(RAY_CKPT_PREFETCH_MAX_AGE_S=0.3):
        reads.begin("a", 1, lambda: ["job1", "job2"], blob_read(10))
        until(lambda: reads.held_bytes() == 20)
        assert claimed_blob(reads, "job1") == b"1" * 10
        assert reads.held_bytes() == 10
        until(lambda: not reads._begun, timeout_s=5.0)  # job2 went stale
    assert reads.held_bytes() == 0 and claimed_blob(reads, "job2") is None


def test_a_read_claimed_before_it_ended_is_not_held(reads: ReadsAhead) -> None:
    """The restore waits on the read it claimed; its blob goes to that restore, not to the hold."""
    started, release = [], []

    def slow(job: str) -> prefetch.Planned:
        started.append(job)
        until(lambda: release)
        return blob_read(10)(job)

    reads.begin("a", 1, lambda: ["job1"], slow)
    until(lambda: started)
    read = reads.claim("job1", "a", 1)
    assert read is not None
    release.append(True)
    assert read.blob_of(7, "record of job1", timeout_s=5.0).tobytes() == b"1" * 10  # type: ignore[arg-type, union-attr]
    until(lambda: not reads._begun)
    assert reads.held_bytes() == 0
