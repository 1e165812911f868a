"""Placement: distinct nodes, the rank's own node avoided, failure domains spread, ranks balanced."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_ckpt.core.placement import Node, max_shards_per_domain, place
from ray_ckpt.core.protection import even_protection, rank_protection
from ray_ckpt.errors import PlacementError


def flat(count: int) -> list[Node]:
    """``count`` nodes, each its own failure domain."""
    return [Node(f"n{i:02d}") for i in range(count)]


def zoned(*sizes: int) -> list[Node]:
    """Nodes in zones: zone z holds sizes[z] nodes named z<z>n<i>."""
    return [Node(f"z{z}n{i}", f"zone{z}") for z, size in enumerate(sizes) for i in range(size)]


def candidates(nodes: list[Node], shards: int, rank_node_id: str | None) -> list[Node]:
    """The nodes placement may use: all but the rank's own node while enough others exist."""
    unique = list({n.node_id: n for n in nodes}.values())
    others = [n for n in unique if n.node_id != rank_node_id]
    return others if len(others) >= shards else unique


def best_domain_max(nodes: list[Node], shards: int) -> int:
    """The smallest possible most-shards-in-one-domain for ``shards`` distinct nodes of ``nodes``
    (water-filling: the least t with sum over domains of min(capacity, t) >= shards)."""
    capacity = Counter(n.failure_domain for n in nodes)
    return next(t for t in range(1, shards + 1) if sum(min(c, t) for c in capacity.values()) >= shards)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    nodes: list[Node]
    shards: int
    rank: int
    rank_node_id: str | None
    own_node_used: bool  # whether the rank's own node must appear in the placement
    domain_max: int  # the exact most shards one failure domain gets


CASES = [
    Case("flat, one shard", flat(3), 1, 0, "n00", False, 1),
    Case("flat, one spare node: own node avoided", flat(6), 5, 0, "n00", False, 1),
    Case("flat, many nodes, high rank", flat(12), 6, 37, "n05", False, 1),
    Case("flat, exactly k+m nodes: own node unavoidable", flat(6), 6, 3, "n02", True, 1),
    Case("flat, rank without a node", flat(6), 6, 1, None, False, 1),
    Case("flat, rank on a node without a store", flat(6), 6, 2, "elsewhere", False, 1),
    Case("3 zones x 3 nodes, 6 shards", zoned(3, 3, 3), 6, 0, "z0n0", False, 2),
    Case("3 zones x 3 nodes, 6 shards, other rank", zoned(3, 3, 3), 6, 4, "z1n2", False, 2),
    Case("3 zones x 3 nodes, 8 shards", zoned(3, 3, 3), 8, 1, "z2n1", False, 3),
    Case("3 zones x 3 nodes, all 9 shards: own node unavoidable", zoned(3, 3, 3), 9, 2, "z0n1", True, 3),
    Case("2 zones x 4 nodes, 3 shards", zoned(4, 4), 3, 5, "z1n3", False, 2),
    Case("unequal zones 1/2/5, 6 shards", zoned(1, 2, 5), 6, 0, None, False, 3),
    Case("unequal zones 1/2/5, 6 shards, rank in the big zone", zoned(1, 2, 5), 6, 3, "z2n0", False, 3),
    Case("unequal zones 1/2/5, 4 shards, rank alone in its zone", zoned(1, 2, 5), 4, 1, "z0n0", False, 2),
    Case("unequal zones 4/4/1/1, 8 shards", zoned(4, 4, 1, 1), 8, 2, None, False, 3),
    Case("zones mixed with domain-less nodes", [*zoned(3, 3), *flat(2)], 4, 1, None, False, 1),
    Case("zones and domain-less nodes, own one avoided", [*zoned(3, 3), *flat(2)], 4, 1, "n00", False, 2),
    Case("one zone only", zoned(5), 3, 0, "z0n0", False, 3),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_placement_rules_hold_for_each_case(case: Case) -> None:
    """Each case: distinct known nodes, own node only if unavoidable, domains as even as capacity allows."""
    chosen = place(case.nodes, shards=case.shards, rank=case.rank, rank_node_id=case.rank_node_id)
    ids = {n.node_id for n in case.nodes}
    assert len(chosen) == case.shards
    assert len(set(chosen)) == case.shards, chosen
    assert set(chosen) <= ids
    assert (case.rank_node_id in chosen) == case.own_node_used
    if case.own_node_used:
        assert len(ids) - 1 < case.shards  # only when the other nodes cannot hold every shard
    usable = candidates(case.nodes, case.shards, case.rank_node_id)
    assert max_shards_per_domain(chosen, case.nodes) == case.domain_max
    assert case.domain_max == best_domain_max(usable, case.shards)


@pytest.mark.parametrize(
    ("zones", "shards"),
    [((3, 3, 3), 6), ((3, 3, 3), 3), ((4, 4, 4, 4), 6), ((2, 2, 2), 5), ((5, 5), 4)],
)
def test_equal_domains_hold_at_most_ceil_shards_over_domains(zones: tuple[int, ...], shards: int) -> None:
    """With equal failure domains no domain ever holds more than ceil(shards/domains) shards of any rank."""
    nodes = zoned(*zones)
    bound = math.ceil(shards / len(zones))
    for rank in range(2 * len(nodes)):
        for host in (None, nodes[rank % len(nodes)].node_id):
            chosen = place(nodes, shards=shards, rank=rank, rank_node_id=host)
            assert max_shards_per_domain(chosen, nodes) <= bound, (rank, host, chosen)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("own", [True, False])
def test_too_few_nodes_double_up_evenly_and_keep_every_shard(count: int, own: bool) -> None:
    """Fewer nodes than shards (RS(4,2) on 1-5 stores): every shard is placed, node loads differ
    by at most one, and the rank's own node is used only when leaving it out costs protection."""
    nodes = flat(count)
    for rank in range(4):
        host = nodes[rank % count].node_id if own else None
        chosen = place(nodes, shards=6, rank=rank, rank_node_id=host, data_shards=4)
        assert len(chosen) == 6
        loads = Counter(chosen)
        if host is None or host not in loads:
            assert max(loads.values()) - min(loads.values()) <= 1, chosen
        else:
            others = [c for n, c in loads.items() if n != host]
            assert loads[host] <= min(others, default=loads[host]), chosen
        best = max(even_protection(6, n, 4) for n in {count, count - 1} if n > 0)
        assert rank_protection(chosen, 4) == best, chosen


def test_degraded_placement_leaves_the_own_node_out_when_that_costs_no_protection() -> None:
    """RS(4,2) on 5 stores: the 4 other nodes give the same protection (1) as all 5, so the
    rank's own node holds nothing; on 3 stores the own node is needed for protection 1."""
    chosen = place(flat(5), shards=6, rank=0, rank_node_id="n00", data_shards=4)
    assert "n00" not in chosen
    assert rank_protection(chosen, 4) == 1
    chosen = place(flat(3), shards=6, rank=0, rank_node_id="n00", data_shards=4)
    assert Counter(chosen) == {"n00": 2, "n01": 2, "n02": 2}
    assert rank_protection(chosen, 4) == 1


def test_degraded_placement_spreads_over_failure_domains() -> None:
    """6 shards on 4 nodes in 2 zones: each zone holds 3 shards, each node 1 or 2."""
    nodes = zoned(2, 2)
    for rank in range(4):
        chosen = place(nodes, shards=6, rank=rank, rank_node_id=None)
        assert max_shards_per_domain(chosen, nodes) == 3, chosen
        assert sorted(Counter(chosen).values()) == [1, 1, 2, 2], chosen


def test_no_store_at_all_raises_placement_error_naming_the_fix() -> None:
    """No node runs a store: PlacementError saying to run ray_ckpt.start()."""
    with pytest.raises(PlacementError, match=r"ray_ckpt\.start\(\)") as caught:
        place([], shards=3, rank=0, rank_node_id=None)
    assert caught.value.nodes == 0


@pytest.mark.parametrize(("shards", "rank"), [(0, 0), (-1, 0), (2, -1)])
def test_nonsense_arguments_raise_placement_error(shards: int, rank: int) -> None:
    """shards < 1 or rank < 0 is rejected with PlacementError naming the bad value."""
    with pytest.raises(PlacementError, match=f"got {min(shards, rank)}"):
        place(flat(4), shards=shards, rank=rank, rank_node_id=None)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_placement_is_independent_of_input_order(case: Case) -> None:
    """Shuffling the node list (or repeating a node) never changes the placement."""
    expected = place(case.nodes, shards=case.shards, rank=case.rank, rank_node_id=case.rank_node_id)
    shuffler = random.Random(case.name)
    for _ in range(5):
        shuffled = [*case.nodes, *case.nodes[:2]]
        shuffler.shuffle(shuffled)
        got = place(shuffled, shards=case.shards, rank=case.rank, rank_node_id=case.rank_node_id)
        assert got == expected


def test_different_ranks_start_at_different_nodes() -> None:
    """Ranks 0..n-1 without a node of their own put their first shard on n different nodes."""
    nodes = flat(8)
    firsts = [place(nodes, shards=1, rank=r, rank_node_id=None)[0] for r in range(8)]
    assert sorted(firsts) == [n.node_id for n in nodes]
    zones = zoned(3, 3, 3)
    firsts = [place(zones, shards=1, rank=r, rank_node_id=None)[0] for r in range(9)]
    assert sorted(firsts) == sorted(n.node_id for n in zones)


Host = Callable[[int], "str | None"]


def loads(nodes: list[Node], shards: int, world_size: int, host: Host) -> Counter[str]:
    load = Counter({n.node_id: 0 for n in nodes})
    for rank in range(world_size):
        load.update(place(nodes, shards=shards, rank=rank, rank_node_id=host(rank)))
    return load


def no_host(rank: int) -> str | None:
    return None


def packed(nodes: list[Node], per_node: int) -> Host:
    """Ranks packed onto nodes in id order, ``per_node`` consecutive ranks per node (Ray Train's layout)."""
    ids = sorted(n.node_id for n in nodes)
    return lambda rank: ids[rank // per_node]


# (nodes, shards, world_size, layout, max - min shards per node).
# Ranks without a node of their own are striped over a fixed cycle of the nodes (over failure domains
# first), so any world size gives max - min <= 1, and exactly 0 when len(nodes) divides world_size * shards.
# Ranks that live on the nodes skip their own node, which shifts the cycle per host: the bounds below are
# the exact spreads (an exhaustive scan of flat clusters up to 40 nodes never exceeded 2 for packed ranks;
# with failure domains it still reaches 6 in some cluster shapes, see the module's rotation).
BALANCE = [
    (flat(6), 3, 6, "none", 0),
    (flat(8), 6, 16, "none", 0),
    (flat(5), 3, 7, "none", 1),
    (flat(7), 6, 11, "none", 1),
    (zoned(3, 3, 3), 6, 9, "none", 0),
    (zoned(3, 3, 3), 6, 10, "none", 1),
    (zoned(4, 4, 4, 4), 6, 128, "none", 0),
    (zoned(5, 5, 5, 5, 5), 6, 100, "none", 0),
    (zoned(2, 2, 2, 2), 3, 64, "none", 0),
    (flat(4), 2, 4, "1 per node", 2),
    (flat(8), 6, 64, "8 per node", 2),
    (zoned(3, 3, 3), 6, 9, "1 per node", 0),
    (zoned(3, 4, 3), 6, 10, "1 per node", 3),  # unequal zones: spreading each rank over zones comes first
    (zoned(4, 4, 4, 4), 6, 128, "8 per node", 0),
    (zoned(3, 3, 3, 3), 6, 96, "8 per node", 0),
]


@pytest.mark.parametrize(
    ("nodes", "shards", "world_size", "layout", "spread"),
    BALANCE,
    ids=[f"{len(b[0])} nodes, {b[1]} shards, {b[2]} ranks, host {b[3]}" for b in BALANCE],
)
def test_shards_of_all_ranks_spread_evenly_over_nodes(
    nodes: list[Node], shards: int, world_size: int, layout: str, spread: int
) -> None:
    """Over world_size ranks the shards per node differ by exactly the tabled spread (0 when divisible)."""
    host = no_host if layout == "none" else packed(nodes, int(layout.split()[0]))
    load = loads(nodes, shards, world_size, host)
    assert sum(load.values()) == shards * world_size
    assert max(load.values()) - min(load.values()) == spread, load
    if layout == "none":
        assert spread == (0 if world_size * shards % len(nodes) == 0 else 1)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], int, int, str | None]:
    domains = draw(st.lists(st.sampled_from([None, "a", "b", "c", "d"]), min_size=1, max_size=12))
    nodes = [Node(f"n{i:02d}", d) for i, d in enumerate(domains)]
    shards = draw(st.integers(1, len(nodes)))
    rank = draw(st.integers(0, 500))
    host = draw(st.sampled_from([None, "elsewhere", *(n.node_id for n in nodes)]))
    return nodes, shards, rank, host


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_property_distinct_own_node_rule_and_domain_balance(
    cluster: tuple[list[Node], int, int, str | None],
) -> None:
    """Any cluster: distinct nodes, own node only if unavoidable, optimal domain spread, order-independent."""
    nodes, shards, rank, host = cluster
    chosen = place(nodes, shards=shards, rank=rank, rank_node_id=host)
    assert len(chosen) == shards
    assert len(set(chosen)) == shards
    assert set(chosen) <= {n.node_id for n in nodes}
    if host in chosen:
        assert len(nodes) - 1 < shards
    elif host in {n.node_id for n in nodes}:
        assert len(nodes) - 1 >= shards
    usable = candidates(nodes, shards, host)
    assert max_shards_per_domain(chosen, nodes) == best_domain_max(usable, shards)
    assert place(list(reversed(nodes)), shards=shards, rank=rank, rank_node_id=host) == chosen


def test_max_shards_per_domain_counts_unknown_nodes_as_their_own_domain() -> None:
    """max_shards_per_domain groups by failure domain; a node it does not know is a domain of its own."""
    nodes = zoned(3, 3)
    assert max_shards_per_domain(["z0n0", "z0n1", "z1n0"], nodes) == 2
    assert max_shards_per_domain(["z0n0", "x", "y"], nodes) == 1
    assert max_shards_per_domain([], nodes) == 0
