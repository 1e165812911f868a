"""Protection: node losses a step survives, computed from where its shards really are."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_ckpt.core.protection import cluster_margin, even_protection, rank_protection, step_protection


def brute_force(shard_nodes: list[str], k: int) -> int:
    """The most nodes whose every choice of that many lost nodes still leaves >= k shards."""
    nodes = sorted(set(shard_nodes))
    if len(shard_nodes) < k:
        return len(shard_nodes) - k
    survived = 0
    for lost in range(1, len(nodes) + 1):
        if all(sum(1 for n in shard_nodes if n not in dead) >= k for dead in itertools.combinations(nodes, lost)):
            survived = lost
        else:
            break
    return survived


@given(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=10), st.integers(1, 8))
def test_rank_protection_equals_the_worst_case_over_every_set_of_lost_nodes(shard_nodes: list[str], k: int) -> None:
    """The greedy count (fullest nodes die first) equals brute force over every loss set."""
    assert rank_protection(shard_nodes, k) == brute_force(shard_nodes, k)


def test_distinct_placement_survives_m_losses_and_doubled_up_fewer() -> None:
    """RS(4,2) on 6 distinct nodes survives 2; on 5 nodes (one holds 2) 1; on 1 node 0."""
    assert rank_protection(list("abcdef"), 4) == 2
    assert rank_protection(list("abcdea"), 4) == 1
    assert rank_protection(list("aaaaaa"), 4) == 0


def test_dead_nodes_do_not_count_and_a_short_rank_is_negative() -> None:
    """Shards on dead nodes are gone; 3 live shards of RS(4,2) are one short (-1)."""
    assert rank_protection(list("abcdef"), 4, live_nodes=set("abcde")) == 1
    assert rank_protection(list("abcdef"), 4, live_nodes=set("abc")) == -1


def test_step_protection_is_the_weakest_rank() -> None:
    """A step survives what its weakest rank survives; no ranks -> None."""
    assert step_protection({0: (list("abcdef"), 4), 1: (list("abcdea"), 4)}) == 1
    assert step_protection({}) is None


@pytest.mark.parametrize(
    ("stores", "expected"),
    [(8, (2, 2)), (6, (0, 2)), (5, (0, 1)), (3, (0, 1)), (2, (0, 0)), (1, (0, 0)), (0, (0, -4))],
)
def test_cluster_margin_for_rs_4_2(stores: int, expected: tuple[int, int]) -> None:
    """(losses absorbed before protection drops, protection of a new step) by store count."""
    assert cluster_margin(stores, 4, 2) == expected


def test_even_protection_matches_an_explicit_even_spread() -> None:
    """6 shards on 4 nodes: loads 2,2,1,1, protection 1 for k=4."""
    assert even_protection(6, 4, 4) == rank_protection(list("aabbcd"), 4) == 1
