"""Events: the measured records of saves, kills and restores, kept by the registry and in files.

Every event is a flat JSON object with ``kind`` and ``time`` (Unix seconds) plus:

- ``save``: job, rank, step, attempt, phases_s {wait_previous, snapshot, blocking, encode,
  scatter, stage[, backup]}, bytes, returned (when ``save()`` returned and training went on;
  the event's time is when the step committed). Sent for the first save of each attempt and
  every RAY_CKPT_SAVE_EVENT_EVERY-th save.
- ``kill``: node_id, mode ("node", "store", ...), by (the tool that killed).
- ``node_dead``: node_id, the time Ray declared the node dead.
- ``restore``: job, rank, attempt, step, source, steps_lost, bytes, started (when this
  rank's checkpointer was created: the new worker is running), phases_s {locate, fetch,
  decode, load}. step -1 means the rank had to start from scratch.

An events file holds one event per line (JSON lines); ``read`` skips lines it cannot parse,
so a file cut by a crash stays readable.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

KINDS = ("save", "kill", "node_dead", "restore")


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """A new event of ``kind`` stamped with the current time (unless ``time`` is given)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {KINDS}")
    return {"kind": kind, "time": fields.pop("time", time.time()), **fields}


class EventLog:
    """A bounded in-memory list of events, mirrored to a JSON-lines file when a path is given.
    Thread-safe. ``since(n)`` returns events with sequence number >= n, for live readers."""

    def __init__(self, path: str | os.PathLike[str] | None = None, capacity: int = 100_000) -> None:
        self.path = None if path is None else pathlib.Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size:
                with self.path.open("rb+") as existing:  # a file cut mid-line by a crash
                    existing.seek(-1, os.SEEK_END)
                    if existing.read(1) != b"\n":
                        existing.write(b"\n")
        self._lock = threading.Lock()
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._count = 0

    def append(self, record: dict[str, Any]) -> None:
        if not isinstance(record, dict) or record.get("kind") not in KINDS:
            raise ValueError(f"not an event: {record!r}")
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            self._events.append(record)
            self._count += 1
            if self.path is not None:
                with self.path.open("a") as out:
                    out.write(line + "\n")

    def since(self, sequence: int = 0) -> tuple[int, list[dict[str, Any]]]:
        """(next sequence number, events numbered >= ``sequence`` still held)."""
        with self._lock:
            first = self._count - len(self._events)
            start = max(sequence, first) - first
            return self._count, list(self._events)[start:]


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a JSON-lines file, in file order; unparsable lines are skipped."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("kind") in KINDS:
                records.append(record)
    return records


def write(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Write events as a JSON-lines file (replacing it)."""
    with open(path, "w") as out:
        for record in records:
            out.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
