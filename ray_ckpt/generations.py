"""Generations of an in-place job: which worker processes train together, and their rendezvous.

A generation is one process group over all ``world_size`` ranks. A full start of the worker
group (Ray Train's ``on_start`` for every worker) begins a generation whose process group Ray
sets up. After a failure, the survivors and the replacement ``join``; once every rank has
joined with a live process, the next generation forms, its rank 0 opens a TCP store on a free
port and ``publish``-es the address, and the others connect to it. A rank that waits longer
than its timeout is taken out of the round (it then fails, and Ray Train restarts workers).

``Generations`` is the bookkeeping, a pure class; ``GenerationCoordinator`` is the Ray actor
around it, one per run, owned by the run's controller. It also watches heartbeats: a member of
the current generation that has not beaten for ``hang_timeout_s`` (its process stopped, or
stuck outside Python) is killed, so Ray sees a dead worker and replaces it; a job too large for
one actor to take every rank's beat at that rate gets a longer bound (``hang_bound_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
import uuid
from typing import Any

import ray

BEATS_PER_S = 200  # heartbeats a second the run's one coordinator takes, leaving room for joins


def hang_bound_s(hang_timeout_s: float, world_size: int) -> float:
    """The hang bound in effect for ``world_size`` ranks: ``hang_timeout_s``, or longer where
    every rank beating every bound / 4 would send the coordinator more than ``BEATS_PER_S``
    heartbeats a second. Beats queued behind an overloaded actor would arrive late and get
    live members killed as hung; a larger job detects hangs later instead."""
    return max(hang_timeout_s, 4 * world_size / BEATS_PER_S)


@dataclasses.dataclass(frozen=True)
class Member:
    """One worker process: its world rank, a token unique to the process and run
    (``incarnation``), its node, pid and host, and the epoch (full start) it belongs to."""

    rank: int
    incarnation: str
    node_id: str
    pid: int
    host: str
    epoch: int


@dataclasses.dataclass
class Formed:
    """A generation: its number, members by rank and, once rank 0 published it, the address."""

    number: int
    members: dict[int, Member]
    formed_at: float
    address: str | None = None


class Generations:
    """The generations of one run. Not thread-safe (the actor runs one coroutine at a time)."""

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex[:12]
        self.epoch = 0
        self.world_size = 0
        self.current: Formed | None = None
        self.pending: dict[int, Member] = {}
        self.round_started: float | None = None
        self.beats: dict[str, tuple[float, Member]] = {}
        self.history: list[dict[str, Any]] = []

    def attempt(self, number: int) -> str:
        """The ray_ckpt attempt id of generation ``number`` (unique across runs)."""
        return f"{self.run}.g{number}"

    def begin(self, world_size: int, now: float) -> int:
        """A full start: a new epoch whose first generation Ray's process group carries.
        Joins of older epochs are dropped. Returns the generation number."""
        self.epoch += 1
        self.world_size = world_size
        self.pending.clear()
        self.round_started = None
        number = (self.current.number if self.current else 0) + 1
        self.current = Formed(number, {}, now)
        return number

    def register(self, member: Member, number: int, now: float) -> bool:
        """A member of a full start announces itself; False if that generation is superseded."""
        if self.current is None or self.current.number != number or member.epoch != self.epoch:
            return False
        self.current.members[member.rank] = member
        self.beat(member, now)
        return True

    def beat(self, member: Member, now: float) -> None:
        self.beats[member.incarnation] = (now, member)

    def join(self, member: Member, now: float) -> bool:
        """Ask to be in the next generation (replacing an older process of the same rank);
        False if the member's epoch is over."""
        if member.epoch != self.epoch:
            return False
        if not self.pending:
            self.round_started = now
        self.pending[member.rank] = member
        self.beat(member, now)
        return True

    def leave(self, incarnation: str) -> None:
        """Take a member out of the round (it gave up waiting)."""
        for rank, member in list(self.pending.items()):
            if member.incarnation == incarnation:
                del self.pending[rank]
        if not self.pending:
            self.round_started = None

    def drop_dead(self, alive_nodes: set[str], now: float, beat_timeout_s: float) -> list[Member]:
        """Take out of the round the members on dead nodes or silent for ``beat_timeout_s``."""
        dropped = []
        for rank, member in list(self.pending.items()):
            last = self.beats.get(member.incarnation, (0.0, member))[0]
            if member.node_id not in alive_nodes or now - last > beat_timeout_s:
                dropped.append(self.pending.pop(rank))
        return dropped

    def complete(self) -> bool:
        return self.world_size > 0 and len(self.pending) == self.world_size

    def form(self, now: float) -> Formed:
        """The next generation, of the members that joined. Its history entry names the ranks
        whose process is not the one the generation before had (``replaced``: a peer was lost
        there; empty when the same processes go on)."""
        number = (self.current.number if self.current else 0) + 1
        before = self.current.members if self.current else {}
        replaced = sorted(rank for rank, member in self.pending.items() if before.get(rank) != member)
        self.current = Formed(number, dict(self.pending), now)
        self.history.append(
            {
                "generation": number,
                "attempt": self.attempt(number),
                "round_started": self.round_started,
                "formed_at": now,
                "pids": {rank: m.pid for rank, m in sorted(self.pending.items())},
                "replaced": replaced,
            }
        )
        self.pending.clear()
        self.round_started = None
        return self.current

    def hung(self, now: float, hang_timeout_s: float) -> list[Member]:
        """Members of the current generation whose last heartbeat is older than the bound."""
        if self.current is None:
            return []
        waiting = {m.incarnation for m in self.pending.values()}
        return [
            member
            for member in self.current.members.values()
            if member.incarnation not in waiting
            and now - self.beats.get(member.incarnation, (now, member))[0] > hang_timeout_s
        ]


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

    async def begin(self, world_size: int) -> dict[str, Any]:
        self._ensure_watcher()
        async with self._changed:
            self._hang_s = hang_bound_s(self._hang_timeout_s, world_size)
            number = self._gens.begin(world_size, time.time())
            self._changed.notify_all()
        return {"epoch": self._gens.epoch, "generation": number, "attempt": self._gens.attempt(number)}

    async def epoch(self) -> int:
        return self._gens.epoch

    async def register(self, member: Member, number: int) -> bool:
        async with self._changed:
            return self._gens.register(member, number, time.time())

    async def beat(self, member: Member) -> bool:
        """Record a heartbeat; True when a round to replace this member's generation has been
        open for over a second without it (its collectives are stuck on a lost peer)."""
        now = time.time()
        self._gens.beat(member, now)
        started = self._gens.round_started
        waiting = self._gens.pending.get(member.rank)
        return started is not None and now - started > 1.0 and (waiting is None or waiting != member)

    async def join(self, member: Member, timeout_s: float) -> dict[str, Any]:
        """Wait until a generation with ``member`` forms: ``{"status": "formed", "generation",
        "attempt", "formed_at", "round_started", "replaced"}`` (the ranks whose process the
        generation before did not have); or ``{"status": "timeout", "missing"}``
        after ``timeout_s``; or ``{"status": "superseded"}`` when a full start overtook it."""
        self._ensure_watcher()
        deadline = time.monotonic() + timeout_s
        async with self._changed:
            after = 0 if self._gens.current is None else self._gens.current.number
            if not self._gens.join(member, time.time()):
                return {"status": "superseded"}
            self._try_form(time.time())
            while True:
                current = self._gens.current
                if current is not None and current.number > after and current.members.get(member.rank) == member:
                    return {
                        "status": "formed",
                        "generation": current.number,
                        "attempt": self._gens.attempt(current.number),
                        "formed_at": current.formed_at,
                        "round_started": self._gens.history[-1]["round_started"],
                        "replaced": self._gens.history[-1]["replaced"],
                    }
                if member.epoch != self._gens.epoch:
                    return {"status": "superseded"}
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self._gens.world_size)) - set(self._gens.pending))
                    self._gens.leave(member.incarnation)
                    return {"status": "timeout", "missing": missing}
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

    async def report(self) -> dict[str, Any]:
        """The generations formed after failures, the members killed as hung, and the round."""
        return {
            "epoch": self._gens.epoch,
            "generation": None if self._gens.current is None else self._gens.current.number,
            "history": list(self._gens.history),
            "hung_killed": list(self._killed),
            "pending": sorted(self._gens.pending),
        }

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
