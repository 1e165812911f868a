"""Registry.stage_batch: a node's ranks staged in one call, with the semantics of one stage each."""

from __future__ import annotations

import pytest
from support.shard_metas import shard_metas

from ray_ckpt.core.registry import CommitDecision, Registry, StageOutcome
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.core.wire import RankLocation, StageRequest, StageResult, StoreHoldings
from ray_ckpt.errors import ConfigError, NoCheckpointError, SnapshotFormatError, StaleAttemptError

K, M = 2, 1
JOB = "job"


def metas(step: int, rank: int, world_size: int = 4, tag: int = 0, job: str = JOB) -> tuple[ShardMeta, ...]:
    return tuple(shard_metas(job, step, rank, world_size, data_shards=K, parity_shards=M, tag=tag))


def request(step: int, rank: int, attempt: str | None = None, world_size: int = 4, tag: int = 0) -> StageRequest:
    return StageRequest(
        metas=metas(step, rank, world_size, tag),
        nodes={i: f"n{(rank + i) % 5}" for i in range(K + M)},
        keep_committed=2,
        attempt=attempt,
    )


def node_batches(
    step: int, attempt: str | None = None, world_size: int = 4, per_node: int = 2
) -> list[list[StageRequest]]:
    ranks = [request(step, r, attempt, world_size) for r in range(world_size)]
    return [ranks[i : i + per_node] for i in range(0, world_size, per_node)]


def test_a_batch_commits_exactly_like_the_same_stages_one_by_one() -> None:
    """Two nodes' batches commit the step with the last rank, with the decisions single stages give."""
    batched, single = Registry(), Registry()
    outcomes = [o for batch in node_batches(1, "a") for o in batched.stage_batch(batch)]
    decisions = [
        single.stage(list(r.metas), dict(r.nodes), keep_committed=2, attempt="a")
        for b in node_batches(1, "a")
        for r in b
    ]
    assert [o.decision for o in outcomes] == decisions
    assert [o.decision.committed for o in outcomes if o.decision] == [False, False, False, True]
    assert batched.committed_steps(JOB) == single.committed_steps(JOB) == [1]
    assert batched.locate(JOB, 1) == single.locate(JOB, 1)


def test_a_half_staged_batch_does_not_commit() -> None:
    """One node's batch of a 4-rank step leaves it staged, not committed."""
    registry = Registry()
    assert all(not o.decision.committed for o in registry.stage_batch(node_batches(1)[0]) if o.decision)
    assert registry.staged_ranks(JOB, 1) == [0, 1]
    assert registry.latest_committed(JOB) is None


def test_a_refused_stage_changes_nothing_and_does_not_stop_the_others() -> None:
    """A stage with the wrong world size is refused with ConfigError; the rest of the batch applies."""
    registry = Registry()
    bad = request(1, 2, world_size=3)
    outcomes = registry.stage_batch([request(1, 0), bad, request(1, 1)])
    assert outcomes[0].error is None and outcomes[2].error is None
    assert isinstance(outcomes[1].error, ConfigError) and outcomes[1].decision is None
    assert registry.staged_ranks(JOB, 1) == [0, 1]


def test_a_stage_of_a_superseded_attempt_is_refused_in_a_batch() -> None:
    """Per stage: a zombie of attempt "a" after "b" joined gets StaleAttemptError; "b"'s stage applies."""
    registry = Registry()
    registry.stage_batch([request(1, 0, "a")])
    outcomes = registry.stage_batch([request(2, 0, "b"), request(2, 1, "a")])
    assert outcomes[0].error is None
    assert outcomes[0].torn == (1,)  # the join of "b" discarded "a"'s torn step 1
    assert isinstance(outcomes[1].error, StaleAttemptError)
    assert registry.staged_ranks(JOB, 2) == [0]
    assert registry.staged_ranks(JOB, 1) == []


def test_steps_not_newer_than_the_newest_commit_are_refused_unless_identical() -> None:
    """After a commit, a different stage of that step is refused as with stage(); an identical
    one (a retry after a registry restart) is acknowledged as committed and changes nothing."""
    registry = Registry()
    for batch in node_batches(1):
        registry.stage_batch(batch)
    before = registry.locate(JOB, 1)
    retry, changed = registry.stage_batch([request(1, 0), request(1, 1, tag=9)])
    assert retry.decision == CommitDecision(True, (1,), ())
    assert isinstance(changed.error, ConfigError)
    assert "not newer than the newest committed step 1" in str(changed.error)
    assert registry.locate(JOB, 1) == before
    with pytest.raises(ConfigError):  # the single stage keeps refusing it
        registry.stage(list(request(1, 0).metas), dict(request(1, 0).nodes), keep_committed=2)


def test_a_retried_batch_after_a_rebuild_is_acknowledged_not_committed_twice() -> None:
    """The registry dies after committing; rebuilt from stores that heard of the commit, the same
    batches sent again are acknowledged, the step stays committed once, and the next step commits."""
    original = Registry()
    batches = node_batches(1)
    for batch in batches:
        original.stage_batch(batch)
    held: dict[str, list[ShardMeta]] = {}
    for record in original.locate(JOB, 1).values():
        for index, meta in record.metas.items():
            held.setdefault(record.nodes[index], []).append(meta)
    rebuilt = Registry()
    rebuilt.rebuild([StoreHoldings(node, tuple(m), {JOB: 1}) for node, m in held.items()])
    outcomes = [o for batch in batches for o in rebuilt.stage_batch(batch)]
    assert all(o.error is None and o.decision and o.decision.committed for o in outcomes)
    assert all(o.decision and o.decision.evict_steps == () for o in outcomes)
    assert rebuilt.committed_steps(JOB) == [1]
    assert rebuilt.locate(JOB, 1) == original.locate(JOB, 1)  # no local copies here: the rebuild keeps all
    last = [o for batch in node_batches(2) for o in rebuilt.stage_batch(batch)][-1]
    assert last.decision == CommitDecision(True, (1, 2), ())


def test_a_batch_without_metadata_is_refused_alone() -> None:
    """A request with no shard metadata is refused with ConfigError; the next one applies."""
    registry = Registry()
    empty = StageRequest(metas=(), nodes={}, keep_committed=2)
    outcomes = registry.stage_batch([empty, request(1, 0)])
    assert isinstance(outcomes[0].error, ConfigError)
    assert outcomes[1] == StageOutcome(decision=CommitDecision(False, (), ()))


def test_locate_rank_returns_one_record_and_the_world_size() -> None:
    """locate_rank: the asking rank's record only, the world size, NoCheckpointError if not committed."""
    registry = Registry()
    for batch in node_batches(1):
        registry.stage_batch(batch)
    located = registry.locate_rank(JOB, 1, 2)
    assert located == RankLocation(world_size=4, record=registry.locate(JOB, 1)[2])
    assert registry.locate_rank(JOB, 1, 7).record is None
    registry.stage_batch([request(2, 0)])
    with pytest.raises(NoCheckpointError):
        registry.locate_rank(JOB, 2, 0)


def test_wire_records_round_trip() -> None:
    """StageRequest, StageResult (errors come back as their own class) and RankLocation survive the wire."""
    registry = Registry()
    for batch in node_batches(1):
        registry.stage_batch(batch)
    located = registry.locate_rank(JOB, 1, 0)
    assert RankLocation.from_wire(located.to_wire()) == located
    req = StageRequest(**{**request(1, 0, "a").__dict__, "local": metas(1, 0)[0], "local_node": "n9"})
    assert StageRequest.from_wire(req.to_wire()) == req
    stale = StageResult(error=StaleAttemptError("attempt a was superseded", job=JOB, attempt="a"))
    back = StageResult.from_wire(stale.to_wire())
    assert isinstance(back.error, StaleAttemptError) and back.error.attempt == "a" and not back.committed
    with pytest.raises(StaleAttemptError, match="superseded"):
        back.raise_error()
    assert StageResult.from_wire(StageResult(committed=True).to_wire()) == StageResult(committed=True)


@pytest.mark.parametrize(
    "change",
    [
        {"shared": ["job", 1, 4, 4, K, M, 100, 50]},  # rank >= world_size
        {"shared": ["job", 1, 0, 4, K, M, 100, 49]},  # shard size does not match the payload
        {"shared": ["job", True, 0, 4, K, M, 100, 50]},  # a bool is no step
        {"shared": [7, 1, 0, 4, K, M, 100, 50]},  # job not a str
        {"shards": [[K + M, 1, "n0"]]},  # index beyond k+m
        {"shards": [[0, -1, "n0"]]},  # negative checksum
    ],
)
def test_a_malformed_compact_request_is_refused_like_malformed_metadata(change: dict) -> None:
    """The compact wire form is validated as ShardMeta.from_dict validates a record."""
    with pytest.raises(SnapshotFormatError):
        StageRequest.from_wire({**request(1, 0).to_wire(), **change})


def test_a_request_whose_nodes_do_not_match_its_shards_goes_as_full_records_and_is_refused() -> None:
    """Nodes naming other indices than the shards survive the wire unchanged, so the registry
    refuses them with the same ConfigError as stage()."""
    odd = StageRequest(metas=metas(1, 0), nodes={0: "n0"}, keep_committed=2)
    assert StageRequest.from_wire(odd.to_wire()) == odd
    (outcome,) = Registry().stage_batch([odd])
    assert isinstance(outcome.error, ConfigError) and "nodes must name the node" in str(outcome.error)
