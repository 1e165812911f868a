"""The commit protocol's holes found without a node failing, each replayed as the interleaving
that showed it, on the simulation the model test drives (``protocol_sim.World``: the real
registry, stores and restore path); docs/commit-protocol.md says what each invariant means."""

from __future__ import annotations

import numpy as np
import pytest
from support.protocol_sim import JOB, World
from support.shard_metas import shard_metas

from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.registry import Registry
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.core.wire import StoreHoldings


def world(**options: object) -> World:
    return World(nodes=5, world_size=2, k=2, m=1, seed=3, **options)  # type: ignore[arg-type]


def restore_every_live_rank(sim: World) -> None:
    for process in sim.live():
        sim.restore(process)


def save_with_every_live_rank(sim: World, steps: int = 1) -> None:
    """``steps`` saves, each put and staged by every live rank in turn."""
    for _ in range(steps):
        for process in sim.live():
            sim.put(process)
            sim.stage(process)


def a_torn_step_0_then_a_new_group() -> World:
    """Group a0 (with an attempt, no restore first) whose rank 0 puts and stages step 0 and dies
    there; then the next group starts, also saving before it restores."""
    sim = world()
    sim.start_incarnation(with_attempt=True, restores_first=False)
    a0 = sim.live()[0]
    sim.put(a0)
    sim.stage(a0)
    sim.start_incarnation(with_attempt=True, restores_first=False)
    return sim


def test_a_new_incarnation_that_saves_before_restoring_keeps_its_step() -> None:
    """Incarnation A's rank 0 stages step 0 and A dies; B's ranks save step 0 without calling
    restore(). B's first stage joins its attempt, which discards A's torn step 0: the stores
    drop A's shards of it, never B's own (put just before), and step 0 commits restorable."""
    sim = a_torn_step_0_then_a_new_group()
    b0, b1 = sim.live()
    sim.put(b0)
    sim.put(b1)
    sim.stage(b0)  # joins B: A's step 0 is torn
    sim.stage(b1)
    assert sim.registry.committed_steps(JOB) == [0]
    sim.check()  # invariant 1: the committed step is in the stores
    sim.start_incarnation(with_attempt=True)
    restore_every_live_rank(sim)
    assert {rank: step for rank, step in next(iter(sim.restores.values())).items()} == {0: 0, 1: 0}


def test_two_incarnations_halves_never_commit_as_one_step() -> None:
    """A's rank 0 staged step 5 (its rank 1 never did); B's ranks then save step 5: the step
    commits with B's two records only, and A's late stage of its rank 1 is refused."""
    sim = world()
    sim.start_incarnation(with_attempt=True, restores_first=False)
    a0, a1 = sim.live()
    for step in range(6):
        sim.put(a0)
        sim.put(a1)
        sim.stage(a0)
        if step < 5:
            sim.stage(a1)
    sim.start_incarnation(with_attempt=True)
    restore_every_live_rank(sim)
    save_with_every_live_rank(sim)
    assert sim.commits[5] == {0: "w1-0", 1: "w1-1"}
    if a1.alive:  # A's rank 1 lingered with its save of step 5 in flight
        sim.stage(a1)
        assert not a1.alive  # refused: StaleAttemptError
    sim.check()


def test_ranks_without_an_attempt_agree_on_one_step() -> None:
    """attempt=None (the README's plain-Ray example): rank 0 restores step 2; then two of rank
    1's step-2 holders die. Rank 1 gets the same plan (the registry's attempt for the ranks
    restoring without one) and fails instead of silently restoring step 1; step 2, which
    rank 0 loaded, is not rolled back."""
    sim = world(local_copy=False)
    sim.start_incarnation(with_attempt=False)
    restore_every_live_rank(sim)
    save_with_every_live_rank(sim, steps=3)
    assert sim.registry.committed_steps(JOB)[-1] == 2
    sim.start_incarnation(with_attempt=False)
    r0, r1 = sim.live()
    sim.restore(r0)
    assert r0.restored == 2
    holders = sorted(set(sim.registry.locate(JOB, 2)[1].nodes.values()) - {r0.node, r1.node})[:2]
    for node in holders:
        sim.kill_node(node)
    assert r1.alive
    sim.restore(r1)  # the plan is step 2, which rank 1 cannot rebuild: it fails, marking step 2
    assert r1.restored is None and not r1.alive and 2 in sim.unrestorable
    assert 2 in sim.registry.committed_steps(JOB)  # nothing rolled back under rank 0
    sim.check()


def test_a_rebuild_never_merges_two_saves_of_one_rank() -> None:
    """The stores hold shards of two saves of step 3 by rank 0 (an abandoned save and its
    re-save, by two writers): the rebuilt registry takes one writer's shards for the rank,
    never index 0 of one and index 1 of the other."""
    metas = {
        writer: [
            ShardMeta(**{**m.to_dict(), "checksum": m.checksum + tag, "attempt": "B", "writer": writer})
            for m in shard_metas(JOB, 3, 0, 1, data_shards=2, parity_shards=1)
        ]
        for tag, writer in ((0, "old"), (7, "new"))
    }
    # the new save lost its shard 2 with a node; the old one its shard 0
    held = [
        StoreHoldings("n0", (metas["new"][0],), {}),
        StoreHoldings("n1", (metas["new"][1], metas["old"][1]), {}),
        StoreHoldings("n2", (metas["old"][2],), {}),
    ]
    registry = Registry()
    registry.rebuild(held)
    (record,) = registry.locate(JOB, 3).values()
    assert {m.writer for m in record.metas.values()} == {"new"}
    assert sorted(record.metas) == [0, 1]


def test_a_zombie_save_never_overwrites_the_next_generations_shards() -> None:
    """The failed generation's abandoned save goes on and puts its shard of step 4 after the
    next generation put its own (other bytes: a GPU job is not bit-deterministic): the store
    keeps both under their writers, and a read names the writer the registry recorded."""
    store = ShardStore(node_id="n0", budget_bytes=1 << 20)

    def shard(writer: str, fill: int) -> tuple[ShardMeta, np.ndarray]:
        data = np.full(32, fill, dtype=np.uint8)
        (first,) = shard_metas(JOB, 4, 0, 1, data_shards=1, parity_shards=0, payload_size=32)
        return ShardMeta(**{**first.to_dict(), "checksum": checksum(data), "writer": writer}), data

    new_meta, new_data = shard("next-generation", 1)
    old_meta, old_data = shard("abandoned", 2)
    store.put(new_meta, new_data)
    store.put(old_meta, old_data)  # the zombie's put lands last
    found = store.get(ShardAddress(JOB, 4, 0, 0, writer="next-generation"))
    assert found is not None and found[0] == new_meta and np.array_equal(found[1], new_data)
    assert store.drop(JOB, [4], writers=["abandoned"]) > old_data.size  # its bytes and metadata
    assert store.get(ShardAddress(JOB, 4, 0, 0, writer="abandoned")) is None
    assert store.get(ShardAddress(JOB, 4, 0, 0, writer="next-generation")) is not None


def test_a_registry_restart_keeps_the_attempt_history_and_the_plan() -> None:
    """Rank 0 of attempt a1 restores step 1; two of rank 1's step-1 holders die and the
    registry restarts. Rank 1 still gets a1's plan (kept by the stores), so it fails on step 1
    (InsufficientShardsError) instead of restoring step 0 and rolling back the step rank 0
    loaded; a zombie of the superseded attempt a0 is still refused."""
    sim = world(local_copy=False)
    sim.start_incarnation(with_attempt=True)
    restore_every_live_rank(sim)
    save_with_every_live_rank(sim, steps=2)
    sim.start_incarnation(with_attempt=True)
    r0, r1 = sim.live()
    sim.restore(r0)
    assert r0.restored == 1
    for node in sorted(set(sim.registry.locate(JOB, 1)[1].nodes.values()) - {r0.node, r1.node})[:2]:
        sim.kill_node(node)
    sim.restart_registry()
    assert r1.alive
    sim.restore(r1)
    assert r1.restored is None and not r1.alive  # refused, not step 0
    with pytest.raises(Exception, match="superseded"):
        sim.registry.join(JOB, "a0")
    sim.check()


def test_a_zombie_whose_shards_were_all_discarded_stays_refused_after_a_registry_restart() -> None:
    """Attempt a0's rank 0 stages step 0 and its rank 1 puts it; a group without an attempt
    restores, which supersedes a0 and drops a0's shards of the torn step 0 (so none is left to
    name a0), and the registry restarts. a0's rank 1 is a zombie whose stage then arrives: it is
    refused (the stores kept the superseded attempts with the plan mark), and the new group
    stays current and commits step 0."""
    sim = world()
    sim.start_incarnation(with_attempt=True, restores_first=False)
    a0, a1 = sim.live()
    sim.put(a0)
    sim.stage(a0)
    sim.put(a1)  # its stage is still in flight
    sim.start_incarnation(with_attempt=False)
    a1.alive = True  # a zombie with a save in flight
    restore_every_live_rank(sim)
    assert not any(m.attempt == "a0" for store in sim.stores.values() for m in store.inventory())
    sim.restart_registry()
    sim.stage(a1)
    assert not a1.alive  # refused: StaleAttemptError
    with pytest.raises(Exception, match="superseded"):
        sim.registry.join(JOB, "a0")
    save_with_every_live_rank(sim)
    assert sim.registry.committed_steps(JOB) == [0]
    assert {w[:2] for w in sim.commits[0].values()} == {"w1"}
    sim.check()


def test_a_zombies_first_stage_never_drops_a_later_groups_unstaged_shards() -> None:
    """Group a0's rank 0 stages step 0; group a1's rank 0 puts step 0 and lingers; group a2
    puts step 0 on both ranks. a1's late stage is the registry's first word of a1: it joins and
    discards a0's torn step 0, dropping the shards of the attempts it knows superseded (a0), never
    a2's, which it has not heard of yet. a2's stages then commit step 0, restorable (found by
    scripts/protocol_campaign.py --seed 23)."""
    sim = a_torn_step_0_then_a_new_group()
    b0 = sim.live()[0]
    sim.put(b0)
    sim.start_incarnation(with_attempt=True, restores_first=False)
    b0.alive = True  # a zombie with its stage in flight
    c0, c1 = sim.live()
    sim.put(c0)
    sim.put(c1)
    sim.stage(b0)  # a1 joins: a0's step 0 is torn
    sim.stage(c0)  # a2 joins: a1 is superseded
    sim.stage(c1)
    assert sim.registry.committed_steps(JOB) == [0]
    assert {w[:2] for w in sim.commits[0].values()} == {"w2"}
    sim.check()  # invariant 1: the committed step is in the stores


def test_a_step_a_rebuilt_registry_holds_every_ranks_shards_of_is_never_called_torn() -> None:
    """Both ranks put step 1 and rank 0 staged it; two nodes die and the registry restarts: it
    rebuilds step 1 as staged by both (their shards are there) but not committed. Rank 0, which
    went past step 1, waits for it: no rank is missing, rank 1's stage may still come, so it is
    pending, not torn; rank 1's stage then commits it (invariant 7: a torn step never commits)."""
    sim = World(nodes=5, world_size=2, k=2, m=1, seed=0)
    sim.start_incarnation(with_attempt=False, restores_first=False)
    restore_every_live_rank(sim)
    save_with_every_live_rank(sim)
    rank0, rank1 = sim.live()
    sim.put(rank0)
    sim.put(rank1)
    sim.kill_node("n2")
    sim.kill_node("n3")
    sim.stage(rank0)
    sim.restart_registry()
    assert sim.registry.staged_ranks(JOB, 1) == [0, 1] and not sim.registry.is_committed(JOB, 1)
    sim.wait_settled(rank0)
    assert sim.log[-1].endswith(": pending"), sim.log[-1]
    sim.stage(rank1)
    assert sim.registry.is_committed(JOB, 1)
    sim.check()


def _a_committed_step_0_and_a_later_groups_unstaged_save_of_it() -> World:
    """Group A (no attempt: the registry's) commits step 0; group B (attempt a1) starts without
    restoring and both its ranks put step 0, neither stages it yet (found by the model test)."""
    sim = World(nodes=5, world_size=2, k=2, m=1, seed=0)
    sim.start_incarnation(with_attempt=False, restores_first=False)
    restore_every_live_rank(sim)
    save_with_every_live_rank(sim)
    assert sim.commits[0] == {0: "w0-0", 1: "w0-1"}
    sim.start_incarnation(with_attempt=True, restores_first=False)
    for process in sim.live():
        sim.put(process)
    return sim


def test_a_rebuild_keeps_a_commit_over_an_equally_whole_resave_by_a_group_it_never_heard_of() -> None:
    """A store restart took the only commit mark; the registry restarts and both saves of step 0
    are whole (as many shards each). Only A can have committed it (the old registry never heard
    of B), so A's stays the commit and B's late stage is refused: step 0 never commits twice
    (invariant 6). Before: B's save won the tie and B's stage committed step 0 a second time."""
    sim = _a_committed_step_0_and_a_later_groups_unstaged_save_of_it()
    sim.restart_store("n1")  # rank 1 of A staged through it: it held the commit mark
    sim.restart_registry()
    assert sim.registry.committed_by(JOB, 0) == sim.processes[0].attempt
    assert {r: rec.first.writer for r, rec in sim.registry.locate(JOB, 0).items()} == {0: "w0-0", 1: "w0-1"}
    b0 = next(p for p in sim.live() if p.rank == 0 and p.alive)
    sim.stage(b0)
    assert not b0.alive  # refused: StaleAttemptError
    assert sim.log[-1].endswith("StaleAttemptError"), sim.log[-1]
    sim.check()


def test_a_rebuild_commits_the_whole_save_of_a_step_over_one_that_lost_shards() -> None:
    """Two nodes die (one with the commit mark) and the registry restarts: A's save of step 0
    keeps k shards on every rank, B's has more shards but one rank below k. The rebuilt registry
    holds A's save committed (invariant 1); before, it took B's by its shard count, found it not
    whole and held step 0 uncommitted, so a committed, restorable step was lost."""
    sim = _a_committed_step_0_and_a_later_groups_unstaged_save_of_it()
    sim.kill_node("n1")
    sim.kill_node("n4")
    sim.restart_registry()
    assert sim.registry.latest_committed(JOB) == 0
    assert {r: rec.first.writer for r, rec in sim.registry.locate(JOB, 0).items()} == {0: "w0-0", 1: "w0-1"}
    sim.check()
