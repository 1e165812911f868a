"""A realistic recorded events file (as the registry writes it) with two recoveries, and the
recovery phases a reader must find in it. Shared by the dashboard tests (no Ray needed).

Job ``gpt-small``, 4 ranks, RS(4,2), a save event every 10 steps:

- attempt ``a1`` starts from scratch and checkpoints steps 0..30;
- node 5 is killed at +20.0 s, declared dead at +22.1 s; attempt ``a2`` restores step 30
  (3 steps lost) and checkpoints 31..50;
- nodes 2 and 6 are killed at +60.0 s and +60.8 s (one failure), declared dead at +62.0 s and
  +62.6 s; attempt ``a3`` restores step 50 (2 steps lost) and checkpoints 51..60;
- the store of node 3 is killed at +90.0 s (the node and the job keep running: no recovery).
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

from ray_ckpt import events

T0 = 1764480000.0
JOB = "gpt-small"
RANKS = 4
SHARD_BYTES = 13_107_200
NODES = [hashlib.sha256(f"node-{i}".encode()).hexdigest()[:56] for i in range(8)]

# what timeline.recoveries must find: per failure, the phases in seconds
EXPECTED = [
    {
        "attempt": "a2",
        "kill_time": T0 + 20.0,
        "killed_nodes": [NODES[5]],
        "step": 30,
        "steps_lost": 3,
        "phases_s": {
            "detect": 2.1,
            "restart": 3.2,
            "locate": 0.015,
            "fetch": 0.7,
            "decode": 0.21,
            "load": 0.11,
            "first_step": 1.7,
        },
        "time_to_resume_s": 8.3,
    },
    {
        "attempt": "a3",
        "kill_time": T0 + 60.0,
        "killed_nodes": [NODES[2], NODES[6]],
        "step": 50,
        "steps_lost": 2,
        "phases_s": {
            "detect": 2.6,
            "restart": 2.7,
            "locate": 0.023,
            "fetch": 1.05,
            "decode": 0.33,
            "load": 0.12,
            "first_step": 2.5,
        },
        "time_to_resume_s": 9.3,
    },
]


def _save(attempt: str, rank: int, step: int, time: float, wait: float = 0.0) -> dict[str, Any]:
    snapshot = 0.018 + 0.001 * rank + 0.002 * (step % 3)
    phases = {
        "wait_previous": wait,
        "snapshot": snapshot,
        "blocking": wait + snapshot + 0.0004,
        "encode": 0.052 + 0.002 * rank,
        "scatter": 0.121 + 0.01 * rank,
        "stage": 0.004,
    }
    return events.event(
        "save",
        time=time,
        job=JOB,
        rank=rank,
        attempt=attempt,
        node_id=NODES[rank],
        step=step,
        phases_s=phases,
        bytes=4 * SHARD_BYTES,
    )


def _restore(attempt: str, rank: int, time: float, started: float, step: int | None, **fields: Any) -> dict[str, Any]:
    return events.event(
        "restore",
        time=time,
        job=JOB,
        rank=rank,
        attempt=attempt,
        node_id=NODES[rank],
        step=step,
        started=started,
        **fields,
    )


def records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # attempt a1: nothing to restore, then steps 0..30
    for rank in range(RANKS):
        out.append(
            _restore(
                "a1", rank, T0 + 2.0 + 0.01 * rank, T0 + 1.0, None, source=None, steps_lost=None, bytes=0, phases_s={}
            )
        )
    for step in (0, 10, 20, 30):
        for rank in range(RANKS):
            wait = 0.031 if step == 20 else 0.0
            out.append(_save("a1", rank, step, T0 + 4.0 + 0.5 * step + 0.02 * rank, wait))
    # failure 1: node 5
    out.append(events.event("kill", time=T0 + 20.0, node_id=NODES[5], mode="node", by="ray-ckpt kill-node"))
    out.append(events.event("node_dead", time=T0 + 22.1, node_id=NODES[5]))
    for rank in range(RANKS):
        out.append(
            _restore(
                "a2",
                rank,
                T0 + 26.0 + 0.2 * rank,
                T0 + 25.0 + 0.1 * rank,
                30,
                source="local" if rank == 0 else "peers",
                steps_lost=3,
                bytes=0 if rank == 0 else 4 * SHARD_BYTES,
                phases_s={
                    "locate": 0.012 + 0.001 * rank,
                    "fetch": 0.4 + 0.1 * rank,
                    "decode": 0.15 + 0.02 * rank,
                    "load": 0.08 + 0.01 * rank,
                },
            )
        )
    for step, base in ((31, 28.0), (40, 32.0), (50, 37.0)):
        for rank in range(RANKS):
            out.append(_save("a2", rank, step, T0 + base + 0.1 * rank))
    # failure 2: nodes 2 and 6, 0.8 s apart
    out.append(events.event("kill", time=T0 + 60.0, node_id=NODES[2], mode="node", by="ray-ckpt kill-node"))
    out.append(events.event("kill", time=T0 + 60.8, node_id=NODES[6], mode="node", by="ray-ckpt kill-node"))
    out.append(events.event("node_dead", time=T0 + 62.0, node_id=NODES[2]))
    out.append(events.event("node_dead", time=T0 + 62.6, node_id=NODES[6]))
    for rank in range(RANKS):
        out.append(
            _restore(
                "a3",
                rank,
                T0 + 66.5 + 0.1 * rank,
                T0 + 65.0 + 0.1 * rank,
                50,
                source="peers",
                steps_lost=2,
                bytes=4 * SHARD_BYTES,
                phases_s={
                    "locate": 0.02 + 0.001 * rank,
                    "fetch": 0.9 + 0.05 * rank,
                    "decode": 0.3 + 0.01 * rank,
                    "load": 0.09 + 0.01 * rank,
                },
            )
        )
    for step, base in ((51, 69.0), (60, 74.0)):
        for rank in range(RANKS):
            out.append(_save("a3", rank, step, T0 + base + 0.1 * rank))
    # a store-only kill: no restart follows
    out.append(events.event("kill", time=T0 + 90.0, node_id=NODES[3], mode="store", by="ray-ckpt kill-node"))
    return out


def write(path: str | pathlib.Path) -> pathlib.Path:
    """Write the events file (JSON lines, as the registry does) and return its path."""
    path = pathlib.Path(path)
    events.write(path, records())
    return path
