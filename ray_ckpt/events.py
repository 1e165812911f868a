"""Events: the measured records of saves, kills and restores, kept by the registry and in files.

Every event is a flat JSON object with ``kind`` and ``time`` (Unix seconds) plus:

- ``save``: job, rank, step, attempt, phases_s {wait_previous, snapshot, blocking, encode,
  scatter, stage[, backup]}, bytes, returned (when ``save()`` returned and training went on;
  the event's time is when the step committed). Sent for the first save of each attempt and
  every RAY_CKPT_SAVE_EVENT_EVERY-th save.
- ``kill``: node_id, mode ("node", "store", ...), by (the tool that killed).
- ``node_dead``: node_id, the time Ray declared the node dead.
- ``restore``: job, rank, attempt, step, source, steps_lost, bytes, pid, started (when this
  rank's checkpointer was created: the new worker is running), phases_s {locate, fetch,
  decode, load}. step -1 means the rank had to start from scratch. A restore that raised
  has ``error`` ("ErrorTypeName: message") with step and source None.
- ``status``: a snapshot the registry takes when a step of ``job`` commits (at most one per
  job every ``STATUS_EVERY_S``; the newest commit is always snapshotted): step (the job's
  newest committed step), world_size, data_shards, parity_shards, protection (node losses the
  step survives, ``ray_ckpt.protection.step_protection`` over shards on alive nodes with a
  store), placement {rank: [node id of shard 0, 1, ...]} (None for a job of more than
  ``PLACEMENT_MAX_RANKS`` ranks: a snapshot must not cost O(ranks) every second), local
  {rank: node id of its local copy}, nodes {node id: {host, address, alive, store,
  used_bytes, budget_bytes, shards[, error]}} (every store's memory, and any node holding a
  shard of the step).
- ``rejoin``: job, rank, attempt, how a worker entered an in-place generation: role
  ("survivor" or "replacement"), generation, pid, process_started (its process was created),
  warmed (its process had imported what a worker needs: ``inplace.warm_up``), worker_started
  (it began its training function), detected (a survivor saw the collective fail), torn_down
  (a survivor had dropped the failed generation's checkpointers and process group), joined (it
  asked to join), round_started (the first rank asked), formed (every rank had joined), ready
  (its process group was up).

An events file holds one event per line (JSON lines); ``read`` skips lines it cannot parse,
so a file cut by a crash stays readable.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ray_ckpt import protection

logger = logging.getLogger(__name__)

KINDS = ("save", "kill", "node_dead", "restore", "status", "rejoin")
STATUS_EVERY_S = 1.0  # the most frequent status snapshots of one job
PLACEMENT_MAX_RANKS = 512  # a status event lists the placement of jobs up to this many ranks


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


def status_event(
    job: str,
    step: int,
    *,
    world_size: int,
    data_shards: int,
    parity_shards: int,
    shards: Mapping[int, Mapping[int, str]] | None,
    local_nodes: Mapping[int, str | None] | None,
    stores: Mapping[str, Mapping[str, Any]],
    ray_nodes: Iterable[Mapping[str, Any]],
    summary: tuple[int | None, Iterable[str]] | None = None,
    time: float | None = None,
) -> dict[str, Any]:
    """A ``status`` event for ``job``'s newest committed ``step``: ``shards`` rank -> shard index
    -> node id, ``local_nodes`` rank -> node of its local copy (or None), ``stores`` node id ->
    the store's ``stats()`` (or ``{"error": ...}``) for every registered store, ``ray_nodes``
    Ray's node records (``ray.nodes()``). Protection counts shards on alive nodes with a store.
    A job of more than ``PLACEMENT_MAX_RANKS`` ranks is summarized instead: ``shards`` and
    ``local_nodes`` None, ``summary`` (its protection so counted, the nodes holding its shards
    and local copies); its event has ``placement`` None and ``local`` empty."""
    known = {str(n.get("NodeID")): n for n in ray_nodes}
    alive = {node_id for node_id, n in known.items() if n.get("Alive")}
    live = alive & set(stores)
    placement: dict[str, list[str | None]] | None = None
    if shards is None or local_nodes is None:
        if summary is None:
            raise ValueError("a status event without shards needs the summary")
        value, held = summary[0], set(summary[1])
        local_nodes = {}
    else:
        placement = {
            str(rank): [by_index.get(i) for i in range(max(by_index, default=-1) + 1)]
            for rank, by_index in sorted(shards.items())
        }
        value = protection.step_protection(
            {rank: (by_index.values(), data_shards) for rank, by_index in shards.items()}, live
        )
        held = {n for by_index in shards.values() for n in by_index.values()}
        held |= {n for n in local_nodes.values() if n}
    nodes = {}
    for node_id in sorted(set(stores) | held):
        record = known.get(node_id, {})
        stats = stores.get(node_id) or {}
        nodes[node_id] = {
            "host": record.get("NodeManagerHostname"),
            "address": record.get("NodeManagerAddress"),
            "alive": node_id in alive,
            "store": node_id in stores,
            "used_bytes": stats.get("used_bytes"),
            "budget_bytes": stats.get("budget_bytes"),
            "shards": stats.get("shards"),
            **({"error": str(stats["error"])} if stats.get("error") else {}),
        }
    fields: dict[str, Any] = {} if time is None else {"time": time}
    return event(
        "status",
        job=job,
        step=step,
        world_size=world_size,
        data_shards=data_shards,
        parity_shards=parity_shards,
        protection=value,
        placement=placement,
        local={str(rank): node for rank, node in sorted(local_nodes.items()) if node},
        nodes=nodes,
        **fields,
    )


class Coalescer:
    """Calls ``work(key)`` on a daemon thread, at most once per ``interval_s`` per key. Requests
    for a key that arrive meanwhile merge into one call, made as soon as the interval allows, so
    the newest state is always captured, at most ``interval_s`` late. Exceptions of ``work``
    are logged and dropped. Thread-safe; the thread starts with the first request."""

    def __init__(self, work: Callable[[str], None], interval_s: float) -> None:
        self._work = work
        self._interval_s = interval_s
        self._due: dict[str, float] = {}  # key -> monotonic time it may run
        self._last: dict[str, float] = {}  # key -> when its last call started
        self._running = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def request(self, key: str) -> None:
        with self._cond:
            if key not in self._due:
                self._due[key] = self._last.get(key, float("-inf")) + self._interval_s
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ray_ckpt-coalescer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is pending or running (False after ``timeout_s``)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._due and not self._running, timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    ready = [key for key, due in self._due.items() if due <= now]
                    if ready:
                        break
                    self._cond.wait(min(self._due.values()) - now if self._due else None)
                for key in ready:
                    del self._due[key]
                    self._last[key] = now
                self._running += 1
            try:
                for key in ready:
                    try:
                        self._work(key)
                    except Exception:
                        logger.warning("%s failed for %r", getattr(self._work, "__name__", "work"), key, exc_info=True)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()
