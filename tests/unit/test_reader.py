"""``Reader``: a process that is none of a job's ranks reads its committed steps bit-exact and
changes nothing: the registry's attempts, plans, plan marks and committed steps are the same
after a read, and the running job's next save commits. A step evicted while it is read is read
again at the newest, a bounded number of times. Real checkpointers, registry and stores in one
process (``in_process_service``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from support.in_process_service import Service

from ray_ckpt import ConfigError, InsufficientShardsError, NoCheckpointError
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.core.wire import RankLocation
from ray_ckpt.errors import StaleAttemptError
from ray_ckpt.reader import READ_TRIES, Reader


def state_of(rank: int, step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return {
        "model": {"w": torch.randn(300, generator=generator), "b": torch.arange(7, dtype=torch.int16) + step},
        "step": step,
        "note": f"rank {rank}",
    }


def assert_same(got: Any, expected: Any) -> None:
    """Bit for bit: tensors by dtype, shape and bytes; everything else by ==."""
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.numpy().tobytes() == expected.numpy().tobytes()
    elif isinstance(expected, dict):
        assert set(got) == set(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    else:
        assert got == expected


def running_job(service: Service, job: str, steps: int, world_size: int = 2, **config: Any) -> list[Checkpointer]:
    """``world_size`` ranks on nodes n0, n1, ... that restored (nothing) and committed ``steps`` steps."""
    ranks = [
        service.checkpointer(job=job, rank=r, world_size=world_size, node=f"n{r}", **config) for r in range(world_size)
    ]
    for ckpt in ranks:
        assert ckpt.restore() is None
    for step in range(steps):
        save_step(ranks, step)
    return ranks


def save_step(ranks: list[Checkpointer], step: int) -> None:
    handles = [ckpt.save(step, state_of(ckpt.rank, step)) for ckpt in ranks]
    for handle in handles:
        handle.wait(timeout_s=30)


def registry_state(service: Service, job: str) -> tuple[Any, ...]:
    """Everything of ``job`` a read must leave as it is (plan marks and discarded steps are
    taken: a read must queue none)."""
    registry = service.registry
    return (
        copy.deepcopy(registry._incarnations.get(job)),
        registry.jobs().get(job),
        registry.committed_steps(job),
        {step: registry.committed_by(job, step) for step in registry.committed_steps(job)},
        {step: registry.locate(job, step) for step in registry.committed_steps(job)},
        registry.take_plan_marks(),
        registry.take_discarded(),
    )


def test_a_read_changes_no_registry_state_and_the_running_job_commits_its_next_step() -> None:
    service = Service()
    ranks = running_job(service, "watched", steps=2)
    before = registry_state(service, "watched")
    asked = len(service.client.calls)
    with service.reader("watched") as reader:
        latest = reader.read()
        other = reader.read(rank=1)
    assert latest is not None and other is not None
    assert set(service.client.calls[asked:]) == {"latest_committed", "locate_rank"}  # queries only
    assert registry_state(service, "watched") == before
    save_step(ranks, 2)  # the job goes on: its attempt was not superseded
    assert service.registry.latest_committed("watched") == 2
    assert service.registry.committed_by("watched", 2) == ranks[0].attempt
    for ckpt in ranks:
        ckpt.close()


def test_an_outside_restore_instead_supersedes_the_running_job() -> None:
    """What the reader avoids: a Checkpointer of rank 0 restoring from outside opens a new
    attempt, and the running ranks' next stage is refused."""
    service = Service()
    ranks = running_job(service, "superseded", steps=1)
    outsider = service.checkpointer(job="superseded", rank=0, world_size=2, node="n3")
    assert outsider.restore() is not None
    with pytest.raises(StaleAttemptError):
        save_step(ranks, 1)
    for ckpt in (*ranks, outsider):
        ckpt.abandon()


def test_a_read_is_bit_exact_for_every_rank_and_any_kept_step() -> None:
    service = Service()
    ranks = running_job(service, "exact", steps=2)
    reader = service.reader("exact")
    for rank in range(2):
        latest = reader.read(rank=rank)
        assert latest is not None and (latest.step, latest.source) == (1, "peers")
        assert set(latest.phases_s) == {"locate", "fetch", "decode", "load"}
        assert_same(latest.state, state_of(rank, 1))
        older = reader.read(step=0, rank=rank)
        assert older is not None and older.step == 0
        assert_same(older.state, state_of(rank, 0))
    for ckpt in ranks:
        ckpt.close()


def test_a_read_into_a_state_fills_its_tensors() -> None:
    service = Service()
    ranks = running_job(service, "filled", steps=1)
    into = {"model": {"w": torch.zeros(300), "b": torch.zeros(7, dtype=torch.int16)}}
    restored = service.reader("filled").read(rank=1, into=into)
    assert restored is not None and restored.state["model"]["w"] is into["model"]["w"]
    assert_same(into["model"], state_of(1, 0)["model"])
    assert restored.state["note"] == "rank 1"
    for ckpt in ranks:
        ckpt.close()


def test_a_job_without_a_committed_step_reads_none_and_bad_arguments_are_refused() -> None:
    service = Service()
    reader = service.reader("empty")
    assert reader.read() is None
    with pytest.raises(NoCheckpointError, match="no committed step 3"):
        reader.read(step=3)
    ranks = running_job(service, "two", steps=1)
    with pytest.raises(ConfigError, match=r"saved by 2 rank\(s\): rank must be in \[0, 2\), got 2"):
        service.reader("two").read(rank=2)
    for bad in (-1, True, "0"):
        with pytest.raises(ConfigError, match="rank must be an int"):
            service.reader("two").read(rank=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="step must be"):
        service.reader("two").read(step=-1)
    with pytest.raises(ConfigError, match="job must be"):
        Reader("a/b", registry=service.client, stores=service.directory)
    for ckpt in ranks:
        ckpt.close()


class CommitsWhileLocated:
    """The reader's registry: after each ``locate_rank`` of the reader's first question about a
    step, the running job (one rank, keep_committed=1) commits its next step, which evicts the
    step located. Up to ``commits`` times."""

    def __init__(self, service: Service, ckpt: Checkpointer, commits: int) -> None:
        self.service, self.ckpt, self.commits = service, ckpt, commits
        self.located: list[int] = []

    def latest_committed(self, job: str) -> int | None:
        return self.service.client.latest_committed(job)

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        located = self.service.client.locate_rank(job, step, rank)
        if self.commits > 0 and step not in self.located:
            self.located.append(step)
            self.commits -= 1
            save_step([self.ckpt], self.service.registry.latest_committed(job) + 1)  # type: ignore[operator]
        return located


def test_a_step_evicted_while_it_is_read_is_read_again_at_the_newest() -> None:
    service = Service()
    (ckpt,) = running_job(service, "racing", steps=3, world_size=1, keep_committed=1)
    registry = CommitsWhileLocated(service, ckpt, commits=1)
    restored = Reader("racing", registry=registry, stores=service.directory, timeout_s=lambda: 5.0).read()
    assert registry.located == [2]  # step 2 was located, then evicted by step 3's commit
    assert restored is not None and restored.step == 3
    assert_same(restored.state, state_of(0, 3))
    ckpt.close()


def test_a_read_evicted_every_time_gives_up_naming_the_steps() -> None:
    service = Service()
    (ckpt,) = running_job(service, "outrun", steps=1, world_size=1, keep_committed=1)
    registry = CommitsWhileLocated(service, ckpt, commits=READ_TRIES)
    reader = Reader("outrun", registry=registry, stores=service.directory, timeout_s=lambda: 5.0)
    with pytest.raises(NoCheckpointError, match=r"steps \[0, 1, 2\] were each evicted") as raised:
        reader.read()
    assert raised.value.steps == [0, 1, 2]
    given = CommitsWhileLocated(service, ckpt, commits=1)
    newest = service.registry.latest_committed("outrun")
    with pytest.raises(NoCheckpointError, match=f"step {newest} was evicted while it was read"):
        Reader("outrun", registry=given, stores=service.directory, timeout_s=lambda: 5.0).read(step=newest)
    ckpt.close()


def test_a_committed_step_whose_shards_are_lost_is_not_read_again() -> None:
    """Only eviction is retried: a step still committed whose shards are gone fails as a
    restore would, naming the lost shards."""
    service = Service()
    ranks = running_job(service, "lost", steps=1, local_copy=False)
    for node in sorted(set(service.registry.locate("lost", 0)[0].nodes.values()))[:2]:
        service.stores[node].drop("lost")
    asked = len(service.client.calls)
    with pytest.raises(InsufficientShardsError, match="rank 0 step 0"):
        service.reader("lost").read()
    assert service.client.calls[asked:].count("latest_committed") == 1
    for ckpt in ranks:
        ckpt.abandon()
