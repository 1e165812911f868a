"""Restore throughput over shaped links, in the network lab (used by ``lab_campaign.py``).

On a lab whose every node's link runs at R Gbit/s (the campaign's lab: 4 nodes), with one
state of ``size`` random bytes per rank saved with RS(2,1) and no local copy (a restore reads
k = 2 data shards from peers, as a replacement does):

- **one rank**: a fresh process on node 0 restores rank 0's state alone; its rate (the bytes
  that crossed its link, per second) against R;
- **all ranks at once**: fresh processes on nodes 0, 1 and 2 restore ranks 0, 1 and 2 at the same
  time (their shards spread over the 4 nodes, so every node serves); against the same bytes
  read by the same 3 nodes at once from one storage node (node 3: the three states in one
  process's memory there, each fetched whole through Ray, which is how a checkpoint on a
  storage host with one link of rate R is read). ``all_ranks_vs_storage_node`` is the storage
  node's time over ray_ckpt's: about the number of nodes that serve, when links are the limit.

Every restore is checked against the saved bytes (XXH3); a mismatch raises. Times are wall
clock inside the processes that restore, the Checkpointer already made.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

CODE = {"data_shards": 2, "parity_shards": 1, "local_copy": False}
RANKS = 3  # on nodes 0..2; node 3 is the storage node of the comparison


def _pinned(lab: Any, index: int) -> dict[str, Any]:
    return {"resources": {lab.nodes[index].resource: 0.01}}


def measure(lab: Any, rate_gbit: float, size: int) -> dict[str, Any]:
    """Save, then time one rank's restore and all ranks' at once against a storage node; the
    ``restore`` section of the campaign's JSON."""
    import ray

    from ray_ckpt.settings import namespace as current_namespace
    from ray_ckpt.testing import rank_actor
    from ray_ckpt.transport import naming

    if len(lab.nodes) < RANKS + 1:
        raise ValueError(f"the restore measurement needs {RANKS + 1} lab nodes, the lab has {len(lab.nodes)}")
    namespace = current_namespace()
    job = f"lab-restore-{uuid.uuid4().hex[:6]}"
    Rank = rank_actor()
    attempt = f"{job}.a"
    savers = [Rank.options(**_pinned(lab, r)).remote(size, seed=r) for r in range(RANKS)]
    ray.get([s.connect.remote(namespace, job, r, RANKS, CODE, attempt) for r, s in enumerate(savers)])
    expected = ray.get([s.checksum.remote() for s in savers])
    ray.get([s.save.remote() for s in savers])
    ray.get([s.close.remote() for s in savers])
    for saver in savers:
        ray.kill(saver, no_restart=True)

    registry = naming.registry_handle(namespace)
    located = ray.get(registry.locate.remote(job, 0))  # step 0: rank -> its record
    placed = [{int(i): n for i, n in located[r]["nodes"].items()} for r in range(RANKS)]
    node_ids = [lab.node_id(n) for n in lab.nodes]

    def restorers(ranks: list[int]) -> list[Any]:
        made = [Rank.options(**_pinned(lab, r)).remote() for r in ranks]
        ray.get([m.connect.remote(namespace, job, r, RANKS, CODE) for r, m in zip(ranks, made, strict=True)])
        return made

    def checked(results: list[dict[str, Any]], ranks: list[int]) -> list[dict[str, Any]]:
        for rank, result in zip(ranks, results, strict=True):
            if result.get("checksum") != expected[rank] or result.get("source") != "peers":
                raise RuntimeError(f"rank {rank} restored {result!r}, expected its saved bytes from peers")
        return results

    one = restorers([0])
    (alone,) = checked(ray.get([m.restore.remote() for m in one]), [0])
    crossed = size * sum(1 for i in range(CODE["data_shards"]) if placed[0][i] != node_ids[0]) // CODE["data_shards"]
    one_rank_gbit = crossed * 8 / alone["seconds"] / 1e9

    every = restorers(list(range(RANKS)))
    started = time.perf_counter()
    together = checked(ray.get([m.restore.remote() for m in every]), list(range(RANKS)))
    ours_s = max(time.perf_counter() - started, max(r["seconds"] for r in together))
    for actor in one + every:
        ray.kill(actor, no_restart=True)

    storage_s = _storage_node_read(lab, size)
    return {
        "link_gbps": rate_gbit,
        "size_bytes": size,
        "one_rank_s": alone["seconds"],
        "one_rank_phases_s": alone.get("phases_s"),
        "one_rank_link_bytes": crossed,
        "one_rank_gbps": one_rank_gbit,
        "one_rank_vs_link": one_rank_gbit / rate_gbit,
        "all_ranks": RANKS,
        "all_ranks_s": ours_s,
        "storage_node_s": storage_s,
        "all_ranks_vs_storage_node": storage_s / ours_s,
    }


def _storage_node_read(lab: Any, size: int) -> float:
    """Seconds for ``RANKS`` processes on nodes 0..RANKS-1 to fetch ``size`` bytes each, all at
    once, from one process on node ``RANKS`` (the storage node), the second of two rounds
    (the first warms both ends)."""
    import ray
    from benchutil import transfer_actors

    Holder, Receiver = transfer_actors()
    holder = Holder.options(**_pinned(lab, RANKS)).remote()
    receivers = [Receiver.options(**_pinned(lab, r)).remote() for r in range(RANKS)]
    seconds = 0.0
    for round_ in range(2):
        seeds = [100 * round_ + r for r in range(RANKS)]
        ray.get([holder.make.remote(size, seed) for seed in seeds])
        started = time.perf_counter()
        fetched = ray.get([m.fetch.remote(holder, seed) for m, seed in zip(receivers, seeds, strict=True)])
        seconds = time.perf_counter() - started
        if any(received != size for _, received in fetched):
            raise RuntimeError(f"the storage node's reads moved {fetched}, expected {size} bytes each")
    for actor in [holder, *receivers]:
        ray.kill(actor, no_restart=True)
    return seconds
