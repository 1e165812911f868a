"""Events: the measured records of saves, kills and restores, kept by the registry and in files.

Every event is a flat JSON object with ``kind`` (an ``EventKind``) and ``time`` (Unix seconds)
plus:

- ``save``: job, rank, step, attempt, phases_s {wait_previous, snapshot, blocking, encode,
  scatter, stage[, backup]}, bytes, returned (when ``save()`` returned and training went on;
  the event's time is when the step committed). Sent for the first save of each attempt and
  every RAY_CKPT_SAVE_EVENT_EVERY-th save.
- ``kill``: node_id, mode ("node", "store", ...), by (the tool that killed).
- ``node_dead``: node_id, the time Ray declared the node dead.
- ``restore``: job, rank, attempt, step, source (a ``RestoreSource``: "local", "peers" or
  "backup"), steps_lost, bytes, pid, started (when this rank's checkpointer was created: the
  new worker is running), phases_s {locate, fetch, decode, load}. step -1 means the rank had
  to start from scratch. A restore that raised has ``error`` ("ErrorTypeName: message") with
  step and source None.
- ``status``: a snapshot the registry takes when a step of ``job`` commits (at most one per
  job every ``STATUS_EVERY_S``; the newest commit is always snapshotted): step (the job's
  newest committed step), world_size, data_shards, parity_shards, protection (node losses the
  step survives, ``ray_ckpt.core.protection.step_protection`` over shards on alive nodes with a
  store), placement {rank: [node id of shard 0, 1, ...]} (None for a job of more than
  ``PLACEMENT_MAX_RANKS`` ranks: a snapshot must not cost O(ranks) every second), local
  {rank: node id of its local copy}, nodes {node id: {host, address, alive, store,
  used_bytes, budget_bytes, shards[, error]}} (every store's memory, and any node holding a
  shard of the step). The registry records most of them as a **delta** (``status_delta``):
  the event then has ``base`` (the time of the job's previous status event, which it patches)
  and, in placement, local and nodes, only the entries that changed (null: the entry is gone);
  its other fields are whole. A job's status event is whole (no ``base``) when it is the job's
  first in the registry's process, in its events file (after a rotation) or in the in-memory
  log (after older events were dropped), when its world size, code or listing changed, and at
  least every ``STATUS_FULL_EVERY_S``. ``resolve`` turns the events back into whole snapshots.
- ``rejoin``: job, rank, attempt, how a worker entered an in-place generation: role
  ("survivor" or "replacement"), generation, pid, process_started (its process was created),
  warmed (its process had imported what a worker needs: ``inplace.warm_up``), worker_started
  (it began its training function), detected (a survivor saw the collective fail), torn_down
  (a survivor had dropped the failed generation's checkpointers and process group), joined (it
  asked to join), round_started (the first rank asked), formed (every rank had joined), ready
  (its process group was up), lost ([rank, reason] of each member the generation before lost:
  "node dead", "raylet gone", "silent", "silent after a closed connection", "silent after its
  connection closed").
- ``interval``: job, rank, attempt, step, interval (the steps between saves a rank of an
  ``every="auto"`` job chose, a power of two), reason ("warm-up", "optimum", "keep-up", "cap"),
  measured {step_s, blocking_s, slowdown_s, background_s, cost_s, mtbf_s, failures,
  optimum_steps, floor_steps, cap_steps} (the known ones; ``ray_ckpt.core.interval``). Sent when
  the rank's interval changes.

``check`` states what a well-formed event is: the fields above with their types (numbers
finite, ranks and counts ints >= 0, phases numbers), the ones its kind needs present. The
registry refuses a malformed event (``ConfigError`` naming the field) and records nothing;
readers (``read``, ``resolve``, the dashboard, ``ray_ckpt.core.timeline``) skip it.

An events file holds one event per line (JSON lines); ``read`` skips lines it cannot parse,
so a file cut by a crash stays readable. ``EventLog`` bounds what it holds by bytes: the file
is renamed to ``<file>.1`` (older ones to ``.2``, ...) once the next line would take it past
RAY_CKPT_EVENTS_FILE_MAX_BYTES, keeping RAY_CKPT_EVENTS_FILE_KEEP of them; the in-memory log
keeps the newest events up to RAY_CKPT_EVENTS_MEMORY_MAX_BYTES of JSON.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import pathlib
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Literal, get_args

from ray_ckpt import settings
from ray_ckpt.core import protection
from ray_ckpt.core.nodes import RayNode
from ray_ckpt.core.wire import StoreStats
from ray_ckpt.errors import ConfigError

logger = logging.getLogger(__name__)

EventKind = Literal["save", "kill", "node_dead", "restore", "status", "rejoin", "interval"]
KINDS: tuple[EventKind, ...] = get_args(EventKind)
CALLER_KINDS: tuple[EventKind, ...] = tuple(k for k in KINDS if k != "status")  # status events are the registry's own
RestoreSource = Literal["local", "peers", "backup"]  # where a restore took its state from (a restore event's source)
STATUS_EVERY_S = 1.0  # the most frequent status snapshots of one job
STATUS_FULL_EVERY_S = 600.0  # a job's status events are whole at least this often (else deltas)
PLACEMENT_MAX_RANKS = 512  # a status event lists the placement of jobs up to this many ranks
_PATCHED = ("placement", "local", "nodes")  # the fields of a status delta that hold only changes


def event(kind: EventKind, **fields: Any) -> dict[str, Any]:
    """A new event of ``kind`` stamped with the current time (unless ``time`` is given)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {KINDS}")
    return {"kind": kind, "time": fields.pop("time", time.time()), **fields}


# ---- what a well-formed event is ----------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _is_rank_key(value: Any) -> bool:
    return (isinstance(value, str) and value.isdecimal() and value.isascii()) or _is_count(value)


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or test(value)


def _is_phases(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_number(v) for k, v in value.items())


_NODE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "host": (_optional(lambda v: isinstance(v, str)), "a string or null"),
    "address": (_optional(lambda v: isinstance(v, str)), "a string or null"),
    "alive": (lambda v: isinstance(v, bool), "true or false"),
    "store": (lambda v: isinstance(v, bool), "true or false"),
    "used_bytes": (_optional(_is_count), "an int >= 0 or null"),
    "budget_bytes": (_optional(_is_count), "an int >= 0 or null"),
    "shards": (_optional(_is_count), "an int >= 0 or null"),
    "error": (lambda v: isinstance(v, str), "a string"),
}

_TEXT = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_OPTIONAL_TEXT = (_optional(lambda v: isinstance(v, str)), "a string or null")
_OPTIONAL_INT = (_optional(_is_int), "an int or null")
_OPTIONAL_COUNT = (_optional(_is_count), "an int >= 0 or null")
_TIME = (_is_number, "a finite number (Unix seconds)")
_OPTIONAL_TIME = (_optional(_is_number), "a finite number (Unix seconds) or null")

# field -> (test, what it must be), for every kind that has the field
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "time": _TIME,
    "job": _TEXT,
    "rank": (_is_count, "an int >= 0"),
    "step": _OPTIONAL_INT,
    "attempt": _OPTIONAL_TEXT,
    "node_id": _OPTIONAL_TEXT,
    **dict.fromkeys(("mode", "by", "source", "role", "error", "reason"), _OPTIONAL_TEXT),
    **dict.fromkeys(("bytes", "pid", "generation", "world_size", "data_shards", "parity_shards"), _OPTIONAL_COUNT),
    **dict.fromkeys(("steps_lost", "protection"), _OPTIONAL_INT),
    **dict.fromkeys(("returned", "started", "worker_started", "joined", "base"), _TIME),
    **dict.fromkeys(
        ("process_started", "warmed", "detected", "torn_down", "round_started", "formed", "ready"), _OPTIONAL_TIME
    ),
    "phases_s": (_is_phases, "an object of phase name -> finite number (seconds)"),
    "interval": (lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "measured": (_is_phases, "an object of name -> finite number"),
}

# kind -> the fields it must have (not null)
_REQUIRED: dict[str, tuple[str, ...]] = {
    "save": ("job", "rank", "step"),
    "kill": ("node_id",),
    "node_dead": ("node_id",),
    "restore": ("job", "rank"),
    "status": ("job", "step"),
    "rejoin": ("job", "rank", "role", "worker_started", "joined"),
    "interval": ("job", "rank", "interval", "reason"),
}


def check(record: Any) -> None:
    """Raise ``ConfigError`` (``field`` names the field) unless ``record`` is a well-formed
    event: a dict with a known ``kind`` and a finite ``time``, the fields its kind needs, and
    every known field of the right type (see the module docstring). Unknown fields pass."""
    if not isinstance(record, dict):
        raise ConfigError(f"an event must be a dict, got {type(record).__name__}", field=None)
    kind = record.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"event field 'kind' must be one of {', '.join(KINDS)}, got {_short(kind)}", field="kind")
    for name in ("time", *_REQUIRED[kind]):
        if record.get(name) is None:
            raise ConfigError(f"a {kind} event needs field {name!r}", field=name, kind=kind)
    for name, value in record.items():
        if not isinstance(name, str):
            raise ConfigError(f"a {kind} event has a field named {_short(name)}: names are strings", field=None)
        test = _FIELDS.get(name)
        if test is not None and not test[0](value):
            raise ConfigError(
                f"{kind} event field {name!r} must be {test[1]}, got {_short(value)}", field=name, kind=kind
            )
    if kind == "status":
        _check_status(record)


def _check_status(record: dict[str, Any]) -> None:
    """The placement, local copies and node rows of a status event (a delta may set entries null)."""
    delta = record.get("base") is not None

    def fail(name: str, what: str, value: Any) -> ConfigError:
        return ConfigError(
            f"status event field {name!r} must be {what}, got {_short(value)}", field=name, kind="status"
        )

    def entries(name: str, what: str, key_ok: Callable[[Any], bool], value_ok: Callable[[Any], bool]) -> dict[Any, Any]:
        """``record[name]`` ({} when absent): a dict whose every key passes ``key_ok`` and every
        value ``value_ok`` (or is null, in a delta)."""
        field = record.get(name)
        if field is None:
            return {}
        if not isinstance(field, dict):
            raise fail(name, what, field)
        for key, value in field.items():
            if not key_ok(key) or not (value_ok(value) or (delta and value is None)):
                raise fail(name, what, {key: value})
        return field

    def node_ids(held: Any) -> bool:
        return isinstance(held, list) and all(n is None or isinstance(n, str) for n in held)

    def is_str(value: Any) -> bool:
        return isinstance(value, str)

    def is_dict(value: Any) -> bool:
        return isinstance(value, dict)

    entries("placement", "an object of rank -> list of node ids (or null)", _is_rank_key, node_ids)
    entries("local", "an object of rank -> node id", _is_rank_key, is_str)
    rows = entries("nodes", "an object of node id -> its row", is_str, is_dict)
    for row in rows.values():
        for name, value in (row or {}).items():
            test = _NODE_FIELDS.get(name)
            if test is not None and not test[0](value):
                raise fail(f"nodes.{name}", test[1], value)


def valid(record: Any) -> bool:
    """Whether ``record`` is a well-formed event (``check``)."""
    try:
        check(record)
    except ConfigError:
        return False
    return True


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _json_default(value: Any) -> Any:
    """numpy-like numbers as numbers; anything else that is not JSON as its text."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def _line(record: Mapping[str, Any]) -> str:
    """One event as a JSON line (no newline); ConfigError if it cannot be JSON (NaN, deep nesting)."""
    try:
        return json.dumps(record, separators=(",", ":"), default=_json_default, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as error:
        raise ConfigError(f"a {record.get('kind')} event is not JSON: {error}", field=None) from None


# ---- the log ------------------------------------------------------------------------------


class EventLog:
    """A bounded in-memory list of events, mirrored to a JSON-lines file when a path is given.
    Thread-safe. ``since(n)`` returns events with sequence number >= n, for live readers.

    Bounds: in memory at most ``capacity`` events and ``memory_max_bytes`` of their JSON (the
    newest event always stays); the file is rotated before a line would take it past
    ``file_max_bytes``, keeping ``file_keep`` older files (``<path>.1`` the newest). The
    previous snapshot of a job (what ``append_status`` records its next delta against) is held
    only while that job's newest whole status event is in memory, in the current file and less
    than ``STATUS_FULL_EVERY_S`` old, and dropped oldest first after that. Each bound
    not given is the setting's value when used (RAY_CKPT_EVENTS_MEMORY_MAX_BYTES,
    RAY_CKPT_EVENTS_FILE_MAX_BYTES, RAY_CKPT_EVENTS_FILE_KEEP)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        capacity: int = 100_000,
        *,
        memory_max_bytes: int | None = None,
        file_max_bytes: int | None = None,
        file_keep: int | None = None,
    ) -> None:
        self.path = None if path is None else pathlib.Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size:
                with self.path.open("rb+") as existing:  # a file cut mid-line by a crash
                    existing.seek(-1, os.SEEK_END)
                    if existing.read(1) != b"\n":
                        existing.write(b"\n")
        self._capacity = capacity
        self._memory_max_bytes = memory_max_bytes
        self._file_max_bytes = file_max_bytes
        self._file_keep = file_keep
        self._lock = threading.Lock()
        self._events: deque[tuple[dict[str, Any], int]] = deque()  # (event, bytes of its line)
        self._held_bytes = 0
        self._count = 0
        self.rotations = 0  # how often the file was rotated
        # job -> (its previous status snapshot, whole; the rotation and sequence number of its
        # newest whole status event, and that event's time), in the order of those sequence
        # numbers: held only while a delta against it could be recorded (``_forget_snapshots``)
        self._status: dict[str, tuple[dict[str, Any], int, int, float]] = {}

    def append(self, record: dict[str, Any], *, max_bytes: int | None = None, kinds: Collection[str] = KINDS) -> None:
        """Append one event; ConfigError (naming the field) if it is malformed (``check``), not
        of one of ``kinds``, or its JSON is longer than ``max_bytes``: nothing is recorded then.
        The registry appends its callers' events with ``CALLER_KINDS`` and
        RAY_CKPT_EVENT_MAX_BYTES."""
        check(record)
        if record["kind"] not in kinds:
            raise ConfigError(
                f"a {record['kind']} event cannot be recorded here (only {', '.join(kinds)})",
                field="kind",
                kind=record["kind"],
            )
        line = _line(record)
        if max_bytes is not None and len(line) > max_bytes:  # JSON is ASCII: characters are bytes
            raise ConfigError(
                f"a {record['kind']} event of {len(line)} bytes is larger than {max_bytes} (RAY_CKPT_EVENT_MAX_BYTES)",
                field=None,
                kind=record["kind"],
                size_bytes=len(line),
            )
        with self._lock:  # held as read back from its line: what a file's reader gets, JSON through and through
            self._add(json.loads(line), line)

    def append_status(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Record a job's whole status snapshot (``status_event``), as the delta against the
        job's previous one (``status_delta``) unless a reader could not find the snapshot it
        patches (see the module docstring): whole then. Returns the event recorded."""
        check(snapshot)
        if snapshot.get("base") is not None:
            raise ConfigError("append_status takes a whole status snapshot, not a delta", field="base")
        job = str(snapshot["job"])
        with self._lock:
            previous = self._status.get(job)
            if (
                previous is not None
                and previous[1] == self.rotations  # its whole event is in this file
                and previous[2] >= self._count - len(self._events)  # and still in memory
                and float(snapshot["time"]) - previous[3] < STATUS_FULL_EVERY_S
            ):
                delta = status_delta(previous[0], snapshot)
                line = "" if delta is None else _line(delta)
                if delta is not None and not self._rotates(len(line) + 1):  # a new file would lack its base
                    self._status[job] = (snapshot, previous[1], previous[2], previous[3])  # keeps its place
                    self._add(delta, line)
                    return delta
            self._status.pop(job, None)
            self._add(snapshot, _line(snapshot))
            self._status[job] = (snapshot, self.rotations, self._count - 1, float(snapshot["time"]))  # the newest
            return snapshot

    def since(self, sequence: int = 0) -> tuple[int, list[dict[str, Any]]]:
        """(next sequence number, events numbered >= ``sequence`` still held)."""
        with self._lock:
            first = self._count - len(self._events)
            start = max(sequence, first) - first
            return self._count, [record for record, _ in list(self._events)[start:]]

    def _add(self, record: dict[str, Any], line: str) -> None:
        """Write (the file first: an event that could not be written is not held either), then hold."""
        if self.path is not None:
            if self._rotates(len(line) + 1):
                self._rotate()
            with self.path.open("a") as out:
                out.write(line + "\n")
        self._events.append((record, len(line) + 1))
        self._held_bytes += len(line) + 1
        self._count += 1
        limit = settings.events_memory_max_bytes() if self._memory_max_bytes is None else self._memory_max_bytes
        while len(self._events) > 1 and (self._held_bytes > limit or len(self._events) > self._capacity):
            self._held_bytes -= self._events.popleft()[1]
        self._forget_snapshots(float(record["time"]))

    def _forget_snapshots(self, now: float) -> None:
        """Drop the jobs' previous snapshots that no delta could be recorded against any more,
        oldest first: their whole event left memory or the file, or is ``STATUS_FULL_EVERY_S``
        old at ``now`` (an event's time). What stays is bounded by the events held, not by every
        job ever seen."""
        first = self._count - len(self._events)
        while self._status:
            job, (_, rotation, sequence, at) = next(iter(self._status.items()))
            if rotation == self.rotations and sequence >= first and now - at < STATUS_FULL_EVERY_S:
                return
            del self._status[job]

    def _rotates(self, size: int) -> bool:
        """Whether writing ``size`` more bytes rotates the file first."""
        if self.path is None:
            return False
        try:
            held = self.path.stat().st_size
        except FileNotFoundError:
            return False
        limit = settings.events_file_max_bytes() if self._file_max_bytes is None else self._file_max_bytes
        return held > 0 and held + size > limit

    def _rotate(self) -> None:
        if self.path is None:
            return
        keep = settings.events_file_keep() if self._file_keep is None else self._file_keep
        if keep <= 0:
            self.path.unlink(missing_ok=True)
        else:
            for older in range(keep - 1, 0, -1):
                source = self.path.with_name(f"{self.path.name}.{older}")
                if source.exists():
                    os.replace(source, self.path.with_name(f"{self.path.name}.{older + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self.rotations += 1


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a JSON-lines file, in file order; lines that do not parse or do not hold a
    well-formed event (``check``) are skipped."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        return parse(lines)


def parse(lines: Iterable[str], *, checked: bool = True) -> list[Any]:
    """The events of JSON lines, in order; lines that do not parse are skipped, and so are those
    that do not hold a well-formed event (``check``) unless ``checked`` is False (for a reader
    that checks each event itself: the dashboard's window)."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not checked or valid(record):
            records.append(record)
    return records


def write(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Write events as a JSON-lines file (replacing it)."""
    with open(path, "w") as out:
        for record in records:
            out.write(json.dumps(record, separators=(",", ":"), default=_json_default) + "\n")


def status_event(
    job: str,
    step: int,
    *,
    world_size: int,
    data_shards: int,
    parity_shards: int,
    shards: Mapping[int, Mapping[int, str]] | None,
    local_nodes: Mapping[int, str | None] | None,
    stores: Mapping[str, StoreStats | str],
    ray_nodes: Iterable[RayNode],
    summary: tuple[int | None, Iterable[str]] | None = None,
    time: float | None = None,
) -> dict[str, Any]:
    """A ``status`` event for ``job``'s newest committed ``step``: ``shards`` rank -> shard index
    -> node id, ``local_nodes`` rank -> node of its local copy (or None), ``stores`` node id ->
    the store's usage (``ShardStore.stats()``), or a message saying why it could not be read,
    for every registered store, ``ray_nodes`` Ray's records of the cluster's nodes. Protection
    counts shards on alive nodes with a store.
    A job of more than ``PLACEMENT_MAX_RANKS`` ranks is summarized instead: ``shards`` and
    ``local_nodes`` None, ``summary`` (its protection so counted, the nodes holding its shards
    and local copies); its event has ``placement`` None and ``local`` empty."""
    known = {n.node_id: n for n in ray_nodes}
    alive = {node_id for node_id, n in known.items() if n.alive}
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
        record = known.get(node_id)
        stats = stores.get(node_id)
        usage = stats if isinstance(stats, StoreStats) else None
        nodes[node_id] = {
            "host": None if record is None else record.host,
            "address": None if record is None else record.address,
            "alive": node_id in alive,
            "store": node_id in stores,
            "used_bytes": None if usage is None else usage.used_bytes,
            "budget_bytes": None if usage is None else usage.budget_bytes,
            "shards": None if usage is None else usage.shards,
            **({"error": stats} if isinstance(stats, str) and stats else {}),
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


def status_delta(previous: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any] | None:
    """``current``, a job's whole status snapshot, as a delta against ``previous``, the job's
    previous one (whole too): its fields as they are, ``base`` the time of ``previous``, and in
    placement, local and nodes only the entries that changed (null for one that is gone). None
    when a delta would not say it: another job, or another world size, code or listing (a
    placement listed rank by rank or summarized). ``resolve`` undoes it."""
    if (
        previous.get("job") != current.get("job")
        or any(previous.get(f) != current.get(f) for f in ("world_size", "data_shards", "parity_shards"))
        or (previous.get("placement") is None) != (current.get("placement") is None)
    ):
        return None
    delta = {name: value for name, value in current.items() if name not in _PATCHED}
    delta["base"] = previous["time"]
    for name in _PATCHED:
        old, new = previous.get(name), current.get(name)
        if name == "placement" and new is None:
            delta[name] = None
            continue
        old, new = old or {}, new or {}
        delta[name] = {key: value for key, value in new.items() if old.get(key) != value}
        delta[name].update({key: None for key in old if key not in new})
    return delta


def resolve(records: Iterable[Any]) -> list[dict[str, Any]]:
    """The well-formed events among ``records`` (in the order they were recorded), each status
    delta replaced by the whole snapshot it stands for: applied to its job's previous snapshot.
    A delta whose ``base`` is not the time of its job's previous status event (that event was
    rotated out of the file, dropped from memory, or skipped) is left out, and so is every later
    delta of the job until its next whole event."""
    resolver = Resolver()
    return [r for r in (resolver.add(record) for record in records if valid(record)) if r is not None]


class Resolver:
    """``resolve`` one event at a time, for a reader that takes events as they arrive (the live
    dashboard). It holds each job's newest snapshot: one per job it was given a status event of."""

    def __init__(self) -> None:
        self._previous: dict[str, dict[str, Any] | None] = {}  # job -> its newest snapshot (None: chain broken)

    def add(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """``record``, a well-formed event (``check``: the caller checked), as ``resolve`` gives
        it: a status delta made whole; None for a delta ``resolve`` leaves out."""
        if record["kind"] != "status":
            return record
        job = str(record["job"])
        if record.get("base") is None:
            snapshot = dict(record)
        else:
            base = self._previous.get(job)
            if base is None or base.get("time") != record["base"]:
                self._previous[job] = None
                return None
            snapshot = {name: value for name, value in record.items() if name != "base"}
            for name in _PATCHED:
                patch = record.get(name)
                if name == "placement" and patch is None:
                    snapshot[name] = None
                    continue
                patched = dict(base.get(name) or {})
                for key, value in (patch or {}).items():
                    if value is None:
                        patched.pop(key, None)
                    else:
                        patched[key] = value
                snapshot[name] = patched
        self._previous[job] = snapshot
        return snapshot

    def adopt(self, other: Resolver, *, since: float) -> None:
        """Take ``other``'s newest snapshot of each job this one has none of, if it is from
        ``since`` on: the deltas that follow it still resolve (a reader that forgot the events
        before them). A job's next delta is at most ``STATUS_FULL_EVERY_S`` after its base."""
        for job, snapshot in other._previous.items():
            if job not in self._previous and snapshot is not None and float(snapshot["time"]) >= since:
                self._previous[job] = snapshot


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
                for key in [k for k, last in self._last.items() if now - last >= self._interval_s]:
                    del self._last[key]  # a request for it may run at once: as if never run
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
