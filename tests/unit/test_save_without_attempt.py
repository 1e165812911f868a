"""A save by a Checkpointer that has no attempt and never restored: with more than one rank it is
refused (the registry tells worker groups without an attempt apart only by their restores), with
one rank it joins the registry's attempt as a restore would. So no step commits with ranks of two
worker groups: checked over every interleaving of two groups' restores and saves, with real
checkpointers, registry and stores in one process (``in_process_service``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support.in_process_service import Service

from ray_ckpt import ConfigError, RayCkptError
from ray_ckpt.errors import StaleAttemptError

REFUSED = r"call restore\(\) first or pass attempt="


def state_of(group: str, rank: int, step: int) -> dict[str, Any]:
    return {"w": torch.full((64,), float(step)), "by": f"{group}{rank}"}


def test_two_groups_saving_without_restoring_never_commit_one_step_together() -> None:
    """Group A's rank 0 saves step 0 and A dies before its rank 1 does; group B's rank 1 then
    saves step 0. Both saves are refused, naming the way out; nothing is staged."""
    service = Service()
    a0 = service.checkpointer(job="mixed", rank=0, world_size=2, node="n0")
    b1 = service.checkpointer(job="mixed", rank=1, world_size=2, node="n1")
    for ckpt in (a0, b1):
        with pytest.raises(ConfigError, match=REFUSED):
            ckpt.save(0, state_of("x", ckpt.rank, 0))
        assert ckpt.attempt is None
    assert service.registry.jobs() == {} and service.registry.latest_committed("mixed") is None
    for ckpt in (a0, b1):
        ckpt.close()


def test_a_restore_of_a_given_step_joins_nothing_so_a_save_after_it_is_refused_too() -> None:
    service = Service()
    ranks = [service.checkpointer(job="given", rank=r, world_size=2, node=f"n{r}") for r in range(2)]
    for ckpt in ranks:
        assert ckpt.restore() is None
    for handle in [ckpt.save(0, state_of("a", ckpt.rank, 0)) for ckpt in ranks]:
        handle.wait(timeout_s=30)
    reader = service.checkpointer(job="given", rank=1, world_size=2, node="n2")
    restored = reader.restore(step=0)
    assert restored is not None and reader.attempt is None
    with pytest.raises(ConfigError, match=REFUSED):
        reader.save(1, state_of("b", 1, 1))
    for ckpt in (*ranks, reader):
        ckpt.close()


def test_one_rank_saving_without_restoring_joins_the_registrys_attempt_and_fences_the_one_before() -> None:
    """One rank: its first save joins the registry's attempt, as a restore would (nothing is
    loaded); a later Checkpointer of the same rank saving so opens the next attempt, and the
    earlier one's next stage is refused instead of committing over it."""
    service = Service()
    first = service.checkpointer(job="alone", rank=0, world_size=1, node="n0")
    first.save(0, state_of("a", 0, 0)).wait(timeout_s=30)
    assert first.attempt is not None
    assert service.registry.committed_by("alone", 0) == first.attempt
    second = service.checkpointer(job="alone", rank=0, world_size=1, node="n1")
    second.save(1, state_of("b", 0, 1)).wait(timeout_s=30)
    assert second.attempt not in (None, first.attempt)
    with pytest.raises(StaleAttemptError):
        first.save(2, state_of("a", 0, 2)).wait(timeout_s=30)
    assert service.registry.committed_steps("alone") == [0, 1]
    assert service.client.calls.count("rollback") == 0 and service.client.calls.count("mark_unrestorable") == 0
    first.abandon()
    second.close()


# ---- every interleaving of two groups ---------------------------------------------------

Event = tuple[str, str, int]  # (group, "restore" | "save", rank)


def merges(a: list[Event], b: list[Event]) -> Iterator[list[Event]]:
    """Every interleaving of ``a`` and ``b`` that keeps each one's order."""
    for places in itertools.combinations(range(len(a) + len(b)), len(a)):
        left, right = iter(a), iter(b)
        yield [next(left) if i in places else next(right) for i in range(len(a) + len(b))]


def old_group_runs() -> Iterator[list[Event]]:
    """The replaced group: each rank makes any of its calls or none (it may die at any point, or
    linger and save late), a rank's restore before its save; a save without a restore included."""
    choices: list[tuple[str, ...]] = [(), ("restore",), ("save",), ("restore", "save")]
    for first, second in itertools.product(choices, repeat=2):
        yield from merges([("old", c, 0) for c in first], [("old", c, 1) for c in second])


def new_group_runs() -> Iterator[list[Event]]:
    """The group that replaced it, as the README's loop: every rank restores, then every rank
    saves the step after the one it restored."""
    for restores, saves in itertools.product(itertools.permutations(range(2)), repeat=2):
        yield [("new", "restore", r) for r in restores] + [("new", "save", r) for r in saves]


def runs() -> Iterator[list[Event]]:
    """Both groups' calls interleaved in every way in which the replaced group restores no more
    once the new one restores (docs/commit-protocol.md, *Attempts without an attempt*)."""
    for old, new in itertools.product(old_group_runs(), new_group_runs()):
        for run in merges(old, new):
            first_new_restore = next(i for i, e in enumerate(run) if e[0] == "new")
            if all(i < first_new_restore for i, e in enumerate(run) if e[:2] == ("old", "restore")):
                yield run


def play(run: list[Event]) -> tuple[set[str], list[str]]:
    """Play ``run``; after every call, check that each committed step holds one group's ranks.
    Returns the groups that committed a step, and what each call did."""
    service = Service()
    ranks = {
        (group, rank): service.checkpointer(job="job", rank=rank, world_size=2, node=f"n{2 * (group == 'new') + rank}")
        for group in ("old", "new")
        for rank in range(2)
    }
    next_step = dict.fromkeys(ranks, 0)
    group_of = {ckpt.writer: group for (group, _), ckpt in ranks.items()}
    committed: set[str] = set()
    log = []
    for group, call, rank in run:
        ckpt = ranks[(group, rank)]
        try:
            if call == "restore":
                restored = ckpt.restore()
                next_step[(group, rank)] = 0 if restored is None else restored.step + 1
            else:
                step = next_step[(group, rank)]
                ckpt.save(step, state_of(group, rank, step)).staged(timeout_s=30)
            log.append(f"{group}{rank} {call}: ok")
        except RayCkptError as error:
            log.append(f"{group}{rank} {call}: {type(error).__name__}")
        for step in service.registry.committed_steps("job"):
            groups = {group_of[record.first.writer] for record in service.registry.locate("job", step).values()}
            assert len(groups) == 1, f"step {step} committed with ranks of groups {sorted(groups)}: {log}"
            committed |= groups
    for ckpt in ranks.values():
        ckpt.abandon()
    return committed, log


def test_no_interleaving_of_two_groups_commits_a_step_with_ranks_of_both() -> None:
    played = [play(run) for run in runs()]
    assert len(played) > 900
    # the check had something to check: each group commits in some runs, and saves were refused
    assert {"old", "new"} <= set().union(*(committed for committed, _ in played))
    calls = [line for _, log in played for line in log]
    assert any(line.endswith("save: ConfigError") for line in calls)
    assert any(line.endswith("save: StaleAttemptError") for line in calls)
