"""What the dashboard draws, as one JSON-able dict (served as ``/api/data``); no Ray here.

``build(events, live=None)``: ``events`` are recorded events (ray_ckpt.core.events); ``live`` is a
snapshot of a running cluster (see ``server.LiveCluster.snapshot``): ``{"status":
ray_ckpt.status(), "alive": [node ids], "placements": {job: {"step", "ranks": registry
locate()}}, "ray_nodes": [Ray's node records, ray_ckpt.core.nodes.RayNode]}``. Memory,
protection and placement come from the live cluster when there is one, else from the newest
``status`` events (each part then carries ``source: "snapshot"`` and the snapshot's time;
shards on nodes that died or were killed after it count as lost); they are None when neither
exists.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from ray_ckpt.core import events as events_module
from ray_ckpt.core import protection as protection_module
from ray_ckpt.core import timeline

VERSION = 1
MAX_STALL_POINTS = 5000  # the newest recorded saves drawn in the save stall chart


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
    Malformed events (``ray_ckpt.core.events.check``) are skipped; status deltas are made whole
    (``ray_ckpt.core.events.resolve``)."""
    ordered = events_module.resolve(sorted((e for e in events if isinstance(e, dict)), key=_sort_time))
    recoveries = []
    for index, recovery in enumerate(timeline.recoveries(ordered)):
        total = sum(v for v in recovery.phases_s.values() if v is not None)
        restore_total = sum(recovery.phases_s.get(p) or 0.0 for p in timeline.RESTORE_PHASES)
        resume = recovery.time_to_resume_s
        # time to resume not covered by a measured phase (e.g. worker start-up before restore())
        other = None if resume is None else max(0.0, resume - total)
        recoveries.append(
            {
                "index": index,
                **recovery.as_dict(),
                "phases_total_s": total,
                "restore_total_s": restore_total,
                "other_s": other,
            }
        )
    saves = [e for e in ordered if e.get("kind") == "save"]
    stall = [
        {
            "job": e.get("job"),
            "rank": e.get("rank"),
            "attempt": e.get("attempt"),
            "step": e.get("step"),
            "time": e.get("time"),
            "blocking_s": (e.get("phases_s") or {}).get("blocking"),
        }
        for e in saves
        if isinstance((e.get("phases_s") or {}).get("blocking"), (int, float))
    ][-MAX_STALL_POINTS:]
    kills = [
        {"time": e.get("time"), "node_id": e.get("node_id"), "mode": e.get("mode"), "by": e.get("by")}
        for e in ordered
        if e.get("kind") == "kill"
    ]
    deaths = [{"time": e.get("time"), "node_id": e.get("node_id")} for e in ordered if e.get("kind") == "node_dead"]
    jobs = sorted({str(e["job"]) for e in ordered if e.get("job") is not None})
    intervals: dict[str, dict[str, Any]] = {}  # job -> the newest interval every="auto" chose
    for e in ordered:
        if e.get("kind") == "interval":
            intervals[str(e["job"])] = {k: e.get(k) for k in ("interval", "reason", "rank", "time")}
    failed = sum(1 for r in recoveries if r["failed"])
    data: dict[str, Any] = {
        "version": VERSION,
        "generated_at": time.time() if now is None else now,
        "live": live is not None,
        "sources": list(sources or []),
        "error": error,
        "phases": list(timeline.PHASES),
        "restore_phases": list(timeline.RESTORE_PHASES),
        "summary": {
            "events": len(ordered),
            "saves": len(saves),
            "restores": sum(1 for e in ordered if e.get("kind") == "restore"),
            "kills": len(kills),
            "node_deaths": len(deaths),
            "recoveries": len(recoveries) - failed,
            "failed_recoveries": failed,
            "status_snapshots": sum(1 for e in ordered if e.get("kind") == "status"),
            "jobs": jobs,
        },
        "recoveries": recoveries,
        "time_to_resume": [
            {"time": r["kill_time"], "job": r["job"], "attempt": r["attempt"], "value": r["time_to_resume_s"]}
            for r in recoveries
            if r["time_to_resume_s"] is not None
        ],
        "save_stall": stall,
        "intervals": intervals,
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
        _add_snapshots(data, ordered)
    data["nodes"] = _nodes(ordered, live, data)
    return data


def _sort_time(record: dict[str, Any]) -> float:
    """An event's time to sort by (0 for a malformed one: it is skipped after sorting)."""
    value = record.get("time")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _add_snapshots(data: dict[str, Any], ordered: list[dict[str, Any]]) -> None:
    """Memory, protection and placement from the newest ``status`` event (per job), with shards
    on nodes that died or were killed after that snapshot counted as lost."""
    newest: dict[str, dict[str, Any]] = {}
    for record in ordered:
        if record.get("kind") == "status" and record.get("job") is not None and record.get("step") is not None:
            newest[str(record["job"])] = record
    if not newest:
        return

    def gone_after(t: float) -> tuple[set[str], set[str]]:
        """(nodes declared dead after t, nodes whose store or node was killed after t)."""
        later = [e for e in ordered if float(e.get("time") or 0.0) > t]
        dead = {str(e.get("node_id")) for e in later if e.get("kind") == "node_dead"}
        return dead, dead | {str(e.get("node_id")) for e in later if e.get("kind") == "kill"}

    latest = max(newest.values(), key=lambda e: float(e.get("time") or 0.0))
    dead, killed = gone_after(float(latest.get("time") or 0.0))
    data["memory"] = [
        {
            "node_id": node_id,
            "alive": bool(info.get("alive")) and node_id not in dead,
            "used_bytes": None if node_id in killed else info.get("used_bytes"),
            "budget_bytes": info.get("budget_bytes"),
            "shards": None if node_id in killed else info.get("shards"),
            "jobs": {},
            "error": "killed after the snapshot" if node_id in killed and node_id not in dead else info.get("error"),
        }
        for node_id, info in sorted((latest.get("nodes") or {}).items())
        if info.get("store")
    ]
    data["memory_source"] = {"source": "snapshot", "time": latest.get("time"), "job": latest.get("job")}
    data["protection"] = {}
    data["placement"] = {}
    for job, snap in sorted(newest.items()):
        dead, killed = gone_after(float(snap.get("time") or 0.0))
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


def _nodes(ordered: list[dict[str, Any]], live: dict[str, Any] | None, data: dict[str, Any]) -> dict[str, Any]:
    """node id -> {"host", "address", "alive", "ranks": [{"job", "rank"}]}: hosts from Ray's
    node records (live) or status snapshots, the ranks from each rank's newest save or restore
    event that names its node."""
    nodes: dict[str, dict[str, Any]] = {}

    def entry(node_id: str) -> dict[str, Any]:
        return nodes.setdefault(node_id, {"host": None, "address": None, "alive": None, "ranks": []})

    for record in ordered:
        if record.get("kind") == "status":
            for node_id, info in (record.get("nodes") or {}).items():
                found = entry(str(node_id))
                found["host"] = info.get("host") or found["host"]
                found["address"] = info.get("address") or found["address"]
                found["alive"] = info.get("alive")
        elif record.get("kind") == "node_dead" and record.get("node_id"):
            entry(str(record["node_id"]))["alive"] = False
    for record in (live or {}).get("ray_nodes") or []:
        found = entry(record.node_id)
        found["host"] = record.host or found["host"]
        found["address"] = record.address or found["address"]
        found["alive"] = record.alive
    if live is not None:
        for node_id in live.get("alive") or []:
            entry(str(node_id))["alive"] = True
    where: dict[tuple[str, int], str] = {}
    for record in ordered:
        if record.get("kind") in ("save", "restore") and record.get("node_id") and record.get("rank") is not None:
            where[(str(record.get("job")), int(record["rank"]))] = str(record["node_id"])
    for (job, rank), node_id in sorted(where.items()):
        entry(node_id)["ranks"].append({"job": job, "rank": rank})
    for node in data.get("memory") or []:
        entry(node["node_id"])
    return dict(sorted(nodes.items()))


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
