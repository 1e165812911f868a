"""Registry: two-phase commit of steps, retention and torn-step eviction, waiting, and rebuilding."""

from __future__ import annotations

import threading
import time

import pytest
from support.shard_metas import shard_metas

from ray_ckpt.core.registry import CommitDecision, Registry
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.core.wire import StoreHoldings
from ray_ckpt.errors import ConfigError, NoCheckpointError

K, M = 2, 1
NODES = ["n0", "n1", "n2", "n3", "n4"]


def metas(job: str, step: int, rank: int, world_size: int) -> list[ShardMeta]:
    return shard_metas(job, step, rank, world_size, data_shards=K, parity_shards=M, payload_size=100 + rank)


def nodes_of(rank: int) -> dict[int, str]:
    """Where rank ``rank``'s shards live: index i on node (rank + i + 1) mod 5."""
    return {index: NODES[(rank + index + 1) % len(NODES)] for index in range(K + M)}


def stage(
    registry: Registry, step: int, rank: int, world_size: int = 3, job: str = "job", keep: int = 2
) -> CommitDecision:
    return registry.stage(metas(job, step, rank, world_size), nodes_of(rank), keep_committed=keep)


def commit(registry: Registry, step: int, world_size: int = 3, job: str = "job", keep: int = 2) -> CommitDecision:
    decisions = [stage(registry, step, r, world_size, job, keep) for r in range(world_size)]
    return decisions[-1]


def test_step_commits_only_when_every_rank_staged() -> None:
    """committed stays False until the last of world_size ranks stages; then True and latest."""
    registry = Registry()
    for rank in (2, 0):
        decision = stage(registry, 1, rank)
        assert decision == CommitDecision(False, (), ())
        assert not registry.is_committed("job", 1)
        assert registry.latest_committed("job") is None
    assert registry.staged_ranks("job", 1) == [0, 2]
    decision = stage(registry, 1, 1)
    assert decision.committed
    assert decision.keep_steps == (1,)
    assert registry.is_committed("job", 1)
    assert registry.latest_committed("job") == 1
    assert registry.staged_ranks("job", 1) == [0, 1, 2]


def test_restaging_a_rank_does_not_count_twice() -> None:
    """A rank that stages the same step again (a retry) does not stand in for a missing rank."""
    registry = Registry()
    for _ in range(3):
        assert not stage(registry, 1, 0).committed
    assert not stage(registry, 1, 1).committed
    assert registry.latest_committed("job") is None


def test_previous_commit_stays_latest_until_the_next_step_commits() -> None:
    """While step 2 is partly staged, step 1 remains the latest committed step."""
    registry = Registry()
    commit(registry, 1)
    stage(registry, 2, 0)
    stage(registry, 2, 1)
    assert registry.latest_committed("job") == 1
    assert registry.committed_steps("job") == [1]
    assert registry.locate("job", 1).keys() == {0, 1, 2}
    commit(registry, 2)
    assert registry.latest_committed("job") == 2


def test_keep_committed_retains_newest_two_and_evicts_older_and_torn_steps() -> None:
    """keep_committed=2: newest two commits stay; older commits and torn steps go; newer staged steps stay."""
    registry = Registry()
    assert commit(registry, 1).evict_steps == ()
    assert commit(registry, 2).keep_steps == (1, 2)
    stage(registry, 3, 0)  # torn: rank 0 staged step 3, the others never did
    stage(registry, 5, 1)  # in flight: newer than the commit below
    decision = commit(registry, 4)
    assert decision == CommitDecision(True, (2, 4), (1, 3))
    assert registry.committed_steps("job") == [2, 4]
    assert registry.staged_ranks("job", 3) == []
    assert registry.staged_ranks("job", 5) == [1]
    with pytest.raises(NoCheckpointError):
        registry.locate("job", 1)
    assert registry.jobs()["job"].staged == {5: (1,)}


def test_keep_committed_one_keeps_only_the_newest() -> None:
    """keep_committed=1 evicts the previous commit as soon as the next one commits."""
    registry = Registry()
    commit(registry, 1, keep=1)
    decision = commit(registry, 2, keep=1)
    assert decision == CommitDecision(True, (2,), (1,))
    assert registry.committed_steps("job") == [2]


@pytest.mark.parametrize("step", [1, 3, 4], ids=["older", "torn and evicted", "equal"])
def test_staging_a_step_not_newer_than_the_newest_commit_raises(step: int) -> None:
    """Staging a step <= the newest committed step raises ConfigError naming job and step."""
    registry = Registry()
    commit(registry, 1)
    stage(registry, 3, 0)
    commit(registry, 4)
    with pytest.raises(ConfigError, match="not newer than the newest committed step 4") as caught:
        stage(registry, step, 0)
    assert (caught.value.job, caught.value.step) == ("job", step)
    assert registry.committed_steps("job") == [1, 4]


def test_mismatched_world_size_raises_and_changes_nothing() -> None:
    """A rank disagreeing on world_size for a step is refused; the step's staged ranks stay as they were."""
    registry = Registry()
    stage(registry, 1, 0, world_size=3)
    with pytest.raises(ConfigError, match="world_size=2"):
        stage(registry, 1, 1, world_size=2)
    assert registry.staged_ranks("job", 1) == [0]
    stage(registry, 1, 1)
    assert stage(registry, 1, 2).committed


def test_stage_rejects_malformed_calls() -> None:
    """stage refuses no shards, shards of different ranks, and nodes that do not match the indices."""
    registry = Registry()
    with pytest.raises(ConfigError, match="at least one shard"):
        registry.stage([], {}, keep_committed=2)
    mixed = metas("job", 1, 0, 3)[:2] + metas("job", 1, 1, 3)[2:]
    with pytest.raises(ConfigError, match="share job, step, rank"):
        registry.stage(mixed, nodes_of(0), keep_committed=2)
    with pytest.raises(ConfigError, match="every staged shard index"):
        registry.stage(metas("job", 1, 0, 3), {0: "n1", 1: "n2"}, keep_committed=2)
    assert registry.jobs() == {}


def test_wait_committed_returns_true_when_another_thread_commits() -> None:
    """wait_committed blocks until the step commits in another thread, then returns True."""
    registry = Registry()
    stage(registry, 1, 0)
    stage(registry, 1, 1)
    waiting = threading.Event()

    def last_rank() -> None:
        waiting.wait(5)
        time.sleep(0.05)
        stage(registry, 1, 2)

    thread = threading.Thread(target=last_rank)
    thread.start()
    waiting.set()
    began = time.monotonic()
    assert registry.wait_committed("job", 1, timeout_s=5)
    assert time.monotonic() - began < 4
    thread.join()


def test_wait_committed_times_out_with_false_and_accepts_newer_commits() -> None:
    """wait_committed is False after a timeout with no commit; a newer commit satisfies an older wait."""
    registry = Registry()
    stage(registry, 1, 0)
    began = time.monotonic()
    assert not registry.wait_committed("job", 1, timeout_s=0.05)
    assert time.monotonic() - began >= 0.04
    assert not registry.wait_committed("other", 1, timeout_s=0.01)
    commit(registry, 2)
    assert registry.wait_committed("job", 1, timeout_s=0)


def test_locate_of_uncommitted_step_raises_no_checkpoint_error() -> None:
    """locate raises NoCheckpointError (with job and step) for never-staged and partly staged steps."""
    registry = Registry()
    commit(registry, 1)
    stage(registry, 2, 0)
    for step in (2, 3):
        with pytest.raises(NoCheckpointError, match=r"committed: \[1\]") as caught:
            registry.locate("job", step)
        assert (caught.value.job, caught.value.step) == ("job", step)
    with pytest.raises(NoCheckpointError):
        registry.locate("unknown", 1)
    located = registry.locate("job", 1)
    assert located[1].nodes == nodes_of(1)
    assert located[1].metas == {m.index: m for m in metas("job", 1, 1, 3)}


def holdings_of(registry: Registry, job: str, marked: set[str], mark: int) -> list:
    """What every node's store would report: the shards it holds and, on ``marked`` nodes, the commit mark."""
    held: dict[str, list[ShardMeta]] = {node: [] for node in NODES}
    for step in registry.committed_steps(job):
        for record in registry.locate(job, step).values():
            for index, meta in record.metas.items():
                held[record.nodes[index]].append(meta)
    return [StoreHoldings(node, tuple(held[node]), {job: mark} if node in marked else {}) for node in NODES]


def test_rebuild_from_store_holdings_reproduces_committed_steps_and_locations() -> None:
    """A fresh registry rebuilt from store holdings has the same committed steps and shard locations."""
    original = Registry()
    for step in (1, 2, 3):
        commit(original, step)
    holdings = holdings_of(original, "job", marked={"n3"}, mark=3)  # one store heard of the commit
    rebuilt = Registry()
    rebuilt.rebuild(holdings)
    assert rebuilt.committed_steps("job") == original.committed_steps("job") == [2, 3]
    assert rebuilt.latest_committed("job") == 3
    for step in (2, 3):
        assert rebuilt.locate("job", step) == original.locate("job", step)
    assert rebuilt.jobs() == original.jobs()
    with pytest.raises(ConfigError):
        stage(rebuilt, 3, 0)


def test_rebuild_commits_a_step_newer_than_the_marks_when_every_rank_still_has_k_shards() -> None:
    """The registry committed step 5 and died before any store heard of it (commit marks travel
    after the commit): every rank's k shards are in the stores, so every rank finished its
    puts and the step is whole; it comes back committed, not torn (a new attempt would then
    discard it). With a rank's shards down to fewer than k, the step comes back staged."""
    registry = Registry()
    for rank in range(3):
        stage(registry, 5, rank)
    assert registry.is_committed("job", 5)
    staged = [
        (node, [m for r in range(3) for m in metas("job", 5, r, 3) if nodes_of(r)[m.index] == node]) for node in NODES
    ]
    for marks in ({"job": 4}, {}):
        rebuilt = Registry()
        rebuilt.rebuild([StoreHoldings(node, tuple(held), marks) for node, held in staged])
        assert rebuilt.committed_steps("job") == [5]
    short = [(node, [m for m in held if not (m.rank == 2 and m.index < 2)]) for node, held in staged]
    rebuilt = Registry()
    rebuilt.rebuild([StoreHoldings(node, tuple(held), {"job": 4}) for node, held in short])
    assert rebuilt.committed_steps("job") == []
    assert rebuilt.jobs()["job"].staged == {5: (0, 1, 2)}


def test_rebuild_does_not_commit_a_step_missing_a_rank() -> None:
    """A step at or below the mark whose shards lack a rank (torn) is not committed after rebuild."""
    original = Registry()
    commit(original, 1)
    holdings = holdings_of(original, "job", marked=set(NODES), mark=2)
    torn = metas("job", 2, 0, 3) + metas("job", 2, 1, 3)  # rank 2 never stored step 2
    holdings.append(StoreHoldings("n9", tuple(torn), {"job": 2}))
    rebuilt = Registry()
    rebuilt.rebuild(holdings)
    assert rebuilt.committed_steps("job") == [1]
    assert rebuilt.staged_ranks("job", 2) == [0, 1]
    with pytest.raises(NoCheckpointError):
        rebuilt.locate("job", 2)


def test_rebuild_replaces_the_previous_view_and_wakes_waiters() -> None:
    """rebuild discards what the registry knew before and releases wait_committed calls it satisfies."""
    source = Registry()
    commit(source, 7, job="b")
    registry = Registry()
    commit(registry, 1, job="a")
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(registry.wait_committed("b", 7, timeout_s=5)))
    waiter.start()
    time.sleep(0.02)
    registry.rebuild(holdings_of(source, "b", marked={"n1"}, mark=7))
    waiter.join()
    assert result == [True]
    assert set(registry.jobs()) == {"b"}


def test_jobs_are_isolated() -> None:
    """Commits, evictions, step order and forget of one job never affect another job."""
    registry = Registry()
    for step in (1, 2, 3):
        commit(registry, step, job="a")
    stage(registry, 1, 0, job="b", world_size=2)  # b may stage step 1 although a committed step 3
    assert registry.committed_steps("a") == [2, 3]
    assert registry.committed_steps("b") == []
    commit(registry, 1, job="b", world_size=2)
    assert {job: info.to_wire() for job, info in registry.jobs().items()} == {
        "a": {"committed_steps": [2, 3], "staged": {}, "world_size": 3},
        "b": {"committed_steps": [1], "staged": {}, "world_size": 2},
    }
    registry.forget("a")
    assert set(registry.jobs()) == {"b"}
    assert registry.latest_committed("a") is None
    assert registry.latest_committed("b") == 1


def test_a_step_only_some_ranks_saved_settles_as_torn_once_the_others_went_past_it() -> None:
    """Under every="auto" rank 0 chose interval 2 and rank 1 interval 4: rank 0's last save
    (step 6) can never commit. Its wait learns so as soon as rank 1 says it went past step 6
    (at its own wait, whose step 4 committed), not after the commit timeout; a rank that went
    only to step 5 settles nothing."""
    registry = Registry()
    for rank in (0, 1):
        stage(registry, 4, rank, world_size=2)
    stage(registry, 6, 0, world_size=2)

    def settle(step: int, rank: int, passed: int, timeout_s: float = 0.0, attempt: str | None = None) -> str:
        return registry.wait_settled(
            "job", step, rank=rank, attempt=attempt, world_size=2, passed=passed, timeout_s=timeout_s
        )

    assert settle(6, rank=0, passed=7) == "pending"
    assert settle(4, rank=1, passed=5) == "committed"
    assert settle(6, rank=0, passed=7) == "pending"  # rank 1 may still save step 6
    assert settle(4, rank=1, passed=7, attempt="another") == "committed"  # another attempt's note
    assert settle(6, rank=0, passed=7) == "pending"
    answers: list[str] = []
    waiter = threading.Thread(target=lambda: answers.append(settle(6, rank=0, passed=7, timeout_s=30)))
    waiter.start()
    began = time.monotonic()
    assert settle(4, rank=1, passed=7) == "committed"
    waiter.join(30)
    assert answers == ["torn"] and time.monotonic() - began < 10
    assert registry.latest_committed("job") == 4


def test_a_newer_step_a_rank_staged_shows_it_went_past() -> None:
    """A rank stages its steps in order: once it staged step 8, an uncommitted step 6 it did not
    stage is torn without any note from it; step 8 itself commits when the other rank saves it."""
    registry = Registry()
    stage(registry, 6, 0, world_size=2)
    stage(registry, 8, 1, world_size=2)
    settled = registry.wait_settled("job", 6, rank=0, attempt=None, world_size=2, passed=6, timeout_s=0)
    assert settled == "torn"
    assert registry.wait_settled("job", 8, rank=1, attempt=None, world_size=2, passed=8, timeout_s=0) == "pending"
    stage(registry, 8, 0, world_size=2)
    assert registry.wait_settled("job", 8, rank=1, attempt=None, world_size=2, passed=8, timeout_s=0) == "committed"


def test_the_jobs_of_an_in_place_run_are_those_with_an_attempt_of_its_generations() -> None:
    """What a replacement reads ahead for (``ray_ckpt.prefetch``): only jobs this run joined, not
    another run's, nor one whose name merely starts like the run's."""
    registry = Registry()
    registry.plan_restore("mine", "abc123.g1", set(NODES))
    registry.plan_restore("mine", "abc123.g2", set(NODES))
    registry.plan_restore("also-mine", "abc123.g3", set(NODES))
    registry.plan_restore("theirs", "def456.g1", set(NODES))
    registry.plan_restore("lookalike", "abc1234.g1", set(NODES))
    assert registry.jobs_of_run("abc123") == ["also-mine", "mine"]
    assert registry.jobs_of_run("nothing") == []
