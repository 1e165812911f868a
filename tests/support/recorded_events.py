"""A realistic recorded events file (as the registry writes it) with two recoveries and a
failed one, and what a reader must find in it. Shared by the dashboard and metrics tests (no
Ray needed).

Job ``gpt-small``, 4 ranks, RS(4,2), 8 nodes (``worker-0`` .. ``worker-7``, rank r on node r),
a save event every 10 steps, and a ``status`` snapshot after each recorded commit.
``records()``:

- attempt ``a1`` starts from scratch and checkpoints steps 0..30;
- node 5 is killed at +20.0 s, declared dead at +22.1 s; attempt ``a2`` restores step 30
  (3 steps lost) and checkpoints 31..50;
- nodes 4 and 6 are killed at +60.0 s and +60.8 s (one failure), declared dead at +62.0 s and
  +62.6 s; attempt ``a3`` restores step 50 (2 steps lost) and checkpoints 51..60 with only 5
  stores left (shards double up: protection 1);
- the store of node 3 is killed at +90.0 s (the node and the job keep running: no recovery).

``failed_restart_records()`` continues it: node 2 (rank 2's) is killed at +100.0 s, declared
dead at +102.0 s; attempt ``a4`` comes back with 3 ranks (rank 2 now on node 7) and every
rank's restore raises a world-size ConfigError: a failed recovery. ``all_records()`` is both,
what ``write`` writes by default.

``single_point_records()``: a tiny job whose charts have one x value each (one recorded save
step, one recovery).
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

from ray_ckpt.core import events
from ray_ckpt.core.nodes import RayNode
from ray_ckpt.core.wire import StoreStats

T0 = 1764480000.0
JOB = "gpt-small"
RANKS = 4
SHARD_BYTES = 13_107_200
NODES = [hashlib.sha256(f"node-{i}".encode()).hexdigest()[:56] for i in range(8)]
HOSTS = [f"worker-{i}" for i in range(8)]
BUDGET = 256 << 20
WORLD_SIZE_ERROR = (
    "ConfigError: job 'gpt-small' was saved by 4 ranks, this attempt has 3 (world size changed from 4 to 3?): "
    "restore at world size 4, start a new job name, or drop the job"
)

# what timeline.recoveries must find: per failure, the phases in seconds (they add up to the time
# to resume; the restore phases are rank 3's, whose restore ended last)
EXPECTED = [
    {
        "attempt": "a2",
        "kill_time": T0 + 20.0,
        "killed_nodes": [NODES[5]],
        "step": 30,
        "steps_lost": 3,
        "phases_s": {
            "detect": 2.1,
            "restart": 3.465,  # to the start of the slowest rank's restore: 26.6 - 1.035 - 22.1
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
        "killed_nodes": [NODES[4], NODES[6]],
        "step": 50,
        "steps_lost": 2,
        "phases_s": {
            "detect": 2.6,
            "restart": 2.677,  # 66.8 - 1.523 - 62.6
            "locate": 0.023,
            "fetch": 1.05,
            "decode": 0.33,
            "load": 0.12,
            "first_step": 2.5,
        },
        "time_to_resume_s": 9.3,
    },
]
# the failure of failed_restart_records(): every restore raised
FAILED_RECOVERY = {
    "attempt": "a4",
    "kill_time": T0 + 100.0,
    "killed_nodes": [NODES[2]],
    "step": None,
    "steps_lost": None,
    "phases_s": {"detect": 2.0, "restart": 3.0},  # no restore phase, no first step
    "time_to_resume_s": None,
    "failed": True,
    "error": WORLD_SIZE_ERROR,
}
EXPECTED_ALL = [*EXPECTED, FAILED_RECOVERY]  # the recoveries of all_records()
# the newest status snapshot (after step 60 committed): where each rank's shards are
LAST_SNAPSHOT_STEP = 60


def _node(attempt: str, rank: int) -> str:
    """The node rank ``rank`` runs on in ``attempt`` (rank 2 moves to node 7 once node 2 died)."""
    return NODES[7] if rank == 2 and attempt == "a4" else NODES[rank]


def _save(attempt: str, rank: int, step: int, time: float, wait: float = 0.0, job: str = JOB) -> dict[str, Any]:
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
        job=job,
        rank=rank,
        attempt=attempt,
        node_id=_node(attempt, rank),
        step=step,
        phases_s=phases,
        bytes=4 * SHARD_BYTES,
    )


def _restore(attempt: str, rank: int, time: float, started: float, step: int | None, **fields: Any) -> dict[str, Any]:
    return events.event(
        "restore",
        time=time,
        job=fields.pop("job", JOB),
        rank=rank,
        attempt=attempt,
        node_id=_node(attempt, rank),
        step=step,
        started=started,
        **fields,
    )


def placement(attempt: str, alive: list[int]) -> dict[int, dict[int, str]]:
    """rank -> shard index -> node id: each rank's 6 shards round-robin over the alive nodes,
    its own node last (with 5 nodes left one node gets two shards of a rank)."""
    result = {}
    for rank in range(RANKS):
        own = NODES.index(_node(attempt, rank))
        candidates = [NODES[i] for i in alive if i != own] + [NODES[own]]
        result[rank] = {i: candidates[(rank + i) % len(candidates)] for i in range(6)}
    return result


def _status(time: float, step: int, attempt: str, alive: list[int], job: str = JOB) -> dict[str, Any]:
    """The snapshot the registry records when ``step`` commits: stores on the ``alive`` nodes,
    each holding two kept steps of its shards and of the local copies of the ranks it runs."""
    shards = placement(attempt, alive)
    stores: dict[str, StoreStats | str] = {}
    for i in alive:
        held = sum(1 for by_index in shards.values() for n in by_index.values() if n == NODES[i])
        local = sum(1 for rank in range(RANKS) if _node(attempt, rank) == NODES[i])
        used = 2 * (held * SHARD_BYTES + local * 4 * SHARD_BYTES)
        stores[NODES[i]] = StoreStats(NODES[i], BUDGET, used, used, 0, shards=2 * (held + local), jobs={job: used})
    ray_nodes = [
        {"NodeID": n, "Alive": i in alive, "NodeManagerHostname": HOSTS[i], "NodeManagerAddress": f"10.0.0.{10 + i}"}
        for i, n in enumerate(NODES)
    ]
    return events.status_event(
        job,
        step,
        world_size=RANKS,
        data_shards=4,
        parity_shards=2,
        shards=shards,
        local_nodes={rank: _node(attempt, rank) for rank in range(RANKS)},
        stores=stores,
        ray_nodes=[RayNode.from_ray(n) for n in ray_nodes],
        time=time,
    )


def _kill(time: float, node: int, mode: str = "node") -> dict[str, Any]:
    return events.event("kill", time=time, node_id=NODES[node], mode=mode, by="ray-ckpt kill-node")


def _dead(time: float, node: int) -> dict[str, Any]:
    return events.event("node_dead", time=time, node_id=NODES[node])


def _recovered(
    attempt: str, step: int, steps_lost: int, times: list[tuple[float, float]], **per_rank: Any
) -> list[dict[str, Any]]:
    """Every rank's restore of ``step`` in ``attempt``: rank r's ``(time, started)`` is
    ``times[r]``; each other field is a function of the rank."""
    return [
        _restore(attempt, rank, time, started, step, steps_lost=steps_lost, **{k: f(rank) for k, f in per_rank.items()})
        for rank, (time, started) in enumerate(times)
    ]


def _saved(attempt: str, steps_at: list[tuple[int, float]], alive: list[int]) -> list[dict[str, Any]]:
    """Every rank's save of each step at its base time (rank r 0.1 s after it), then the status
    snapshot of its commit 0.35 s after the base."""
    out = []
    for step, base in steps_at:
        out += [_save(attempt, rank, step, T0 + base + 0.1 * rank) for rank in range(RANKS)]
        out.append(_status(T0 + base + 0.35, step, attempt, alive))
    return out


def records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    everyone = list(range(8))
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
        out.append(_status(T0 + 4.0 + 0.5 * step + 0.11, step, "a1", everyone))
    # failure 1: node 5
    out += [_kill(T0 + 20.0, 5), _dead(T0 + 22.1, 5)]
    out += _recovered(
        "a2",
        30,
        3,
        [(T0 + 26.0 + 0.2 * rank, T0 + 25.0 + 0.1 * rank) for rank in range(RANKS)],
        source=lambda rank: "local" if rank == 0 else "peers",
        bytes=lambda rank: 0 if rank == 0 else 4 * SHARD_BYTES,
        phases_s=lambda rank: {
            "locate": 0.012 + 0.001 * rank,
            "fetch": 0.4 + 0.1 * rank,
            "decode": 0.15 + 0.02 * rank,
            "load": 0.08 + 0.01 * rank,
        },
    )
    out += _saved("a2", [(31, 28.0), (40, 32.0), (50, 37.0)], [0, 1, 2, 3, 4, 6, 7])
    # failure 2: nodes 4 and 6, 0.8 s apart
    out += [_kill(T0 + 60.0, 4), _kill(T0 + 60.8, 6), _dead(T0 + 62.0, 4), _dead(T0 + 62.6, 6)]
    out += _recovered(
        "a3",
        50,
        2,
        [(T0 + 66.5 + 0.1 * rank, T0 + 65.0 + 0.1 * rank) for rank in range(RANKS)],
        source=lambda rank: "peers",
        bytes=lambda rank: 4 * SHARD_BYTES,
        phases_s=lambda rank: {
            "locate": 0.02 + 0.001 * rank,
            "fetch": 0.9 + 0.05 * rank,
            "decode": 0.3 + 0.01 * rank,
            "load": 0.09 + 0.01 * rank,
        },
    )
    out += _saved("a3", [(51, 69.0), (60, 74.0)], SURVIVORS)
    # a store-only kill: no restart follows
    out.append(_kill(T0 + 90.0, 3, mode="store"))
    return out


def failed_restart_records() -> list[dict[str, Any]]:
    """Failure 3, after ``records()``: node 2; the job comes back with 3 ranks and every restore raises."""
    out = [_kill(T0 + 100.0, 2), _dead(T0 + 102.0, 2)]
    for rank in range(3):
        out.append(
            _restore(
                "a4",
                rank,
                T0 + 105.5 + 0.1 * rank,
                T0 + 104.8 + 0.1 * rank,
                None,
                source=None,
                steps_lost=None,
                bytes=0,
                phases_s={},
                error=WORLD_SIZE_ERROR,
            )
        )
    return out


def all_records() -> list[dict[str, Any]]:
    return records() + failed_restart_records()


SURVIVORS = [0, 1, 2, 3, 7]  # nodes with a store after failure 2
# shards of the newest snapshot on nodes gone since in all_records() (store of node 3 killed,
# node 2 dead), per rank: node index -> shard indices
LOST_AFTER_SNAPSHOT = {0: {2: [1], 3: [2]}, 1: {2: [0, 5], 3: [1]}, 2: {2: [2], 3: [0, 5]}, 3: {2: [4], 3: [1]}}

TINY = "tiny"


def single_point_records() -> list[dict[str, Any]]:
    """Job ``tiny``, 2 ranks: one recorded save step (step 0, one point per rank), a kill of
    node 1 and one recovery (restored step 0, no later save): every chart has one x value."""
    out = [
        _restore("a1", rank, T0 + 1.0, T0 + 0.5, None, job=TINY, source=None, steps_lost=None, bytes=0, phases_s={})
        for rank in range(2)
    ]
    out += [_save("a1", rank, 0, T0 + 3.0 + 0.01 * rank, job=TINY) for rank in range(2)]
    out += [_kill(T0 + 10.0, 1), _dead(T0 + 11.0, 1)]
    phases = {"locate": 0.01, "fetch": 0.2, "decode": 0.05, "load": 0.03}
    out += [
        _restore("a2", r, T0 + 14.0, T0 + 13.0, 0, job=TINY, source="peers", steps_lost=0, bytes=1, phases_s=phases)
        for r in range(2)
    ]
    return out


def write(path: str | pathlib.Path, records_: list[dict[str, Any]] | None = None) -> pathlib.Path:
    """Write the events file (JSON lines, as the registry does; default ``all_records()``) and return its path."""
    path = pathlib.Path(path)
    events.write(path, all_records() if records_ is None else records_)
    return path
