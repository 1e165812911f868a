"""The relay tree and stage groups: the tree's shape, merging and splitting at a relay, and the
registry's commit of packed groups (the same decisions as one stage per rank, nothing unpacked)."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.shard_metas import shard_metas

from ray_ckpt.core.batcher import Batcher
from ray_ckpt.core.registry import Registry
from ray_ckpt.core.relay import Relay, announce, reachable_part, subtrees
from ray_ckpt.core.wire import GroupResult, PlanAnswer, PlanQuery, RestorePlan, StageGroup, StagePart, StageRequest
from ray_ckpt.errors import ConfigError, SnapshotFormatError, StaleAttemptError

K, M = 2, 1
JOB = "job"


def request(step: int, rank: int, attempt: str | None = "a", world_size: int = 8, tag: int = 0) -> StageRequest:
    return StageRequest(
        metas=tuple(shard_metas(JOB, step, rank, world_size, data_shards=K, parity_shards=M, tag=tag)),
        nodes={i: f"n{(rank + i) % 5}" for i in range(K + M)},
        keep_committed=2,
        attempt=attempt,
    )


def node_groups(step: int, world_size: int = 8, per_node: int = 2, attempt: str | None = "a") -> list[StageGroup]:
    """One group per node of ``per_node`` ranks, as each node's store packs its ranks' stages."""
    return [
        StageGroup.of([request(step, r, attempt, world_size) for r in range(first, first + per_node)])[0]
        for first in range(0, world_size, per_node)
    ]


# ---- the tree ----------------------------------------------------------------------------------


def tree(members: list[str], fanin: int) -> dict[str, str | None]:
    """child -> parent, as the commits handed down the tree draw it (the root's parent: None)."""
    parents: dict[str, str | None] = {members[0]: None}
    pending = [members]
    while pending:
        part = pending.pop()
        for run in subtrees(part, fanin):
            parents[run[0]] = part[0]
            pending.append(run)
    return parents


@pytest.mark.parametrize("count", [1, 2, 17, 100, 513])
@pytest.mark.parametrize("fanin", [1, 4, 16])
def test_the_tree_reaches_every_store_once_with_parents_before_children(count: int, fanin: int) -> None:
    """Every store gets exactly one parent; a parent sorts before its children (no cycle, whatever
    a store's view); no store has more than ``fanin`` children; the depth is logarithmic."""
    members = sorted(f"{i:04x}" for i in range(count))
    parents = tree(members, fanin)
    assert sorted(parents) == members
    assert all(parent is None or parent < child for child, parent in parents.items())
    children: dict[str, int] = {}
    for parent in parents.values():
        if parent is not None:
            children[parent] = children.get(parent, 0) + 1
    assert max(children.values(), default=0) <= fanin

    def depth(node: str) -> int:
        parent = parents[node]
        return 0 if parent is None else 1 + depth(parent)

    deepest = max(depth(n) for n in members)
    bound = count - 1 if fanin == 1 else 2 * max(1, (count - 1).bit_length())
    assert deepest <= bound


def tree_past_gone(members: list[str], fanin: int, gone: set[str]) -> dict[str, str | None]:
    """child -> parent as the commits draw the tree when the ``gone`` stores (the registry's
    list, cached, still names them) pass nothing on: each store hands a child's run to its
    first reachable store (``reachable_part``)."""
    parents: dict[str, str | None] = {members[0]: None}
    pending = [members]
    while pending:
        part = pending.pop()
        for run in subtrees(part, fanin):
            reached = reachable_part(run, lambda node: node not in gone)
            if reached is not None:
                parents[reached[0]] = part[0]
                pending.append(reached)
    return parents


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 80), fanin=st.integers(1, 5), data=st.data())
def test_stores_below_gone_ones_are_still_placed_once_with_parents_before_children(
    count: int, fanin: int, data: st.DataObject
) -> None:
    """Any stores but the root gone (killed, still on the registry's list): every store left is
    placed exactly once, no gone store is, a parent sorts before its children, and no store has
    more than ``fanin`` children."""
    members = sorted(f"{i:04x}" for i in range(count))
    gone = set(data.draw(st.sets(st.sampled_from(members[1:])) if count > 1 else st.just(set())))
    parents = tree_past_gone(members, fanin, gone)
    assert sorted(parents) == sorted(set(members) - gone)
    assert all(parent is None or parent < child for child, parent in parents.items())
    children = [parent for parent in parents.values() if parent is not None]
    assert all(children.count(parent) <= fanin for parent in set(children))


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 40), fanin=st.integers(1, 5), data=st.data())
def test_a_commit_announced_past_any_gone_stores_reaches_every_live_store_once(
    count: int, fanin: int, data: st.DataObject
) -> None:
    """Any stores gone, the root too (the registry's list, cached, still names them; its fresh
    lookups may still name some): the commit reaches every live store exactly once, with parents
    before children; each store is offered the commit at most once; none live: None."""
    members = sorted(f"{i:04x}" for i in range(count))
    gone = data.draw(st.sets(st.sampled_from(members)))
    still_listed = data.draw(st.sets(st.sampled_from(sorted(gone)))) if gone else set()
    offered: list[str] = []

    def deliver(tree: list[str]) -> bool:
        offered.append(tree[0])
        return tree[0] not in gone

    went = announce(members, deliver, lambda: (set(members) - gone) | still_listed)
    assert len(offered) == len(set(offered))
    if went is None:
        assert gone == set(members)
        return
    parents = tree_past_gone(went, fanin, gone)
    assert sorted(parents) == sorted(set(members) - gone)
    assert all(parent is None or parent < child for child, parent in parents.items())


def test_a_live_root_takes_the_commit_with_no_lookup_and_a_dead_one_is_passed_over_after_one() -> None:
    """The root of the cached list takes the commit: one call, no lookup. A dead root: the live
    stores are looked up again and the first of them takes the commit with the rest as its tree."""
    lookups: list[int] = []

    def live() -> list[str]:
        lookups.append(1)
        return ["c", "b", "d"]  # any order: the tree is drawn over them sorted

    assert announce(["a", "b", "c"], lambda tree: True, live) == ["a", "b", "c"] and not lookups
    assert announce(["a", "b", "c"], lambda tree: tree[0] != "a", live) == ["b", "c", "d"]
    assert len(lookups) == 1


def test_an_announcement_gives_up_when_no_store_is_left_to_try() -> None:
    offered: list[list[str]] = []
    assert announce(["a", "b"], lambda tree: offered.append(tree) is not None, lambda: []) is None
    assert offered == [["a", "b"]]
    assert announce([], lambda tree: True, lambda: ["a"]) is None


def test_subtrees_splits_the_rest_into_contiguous_runs_of_near_equal_length() -> None:
    assert subtrees(["r", "a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d", "e"]]
    assert subtrees(["r"], 4) == []
    with pytest.raises(ValueError, match="fanin"):
        subtrees(["r", "a"], 0)


# ---- groups on the wire -------------------------------------------------------------------------


def test_a_group_packs_its_ranks_and_round_trips_the_wire() -> None:
    """A node's requests pack into one part with their protection and nodes; the wire form comes
    back equal, and unpacking gives the requests back."""
    requests = [request(1, 0), request(1, 1)]
    (group,) = StageGroup.of(requests)
    assert group.key == (JOB, 1, 8, 2, "a") and group.ranks == [0, 1]
    (part,) = group.parts
    assert part.protection == min(r.record().protection() for r in requests)
    assert part.nodes == {"n0", "n1", "n2", "n3"}
    assert StageGroup.from_wire(group.to_wire()) == group
    assert part.requests() == requests
    assert part.requests(limit=1) == requests[:1]


def test_groups_of_one_step_merge_into_one_part_and_others_stay_apart() -> None:
    """Merging joins the parts of the same step and attempt (ranks and bytes side by side) and
    keeps other steps in their own groups, in first-seen order."""
    a, b = node_groups(1, world_size=4)
    (other,) = StageGroup.of([request(2, 0, world_size=4)])
    merged = StageGroup.merged([a, other, b])
    assert [g.key for g in merged] == [a.key, other.key]
    assert merged[0].ranks == [0, 1, 2, 3] and len(merged[0].parts) == 1
    assert merged[0].parts[0].requests() == [*a.parts[0].requests(), *b.parts[0].requests()]
    assert merged[1] == other


@pytest.mark.parametrize(
    "change",
    [
        {"head": [JOB, -1, 8, 2, "a"]},  # negative step
        {"head": [JOB, 1, 8, 2]},  # short head
        {"parts": [[[0], "not bytes", 1, []]]},
        {"parts": [[[0.5], b"", 1, []]]},  # a rank that is no int
    ],
)
def test_a_malformed_group_is_refused(change: dict) -> None:
    (group,) = StageGroup.of([request(1, 0)])
    with pytest.raises(SnapshotFormatError):
        StageGroup.from_wire({**group.to_wire(), **change})


def test_a_part_whose_bytes_are_not_its_ranks_stages_is_refused_when_unpacked() -> None:
    (group,) = StageGroup.of([request(1, 0), request(1, 1)])
    part = group.parts[0]
    with pytest.raises(SnapshotFormatError, match="other stages"):
        dataclasses.replace(part, ranks=(1, 0)).requests()
    with pytest.raises(SnapshotFormatError):
        dataclasses.replace(part, packed=b"\xc1" + part.packed[1:]).requests()


# ---- a relay ----------------------------------------------------------------------------------


def test_a_relay_sends_concurrent_callers_groups_merged_and_hands_each_its_own_results() -> None:
    """While one send is in flight, three callers' groups of the same step queue and go up as
    one merged group; each caller gets only its own ranks' refusals back."""
    release = threading.Event()
    sent: list[list[StageGroup]] = []

    def send(groups: list[StageGroup]) -> list[GroupResult]:
        sent.append(groups)
        if len(sent) == 1:
            release.wait(5)
        return [GroupResult(committed=True, keep_steps=(1,), refused={3: ConfigError("no")}) for _ in groups]

    relay = Relay(send, StageGroup.merged)
    first, *rest = node_groups(1)
    with ThreadPoolExecutor(4) as pool:
        head = pool.submit(relay.submit, [first])
        while not sent:
            time.sleep(0.001)
        queued = [pool.submit(relay.submit, [group]) for group in rest]
        time.sleep(0.1)
        release.set()
        assert head.result(5) == [GroupResult(committed=True, keep_steps=(1,))]
        results = [f.result(5) for f in queued]
    assert len(sent) == 2 and [g.ranks for g in sent[1]] == [[2, 3, 4, 5, 6, 7]]
    assert [list(r[0].refused) for r in results] == [[3], [], []]
    assert results[0][0].result(3).error is not None and results[0][0].result(2).committed
    assert relay.sends == 2


def test_a_relay_hands_a_failed_send_to_every_caller() -> None:
    def send(groups: list[StageGroup]) -> list[GroupResult]:
        raise ConnectionError("parent gone")

    with pytest.raises(ConnectionError):
        Relay(send, StageGroup.merged).submit(node_groups(1)[:1])
    with pytest.raises(RuntimeError, match="answers back"):
        Relay(lambda groups: [], StageGroup.merged).submit(node_groups(1)[:1])


def test_a_lingering_batch_takes_the_items_that_arrive_meanwhile() -> None:
    """With linger_s, the caller that starts a batch waits for more: four calls, one send."""
    sent: list[list[int]] = []
    batcher: Batcher[int, int] = Batcher(lambda items: sent.append(list(items)) or list(items))
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(batcher.submit, 0, 0.3)]
        time.sleep(0.05)
        futures += [pool.submit(batcher.submit, i) for i in range(1, 4)]
        assert [f.result(5) for f in futures] == [0, 1, 2, 3]
    assert len(sent) == 1 and sorted(sent[0]) == [0, 1, 2, 3]


# ---- the registry ------------------------------------------------------------------------------


def test_groups_commit_like_the_same_stages_one_by_one() -> None:
    """Four nodes' groups commit the step with the last one: the same commits and records as
    eight single stages."""
    grouped, single = Registry(), Registry()
    outcomes = grouped.stage_groups(node_groups(1))
    for r in range(8):
        single.stage(list(request(1, r).metas), dict(request(1, r).nodes), keep_committed=2, attempt="a")
    assert [bool(o.decision and o.decision.committed) for o in outcomes] == [False, False, False, True]
    assert [o.result().keep_steps for o in outcomes] == [(), (), (), (1,)]
    assert grouped.committed_steps(JOB) == single.committed_steps(JOB) == [1]
    assert grouped.locate(JOB, 1) == single.locate(JOB, 1)


def test_the_registry_counts_stages_without_unpacking_them() -> None:
    """A committed step whose packed records are unreadable committed all the same: staging only
    counts ranks; the bytes are read when a record is asked for."""
    broken = [
        dataclasses.replace(g, parts=tuple(dataclasses.replace(p, packed=b"\xc1" * 4) for p in g.parts))
        for g in node_groups(1)
    ]
    registry = Registry()
    registry.stage_groups(broken)
    assert registry.committed_steps(JOB) == [1] and registry.staged_ranks(JOB, 1) == list(range(8))
    with pytest.raises(SnapshotFormatError):
        registry.locate(JOB, 1)


def test_a_step_summary_needs_no_record_and_matches_them() -> None:
    """summary(): world size, code, the weakest rank's protection and the nodes, as the records say."""
    registry = Registry()
    registry.stage_groups(node_groups(1))
    summary = registry.summary(JOB, 1)
    records = registry.locate(JOB, 1)
    assert (summary.world_size, summary.data_shards, summary.parity_shards) == (8, K, M)
    assert summary.protection == min(r.protection() for r in records.values())
    assert summary.nodes == {n for r in records.values() for n in r.nodes.values()}


def test_a_group_retried_after_its_commit_is_acknowledged_and_a_changed_one_refused() -> None:
    """A relay that failed after the registry took its group sends it again: acknowledged as
    committed, nothing doubled; a different stage of that step is refused per rank."""
    registry = Registry()
    groups = node_groups(1)
    registry.stage_groups(groups)
    before = registry.locate(JOB, 1)
    (again,) = registry.stage_groups(groups[:1])
    assert again.result() == GroupResult(committed=True, keep_steps=(1,))
    changed = StageGroup.of([request(1, 0), request(1, 1, tag=9)])[0]
    (mixed,) = registry.stage_groups([changed])
    assert list(mixed.refused) == [1] and "not newer" in str(mixed.refused[1])
    assert registry.locate(JOB, 1) == before and registry.committed_steps(JOB) == [1]


def test_a_group_of_a_superseded_attempt_or_another_world_size_is_refused_for_all_its_ranks() -> None:
    registry = Registry()
    registry.stage_groups(node_groups(1, attempt="a")[:1])
    newer, stale = registry.stage_groups([node_groups(2, attempt="b")[0], node_groups(2, attempt="a")[1]])
    assert newer.torn == (1,) and not newer.refused
    assert set(stale.refused) == {2, 3} and all(isinstance(e, StaleAttemptError) for e in stale.refused.values())
    (odd,) = registry.stage_groups(node_groups(2, world_size=6, attempt="b")[1:2])
    assert set(odd.refused) == {2, 3} and isinstance(odd.refused[2], ConfigError)
    assert registry.staged_ranks(JOB, 2) == [0, 1]


def test_a_part_joins_with_its_summary() -> None:
    parts = [g.parts[0] for g in node_groups(1)]
    joined = StagePart.joined(parts)
    assert joined.ranks == tuple(range(8))
    assert joined.protection == min(p.protection for p in parts)
    assert joined.nodes == frozenset().union(*(p.nodes for p in parts))
    assert StagePart.joined(parts[:1]) is parts[0]


# ---- restore plans -----------------------------------------------------------------------------


def test_plan_queries_merge_per_attempt_and_answers_split_per_rank() -> None:
    """A node's ranks' queries of one attempt join into one (ranks in order, no duplicates); the
    registry's answer carries every asking rank's record, and each rank gets only its own."""
    queries = [PlanQuery(JOB, "a", (0,)), PlanQuery(JOB, "b", (5,)), PlanQuery(JOB, "a", (1, 0))]
    merged = PlanQuery.merged(queries)
    assert merged == [PlanQuery(JOB, "a", (0, 1)), PlanQuery(JOB, "b", (5,))]
    assert [PlanQuery.from_wire(q.to_wire()) for q in merged] == merged
    with pytest.raises(ConfigError, match="malformed"):
        PlanQuery.from_wire([JOB, "a", [-1]])
    registry = Registry()
    registry.stage_groups(node_groups(1))
    answer = registry.plan_ranks(PlanQuery(JOB, "b", (0, 1, 7)), live_nodes={f"n{i}" for i in range(5)})
    assert (answer.plan.step, answer.plan.source, sorted(answer.records)) == (1, "peers", [0, 1, 7])
    assert answer.records[7] == registry.locate_rank(JOB, 1, 7)
    assert PlanAnswer.from_wire(answer.to_wire()) == answer
    assert list(answer.for_ranks([1]).records) == [1]
    nothing = Registry().plan_ranks(PlanQuery("other", "a", (0,)), live_nodes=set())
    assert nothing.plan.source is None and nothing.records == {}


def test_a_refused_plan_query_comes_back_as_its_error() -> None:
    stale = PlanAnswer(RestorePlan(), error=StaleAttemptError("attempt a was superseded", job=JOB, attempt="a"))
    back = PlanAnswer.from_wire(stale.to_wire())
    with pytest.raises(StaleAttemptError, match="superseded"):
        back.raise_error()
    PlanAnswer(RestorePlan()).raise_error()  # no error: nothing raised
