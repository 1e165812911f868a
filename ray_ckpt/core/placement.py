"""Placement: which node holds each of a rank's k+m shards (a pure, deterministic function)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ray_ckpt.core.protection import even_protection
from ray_ckpt.errors import PlacementError


@dataclasses.dataclass(frozen=True)
class Node:
    """A node that runs a store: its Ray node id and its failure domain (None = its own)."""

    node_id: str
    domain: str | None = None

    @property
    def failure_domain(self) -> str:
        return self.domain if self.domain is not None else f"node:{self.node_id}"


def place(
    nodes: Sequence[Node], *, shards: int, rank: int, rank_node_id: str | None, data_shards: int | None = None
) -> list[str]:
    """The node ids for shard indices 0..shards-1 of ``rank``.

    Rules, in priority order:
      1. distinct nodes while at least ``shards`` nodes run a store; with fewer, shards double
         up as evenly as the nodes allow (counts differ by at most one), so a save keeps
         working on a shrunken cluster: its protection (``ray_ckpt.core.protection``) says how
         many node losses the step really survives. PlacementError only when no node runs a
         store;
      2. never the rank's own node while enough other nodes exist (its node dying must not take
         both the rank and its shards); with too few others, the own node is left out only if
         that costs no protection (judged with ``data_shards``; without it, all nodes are used);
      3. spread over failure domains: domains are used round-robin, so no domain holds more
         than ceil(shards / domains) shards of a rank;
      4. balance across ranks: each rank starts at a different offset, so ranks' shards land on
         different nodes and stores fill evenly.
    The result depends only on the arguments (sorted internally), never on call order.
    """
    if shards < 1:
        raise PlacementError(f"shards must be >= 1, got {shards}")
    if rank < 0:
        raise PlacementError(f"rank must be >= 0, got {rank}")
    unique = {node.node_id: node for node in nodes}
    if not unique:
        raise PlacementError(
            f"cannot place the {shards} shards of rank {rank}: no alive node runs a ray_ckpt store. "
            "Run ray_ckpt.start() on the cluster (stores come back on nodes that rejoin by themselves)",
            shards=shards,
            nodes=0,
        )
    others = [n for n in unique.values() if n.node_id != rank_node_id]
    candidates = others
    if len(others) < shards and len(others) < len(unique):
        own_adds_protection = (
            data_shards is None
            or not others
            or even_protection(shards, len(unique), data_shards) > even_protection(shards, len(others), data_shards)
        )
        if own_adds_protection:
            candidates = list(unique.values())
    chosen: list[str] = []
    while len(chosen) < shards:  # each round puts at most one shard on every candidate
        need = shards - len(chosen)
        pool = candidates
        if need < len(candidates) and len(others) >= need:
            pool = [n for n in candidates if n.node_id != rank_node_id]  # a partial round spares the own node
        chosen += _place_distinct(pool, min(need, len(pool)), rank, shards)
    return chosen


def _place_distinct(candidates: Sequence[Node], count: int, rank: int, shards: int) -> list[str]:
    """``count`` distinct nodes out of ``candidates`` by rules 3 and 4 (``shards`` sets the
    rank's rotation, so every round of a doubled-up placement starts at the same offset)."""
    by_domain: dict[str, list[Node]] = {}
    for node in sorted(candidates, key=lambda n: n.node_id):
        by_domain.setdefault(node.failure_domain, []).append(node)
    domains = sorted(by_domain)
    offset = (rank * shards) % len(domains)
    domains = domains[offset:] + domains[:offset]
    for position, domain in enumerate(domains):
        # stripe ranks over the (domain, member) grid: rank r's shards take slots r*shards.. of a
        # sequence that visits every domain before a domain's next member, so ranks fill all nodes
        members = by_domain[domain]
        turn = (rank * shards + position) // len(domains) % len(members)
        by_domain[domain] = members[turn:] + members[:turn]
    taken = dict.fromkeys(domains, 0)
    chosen: list[str] = []
    for _ in range(count):
        # the least-used domain that still has a free node; ties go to the rank's rotation
        domain = min(
            (d for d in domains if taken[d] < len(by_domain[d])),
            key=lambda d: taken[d],
        )
        chosen.append(by_domain[domain][taken[domain]].node_id)
        taken[domain] += 1
    return chosen


def max_shards_per_domain(placement: Sequence[str], nodes: Sequence[Node]) -> int:
    """The most shards of one placement that share a failure domain."""
    domain_of = {n.node_id: n.failure_domain for n in nodes}
    counts: dict[str, int] = {}
    for node_id in placement:
        domain = domain_of.get(node_id, f"node:{node_id}")
        counts[domain] = counts.get(domain, 0) + 1
    return max(counts.values(), default=0)
