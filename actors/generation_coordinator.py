"""The generation coordinator: the per-run Ray actor over ``ray_ckpt.core.generations.Generations``
(its module docstring tells the rendezvous and the hang watcher this actor serves). Its replies
are that module's frozen records; callers reach it through
``ray_ckpt.transport.coordinator_client.CoordinatorClient``, which bounds every call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import ray

from ray_ckpt.core.generations import (
    BeginReply,
    CoordinatorReport,
    Generations,
    JoinReply,
    Member,
    beat_interval_s,
    hang_bound_s,
)


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@ray.remote(num_cpus=0, max_restarts=0)
class GenerationCoordinator:
    """The per-run actor over ``Generations`` (see the module docstring)."""

    def __init__(self, hang_timeout_s: float, watch_interval_s: float = 0.25) -> None:
        self._gens = Generations()
        self._changed = asyncio.Condition()
        self._hang_timeout_s = hang_timeout_s  # as asked; the bound used is hang_bound_s of it
        self._hang_s = hang_timeout_s
        self._beat_s = beat_interval_s(hang_timeout_s, 1)
        self._watch_interval_s = watch_interval_s
        self._killed: list[dict[str, Any]] = []
        self._watcher: asyncio.Task[None] | None = None
        self._alive: set[str] | None = None  # alive node ids as of the watcher's last tick

    def _try_form(self, now: float) -> None:
        """Form the next generation if every rank joined from a live process (caller holds
        the condition)."""
        if self._alive is not None:
            self._gens.drop_dead(self._alive, now, self._hang_s)
        if self._gens.complete():
            self._gens.form(now)
            self._changed.notify_all()

    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def begin(self, world_size: int) -> BeginReply:
        """A full start of ``world_size`` workers: a new epoch and its first generation."""
        self._ensure_watcher()
        async with self._changed:
            self._hang_s = hang_bound_s(self._hang_timeout_s, world_size)
            self._beat_s = beat_interval_s(self._hang_timeout_s, world_size)
            number = self._gens.begin(world_size, time.time(), self._beat_s)
            self._changed.notify_all()
        return BeginReply(self._gens.epoch, number, self._gens.attempt(number))

    async def epoch(self) -> int:
        return self._gens.epoch

    async def register(self, member: Member, number: int) -> bool:
        async with self._changed:
            return self._gens.register(member, number, time.time())

    async def beat(self, member: Member, suspect: bool = False, orphaned: bool = False) -> bool:
        """Record a heartbeat (``suspect``: the member saw a gloo connection of its generation
        close; ``orphaned``: its node's raylet is gone); True when the member must leave its
        generation now (``Generations.must_leave``: a peer is lost or a round to replace the
        generation is open without it)."""
        now = time.time()
        self._gens.beat(member, now, suspect=suspect, orphaned=orphaned)
        self._gens.find_lost(now, self._alive)
        return self._gens.must_leave(member)

    async def finish(self, member: Member) -> None:
        """``member``'s training function returned: its beats stop and that is no loss."""
        self._gens.finish(member)

    async def join(self, member: Member, timeout_s: float) -> JoinReply:
        """Wait until a generation with ``member`` forms (``JoinStatus.FORMED``, with the ranks
        whose process the generation before did not have), or ``timeout_s`` runs out
        (``TIMEOUT``, naming the missing ranks), or a full start overtakes it (``SUPERSEDED``),
        or its node is going (``DOOMED``): ``Generations.join``, ``join_reply`` and ``give_up``
        make the replies."""
        self._ensure_watcher()
        deadline = time.monotonic() + timeout_s
        async with self._changed:
            after = 0 if self._gens.current is None else self._gens.current.number
            refused = self._gens.join(member, time.time())
            if refused is not None:
                return refused
            self._try_form(time.time())
            while True:
                reply = self._gens.join_reply(member, after)
                if reply is not None:
                    return reply
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._gens.give_up(member)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, self._watch_interval_s))

    async def publish(self, number: int, address: str) -> None:
        async with self._changed:
            if self._gens.current is not None and self._gens.current.number == number:
                self._gens.current.address = address
                self._changed.notify_all()

    async def address(self, number: int, timeout_s: float) -> str | None:
        """Generation ``number``'s rendezvous address, or None if it is superseded or late."""
        deadline = time.monotonic() + timeout_s
        async with self._changed:
            while True:
                current = self._gens.current
                if current is None or current.number != number:
                    return None
                if current.address is not None:
                    return current.address
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)

    async def report(self) -> CoordinatorReport:
        """The generations formed after failures, the members killed as hung, and the round."""
        return CoordinatorReport(
            epoch=self._gens.epoch,
            generation=None if self._gens.current is None else self._gens.current.number,
            history=tuple(self._gens.history),
            hung_killed=tuple(self._killed),
            pending=tuple(sorted(self._gens.pending)),
        )

    async def _watch(self) -> None:
        """Form a generation when its round is complete; kill hung members."""
        while True:
            await asyncio.sleep(self._watch_interval_s)
            now = time.time()
            try:
                alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            except Exception:  # the GCS is briefly unreachable: try again next tick
                continue
            self._alive = alive
            async with self._changed:
                self._gens.find_lost(now, alive)
                self._try_form(now)
                hung = [m for m in self._gens.hung(now, self._hang_s) if m.node_id in alive]
            for member in hung:
                if any(k["incarnation"] == member.incarnation for k in self._killed):
                    continue
                self._killed.append(
                    {"rank": member.rank, "pid": member.pid, "incarnation": member.incarnation, "time": now}
                )
                strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(member.node_id, soft=False)
                ray.remote(num_cpus=0)(_kill_pid).options(scheduling_strategy=strategy).remote(member.pid)
