"""Protection: how many more node losses a checkpoint survives, from where its shards really are.

A rank's shards may share nodes (degraded placement while fewer than k+m stores are alive), so
protection is not ``live shards - k``: the worst case loses the nodes holding the most shards
first. ``rank_protection`` is the number of further node losses after which any k shards are
still guaranteed to survive; a negative value says how many shards short the rank already is.
A step's protection is the minimum over its ranks. Pure: no Ray import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Mapping


def rank_protection(shard_nodes: Iterable[str], data_shards: int, live_nodes: Container[str] | None = None) -> int:
    """Node losses one rank's shards survive: ``shard_nodes`` names the node of each shard
    (repeats allowed), ``live_nodes`` (None = all alive) filters out shards on dead nodes.
    Returns ``live shards - data_shards`` when that is negative (the rank is that many short)."""
    per_node = Counter(n for n in shard_nodes if live_nodes is None or n in live_nodes)
    spare = sum(per_node.values()) - data_shards
    if spare < 0:
        return spare
    survived = 0
    for count in sorted(per_node.values(), reverse=True):  # the worst case: fullest nodes die first
        if count > spare:
            break
        spare -= count
        survived += 1
    return survived


def step_protection(
    ranks: Mapping[int, tuple[Iterable[str], int]], live_nodes: Container[str] | None = None
) -> int | None:
    """The minimum of ``rank_protection`` over ``ranks`` (rank -> (shard nodes, data shards)),
    or None for no ranks."""
    values = [rank_protection(nodes, k, live_nodes) for nodes, k in ranks.values()]
    return min(values) if values else None


def even_protection(shards: int, nodes: int, data_shards: int) -> int:
    """The protection of ``shards`` shards spread as evenly as possible over ``nodes`` nodes."""
    if nodes <= 0:
        return -data_shards
    counts = [shards // nodes + (1 if i < shards % nodes else 0) for i in range(min(nodes, shards))]
    return rank_protection([str(i) for i, count in enumerate(counts) for _ in range(count)], data_shards)


def cluster_margin(stores: int, data_shards: int, parity_shards: int) -> tuple[int, int]:
    """For a cluster with ``stores`` store nodes: (node losses it absorbs before a new step's
    protection drops below ``parity_shards``, the protection a new step gets now)."""
    total = data_shards + parity_shards
    return max(0, stores - total), even_protection(total, stores, data_shards)
