"""Recovery timelines: one record per failure, assembled from events (a pure function).

A recovery is the set of ``restore`` events of one job attempt that restored a step or raised
(a restore event with ``error``). It ``failed`` when some rank's restore raised: ``error`` is
the first rank's error ("ErrorTypeName: message"), ``errors`` every failed rank's; a failed
recovery has no first step and no time to resume. Its failure is the newest burst of ``kill``
events (kills less than ``BURST_S`` apart) before the attempt's workers started, and after the
job's previous successful recovery (or its first event): an attempt that follows a failed one
still answers the same kills, and its time to resume includes the failed attempt.
Phases, in seconds, follow the critical path: each ends at a moment that waited for every rank,
and the restore is the slowest rank's (the rank whose restore ended last), so with a recorded
kill they add up to ``time_to_resume_s``:

    detect      kill -> Ray declared the killed node(s) dead (``node_dead``); in place: kill ->
                the last survivor saw its collective fail (every survivor had left its step)
    restart     dead -> the slowest rank began its restore (the new worker group started, its
                training function ran up to ``restore()``); None in place
    replace     in place: every survivor detected -> the last replacement started its training
                function (0 when the replacements were up first)
    rendezvous  in place: replaced -> the slowest rank began its restore (the join, the process
                group, the training function re-run up to ``restore()``)
    locate, fetch, decode, load    the slowest rank's restore
    first_step  restore done -> the first step of the new attempt done (its save returned:
                a save event's ``returned``, else its time)

``time_to_resume_s`` spans kill -> first step done. Without a recorded kill (a crash the kill
tool did not cause) the phases before the restore are None. A recovery is ``in_place`` when
its attempt has ``rejoin`` events (survivors kept their processes; ``survivor_pids`` and
``replacement_pids`` list them), else a ``restart`` of the worker group.

``LiveRecoveries`` gives the same records one at a time as events arrive, each once, when the
recovery's first step is done (for the registry's metrics).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ray_ckpt.core.events import valid
from ray_ckpt.core.record_dict import fields_dict

BURST_S = 2.0
RESTORE_PHASES = ("locate", "fetch", "decode", "load")
PHASES = ("detect", "restart", "replace", "rendezvous", *RESTORE_PHASES, "first_step")

RecoveryMode = Literal["restart", "in_place"]


@dataclasses.dataclass(frozen=True)
class Recovery:
    """One recovery (see the module docstring). Ranks are keys as text ("0", "1", ...), as in
    the events file.

    - ``job``, ``attempt``: the job and the attempt (or in-place generation) that restored.
    - ``kill_time``: the first kill of the failure's burst (Unix seconds); None without a
      recorded kill. ``killed_nodes``: the nodes that burst killed.
    - ``step``: the step restored (the newest any rank restored); None when no rank restored one.
    - ``phases_s``: every phase of ``PHASES`` -> seconds on the critical path, or None where
      not measured.
    - ``time_to_resume_s``: kill -> first step done; None without a kill, or when it failed.
    - ``steps_lost``: the most steps any rank lost; None when no rank restored a step.
    - ``bytes_moved``: bytes every rank's restore read.
    - ``sources``: rank -> where it restored from (a ``ray_ckpt.core.events.RestoreSource`` as
      recorded; None for a rank whose restore raised).
    - ``failed``: some rank's restore raised; ``error`` the first such rank's error
      ("ErrorTypeName: message"), ``errors`` every failed rank's.
    - ``mode``: "in_place" (survivors kept their processes) or "restart" (the worker group was
      restarted).
    - ``survivor_pids``, ``replacement_pids``: in place, rank -> the pid of its survivor or
      replacement process.
    - ``warm_replacements``: in place, rank -> whether its replacement started in a process
      that had warmed up before the kill (a warm spare).
    """

    job: str
    attempt: str
    kill_time: float | None
    killed_nodes: tuple[str, ...]
    step: int | None
    phases_s: Mapping[str, float | None]
    time_to_resume_s: float | None
    steps_lost: int | None
    bytes_moved: int
    sources: Mapping[str, str | None]
    failed: bool
    error: str | None
    errors: Mapping[str, str]
    mode: RecoveryMode
    survivor_pids: Mapping[str, int | None]
    replacement_pids: Mapping[str, int | None]
    warm_replacements: Mapping[str, bool]

    def as_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict of its fields (the dashboard's and the scripts' JSON)."""
        return fields_dict(self)


def recoveries(events: Iterable[dict[str, Any]]) -> list[Recovery]:
    """The recoveries the events record, oldest first (``Recovery``). A start that restored
    nothing (step None, or -1: started from scratch) is a recovery only after a kill. Malformed
    events (``ray_ckpt.core.events.check``) are skipped."""
    ordered: list[dict[str, Any]] = sorted(
        (e for e in events if isinstance(e, dict) and e.get("kind") != "status" and valid(e)),
        key=lambda e: float(e["time"]),
    )
    kills = [e for e in ordered if e["kind"] == "kill"]
    deaths = [e for e in ordered if e["kind"] == "node_dead"]
    attempts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in ordered:
        if record["kind"] == "restore" and (record.get("step") is not None or record.get("error")):
            attempts.setdefault((record["job"], str(record.get("attempt"))), []).append(record)
    rejoins: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in ordered:
        if record["kind"] == "rejoin":
            rejoins.setdefault((record["job"], str(record.get("attempt"))), []).append(record)
    first_saves: dict[tuple[str, str], dict[int, float]] = {}
    for record in ordered:
        if record["kind"] == "save":
            key = (record["job"], str(record.get("attempt")))
            done = float(record.get("returned", record["time"]))
            first_saves.setdefault(key, {}).setdefault(int(record["rank"]), done)
    result = []
    began: list[float] = []  # per record: its first kill, else its first worker start
    # a failure of a job lies after the job was first seen and after its previous successful recovery
    previous: dict[str, float] = {}
    for record in ordered:
        if record.get("job") is not None:
            previous.setdefault(record["job"], float(record["time"]))
    by_start = sorted(attempts.items(), key=lambda item: min(float(r.get("started", r["time"])) for r in item[1]))
    for (job, attempt), restores in by_start:
        restored = max(float(r["time"]) for r in restores)
        first_start = min(float(r.get("started", r["time"])) for r in restores)
        burst = _burst_before([k for k in kills if float(k["time"]) > previous[job]], first_start)
        errors = {str(r["rank"]): str(r["error"]) for r in restores if r.get("error")}
        restored_ranks = [r for r in restores if r.get("step") is not None and not r.get("error")]
        failed = bool(errors)
        if not burst and not failed and not any(int(r["step"]) >= 0 for r in restored_ranks):
            continue  # a start from scratch (step -1) with no kill before it: a first start, not a recovery
        if not failed:
            previous[job] = restored
        phases: dict[str, float | None] = dict.fromkeys(PHASES)
        slowest = max(restored_ranks or restores, key=lambda r: float(r["time"]))
        measured = slowest.get("phases_s") or {}
        for name in RESTORE_PHASES:  # a failed rank may not have measured a phase: None, not 0
            phases[name] = float(measured[name]) if name in measured else (None if failed else 0.0)
        if all(name in measured for name in RESTORE_PHASES):
            restore_began = float(slowest["time"]) - sum(float(measured[name]) for name in RESTORE_PHASES)
        else:  # a rank that raised mid-way, or an older event: its Checkpointer's creation
            restore_began = float(slowest.get("started", slowest["time"]))
        saves = {} if failed else first_saves.get((job, attempt), {})
        first_step_done = max(saves.values()) if saves else None
        if first_step_done is not None:
            phases["first_step"] = max(0.0, first_step_done - restored)
        kill_time = None
        killed = []
        joined = rejoins.get((job, attempt), [])
        if burst:
            kill_time = float(burst[0]["time"])
            killed = [str(k.get("node_id")) for k in burst]
            dead = [float(d["time"]) for d in deaths if d.get("node_id") in killed and d["time"] >= kill_time]
            if joined:
                _in_place_phases(phases, joined, kill_time, restore_began)
            elif dead:
                detected = max(dead)
                phases["detect"] = detected - kill_time
                phases["restart"] = max(0.0, restore_began - detected)
            else:
                phases["restart"] = max(0.0, restore_began - kill_time)
        elif joined:
            _in_place_phases(phases, joined, None, restore_began)
        began.append(kill_time if kill_time is not None else first_start)
        end = first_step_done if first_step_done is not None else restored
        result.append(
            Recovery(
                job=job,
                attempt=attempt,
                kill_time=kill_time,
                killed_nodes=tuple(killed),
                step=max(int(r["step"]) for r in restored_ranks) if restored_ranks else None,
                phases_s=phases,
                time_to_resume_s=None if kill_time is None or failed else end - kill_time,
                steps_lost=max(int(r.get("steps_lost") or 0) for r in restored_ranks) if restored_ranks else None,
                bytes_moved=sum(int(r.get("bytes") or 0) for r in restores),
                sources={str(r["rank"]): r.get("source") for r in restores},
                failed=failed,
                error=errors[min(errors, key=int)] if errors else None,
                errors=errors,
                mode="in_place" if joined else "restart",
                survivor_pids={str(r["rank"]): r.get("pid") for r in joined if r.get("role") == "survivor"},
                replacement_pids={str(r["rank"]): r.get("pid") for r in joined if r.get("role") == "replacement"},
                # a replacement whose process had warmed up before the kill started in a warm spare
                warm_replacements={
                    str(r["rank"]): kill_time is not None and float(r.get("warmed") or kill_time) < kill_time
                    for r in joined
                    if r.get("role") == "replacement"
                },
            )
        )
    order = sorted(range(len(result)), key=lambda i: (began[i], result[i].job))
    return [result[i] for i in order]


def _in_place_phases(
    phases: dict[str, float | None], rejoins: list[dict[str, Any]], kill_time: float | None, restore_began: float
) -> None:
    """Fill detect, replace and rendezvous from an in-place generation's rejoin events, along
    the critical path: kill -> the last survivor detected -> the last replacement started ->
    the slowest rank began its restore. Detect needs the kill and a detection; without a
    detection replace runs from the kill, without either rendezvous from the last join."""
    detected = [float(r["detected"]) for r in rejoins if r.get("detected") is not None]
    started = [float(r["worker_started"]) for r in rejoins if r.get("role") == "replacement"]
    every_survivor_left = max(detected) if detected else kill_time
    if every_survivor_left is None:
        phases["rendezvous"] = max(0.0, restore_began - max(float(r["joined"]) for r in rejoins))
        return
    if detected and kill_time is not None:
        phases["detect"] = max(0.0, every_survivor_left - kill_time)
    replaced = max([every_survivor_left, *started])
    if started:
        phases["replace"] = replaced - every_survivor_left
    phases["rendezvous"] = max(0.0, restore_began - replaced)


def _burst_before(kills: list[dict[str, Any]], before: float) -> list[dict[str, Any]]:
    """The newest group of kills (each within BURST_S of the next) that happened before ``before``."""
    earlier = [k for k in kills if float(k["time"]) <= before]
    if not earlier:
        return []
    burst = [earlier[-1]]
    for kill in reversed(earlier[:-1]):
        if float(burst[0]["time"]) - float(kill["time"]) > BURST_S:
            break
        burst.insert(0, kill)
    return burst


class LiveRecoveries:
    """:func:`recoveries` as events arrive (the registry's metrics): keeps the events a recovery
    is assembled from (kills, node deaths, restores, each rank's first save of an attempt), the
    newest ``capacity`` of them, and reports each recovery once, when every restored rank has
    finished its first step of the new attempt. Thread-safe."""

    def __init__(self, capacity: int = 5000) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._first_saves: set[tuple[str, str, int]] = set()
        self._restored: dict[tuple[str, str], set[int]] = {}
        self._steps_lost: dict[tuple[str, str], int] = {}  # (job, attempt) -> steps lost counted so far
        self._reported: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def add(self, event: dict[str, Any]) -> tuple[int, list[Recovery]]:
        """(steps lost to count now, recoveries completed by this event)."""
        kind = event.get("kind")
        with self._lock:
            if kind in ("kill", "node_dead"):
                self._events.append(event)
                return 0, []
            key = (str(event.get("job")), str(event.get("attempt")))
            if kind == "restore":
                step = event.get("step")
                if step is None or int(step) < 0:
                    return 0, []
                self._events.append(event)
                self._restored.setdefault(key, set()).add(int(event.get("rank", 0)))
                lost = int(event.get("steps_lost") or 0)
                counted = self._steps_lost.get(key, 0)
                self._steps_lost[key] = max(counted, lost)
                return max(0, lost - counted), []
            if kind != "save":
                return 0, []
            first = (key[0], key[1], int(event.get("rank", 0)))
            if first in self._first_saves:
                return 0, []
            self._first_saves.add(first)
            self._events.append(event)
            ranks = self._restored.get(key)
            if key in self._reported or not ranks:
                return 0, []
            saved = {rank for job, attempt, rank in self._first_saves if (job, attempt) == key}
            if not ranks <= saved:
                return 0, []
            self._reported.add(key)
            done = [r for r in recoveries(list(self._events)) if (r.job, r.attempt) == key]
            return 0, done[-1:]
