"""Aborting every process group on a lost peer, with fake groups that record their aborts (the
NCCL path: no GPU needed), and the in-place worker's teardown order for each backend."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ray_ckpt.core.generations import LEAVE, BeatReply
from ray_ckpt.train import _torch_compat, inplace_worker, process_groups


class FakeGroup:
    """A process group that records its abort (or fails it) in a shared log."""

    def __init__(self, name: str, log: list[str], fails: bool = False) -> None:
        self.name, self.log, self.fails = name, log, fails

    def abort(self) -> None:
        if self.fails:
            self.log.append(f"abort {self.name} raised")
            raise RuntimeError(f"{self.name} is already shut")
        self.log.append(f"abort {self.name}")


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Groups WORLD, fsdp, tp (oldest first) behind _torch_compat; NCCL's group call recorded."""
    entries: list[str] = []
    groups = [FakeGroup("world", entries), FakeGroup("fsdp", entries), FakeGroup("tp", entries)]
    monkeypatch.setattr(_torch_compat, "process_groups", lambda: list(groups))

    @contextlib.contextmanager
    def nccl_group(aborting: list[Any]) -> Iterator[None]:
        entries.append(f"group start ({len(aborting)})")
        yield
        entries.append("group end")

    monkeypatch.setattr(_torch_compat, "nccl_group", nccl_group)
    return entries


def test_every_group_is_aborted_once_newest_first_inside_one_nccl_group_call(log: list[str]) -> None:
    aborted = process_groups.abort_all()
    assert [g.name for g in aborted] == ["tp", "fsdp", "world"]
    assert log == ["group start (3)", "abort tp", "abort fsdp", "abort world", "group end"]


def test_a_group_whose_abort_raises_does_not_keep_the_others_alive(
    log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = [FakeGroup("world", log), FakeGroup("fsdp", log, fails=True), FakeGroup("tp", log)]
    monkeypatch.setattr(_torch_compat, "process_groups", lambda: list(groups))
    assert [g.name for g in process_groups.abort_all()] == ["tp", "world"]
    assert log == ["group start (3)", "abort tp", "abort fsdp raised", "abort world", "group end"]


class FakeNccl:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def _group_start(self) -> None:
        self.log.append("ncclGroupStart")

    def _group_end(self) -> None:
        self.log.append("ncclGroupEnd")


class GroupWithBackend:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def _get_backend(self, device: torch.device) -> Any:
        if self.backend is None:
            raise RuntimeError("no backend for cuda")
        return self.backend


def test_nccl_group_brackets_with_the_first_nccl_backend_and_is_a_no_op_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries: list[str] = []
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNccl, raising=False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with _torch_compat.nccl_group([GroupWithBackend(None), GroupWithBackend(FakeNccl(entries))]):
        entries.append("abort")
    assert entries == ["ncclGroupStart", "abort", "ncclGroupEnd"]
    entries.clear()
    with _torch_compat.nccl_group([GroupWithBackend(None), GroupWithBackend(object())]):  # gloo only
        entries.append("abort")
    assert entries == ["abort"]


@pytest.mark.parametrize(
    ("backend", "nccl"),
    [("nccl", True), ("cuda:nccl", True), ("cpu:gloo,cuda:nccl", True), ("CPU:GLOO, CUDA:NCCL", True), ("gloo", False),
     ("cpu:gloo", False), ("undefined", False)],
)  # fmt: skip
def test_nccl_is_read_per_device_type_from_the_backend_string(backend: str, nccl: bool) -> None:
    """``dist.get_backend()`` of a group made with "cpu:gloo,cuda:nccl" (DCP's asynchronous save
    on GPUs needs one) is that whole string: it runs NCCL for CUDA tensors all the same."""
    assert process_groups.uses_nccl(backend) is nccl


def test_the_backends_of_a_backend_string_are_its_device_types_backends() -> None:
    assert process_groups.backends("cpu:gloo,cuda:nccl") == {"gloo", "nccl"}
    assert process_groups.backends("gloo") == {"gloo"} and process_groups.backends("") == frozenset()
    with pytest.raises(TypeError, match="cpu:gloo,cuda:nccl"):
        process_groups.backends(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "gloo"])
def test_the_teardown_shuts_gloo_connections_and_aborts_nccl_groups_before_destroying(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destroy of an NCCL group stuck on a lost peer hangs: every group is aborted first,
    for a group with gloo on the CPU and NCCL on CUDA too; gloo's collectives (a gloo group's,
    a mixed group's CPU side, a gloo subgroup beside NCCL) are woken by shutting gloo's
    connections, which comes first: it cannot hang."""
    calls: list[str] = []
    worker = inplace_worker._Worker.__new__(inplace_worker._Worker)  # no Ray Train context needed
    worker.backend = backend

    def record(call: str, result: Any) -> Callable[[], Any]:
        return lambda: calls.append(call) or result  # type: ignore[func-returns-value]

    monkeypatch.setattr(worker, "_shut_gloo", record("shut gloo", 0), raising=False)
    monkeypatch.setattr(process_groups, "abort_all", record("abort all", []))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append("destroy"))
    worker._teardown()
    assert calls == ["shut gloo", "abort all", "destroy"] if "nccl" in backend else ["shut gloo", "destroy"]


class LeaveCoordinator:
    """Answers every heartbeat with "a peer of your generation is lost: leave"."""

    def __init__(self) -> None:
        self.beats = 0
        self.store = None  # no node store: beats go straight to the coordinator

    def beat(self, member: Any, timeout_s: float, *, suspect: bool = False, orphaned: bool = False) -> BeatReply:
        self.beats += 1
        return LEAVE


class RecordedInterrupts:
    def __init__(self, log: list[int], coordinator: LeaveCoordinator) -> None:
        self.log, self.coordinator = log, coordinator

    def fire(self) -> bool:
        self.log.append(self.coordinator.beats)
        return True


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_a_heartbeat_told_to_leave_interrupts_and_aborts_every_nccl_group_once_per_generation(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank may be computing or blocked in an NCCL collective on a lost peer: its heartbeat
    thread interrupts the training function and aborts every group (not only WORLD), once per
    generation however many beats say so, with NCCL for CUDA alone or beside gloo for the CPU;
    a new generation can be left again."""
    aborts: list[int] = []
    fired: list[int] = []
    coordinator = LeaveCoordinator()

    def abort_all() -> list[Any]:
        aborts.append(coordinator.beats)
        return []

    monkeypatch.setattr(process_groups, "abort_all", abort_all)
    monkeypatch.setattr(inplace_worker.PROCESS, "interrupts", RecordedInterrupts(fired, coordinator))
    world = types.SimpleNamespace(WORLD=object())  # the worker's view of torch.distributed, initialized
    monkeypatch.setattr(inplace_worker, "dist", types.SimpleNamespace(is_initialized=lambda: True, group=world))
    monkeypatch.setattr(inplace_worker.PROCESS, "gloo", None)
    worker = inplace_worker._Worker.__new__(inplace_worker._Worker)
    settings = inplace_worker._Settings(120.0, 10.0, 300.0, backend)
    worker.role = inplace_worker._Role(
        coordinator=coordinator,  # type: ignore[arg-type]
        epoch=1,
        generation=None,
        attempt=None,
        settings=settings,
    )
    worker.settings, worker.rank, worker.world_size, worker.backend = settings, 0, 4, backend
    worker.member, worker._beating, worker._store = None, threading.Event(), None  # type: ignore[assignment]
    worker._raylet = os.getppid()
    monkeypatch.setattr(inplace_worker.PROCESS, "generation", 1)

    def wait_for_beats(count: int) -> None:
        deadline = time.monotonic() + 10
        while coordinator.beats < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert coordinator.beats >= count

    worker._start_heartbeat()
    wait_for_beats(4)
    assert aborts == fired == [1]
    inplace_worker.PROCESS.generation = 2  # the rank joined the next generation
    wait_for_beats(coordinator.beats + 3)
    worker._beating.set()
    assert len(aborts) == len(fired) == 2 and aborts == fired
