"""What the dashboard draws, as one JSON-able dict (served as ``/api/data``); no Ray here.

``build(events, live=None)``: ``events`` are recorded events (ray_ckpt.events); ``live`` is a
snapshot of a running cluster (see ``server.LiveCluster.snapshot``): ``{"status":
ray_ckpt.status(), "alive": [node ids], "placements": {job: {"step", "ranks": registry
locate()}}}``. Parts that need a live cluster are None without one, and the page says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ray_ckpt import timeline

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
    """The dashboard's data: recoveries (one per failure, from ``timeline.recoveries``), time to
    resume over time, save stall per step, kills and node deaths, and, live only, memory per
    node, shard placement of each job's newest committed step, and protection per job."""
    ordered = sorted((e for e in events if isinstance(e, dict)), key=lambda e: float(e.get("time") or 0.0))
    recoveries = []
    for index, recovery in enumerate(timeline.recoveries(ordered)):
        total = sum(v for v in recovery["phases_s"].values() if v is not None)
        resume = recovery["time_to_resume_s"]
        # time to resume not covered by a measured phase (e.g. worker start-up before restore())
        other = None if resume is None else max(0.0, resume - total)
        recoveries.append({"index": index, **recovery, "phases_total_s": total, "other_s": other})
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
    data: dict[str, Any] = {
        "version": VERSION,
        "generated_at": time.time() if now is None else now,
        "live": live is not None,
        "sources": list(sources or []),
        "error": error,
        "phases": list(timeline.PHASES),
        "summary": {
            "events": len(ordered),
            "saves": len(saves),
            "restores": sum(1 for e in ordered if e.get("kind") == "restore"),
            "kills": len(kills),
            "node_deaths": len(deaths),
            "recoveries": len(recoveries),
            "jobs": jobs,
        },
        "recoveries": recoveries,
        "time_to_resume": [
            {"time": r["kill_time"], "job": r["job"], "attempt": r["attempt"], "value": r["time_to_resume_s"]}
            for r in recoveries
            if r["time_to_resume_s"] is not None
        ],
        "save_stall": stall,
        "kills": kills,
        "node_deaths": deaths,
        "memory": None,
        "placement": None,
        "protection": None,
    }
    if live is not None:
        _add_live(data, live)
    return data


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
    protection = {}
    for job, info in sorted((status.get("jobs") or {}).items()):
        protection[job] = {
            "value": info.get("protection"),
            "latest_committed": info.get("latest_committed"),
            "committed_steps": info.get("committed_steps") or [],
            "world_size": info.get("world_size"),
        }
    data["protection"] = protection
    data["placement"] = {
        job: placement(entry["step"], entry["ranks"], alive, store_nodes=set(status.get("nodes") or {}))
        for job, entry in sorted((live.get("placements") or {}).items())
        if entry and entry.get("ranks")
    }


def placement(
    step: int, ranks: dict[Any, dict[str, Any]], alive: set[str], store_nodes: set[str] | None = None
) -> dict[str, Any]:
    """Nodes x ranks of one committed step: which shard indices (and local copies) each node
    holds for each rank, with shards on dead nodes marked lost. ``ranks``: the registry's
    ``locate`` (rank -> {"metas": {index: meta}, "nodes": {index: node}, "local_node"})."""
    cells = []
    nodes: set[str] = set(store_nodes or ()) & alive
    k = m = None
    protection = None
    for rank in sorted(ranks, key=int):
        record = ranks[rank]
        metas = {int(i): meta for i, meta in (record.get("metas") or {}).items()}
        if metas:
            first = next(iter(metas.values()))
            k, m = int(first["data_shards"]), int(first["parity_shards"])
        held: dict[str, list[int]] = {}
        for index, node_id in (record.get("nodes") or {}).items():
            held.setdefault(str(node_id), []).append(int(index))
        live_shards = sum(len(v) for n, v in held.items() if n in alive)
        if k is not None:
            margin = live_shards - k
            protection = margin if protection is None else min(protection, margin)
        local_node = record.get("local_node")
        for node_id in sorted(set(held) | ({str(local_node)} if local_node else set())):
            nodes.add(node_id)
            cells.append(
                {
                    "rank": int(rank),
                    "node_id": node_id,
                    "indices": sorted(held.get(node_id, [])),
                    "local": node_id == local_node and record.get("local") is not None,
                    "lost": node_id not in alive,
                }
            )
    ordered_nodes = sorted(nodes, key=lambda n: (n not in alive, n))
    return {
        "step": step,
        "data_shards": k,
        "parity_shards": m,
        "ranks": sorted(int(r) for r in ranks),
        "nodes": [{"node_id": n, "alive": n in alive} for n in ordered_nodes],
        "cells": cells,
        "protection": protection,
    }
