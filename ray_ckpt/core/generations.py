"""Generations of an in-place job: which worker processes train together, and their rendezvous.

A generation is one process group over all ``world_size`` ranks. A full start of the worker
group (Ray Train's ``on_start`` for every worker) begins a generation whose process group Ray
sets up. After a failure, the survivors and the replacement ``join``; once every rank has
joined with a live process, the next generation forms, its rank 0 opens a TCP store on a free
port and ``publish``-es the address, and the others connect to it. A rank that waits longer
than its timeout is taken out of the round (it then fails, and Ray Train restarts workers).

``Generations`` is the bookkeeping, a pure class; ``actors.generation_coordinator`` holds the
Ray actor around it, one per run, owned by the run's controller. It also watches heartbeats: a member of
the current generation that has not beaten for ``hang_timeout_s`` (its process stopped, or
stuck outside Python) is killed, so Ray sees a dead worker and replaces it; a job too large for
one actor to take every rank's beat at that rate gets a longer bound (``hang_bound_s``).

The actor's replies are the frozen records here (``BeginReply``, ``JoinReply`` with its
``JoinStatus``, ``CoordinatorReport``): they cross Ray by pickle, and
``ray_ckpt.transport.coordinator_client.CoordinatorClient`` hands them to its callers as they are.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from typing import Any

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


class JoinStatus(enum.Enum):
    """How a join ended: its generation formed; the wait ran out (the member left the round);
    or a full start of the worker group (a new epoch) overtook it."""

    FORMED = "formed"
    TIMEOUT = "timeout"
    SUPERSEDED = "superseded"


@dataclasses.dataclass(frozen=True)
class JoinReply:
    """The coordinator's answer to a join. ``FORMED``: ``generation``, its ``attempt`` id,
    ``formed_at``, ``round_started`` (when the round's first member joined) and ``replaced``
    (the ranks whose process the generation before did not have: empty when the same processes
    go on). ``TIMEOUT``: ``missing``, the ranks that had not joined. ``SUPERSEDED``: nothing
    more. A field its status does not name keeps its default."""

    status: JoinStatus
    generation: int = 0
    attempt: str = ""
    formed_at: float = 0.0
    round_started: float | None = None
    replaced: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class BeginReply:
    """A full start's answer: the new ``epoch``, the ``generation`` Ray's process group carries
    and its ``attempt`` id."""

    epoch: int
    generation: int
    attempt: str


@dataclasses.dataclass(frozen=True)
class CoordinatorReport:
    """What the coordinator can tell of its run: the ``epoch``, the current ``generation``
    (None before the first start), the ``history`` of generations formed after failures
    (``Generations.form``'s entries), the members killed as hung (``hung_killed``: rank, pid,
    incarnation, time) and the ranks ``pending`` in the open round."""

    epoch: int
    generation: int | None
    history: tuple[dict[str, Any], ...]
    hung_killed: tuple[dict[str, Any], ...]
    pending: tuple[int, ...]


@dataclasses.dataclass
class Formed:
    """A generation: its number, members by rank and, once rank 0 published it, the address."""

    number: int
    members: dict[int, Member]
    formed_at: float
    address: str | None = None


def generation_of(attempt: str | None) -> int | None:
    """The generation number in an attempt id of ``Generations.attempt`` (``<run>.g<n>``), or
    None for any other attempt id. Generation 1 is a run's first; every later one follows a
    failure (a full restart or an in-place recovery)."""
    if not isinstance(attempt, str):
        return None
    run, dot, tail = attempt.rpartition(".g")
    if not dot or not run or not tail.isdecimal() or not tail.isascii():
        return None
    return int(tail)


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

    def join_reply(self, member: Member, after: int) -> JoinReply | None:
        """The reply to ``member``'s join, made when generation ``after`` was current: FORMED
        once a newer generation formed with this very member, SUPERSEDED once its epoch is
        over, None while it still waits."""
        current = self.current
        if current is not None and current.number > after and current.members.get(member.rank) == member:
            formed = self.history[-1]
            return JoinReply(
                JoinStatus.FORMED,
                generation=current.number,
                attempt=self.attempt(current.number),
                formed_at=current.formed_at,
                round_started=formed["round_started"],
                replaced=tuple(formed["replaced"]),
            )
        if member.epoch != self.epoch:
            return JoinReply(JoinStatus.SUPERSEDED)
        return None

    def give_up(self, member: Member) -> JoinReply:
        """``member`` stops waiting: the TIMEOUT reply naming the ranks missing from the round,
        which ``member`` then leaves."""
        missing = tuple(sorted(set(range(self.world_size)) - set(self.pending)))
        self.leave(member.incarnation)
        return JoinReply(JoinStatus.TIMEOUT, missing=missing)

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
