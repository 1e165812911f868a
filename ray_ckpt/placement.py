"""Placement: which node holds each of a rank's k+m shards (a pure, deterministic function)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ray_ckpt.errors import PlacementError


@dataclasses.dataclass(frozen=True)
class Node:
    """A node that runs a store: its Ray node id and its failure domain (None = its own)."""

    node_id: str
    domain: str | None = None

    @property
    def failure_domain(self) -> str:
        return self.domain if self.domain is not None else f"node:{self.node_id}"


def place(nodes: Sequence[Node], *, shards: int, rank: int, rank_node_id: str | None) -> list[str]:
    """The node ids for shard indices 0..shards-1 of ``rank``: all distinct.

    Rules, in priority order:
      1. distinct nodes (else PlacementError naming the numbers and the settings to change);
      2. never the rank's own node while enough other nodes exist (its node dying must not take
         both the rank and its shards);
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
    if len(unique) < shards:
        raise PlacementError(
            f"cannot place {shards} shards of rank {rank} on distinct nodes: only {len(unique)} "
            f"node(s) run a ray_ckpt store. Add nodes (and run ray_ckpt.start() again so they get "
            f"stores) or lower data_shards + parity_shards in CheckpointConfig",
            shards=shards,
            nodes=len(unique),
        )
    candidates = [n for n in unique.values() if n.node_id != rank_node_id]
    if len(candidates) < shards:
        candidates = list(unique.values())
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
    for _ in range(shards):
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
