"""Registry incarnations: attempts, torn-step discard, stale workers, restore plans, backup settling, rollback."""

from __future__ import annotations

import dataclasses

import pytest
from support.shard_metas import shard_metas

from ray_ckpt.core.registry import REACHED_ATTEMPTS, CommitDecision, Registry
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.core.wire import RestorePlan
from ray_ckpt.errors import ConfigError, StaleAttemptError

K, M = 2, 1
JOB = "job"


def metas(step: int, rank: int, world_size: int = 2, tag: int = 0, job: str = JOB) -> list[ShardMeta]:
    """Shard metadata of one rank's step; ``tag`` goes into the checksum to tell stages apart."""
    return shard_metas(job, step, rank, world_size, data_shards=K, parity_shards=M, tag=tag)


def node(step: int, rank: int, index: int) -> str:
    """Every shard of every step on its own node, so a test can kill exactly the shards it wants."""
    return f"n{step}-{rank}-{index}"


def nodes_of(step: int, rank: int) -> dict[int, str]:
    return {index: node(step, rank, index) for index in range(K + M)}


def all_nodes(step: int, world_size: int = 2) -> set[str]:
    return {node(step, rank, index) for rank in range(world_size) for index in range(K + M)}


def stage(
    registry: Registry,
    step: int,
    rank: int,
    attempt: str | None,
    *,
    world_size: int = 2,
    tag: int = 0,
    keep: int = 2,
    local_node: str | None = None,
) -> CommitDecision:
    shard_metas = metas(step, rank, world_size, tag)
    local = shard_metas[0] if local_node is not None else None
    return registry.stage(
        shard_metas,
        nodes_of(step, rank),
        keep_committed=keep,
        attempt=attempt,
        local=local,
        local_node=local_node,
    )


def commit(registry: Registry, step: int, attempt: str | None, *, world_size: int = 2, keep: int = 2, **kw) -> None:
    decisions = [stage(registry, step, r, attempt, world_size=world_size, keep=keep, **kw) for r in range(world_size)]
    assert decisions[-1].committed


# ---- attempts and torn steps ------------------------------------------------------------


def test_new_attempt_discards_torn_step_so_ranks_of_two_incarnations_never_mix() -> None:
    """A step half-staged by attempt A cannot commit with a rank of attempt B; it commits with B's records only."""
    registry = Registry()
    assert not stage(registry, 5, 0, "A", tag=1).committed
    assert registry.staged_ranks(JOB, 5) == [0]

    assert not stage(registry, 5, 1, "B", tag=2).committed
    assert not registry.is_committed(JOB, 5)
    assert registry.staged_ranks(JOB, 5) == [1]

    assert stage(registry, 5, 0, "B", tag=2).committed
    located = registry.locate(JOB, 5)
    assert sorted(located) == [0, 1]
    for rank, record in located.items():
        assert record.metas == {m.index: m for m in metas(5, rank, tag=2)}
        assert record.nodes == nodes_of(5, rank)


def test_join_returns_the_discarded_torn_steps_and_keeps_committed_ones() -> None:
    """join of a new attempt returns the uncommitted steps it dropped; committed ones stay; re-joining is a no-op."""
    registry = Registry()
    commit(registry, 1, "A")
    stage(registry, 2, 0, "A")
    stage(registry, 3, 1, "A")
    assert registry.join(JOB, "A") == ()
    assert registry.join(JOB, "B") == (2, 3)
    assert registry.committed_steps(JOB) == [1]
    assert registry.jobs()[JOB].staged == {}
    stage(registry, 4, 0, "B")
    assert registry.join(JOB, "B") == ()
    assert registry.staged_ranks(JOB, 4) == [0]


def test_stage_from_superseded_attempt_raises_and_changes_nothing() -> None:
    """A zombie rank of attempt A staging after B joined gets StaleAttemptError and its shards are not recorded."""
    registry = Registry()
    stage(registry, 1, 0, "A")
    registry.join(JOB, "B")
    with pytest.raises(StaleAttemptError):
        stage(registry, 1, 1, "A")
    with pytest.raises(StaleAttemptError):
        stage(registry, 2, 0, "A")
    assert registry.jobs()[JOB].staged == {}
    assert registry.latest_committed(JOB) is None


def test_plan_and_join_from_superseded_attempt_raise() -> None:
    """plan_restore and join from an attempt that was replaced raise StaleAttemptError, even after a later one."""
    registry = Registry()
    commit(registry, 1, "A")
    registry.plan_restore(JOB, "B", all_nodes(1))
    registry.join(JOB, "C")
    for stale in ("A", "B"):
        with pytest.raises(StaleAttemptError):
            registry.plan_restore(JOB, stale, all_nodes(1))
        with pytest.raises(StaleAttemptError):
            registry.join(JOB, stale)
    assert registry.plan_restore(JOB, "C", all_nodes(1)).step == 1


# ---- restore plans ----------------------------------------------------------------------


def test_plan_is_decided_once_per_attempt_and_a_new_attempt_redecides() -> None:
    """Every rank of an attempt gets the first call's plan even if liveness changed; the next attempt re-decides."""
    registry = Registry()
    commit(registry, 1, "A")
    commit(registry, 2, "A")
    first = registry.plan_restore(JOB, "B", all_nodes(1) | all_nodes(2))
    assert first.step == 2 and first.source == "peers"
    assert registry.plan_restore(JOB, "B", set()) == first  # another rank, after the nodes died
    assert registry.plan_restore(JOB, "B", all_nodes(1)) == first
    with pytest.raises(dataclasses.FrozenInstanceError):  # a caller cannot change the registry's plan
        first.step = 99  # type: ignore[misc]
    assert registry.plan_restore(JOB, "B", set()).step == 2

    again = registry.plan_restore(JOB, "C", all_nodes(1))
    assert again.step == 1 and again.source == "peers"
    assert registry.plan_restore(JOB, "C", all_nodes(2)) == again


def test_plan_without_attempt_is_not_cached() -> None:
    """plan_restore with attempt None decides afresh on every call."""
    registry = Registry()
    commit(registry, 1, None)
    assert registry.plan_restore(JOB, None, all_nodes(1)).source == "peers"
    assert registry.plan_restore(JOB, None, set()).source == "backup"


def test_plan_picks_newest_committed_step_with_k_live_shards_per_rank() -> None:
    """With k of k+m shards of every rank alive the newest step is chosen; one shard down per rank is tolerated."""
    registry = Registry()
    commit(registry, 1, "A")
    commit(registry, 2, "A")
    live = (all_nodes(1) | all_nodes(2)) - {node(2, 0, 0), node(2, 1, 2)}  # one shard of each rank lost
    plan = registry.plan_restore(JOB, "B", live)
    assert plan == RestorePlan(
        step=2,
        source="peers",
        ever_committed=True,
        newest_committed=2,
        newest_staged=2,
        world_size=2,
        attempt="B",
    )


def test_plan_falls_back_to_older_kept_step_when_newest_is_not_rebuildable() -> None:
    """If one rank of the newest step has fewer than k live shards, the older kept step is planned."""
    registry = Registry()
    commit(registry, 1, "A")
    commit(registry, 2, "A")
    live = (all_nodes(1) | all_nodes(2)) - {node(2, 1, 0), node(2, 1, 1)}  # rank 1 of step 2: 1 < k shards
    plan = registry.plan_restore(JOB, "B", live)
    assert (plan.step, plan.source) == (1, "peers")


def test_plan_uses_local_copy_when_shards_are_gone_but_local_node_is_alive() -> None:
    """A rank whose shards are all lost still counts as rebuildable while the node of its local copy lives."""
    registry = Registry()
    commit(registry, 1, "A")
    commit(registry, 2, "A", local_node="local")
    live_without_rank1 = all_nodes(1) | (all_nodes(2) - set(nodes_of(2, 1).values()))
    plan = registry.plan_restore(JOB, "B", live_without_rank1 | {"local"})
    assert (plan.step, plan.source) == (2, "peers")
    without_local = registry.plan_restore(JOB, "C", live_without_rank1)
    assert (without_local.step, without_local.source) == (1, "peers")


def test_plan_skips_steps_marked_unrestorable() -> None:
    """A step marked unrestorable is never planned again, even with all its shards alive."""
    registry = Registry()
    commit(registry, 1, "A")
    commit(registry, 2, "A")
    live = all_nodes(1) | all_nodes(2)
    assert registry.plan_restore(JOB, "B", live).step == 2
    registry.mark_unrestorable(JOB, 2)
    assert registry.plan_restore(JOB, "C", live).step == 1
    registry.mark_unrestorable(JOB, 1)
    plan = registry.plan_restore(JOB, "D", live)
    assert plan.step is None and plan.source == "backup" and plan.ever_committed


def test_plan_is_backup_when_nothing_is_rebuildable_but_something_committed() -> None:
    """With every committed step unrebuildable the plan says: step None, source backup, ever_committed."""
    registry = Registry()
    commit(registry, 1, "A")
    commit(registry, 2, "A")
    plan = registry.plan_restore(JOB, "B", {"some-other-node"})
    assert plan == RestorePlan(
        step=None,
        source="backup",
        ever_committed=True,
        newest_committed=2,
        newest_staged=2,
        attempt="B",
    )


def test_plan_is_none_when_nothing_was_ever_committed() -> None:
    """A job with only torn steps (or none at all) plans source None and ever_committed False."""
    registry = Registry()
    assert registry.plan_restore(JOB, "A", set()) == RestorePlan(
        step=None,
        source=None,
        ever_committed=False,
        newest_committed=None,
        newest_staged=None,
        attempt="A",
    )
    stage(registry, 3, 0, "A")
    plan = registry.plan_restore(JOB, "B", all_nodes(3))
    assert plan == RestorePlan(
        step=None,
        source=None,
        ever_committed=False,
        newest_committed=None,
        newest_staged=3,
        attempt="B",
    )


def test_newest_staged_counts_a_torn_step_discarded_by_the_new_attempt() -> None:
    """newest_staged reports the newest step any rank staged, even one that never committed and was discarded."""
    registry = Registry()
    commit(registry, 1, "A")
    stage(registry, 2, 0, "A")
    stage(registry, 3, 1, "A")
    plan = registry.plan_restore(JOB, "B", all_nodes(1))
    assert (plan.step, plan.newest_staged) == (1, 3)
    assert registry.jobs()[JOB].staged == {}  # the torn steps were discarded by B's join


# ---- backup step ------------------------------------------------------------------------


def test_settle_backup_step_first_proposal_wins_within_an_attempt() -> None:
    """All ranks of an attempt get the first proposed backup step; a new attempt settles anew; None passes through."""
    registry = Registry()
    commit(registry, 4, "A")
    assert registry.plan_restore(JOB, "B", set()).source == "backup"
    assert registry.settle_backup_step(JOB, "B", 3) == 3
    assert registry.settle_backup_step(JOB, "B", 2) == 3
    assert registry.settle_backup_step(JOB, "B", None) == 3
    assert registry.plan_restore(JOB, "C", set()).source == "backup"
    assert registry.settle_backup_step(JOB, "C", 2) == 2
    assert registry.settle_backup_step(JOB, "B", 1) == 3
    assert registry.settle_backup_step(JOB, None, 7) == 7
    assert registry.settle_backup_step(JOB, None, 5) == 5


# ---- rollback ---------------------------------------------------------------------------


def test_rollback_drops_newer_steps_of_earlier_attempts_only_and_allows_restaging() -> None:
    """rollback(3) drops committed 4 and 5 of attempt A, keeps B's staged step 6, and lets B save 4 and 5 again."""
    registry = Registry()
    for step in (3, 4, 5):
        commit(registry, step, "A", keep=3)
    assert registry.plan_restore(JOB, "B", set()).source == "backup"
    assert registry.settle_backup_step(JOB, "B", 3) == 3
    stage(registry, 6, 0, "B", keep=3)

    with pytest.raises(ConfigError):  # before the rollback, 4 is older than the newest commit
        stage(registry, 4, 0, "B", keep=3)
    assert registry.rollback(JOB, 3) == (4, 5)
    assert registry.committed_steps(JOB) == [3]
    assert registry.staged_ranks(JOB, 6) == [0]

    for step in (4, 5):
        commit(registry, step, "B", keep=3, tag=7)
        assert registry.locate(JOB, step)[0].metas[0].checksum == metas(step, 0, tag=7)[0].checksum
    assert registry.committed_steps(JOB) == [3, 4, 5]
    assert registry.staged_ranks(JOB, 6) == [0]
    assert registry.rollback(JOB, 3) == ()  # B's own commits are not rolled back


def test_rollback_without_attempts_drops_every_newer_step() -> None:
    """With no attempt ever joined, rollback drops every step above the given one."""
    registry = Registry()
    for step in (1, 2, 3):
        commit(registry, step, None, keep=3)
    assert registry.rollback(JOB, 1) == (2, 3)
    assert registry.committed_steps(JOB) == [1]
    assert registry.rollback("other-job", 0) == ()


def test_newest_reached_is_the_step_the_attempt_before_trained_saved_or_not() -> None:
    """With saves every few steps, the plan of the next attempt gives the newest step the one
    before said it trained (``note_reached``), so that steps trained after the last save count
    as redone; the restoring attempt's own reports, and older attempts', are not it."""
    registry = Registry()
    commit(registry, 10, "A")
    for step in (10, 11, 12):
        registry.note_reached(JOB, "A", step)
    registry.note_reached(JOB, "A", 11)  # a late, older report moves nothing
    plan = registry.plan_restore(JOB, "B", all_nodes(10))
    assert (plan.step, plan.newest_staged, plan.newest_reached) == (10, 10, 12)
    registry.note_reached(JOB, "B", 11)  # B trains again, then fails at 11
    assert registry.steps_reached(JOB, "C") == (10, 11)
    assert registry.plan_restore(JOB, "C", all_nodes(10)).newest_reached == 11
    assert registry.steps_reached(JOB, "B") == (10, 12)
    assert registry.steps_reached("other-job", "A") == (None, None)


def test_newest_reached_keeps_only_the_newest_attempts() -> None:
    registry = Registry()
    for n in range(REACHED_ATTEMPTS + 3):
        registry.note_reached(JOB, f"attempt-{n}", n)
    assert registry.steps_reached(JOB, None) == (None, REACHED_ATTEMPTS + 2)
    assert len(registry._incarnations[JOB].reached) == REACHED_ATTEMPTS
