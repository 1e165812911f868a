"""What the dashboard draws, as one JSON-able dict (served as ``/api/data``); no Ray here.

``build(events, live=None)``: ``events`` are recorded events (ray_ckpt.core.events); ``live`` is a
snapshot of a running cluster (see ``server.LiveCluster.snapshot``): ``{"status":
ray_ckpt.status(), "alive": [node ids], "placements": {job: {"step", "ranks": registry
locate()}}, "ray_nodes": [Ray's node records, ray_ckpt.core.nodes.RayNode]}``. Memory,
protection and placement come from the live cluster when there is one, else from the newest
``status`` events (each part then carries ``source: "snapshot"`` and the snapshot's time;
shards on nodes that died or were killed after it count as lost); they are None when neither
exists.

``EventWindow`` is what a running dashboard keeps: the events it was given, without duplicates,
each folded into the data once as it arrives (a poll costs the new events, not all of them),
and bounded: by the bytes of their JSON and by their age (against the newest event's time, or
the clock if that is earlier), the oldest dropped first. Once past a bound it drops down to
``KEEP_FRACTION`` of it and folds what is left anew, so it trims rarely; the data then shows
only the events it holds. ``build`` is one unbounded window given every event at once.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from ray_ckpt.core import events as events_module
from ray_ckpt.core import protection as protection_module
from ray_ckpt.core import timeline

VERSION = 1
MAX_STALL_POINTS = 5000  # the newest recorded saves drawn in the save stall chart
KEEP_FRACTION = 0.75  # a window past a bound drops down to this share of it (bytes, age)

_Key = tuple[float, int]  # (an event's time, its place in arrival order): how "newest" is decided


def build(
    events: Iterable[dict[str, Any]],
    live: dict[str, Any] | None = None,
    *,
    sources: list[str] | None = None,
    error: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The dashboard's data: recoveries (one per failure, from ``timeline.recoveries``; failed
    ones flagged), time to resume over time, save stall per step, the newest interval
    ``every="auto"`` chose per job, kills and node deaths, the
    nodes (host, ranks running there), and memory per node, shard placement of each job's
    newest committed step and protection per job (live, else from ``status`` snapshots).
    Malformed events (``ray_ckpt.core.events.check``) and duplicates are skipped; the events
    are taken in time order; status deltas are made whole (``ray_ckpt.core.events.resolve``)."""
    window = EventWindow()
    window.add(events)
    return window.data(live, sources=sources, error=error, now=now)


class EventWindow:
    """The events a dashboard shows, folded into its data as they arrive (see the module
    docstring). ``max_bytes``: of the held events' JSON; ``max_age_s``: of the oldest held event
    against the newest (or the clock); None: no bound. Not thread-safe (the server locks)."""

    def __init__(self, *, max_bytes: int | None = None, max_age_s: float | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.dropped = 0  # events dropped by the bounds so far
        self._held: deque[tuple[int, int, float, dict[str, Any]]] = deque()  # (key, bytes, time, event) as arrived
        self._keys: set[int] = set()  # the held events' keys (a hash of their JSON): duplicates are skipped
        self._bytes = 0
        self._newest = -math.inf
        self._oldest = math.inf
        self._fold = _Fold()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        """The bytes of the held events' JSON."""
        return self._bytes

    def add(self, records: Iterable[Any]) -> int:
        """Fold in ``records`` (in time order), skipping malformed ones (``events.check``),
        those already held and those already past the age bound, then keep to the bounds;
        returns how many were new."""
        new = 0
        for record in sorted((r for r in records if isinstance(r, dict)), key=_sort_time):
            if not events_module.valid(record):
                continue
            if self.max_age_s is not None and record["time"] < min(self._newest, time.time()) - self.max_age_s:
                self.dropped += 1  # a late one (a clock behind) would cost a trim each time
                continue
            line = _json(record)
            key = hash(line)
            if key in self._keys:
                continue
            self._keys.add(key)
            at = float(record["time"])
            self._held.append((key, len(line) + 1, at, record))
            self._bytes += len(line) + 1
            self._newest, self._oldest = max(self._newest, at), min(self._oldest, at)
            self._fold.add(record)
            new += 1
        if new:
            self._bound()
        return new

    def data(
        self,
        live: dict[str, Any] | None = None,
        *,
        sources: list[str] | None = None,
        error: str | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The dashboard's data (``build``) from the held events and ``live``."""
        data = self._fold.data(live, sources=sources, error=error, now=now)
        data["window"] = {
            "max_bytes": self.max_bytes,
            "max_age_s": self.max_age_s,
            "dropped_events": self.dropped,
            "oldest_time": None if not self._held else self._oldest,
        }
        return data

    def _bound(self) -> None:
        reference = min(self._newest, time.time())  # an event stamped far ahead must not age out the rest
        over_bytes = self.max_bytes is not None and self._bytes > self.max_bytes
        over_age = self.max_age_s is not None and self._oldest < reference - self.max_age_s
        if over_bytes or over_age:
            self._trim(reference)

    def _trim(self, reference: float) -> None:
        """Drop the oldest events down to ``KEEP_FRACTION`` of the bounds and fold the rest anew.
        A status delta whose base is dropped is held whole instead, and a job's newest snapshot
        is kept (not shown) while a delta against it may still come, so later deltas resolve."""
        horizon = -math.inf if self.max_age_s is None else reference - KEEP_FRACTION * self.max_age_s
        budget = math.inf if self.max_bytes is None else KEEP_FRACTION * self.max_bytes
        held = list(self._held)
        keep = [False] * len(held)
        total = 0
        for i in range(len(held) - 1, -1, -1):  # newest first
            _, size, at, _ = held[i]
            if at < horizon:
                continue
            if total + size > budget and total:
                break
            keep[i], total = True, total + size
        resolver = events_module.Resolver()
        previous: dict[str, int] = {}  # job -> the index of its previous status event
        kept = []
        for i, (key, size, at, record) in enumerate(held):
            resolved = resolver.add(record)
            if record["kind"] == "status":
                job = str(record["job"])
                before, previous[job] = previous.get(job), i
                if keep[i] and record.get("base") is not None and (before is None or not keep[before]):
                    keep[i] = resolved is not None  # a delta that was skipped anyway goes
                    record, size = resolved or record, len(_json(resolved or record)) + 1
            if keep[i]:
                kept.append((key, size, at, record))
        self.dropped += len(held) - len(kept)
        self._held = deque(kept)
        self._keys = {key for key, _, _, _ in kept}
        self._bytes = sum(size for _, size, _, _ in kept)
        self._oldest = min((at for _, _, at, _ in kept), default=math.inf)
        old, self._fold = self._fold, _Fold()
        for _, _, _, record in kept:
            self._fold.add(record)
        # a job whose status events were all dropped: its next delta still resolves
        self._fold.resolver.adopt(old.resolver, since=reference - events_module.STATUS_FULL_EVERY_S)


def _json(record: dict[str, Any]) -> str:
    """An event's JSON with its keys sorted: what makes two copies of it the same."""
    try:
        return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    except TypeError:  # keys that do not sort (ints beside strs)
        return json.dumps(record, separators=(",", ":"), default=str)


def _newest(table: dict[Any, tuple[_Key, Any]], name: Any, key: _Key, value: Any) -> bool:
    """Set ``table[name]`` to ``(key, value)`` unless it holds a newer one; whether it did."""
    held = table.get(name)
    if held is not None and held[0] >= key:
        return False
    table[name] = (key, value)
    return True


def _oldest(table: dict[Any, tuple[_Key, Any]], name: Any, key: _Key, value: Any) -> bool:
    """Set ``table[name]`` to ``(key, value)`` unless it holds an older one; whether it did."""
    held = table.get(name)
    if held is not None and held[0] <= key:
        return False
    table[name] = (key, value)
    return True


def _in_order(entries: Iterable[tuple[_Key, Any]]) -> list[Any]:
    return [value for _, value in sorted(entries, key=lambda entry: entry[0])]


class _Fold:
    """The dashboard's data from well-formed events given one at a time, each folded in once.
    What only the newest event decides (a job's newest snapshot and interval, a node's host, a
    rank's node) is kept per name with that event's time and arrival; the recoveries are
    assembled again, when an event that could change them arrived, from the events they are made
    of (kills, node deaths, restores, rejoins, each rank's first save of an attempt and each
    job's first event), never from every save."""

    def __init__(self) -> None:
        self.resolver = events_module.Resolver()
        self._seq = 0
        self.counts = dict.fromkeys(("events", "saves", "restores", "status"), 0)
        self.jobs: set[str] = set()
        self._stall: list[tuple[_Key, dict[str, Any]]] = []  # a heap: the newest saves with a blocking phase
        self._kills: list[tuple[_Key, dict[str, Any]]] = []
        self._deaths: list[tuple[_Key, dict[str, Any]]] = []
        self._intervals: dict[str, tuple[_Key, dict[str, Any]]] = {}  # job -> the newest interval every="auto" chose
        self._snapshots: dict[str, tuple[_Key, dict[str, Any]]] = {}  # job -> its newest status snapshot
        self._hosts: dict[str, dict[str, tuple[_Key, Any]]] = {}  # node -> "host", "address", "alive" -> newest
        self._where: dict[tuple[str, int], tuple[_Key, str]] = {}  # (job, rank) -> the node of its newest event
        self._parts: dict[int, tuple[_Key, dict[str, Any]]] = {}  # seq -> an event the recoveries are made of
        self._first_saves: dict[tuple[str, str, int], tuple[_Key, dict[str, Any]]] = {}  # (job, attempt, rank)
        self._first_events: dict[str, tuple[_Key, dict[str, Any]]] = {}  # job -> its first event (not status)
        self._recoveries: list[dict[str, Any]] | None = None  # None: assemble them again
        self._stall_points: list[dict[str, Any]] | None = None

    def add(self, record: dict[str, Any]) -> None:
        """Fold in ``record``, a well-formed event (``events.check``), as it arrives."""
        resolved = self.resolver.add(record)
        if resolved is None:  # a status delta whose base is missing: resolve() skips it too
            return
        self._seq += 1
        key = (float(resolved["time"]), self._seq)
        kind, job = resolved["kind"], resolved.get("job")
        self.counts["events"] += 1
        if job is not None:
            self.jobs.add(str(job))
        if kind == "status":
            self.counts["status"] += 1
            _newest(self._snapshots, str(job), key, resolved)
            for node_id, info in (resolved.get("nodes") or {}).items():
                fields = self._hosts.setdefault(str(node_id), {})
                for name in ("host", "address"):
                    if info.get(name):
                        _newest(fields, name, key, info[name])
                _newest(fields, "alive", key, info.get("alive"))
            return
        if job is not None and _oldest(self._first_events, str(job), key, resolved):
            self._recoveries = None
        if kind in ("save", "restore") and resolved.get("node_id") and resolved.get("rank") is not None:
            _newest(self._where, (str(job), int(resolved["rank"])), key, str(resolved["node_id"]))
        if kind == "save":
            self._add_save(key, resolved)
        elif kind == "interval":
            chose = {k: resolved.get(k) for k in ("interval", "reason", "rank", "time")}
            _newest(self._intervals, str(job), key, chose)
        elif kind in ("kill", "node_dead", "restore", "rejoin"):
            self._parts[self._seq] = (key, resolved)
            self._recoveries = None
            if kind == "restore":
                self.counts["restores"] += 1
            elif kind == "kill":
                point = {k: resolved.get(k) for k in ("time", "node_id", "mode", "by")}
                self._kills.append((key, point))
            elif kind == "node_dead":
                self._deaths.append((key, {"time": resolved.get("time"), "node_id": resolved.get("node_id")}))
                _newest(self._hosts.setdefault(str(resolved["node_id"]), {}), "alive", key, False)

    def _add_save(self, key: _Key, save: dict[str, Any]) -> None:
        self.counts["saves"] += 1
        if _oldest(self._first_saves, (str(save["job"]), str(save.get("attempt")), int(save["rank"])), key, save):
            self._recoveries = None
        blocking = (save.get("phases_s") or {}).get("blocking")
        if not isinstance(blocking, (int, float)):
            return
        point = {
            "job": save.get("job"),
            "rank": save.get("rank"),
            "attempt": save.get("attempt"),
            "step": save.get("step"),
            "time": save.get("time"),
            "blocking_s": blocking,
        }
        if len(self._stall) < MAX_STALL_POINTS:
            heapq.heappush(self._stall, (key, point))
        elif key > self._stall[0][0]:
            heapq.heapreplace(self._stall, (key, point))
        else:
            return
        self._stall_points = None

    def recoveries(self) -> list[dict[str, Any]]:
        """The recoveries as the page draws them, assembled again only after a change."""
        if self._recoveries is not None:
            return self._recoveries
        parts = dict(self._parts)
        for key, record in [*self._first_saves.values(), *self._first_events.values()]:
            parts[key[1]] = (key, record)
        result = []
        for index, recovery in enumerate(timeline.recoveries(_in_order(parts.values()))):
            total = sum(v for v in recovery.phases_s.values() if v is not None)
            restore_total = sum(recovery.phases_s.get(p) or 0.0 for p in timeline.RESTORE_PHASES)
            resume = recovery.time_to_resume_s
            # time to resume not covered by a measured phase (e.g. worker start-up before restore())
            other = None if resume is None else max(0.0, resume - total)
            result.append(
                {
                    "index": index,
                    **recovery.as_dict(),
                    "phases_total_s": total,
                    "restore_total_s": restore_total,
                    "other_s": other,
                }
            )
        self._recoveries = result
        return result

    def stall(self) -> list[dict[str, Any]]:
        if self._stall_points is None:
            self._stall_points = _in_order(self._stall)
        return self._stall_points

    def data(
        self, live: dict[str, Any] | None, *, sources: list[str] | None, error: str | None, now: float | None
    ) -> dict[str, Any]:
        recoveries = self.recoveries()
        failed = sum(1 for r in recoveries if r["failed"])
        kills, deaths = _in_order(self._kills), _in_order(self._deaths)
        data: dict[str, Any] = {
            "version": VERSION,
            "generated_at": time.time() if now is None else now,
            "live": live is not None,
            "sources": list(sources or []),
            "error": error,
            "phases": list(timeline.PHASES),
            "restore_phases": list(timeline.RESTORE_PHASES),
            "summary": {
                "events": self.counts["events"],
                "saves": self.counts["saves"],
                "restores": self.counts["restores"],
                "kills": len(kills),
                "node_deaths": len(deaths),
                "recoveries": len(recoveries) - failed,
                "failed_recoveries": failed,
                "status_snapshots": self.counts["status"],
                "jobs": sorted(self.jobs),
            },
            "recoveries": recoveries,
            "time_to_resume": [
                {"time": r["kill_time"], "job": r["job"], "attempt": r["attempt"], "value": r["time_to_resume_s"]}
                for r in recoveries
                if r["time_to_resume_s"] is not None
            ],
            "save_stall": self.stall(),
            "intervals": {job: value for job, (_, value) in self._intervals.items()},
            "kills": kills,
            "node_deaths": deaths,
            "nodes": {},
            "memory": None,
            "placement": None,
            "protection": None,
        }
        if live is not None:
            _add_live(data, live)
        else:
            self._add_snapshots(data)
        data["nodes"] = self._nodes(live, data)
        return data

    def _add_snapshots(self, data: dict[str, Any]) -> None:
        """Memory, protection and placement from the newest ``status`` event (per job), with shards
        on nodes that died or were killed after that snapshot counted as lost."""
        if not self._snapshots:
            return

        def gone_after(t: float) -> tuple[set[str], set[str]]:
            """(nodes declared dead after t, nodes whose store or node was killed after t)."""
            dead = {str(e.get("node_id")) for (at, _), e in self._deaths if at > t}
            return dead, dead | {str(e.get("node_id")) for (at, _), e in self._kills if at > t}

        latest = max(self._snapshots.values(), key=lambda entry: entry[0])[1]
        dead, killed = gone_after(float(latest["time"]))
        data["memory"] = [
            {
                "node_id": node_id,
                "alive": bool(info.get("alive")) and node_id not in dead,
                "used_bytes": None if node_id in killed else info.get("used_bytes"),
                "budget_bytes": info.get("budget_bytes"),
                "shards": None if node_id in killed else info.get("shards"),
                "jobs": {},
                "error": (
                    "killed after the snapshot" if node_id in killed and node_id not in dead else info.get("error")
                ),
            }
            for node_id, info in sorted((latest.get("nodes") or {}).items())
            if info.get("store")
        ]
        data["memory_source"] = {"source": "snapshot", "time": latest.get("time"), "job": latest.get("job")}
        data["protection"] = {}
        data["placement"] = {}
        for job, (_, snap) in sorted(self._snapshots.items()):
            dead, killed = gone_after(float(snap["time"]))
            nodes = snap.get("nodes") or {}
            alive = {n for n, info in nodes.items() if info.get("alive")} - dead
            stores = {n for n, info in nodes.items() if info.get("store")} - killed
            local = snap.get("local") or {}
            ranks = {
                int(rank): {
                    "nodes": {i: n for i, n in enumerate(shard_nodes or []) if n is not None},
                    "local": True if local.get(rank) else None,
                    "local_node": local.get(rank),
                }
                for rank, shard_nodes in (snap.get("placement") or {}).items()
            }
            entry = placement(
                int(snap["step"]),
                ranks,
                alive,
                store_nodes=stores,
                data_shards=snap.get("data_shards"),
                parity_shards=snap.get("parity_shards"),
            )
            entry.update({"source": "snapshot", "time": snap.get("time")})
            if snap.get("placement") is None:  # a job too large to list rank by rank: its summary
                entry.update({"protection": snap.get("protection"), "unlisted_ranks": snap.get("world_size")})
            data["placement"][job] = entry
            data["protection"][job] = {
                "value": entry["protection"],
                "recorded": snap.get("protection"),
                "latest_committed": snap.get("step"),
                "committed_steps": None,
                "world_size": snap.get("world_size"),
                "source": "snapshot",
                "time": snap.get("time"),
            }

    def _nodes(self, live: dict[str, Any] | None, data: dict[str, Any]) -> dict[str, Any]:
        """node id -> {"host", "address", "alive", "ranks": [{"job", "rank"}]}: hosts from Ray's
        node records (live) or status snapshots, the ranks from each rank's newest save or restore
        event that names its node."""
        nodes: dict[str, dict[str, Any]] = {}

        def entry(node_id: str) -> dict[str, Any]:
            return nodes.setdefault(node_id, {"host": None, "address": None, "alive": None, "ranks": []})

        for node_id, fields in self._hosts.items():
            found = entry(node_id)
            for name, (_, value) in fields.items():
                found[name] = value
        for record in (live or {}).get("ray_nodes") or []:
            found = entry(record.node_id)
            found["host"] = record.host or found["host"]
            found["address"] = record.address or found["address"]
            found["alive"] = record.alive
        if live is not None:
            for node_id in live.get("alive") or []:
                entry(str(node_id))["alive"] = True
        for (job, rank), (_, node_id) in sorted(self._where.items()):
            entry(node_id)["ranks"].append({"job": job, "rank": rank})
        for node in data.get("memory") or []:
            entry(node["node_id"])
        return dict(sorted(nodes.items()))


def _sort_time(record: dict[str, Any]) -> float:
    """An event's time to sort by (0 for a malformed one: it is skipped after sorting)."""
    value = record.get("time")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _add_live(data: dict[str, Any], live: dict[str, Any]) -> None:
    status = live.get("status") or {}
    alive = set(live.get("alive") or [])
    data["namespace"] = status.get("namespace")
    data["registry"] = status.get("registry")
    memory = []
    for node_id, stats in sorted((status.get("nodes") or {}).items()):
        memory.append(
            {
                "node_id": node_id,
                "alive": node_id in alive,
                "used_bytes": stats.get("used_bytes"),
                "budget_bytes": stats.get("budget_bytes"),
                "shards": stats.get("shards"),
                "jobs": stats.get("jobs") or {},
                "error": stats.get("error"),
            }
        )
    data["memory"] = memory
    data["memory_source"] = {"source": "live", "time": data["generated_at"], "job": None}
    data["placement"] = {
        job: {
            **placement(entry["step"], entry["ranks"], alive, store_nodes=set(status.get("nodes") or {})),
            "source": "live",
            "time": data["generated_at"],
        }
        for job, entry in sorted((live.get("placements") or {}).items())
        if entry and entry.get("ranks")
    }
    protection = {}
    for job, info in sorted((status.get("jobs") or {}).items()):
        located = data["placement"].get(job)
        protection[job] = {
            # from where the shards are (ray_ckpt.core.protection), as the placement table shows it
            "value": located["protection"] if located else info.get("protection"),
            "latest_committed": info.get("latest_committed"),
            "committed_steps": info.get("committed_steps") or [],
            "world_size": info.get("world_size"),
            "source": "live",
            "time": data["generated_at"],
        }
    data["protection"] = protection


def placement(
    step: int,
    ranks: dict[Any, dict[str, Any]],
    alive: set[str],
    store_nodes: set[str] | None = None,
    *,
    data_shards: int | None = None,
    parity_shards: int | None = None,
) -> dict[str, Any]:
    """Nodes x ranks of one committed step: which shard indices (and local copies) each node
    holds for each rank, with shards on dead nodes (or, given ``store_nodes``, nodes without a
    store) marked lost. ``ranks``: the registry's ``locate`` (rank -> {"metas": {index: meta},
    "nodes": {index: node}, "local", "local_node"}); the code (k, m) comes from the metas unless
    given. Protection: ``ray_ckpt.core.protection.step_protection`` over the shards not lost."""
    live = alive if store_nodes is None else alive & set(store_nodes)
    cells = []
    nodes: set[str] = set(store_nodes or ()) & alive
    k, m = data_shards, parity_shards
    held_by_rank: dict[int, list[str]] = {}
    for rank in sorted(ranks, key=int):
        record = ranks[rank]
        metas = {int(i): meta for i, meta in (record.get("metas") or {}).items()}
        if metas:
            first = next(iter(metas.values()))
            k, m = int(first["data_shards"]), int(first["parity_shards"])
        held: dict[str, list[int]] = {}
        for index, node_id in (record.get("nodes") or {}).items():
            held.setdefault(str(node_id), []).append(int(index))
        held_by_rank[int(rank)] = [str(n) for n in (record.get("nodes") or {}).values()]
        local_node = record.get("local_node")
        for node_id in sorted(set(held) | ({str(local_node)} if local_node else set())):
            nodes.add(node_id)
            cells.append(
                {
                    "rank": int(rank),
                    "node_id": node_id,
                    "indices": sorted(held.get(node_id, [])),
                    "local": node_id == local_node and record.get("local") is not None,
                    "lost": node_id not in live,
                }
            )
    value = None
    if k is not None:
        value = protection_module.step_protection({r: (held, k) for r, held in held_by_rank.items()}, live)
    ordered_nodes = sorted(nodes, key=lambda n: (n not in alive, n))
    return {
        "step": step,
        "data_shards": k,
        "parity_shards": m,
        "ranks": sorted(int(r) for r in ranks),
        "nodes": [{"node_id": n, "alive": n in alive, "store": n in live} for n in ordered_nodes],
        "cells": cells,
        "protection": value,
    }
