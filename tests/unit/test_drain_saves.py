"""The Ray Train Checkpointer under a drain notice, without Ray: every step is saved whatever
``every`` says, new shards avoid the draining nodes, and a rank on a draining node hands its
place over (in place) or holds (full restarts) only at its first save after a step saved after
the notice committed, once the step it saves committed too; otherwise it trains on."""

from __future__ import annotations

import types
from typing import Any

import pytest

from ray_ckpt.core.generations import DrainNotice
from ray_ckpt.errors import CommitTimeoutError, HandedOver
from ray_ckpt.train import checkpointer as train_checkpointer
from ray_ckpt.train import inplace

NOTICE = DrainNotice(ranks=(2,), nodes=("drained",), deadline=None)


class Handle:
    def __init__(self, step: int, commits: bool) -> None:
        self.step, self.skipped, self.commits, self.waited = step, False, commits, False

    def wait(self, timeout_s: float | None = None) -> None:
        self.waited = True
        if not self.commits:
            raise CommitTimeoutError("not yet", job="j", step=self.step, missing_ranks=[0])


class Registry:
    def __init__(self) -> None:
        self.latest: int | None = None

    def latest_committed(self, job: str) -> int | None:
        return self.latest


def checkpointer(rank: int, notices: list[DrainNotice | None], commits: bool = True) -> Any:
    """A Ray Train Checkpointer of ``rank`` whose saves record (step, forced) and whose drain
    notice is ``notices[0]`` (a list the test changes)."""
    ckpt = train_checkpointer.Checkpointer.__new__(train_checkpointer.Checkpointer)
    ckpt._drain_first, ckpt._held = None, False
    ckpt._saves = types.SimpleNamespace(avoid=frozenset())
    ckpt._registry = Registry()
    ckpt.config = types.SimpleNamespace(commit_timeout_s=30.0)
    ckpt.identity = types.SimpleNamespace(rank=rank, job="j")
    ckpt.saved = []

    def save(step: int, state: Any, force: bool) -> Handle:
        ckpt.saved.append((step, force))
        return Handle(step, commits)

    ckpt._save = save
    ckpt._drain_notice = lambda: notices[0]
    return ckpt


@pytest.fixture
def in_place(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An in-place run's worker: the handovers the coordinator took."""
    taken: list[str] = []
    monkeypatch.setattr(inplace, "current_attempt", lambda: "run.g1")
    monkeypatch.setattr(inplace, "hand_over", lambda: taken.append("handed") or HandedOver("rank 2: handed over"))
    return taken


def test_without_a_notice_saves_go_as_asked(in_place: list[str]) -> None:
    ckpt = checkpointer(2, [None])
    ckpt.save(1, {})
    assert ckpt.saved == [(1, False)] and ckpt._saves.avoid == frozenset()


def test_a_draining_rank_hands_over_once_a_step_after_the_notice_committed(in_place: list[str]) -> None:
    notices: list[DrainNotice | None] = [NOTICE]
    ckpt = checkpointer(2, notices)
    ckpt.save(7, {})  # the first step after the notice: saved, forced, nothing more
    assert ckpt.saved == [(7, True)] and ckpt._saves.avoid == {"drained"} and in_place == []
    ckpt.save(8, {})  # step 7 has not committed (another rank had not saved it): train on
    assert in_place == []
    ckpt._registry.latest = 8
    with pytest.raises(HandedOver):
        ckpt.save(9, {})  # a step after the notice committed: step 9 commits, then the handover
    assert in_place == ["handed"] and ckpt.saved[-1] == (9, True)


def test_a_peer_of_the_draining_rank_saves_every_step_and_never_hands_over(in_place: list[str]) -> None:
    notices: list[DrainNotice | None] = [NOTICE]
    ckpt = checkpointer(0, notices)
    ckpt._registry.latest = 100
    for step in (7, 8, 9):
        ckpt.save(step, {})
    assert ckpt.saved == [(7, True), (8, True), (9, True)] and in_place == []
    notices[0] = None  # the replacement trains elsewhere: the notice is gone
    ckpt.save(10, {})
    assert ckpt.saved[-1] == (10, False) and ckpt._saves.avoid == frozenset()


def test_a_step_that_does_not_commit_in_time_is_tried_again_at_the_next(in_place: list[str]) -> None:
    ckpt = checkpointer(2, [NOTICE], commits=False)
    ckpt.save(7, {})
    ckpt._registry.latest = 7
    assert ckpt.save(8, {}).waited and in_place == []


def test_without_in_place_the_draining_rank_holds_instead_of_handing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inplace, "current_attempt", lambda: None)
    held: list[int] = []
    ckpt = checkpointer(2, [NOTICE])
    ckpt._hold = lambda step, notice: held.append(step)
    ckpt.save(7, {})
    ckpt._registry.latest = 7
    ckpt.save(8, {})
    assert held == [8] and ckpt.saved == [(7, True), (8, True)]
