"""Generations of an in-place job: which worker processes train together, and their rendezvous.

A generation is one process group over all ``world_size`` ranks. A full start of the worker
group (Ray Train's ``on_start`` for every worker) begins a generation whose process group Ray
sets up. After a failure, the survivors and the replacement ``join``; once every rank has
joined with a live process, the next generation forms, its rank 0 opens a TCP store on a free
port and ``publish``-es the address, and the others connect to it. A rank that waits longer
than its timeout is taken out of the round (it then fails, and Ray Train restarts workers).

``Generations`` is the bookkeeping, a pure class; ``ray_ckpt.actors.generation_coordinator`` holds the
Ray actor around it, one per run, owned by the run's controller. It also watches heartbeats: a member of
the current generation that has not beaten for ``hang_timeout_s`` (its process stopped, or
stuck outside Python) is killed, so Ray sees a dead worker and replaces it; a job too large for
one actor to take every rank's beat, one call each, at that rate gets a longer bound
(``hang_bound_s``). The stores relay ranks' calls in batches (``ray_ckpt.core.coordinator_relay``):
``beat_many`` takes many beats at once.

A member of the current generation is *lost* once it says its node's raylet is gone (its
worker process outlives the raylet a moment, and can still beat), once its node is dead
(``find_lost``), or once it has gone silent while its peers kept beating: it missed
``SILENT_BEATS`` beats in a row (and at least ``SILENT_MIN_S``) after a peer reported one of
its gloo connections closed (a process that dies closes its sockets), ``QUIET_BEATS`` (and at
least ``QUIET_MIN_S``) without such a report, or ``SILENT_BEATS`` (and ``SILENT_MIN_S``) once
its node's raylet did not answer the coordinator's probe (``unreachable``: a node that lost power,
its link, or its way to the head closes no socket, so no peer reports a closure; the actor probes
the node of every member ``silent`` for ``PROBE_AFTER_S``). Each member reports, once per generation, its
process's gloo pairs (those accepted on a gloo listener and those made since it started,
``Connections``); a closed connection its witness reported that way names the peer that
reported the same connection from its end, matched by both ends' full addresses. A closure
never makes its member lost on its own word while the member keeps beating: it stops counting
against the member once the coordinator took two beats of the member after it (one may have
been on its way before the member died), and the member must miss ``SILENT_BEATS`` beats and
``SILENT_MIN_S`` (a beat thread's pause, a GC's, of up to ``SILENT_MIN_S`` less a beat interval
is no loss) unless one peer saw every connection it shares with the member close, as all of a
dead process's close: then ``NAMED_SILENT_MIN_S`` suffices. A live member taken for lost costs
one more round (it is told to leave and rejoins with its process), so the bounds leave room for
a beat thread held up by a busy host. Silence is counted in its
peers' beats, and in seconds of the coordinator's own ``clock``, which stands still while the
coordinator takes nothing (a gap between two calls counts for one beat interval at most): a
coordinator that stalls and then takes a backlog of beats finds nobody silent. From the first
loss, and while a round to replace the generation is open, every member that has not joined is
told to leave at its next beat (``must_leave``): its worker interrupts its training function. A
member that ``finish``-ed its training function is never lost by silence (its beats stop on
purpose). A member whose node is going (it said its raylet is gone, or its node is dead) is
*doomed*: it leaves the round it is in and may not join another, so no generation forms with
a process about to die. ``tests/unit/test_loss_detection_model.py`` checks these rules under
generated interleavings.

The actor's replies are the frozen records here (``BeginReply``, ``JoinReply`` with its
``JoinStatus``, ``CoordinatorReport``): they cross Ray by pickle, and
``ray_ckpt.transport.coordinator_client.CoordinatorClient`` hands them to its callers as they are.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from typing import Any

BEATS_PER_S = 200  # heartbeats a second the run's one coordinator takes one call each, leaving room for joins
BATCHED_BEATS_PER_S = 5000  # ... taken in batches up the stores' relay tree: ~10 us of its CPU each (bench_rendezvous)
MIN_BEAT_INTERVAL_S = 0.1  # the most often a worker beats
POLL_S = 2.0  # the longest a coordinator call waits for a generation or its address before it answers "not yet"
SILENT_BEATS = 1  # beats missed in a row that make a member lost once a peer saw a connection close
SILENT_MIN_S = 0.5  # and the least silence that does: longer than a live member's beat thread pauses (a GC)
NAMED_SILENT_MIN_S = 0.25  # ... once a peer saw every connection it had with the member close
QUIET_BEATS = 5  # beats missed in a row that make a member lost without such a sign
QUIET_MIN_S = 3.0  # and the least silence that does: a beat thread may wait a second or more for the GIL or CPU
PROBE_AFTER_S = 0.3  # a member silent this long gets its node probed (``silent``; the actor probes)


def hang_bound_s(hang_timeout_s: float, world_size: int) -> float:
    """The hang bound in effect for ``world_size`` ranks: ``hang_timeout_s``, or longer where
    every rank beating every bound / 4 would send the coordinator more than ``BEATS_PER_S``
    heartbeats a second. Beats queued behind an overloaded actor would arrive late and get
    live members killed as hung; a larger job detects hangs later instead."""
    return max(hang_timeout_s, 4 * world_size / BEATS_PER_S)


def beat_interval_s(hang_timeout_s: float, world_size: int, *, batched: bool = False) -> float:
    """How often each of ``world_size`` workers beats: every ``MIN_BEAT_INTERVAL_S``, less often
    once the run's beats would pass ``BEATS_PER_S`` (``BATCHED_BEATS_PER_S`` for a worker whose
    beats go through its node's store, ``batched``), and at least four times per hang bound.
    The coordinator counts silence in the unbatched interval, so a faster beat is never taken
    for a silent one."""
    rate = BATCHED_BEATS_PER_S if batched else BEATS_PER_S
    return min(hang_bound_s(hang_timeout_s, world_size) / 4, max(MIN_BEAT_INTERVAL_S, world_size / rate))


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

    def to_wire(self) -> MemberWire:
        """The record as a plain tuple: Ray moves a batch of tuples faster than one of dataclass
        objects (its pickler reduces every object that is not a builtin one by one)."""
        return (self.rank, self.incarnation, self.node_id, self.pid, self.host, self.epoch)

    @classmethod
    def from_wire(cls, values: MemberWire) -> Member:
        rank, incarnation, node_id, pid, host, epoch = values
        return cls(rank, incarnation, node_id, pid, host, epoch)

    @property
    def waiting(self) -> Waiting:
        """What a joined member sends while it waits for its generation: (rank, incarnation,
        epoch), a third of the record's pickled size."""
        return (self.rank, self.incarnation, self.epoch)


Waiting = tuple[int, str, int]
"""A joined member's key as it polls for its generation (``Member.waiting``)."""

MemberWire = tuple[int, str, str, int, str, int]
"""A ``Member`` on the wire (``Member.to_wire``)."""

Address = tuple[str, int]
"""A TCP endpoint: (IP, port), an IPv4-mapped IPv6 address written as IPv4 (``address``)."""

Connection = tuple[Address, Address]
"""A TCP connection as one of its ends sees it: (local address, remote address)."""

Connections = tuple[int, tuple[Connection, ...]]
"""What a member reports of its sockets once per generation: the generation's number and the
connections its process accepted on a gloo listener or made since it started. A peer that sees
one of them close from the other end names this member (``Generations.find_lost``)."""


def address(ip: str, port: int) -> Address:
    """``(ip, port)`` as the two ends of one TCP connection both write it: a socket of one end
    may be IPv6 (``::ffff:10.0.0.1``) where the other's is IPv4 (``10.0.0.1``)."""
    return (ip.removeprefix("::ffff:"), int(port))


@dataclasses.dataclass(frozen=True)
class Beat:
    """One heartbeat of ``member``: ``suspect``, it saw a gloo connection it accepted close;
    ``orphaned``, its node's raylet is gone; ``closed``, the connections it saw close (each
    may name the peer that reported it, ``Connections``); ``connections``, its own, sent until
    a beat is taken after its generation formed."""

    member: Member
    suspect: bool = False
    orphaned: bool = False
    closed: tuple[Connection, ...] = ()
    connections: Connections | None = None

    def to_wire(self) -> BeatWire:
        return (self.member.to_wire(), self.suspect, self.orphaned, self.closed, self.connections)

    @classmethod
    def from_wire(cls, values: BeatWire) -> Beat:
        member, suspect, orphaned, closed, connections = values
        return cls(Member.from_wire(member), bool(suspect), bool(orphaned), tuple(closed), connections)


BeatWire = tuple[MemberWire, bool, bool, tuple[Connection, ...], Connections | None]
"""A ``Beat`` on the wire (``Beat.to_wire``)."""


@dataclasses.dataclass(frozen=True)
class DrainNotice:
    """A drain under way: Ray was told that the nodes ``nodes`` will go (a preemption notice,
    a maintenance drain; no new shard goes there), and the ranks ``ranks`` of the current
    generation train there (none: only stores are there); ``deadline`` is the earliest deadline
    Ray was given for those ranks' nodes, else for any (Unix seconds; None: none). While
    ``ranks`` is not empty every rank saves each step, and each rank in it hands its place over
    once every rank saves each step (``ray_ckpt.train.checkpointer``)."""

    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    deadline: float | None


@dataclasses.dataclass(frozen=True)
class BeatReply:
    """The coordinator's answer to a heartbeat: whether the member must ``leave`` its
    generation now (``Generations.must_leave``), and the ``drain`` under way, if any."""

    leave: bool
    drain: DrainNotice | None = None


STAY = BeatReply(False)
LEAVE = BeatReply(True)


class JoinStatus(enum.Enum):
    """How a join ended: its generation formed; the wait ran out (the member left the round);
    a full start of the worker group (a new epoch) overtook it; or the member's node is going
    (``DOOMED``: its raylet is gone or its node is dead), so it may not be in a generation."""

    FORMED = "formed"
    TIMEOUT = "timeout"
    SUPERSEDED = "superseded"
    DOOMED = "doomed"


@dataclasses.dataclass(frozen=True)
class JoinReply:
    """The coordinator's answer to a join. ``FORMED``: ``generation``, its ``attempt`` id,
    ``formed_at``, ``round_started`` (when the round's first member joined), ``replaced``
    (the ranks whose process the generation before did not have: empty when the same processes
    go on) and ``lost`` (rank, how it was found lost) of the generation before. ``TIMEOUT``:
    ``missing``, the ranks that had not joined. ``SUPERSEDED``: nothing more. A field its
    status does not name keeps its default."""

    status: JoinStatus
    generation: int = 0
    attempt: str = ""
    formed_at: float = 0.0
    round_started: float | None = None
    replaced: tuple[int, ...] = ()
    lost: tuple[tuple[int, str], ...] = ()
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
    incarnation, time), the ranks ``pending`` in the open round, the nodes declared dead
    to Ray because they went silent (``fenced``: node_id, rank, time, declared), and the ranks
    that handed their place over because their node drains (``handed_over``: rank, pid,
    node_id, time)."""

    epoch: int
    generation: int | None
    history: tuple[dict[str, Any], ...]
    hung_killed: tuple[dict[str, Any], ...]
    pending: tuple[int, ...]
    fenced: tuple[dict[str, Any], ...] = ()
    handed_over: tuple[dict[str, Any], ...] = ()


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
    parsed = _parse_attempt(attempt)
    return None if parsed is None else parsed[1]


def run_of(attempt: str | None) -> str | None:
    """The run in an attempt id of ``Generations.attempt`` (``<run>.g<n>``), or None for any
    other attempt id."""
    parsed = _parse_attempt(attempt)
    return None if parsed is None else parsed[0]


def _parse_attempt(attempt: str | None) -> tuple[str, int] | None:
    if not isinstance(attempt, str):
        return None
    run, dot, tail = attempt.rpartition(".g")
    if not dot or not run or not tail.isdecimal() or not tail.isascii():
        return None
    return run, int(tail)


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
        self.interval_s = MIN_BEAT_INTERVAL_S  # how often each member beats (``begin`` sets it)
        self.clock = 0.0  # seconds in which the coordinator was taking calls (see the module docstring)
        self._called: float | None = None  # when the clock last moved
        self.beat_count = 0  # beats taken so far; ``beat_seen`` holds each member's count and clock at its last
        self.beat_seen: dict[str, tuple[int, float]] = {}
        self.suspected = False  # a member saw a gloo connection close in the current generation
        # the current generation's closed connections as their other end sees them, each with
        # its witness (the incarnation that saw it close and had reported it) and ``beat_count``
        # when first taken; each member's connections (by incarnation) as it reported them; and
        # ``beat_count`` at each member's beat before its last (a closure taken before it no
        # longer counts against the member: two of its beats came after)
        self.closed: dict[Connection, tuple[str, int]] = {}
        self.connections: dict[str, frozenset[Connection]] = {}
        self.beat_before_last: dict[str, int] = {}
        self.lost: dict[int, dict[str, Any]] = {}  # the current generation's lost ranks: how, when
        self.finished: set[str] = set()  # incarnations whose training function returned
        self.doomed: set[str] = set()  # incarnations whose node is going: never in a generation again
        self.history: list[dict[str, Any]] = []
        self.drains: dict[str, float | None] = {}  # node id -> deadline, of the nodes Ray drains
        self.notice: DrainNotice | None = None  # the current generation's drain (``set_drains``)
        self.keep: frozenset[str] = frozenset()  # nodes whose ranks never hand over (the head)
        self._formed_reply: JoinReply | None = None  # the FORMED reply of the current generation, once made

    def attempt(self, number: int) -> str:
        """The ray_ckpt attempt id of generation ``number`` (unique across runs)."""
        return f"{self.run}.g{number}"

    def begin(self, world_size: int, now: float, interval_s: float = MIN_BEAT_INTERVAL_S) -> int:
        """A full start: a new epoch whose first generation Ray's process group carries, its
        members beating every ``interval_s``. Joins of older epochs are dropped. Returns the
        generation number."""
        self.epoch += 1
        self.world_size = world_size
        self.interval_s = interval_s
        self.pending.clear()
        self.round_started = None
        number = (self.current.number if self.current else 0) + 1
        self.current = Formed(number, {}, now)
        self._new_generation()
        return number

    def _new_generation(self) -> None:
        self.notice = None  # until the next ``set_drains``: every generation's members are new
        self.suspected = False
        self.closed = {}
        self.connections = {}
        self.lost = {}
        self.finished.clear()

    def register(self, member: Member, number: int, now: float) -> bool:
        """A member of a full start announces itself; False if that generation is superseded."""
        if self.current is None or self.current.number != number or member.epoch != self.epoch:
            return False
        self.current.members[member.rank] = member
        self.beat(member, now)
        return True

    def beat(self, member: Member, now: float, *, suspect: bool = False, orphaned: bool = False) -> None:
        """A heartbeat of ``member`` (``Beat`` says what its flags mean)."""
        self.take(Beat(member, suspect, orphaned), now)

    def take(self, beat: Beat, now: float) -> None:
        """A heartbeat: ``beat.suspect``, ``closed`` and ``connections`` count only from a
        member of the current generation (``connections`` only for that generation; closures
        only before a member is lost or a round opens, each only if the member reported it among
        its own connections, and a closed accepted connection that names a member is no
        ``suspect``); ``orphaned`` makes the member lost."""
        member = beat.member
        self.beats[member.incarnation] = (now, member)
        self._tick(now)
        self.beat_count += 1
        self.beat_before_last[member.incarnation] = self.beat_seen.get(member.incarnation, (0, 0.0))[0]
        self.beat_seen[member.incarnation] = (self.beat_count, self.clock)
        if self._in_current(member):
            reported = beat.connections
            if reported is not None and self.current is not None and reported[0] == self.current.number:
                self.connections[member.incarnation] = frozenset(
                    (address(*local), address(*remote)) for local, remote in reported[1]
                )
            if not self.recovering():  # once it fails, its members close their connections as they leave
                seen = {(address(*local), address(*remote)) for local, remote in beat.closed}
                closed = {(remote, local) for local, remote in seen}
                if seen:  # each of its own reported connections (another may be no gloo pair)
                    for local, remote in seen & self.connections.get(member.incarnation, frozenset()):
                        self.closed.setdefault((remote, local), (member.incarnation, self.beat_count))
                if beat.suspect and not self.suspected:
                    self.suspected = all(closed.isdisjoint(theirs) for theirs in self.connections.values())
        orphaned = beat.orphaned
        if orphaned:
            self._doom(member)
            if self._in_current(member) and member.rank not in self.lost:
                self.lost[member.rank] = {"rank": member.rank, "pid": member.pid, "reason": "raylet gone", "time": now}

    def beat_many(
        self,
        beats: list[Beat],
        now: float,
        alive_nodes: set[str] | None,
        unreachable: frozenset[str] | set[str] = frozenset(),
    ) -> list[BeatReply]:
        """The heartbeats of many members taken at once (as ``take`` takes one), then
        ``find_lost``: for each member, whether it must leave its generation (``must_leave``)
        and the drain under way (``notice``). One call of a batch relayed up the stores' tree."""
        for beat in beats:
            self.take(beat, now)
        self.find_lost(now, alive_nodes, unreachable)
        notice = self.notice
        if notice is None:
            return [LEAVE if self.must_leave(beat.member) else STAY for beat in beats]
        return [BeatReply(self.must_leave(beat.member), notice) for beat in beats]

    def set_drains(self, drains: dict[str, float | None], keep: frozenset[str] | set[str] = frozenset()) -> None:
        """The nodes Ray drains now (node id -> deadline, Unix seconds or None), as the actor
        reads them from the GCS: ``notice`` names them all, and the ranks of the current
        generation there that are neither lost nor finished, but those on a node of ``keep``
        (the head node: it cannot be declared dead, so its ranks cannot hand over); None where
        no node drains."""
        self.drains = dict(drains)
        self.keep = frozenset(keep)
        current = self.current
        if current is None or not drains:
            self.notice = None
            return
        ranks = sorted(
            rank
            for rank, member in current.members.items()
            if member.node_id in drains
            and member.node_id not in self.keep
            and rank not in self.lost
            and member.incarnation not in self.finished
        )
        nodes = tuple(sorted(drains))
        theirs = {current.members[rank].node_id for rank in ranks} or set(nodes)
        deadlines = [d for d in (drains[node] for node in theirs) if d is not None]
        notice = DrainNotice(tuple(ranks), nodes, min(deadlines) if deadlines else None)
        if notice != self.notice:  # an equal one is kept: one object in every reply of a batch
            self.notice = notice

    def live_on(self, node_id: str) -> list[int]:
        """The ranks of the current generation on ``node_id`` that are neither lost nor finished."""
        if self.current is None:
            return []
        return sorted(
            rank
            for rank, member in self.current.members.items()
            if member.node_id == node_id and rank not in self.lost and member.incarnation not in self.finished
        )

    def hand_over(self, member: Member, now: float) -> bool:
        """``member``, on a draining node, saved a step every rank committed after the notice
        and leaves its place, and so does every other live member on its node (that step
        committed with theirs too): each is lost ("drained") and doomed (it may not join
        again), so their peers leave the generation and replacements take their ranks. False
        where ``member`` is not a live member of the current generation outside the round, or
        its node may not hand over (``keep``; nothing changes)."""
        if not self._in_current(member) or member.rank in self.lost or member.incarnation in self.finished:
            return False
        if self.pending.get(member.rank) == member:  # it left its generation already: no step to hand over
            return False
        if member.node_id in self.keep:
            return False
        members = self.current.members if self.current is not None else {}
        for rank in self.live_on(member.node_id):
            leaving = members[rank]
            self.lost[rank] = {"rank": rank, "pid": leaving.pid, "reason": "drained", "time": now}
            self._doom(leaving)  # out of the round too, should it wait there
        self.set_drains(self.drains, self.keep)
        return True

    def _doom(self, member: Member) -> None:
        """``member``'s node is going: it may not join a round, and leaves the one it is in."""
        self.doomed.add(member.incarnation)
        if self.pending.get(member.rank) == member:
            self.leave(member.incarnation)

    def _in_current(self, member: Member) -> bool:
        return self.current is not None and self.current.members.get(member.rank) == member

    def finish(self, member: Member) -> None:
        """``member``'s training function returned: its silence from now on is no loss."""
        self.finished.add(member.incarnation)

    def _tick(self, now: float) -> None:
        if self._called is not None:
            self.clock += min(max(0.0, now - self._called), self.interval_s)
        self._called = now

    def silent(self, now: float, after_s: float = PROBE_AFTER_S) -> list[Member]:
        """The members of the current generation, outside the round, neither lost nor finished,
        whose last beat is more than ``after_s`` old on the coordinator's clock: those whose
        node the actor probes (``find_lost``'s ``unreachable``)."""
        if self.current is None:
            return []
        self._tick(now)
        found = []
        for rank, member in self.current.members.items():
            if rank in self.lost or member.incarnation in self.finished or self.pending.get(rank) == member:
                continue
            _, clock = self.beat_seen.get(member.incarnation, (self.beat_count, self.clock))
            if self.clock - clock > after_s:
                found.append(member)
        return found

    def find_lost(
        self, now: float, alive_nodes: set[str] | None, unreachable: frozenset[str] | set[str] = frozenset()
    ) -> list[Member]:
        """Mark, and return, the members of the current generation newly found lost (see the
        module docstring); ``alive_nodes`` None: node liveness unknown; ``unreachable``: the
        nodes whose raylet did not answer the coordinator's last probe (a silent member there is
        lost after ``SILENT_MIN_S``, as after a closure; it is not doomed by that: a probe may
        fail on a live node, and a member whose node answers again rejoins with its process.
        Its node is going only once the coordinator fences it or Ray finds it dead, as for any
        member). Members in the open round or finished are never lost."""
        if self.current is None:
            return []
        self._tick(now)
        beats = SILENT_BEATS if self.suspected else QUIET_BEATS
        # a member that missed ``beats`` in a row is silent a beat longer, as beats come in any order
        quiet_s = max(SILENT_MIN_S if self.suspected else QUIET_MIN_S, (beats + 1) * self.interval_s)
        silent_s = max(SILENT_MIN_S, (SILENT_BEATS + 1) * self.interval_s)
        named_s = max(NAMED_SILENT_MIN_S, (SILENT_BEATS + 1) * self.interval_s)
        named = self._named() if self.closed else {}
        beating = [
            m for r, m in self.current.members.items() if r not in self.lost and m.incarnation not in self.finished
        ]
        others = max(1, len(beating) - 1)
        found = []
        for rank, member in self.current.members.items():
            if self.pending.get(rank) == member:  # in the round: ``drop_dead`` takes it out if its node died
                continue
            on_dead_node = alive_nodes is not None and member.node_id not in alive_nodes
            if on_dead_node:  # lost by silence or finished before, it still may not join
                self.doomed.add(member.incarnation)
            if rank in self.lost or member.incarnation in self.finished:
                continue
            reason = None
            if on_dead_node:
                reason = "node dead"
            else:
                count, clock = self.beat_seen.get(member.incarnation, (self.beat_count, self.clock))
                every = named.get(member.incarnation)  # None: no closure counts against it
                bound_s = named_s if every else silent_s
                missed = self.beat_count - count
                if every is not None and self.clock - clock > bound_s and missed >= SILENT_BEATS * others:
                    reason = "silent after its connection closed"
                elif (
                    member.node_id in unreachable and self.clock - clock > silent_s and missed >= SILENT_BEATS * others
                ):
                    reason = "node unreachable"  # not doomed: a node that answers again keeps its process
                elif self.clock - clock > quiet_s and missed >= beats * others:
                    reason = "silent after a closed connection" if self.suspected else "silent"
            if reason is not None:
                self.lost[rank] = {"rank": rank, "pid": member.pid, "reason": reason, "time": now}
                found.append(member)
        return found

    def _named(self) -> dict[str, bool]:
        """The members (by incarnation) a closure still counts against (``take`` took it after
        the member's beat before its last), each with whether one witness saw every connection
        it shares with the member close (what a dead process's peers see) or only some."""
        named: dict[str, bool] = {}
        for incarnation, theirs in self.connections.items():
            hits = theirs.intersection(self.closed)
            if not hits:
                continue
            before = self.beat_before_last.get(incarnation, 0)
            seen: dict[str, set[Connection]] = {}
            for connection in hits:
                witness, first = self.closed[connection]
                if first > before and witness != incarnation:
                    seen.setdefault(witness, set()).add(connection)
            if seen:
                named[incarnation] = any(
                    self._shared(incarnation, witness) <= connections for witness, connections in seen.items()
                )
        return named

    def _shared(self, member: str, witness: str) -> set[Connection]:
        """The connections ``member`` and ``witness`` both reported, as ``member`` sees them."""
        theirs = self.connections.get(witness, frozenset())
        return {(local, remote) for local, remote in self.connections[member] if (remote, local) in theirs}

    def recovering(self) -> bool:
        """Whether a recovery is under way: a member of the current generation is lost, or a
        round to replace the generation is open."""
        return bool(self.lost) or bool(self.pending)

    def must_leave(self, member: Member) -> bool:
        """Whether ``member`` must leave its generation now: it is in the current generation,
        has not joined the next, and a member of it is lost or a round to replace it is open."""
        if not self._in_current(member) or self.pending.get(member.rank) == member:
            return False
        return bool(self.lost) or bool(self.pending)

    def join(self, member: Member, now: float) -> JoinReply | None:
        """Ask to be in the next generation (replacing an older process of the same rank): None
        once the member waits in the round; the final reply if it is refused (``SUPERSEDED``:
        its epoch is over; ``DOOMED``: its node is going)."""
        if member.epoch != self.epoch:
            return JoinReply(JoinStatus.SUPERSEDED)
        if member.incarnation in self.doomed:
            return JoinReply(JoinStatus.DOOMED)
        if not self.pending:
            self.round_started = now
        self.pending[member.rank] = member
        self.beat(member, now)
        return None

    def join_reply(self, member: Member | Waiting, after: int) -> JoinReply | None:
        """The reply to ``member``'s join (the member, or its ``Member.waiting`` key), made when
        generation ``after`` was current: FORMED once a newer generation formed with this very
        member, SUPERSEDED once its epoch is over, None while it still waits."""
        rank, incarnation, epoch = member.waiting if isinstance(member, Member) else member
        current = self.current
        formed_with = None if current is None else current.members.get(rank)
        if current is not None and current.number > after and formed_with and formed_with.incarnation == incarnation:
            if self._formed_reply is None or self._formed_reply.generation != current.number:
                formed = self.history[-1]
                self._formed_reply = JoinReply(
                    JoinStatus.FORMED,
                    generation=current.number,
                    attempt=self.attempt(current.number),
                    formed_at=current.formed_at,
                    round_started=formed["round_started"],
                    replaced=tuple(formed["replaced"]),
                    lost=tuple((int(lost["rank"]), str(lost["reason"])) for lost in formed["lost"]),
                )
            return self._formed_reply  # one object for every member: a batch of replies pickles it once
        if epoch != self.epoch:
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
        """Take out of the round the members on dead nodes (doomed) or silent for ``beat_timeout_s``."""
        dropped = []
        for rank, member in list(self.pending.items()):
            last = self.beats.get(member.incarnation, (0.0, member))[0]
            if member.node_id not in alive_nodes:
                self.doomed.add(member.incarnation)
            if member.node_id not in alive_nodes or now - last > beat_timeout_s:
                dropped.append(self.pending.pop(rank))
        if not self.pending:
            self.round_started = None
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
                "lost": [self.lost[rank] for rank in sorted(self.lost)],
            }
        )
        self.pending.clear()
        self.round_started = None
        self._new_generation()
        return self.current

    def hung(self, now: float, hang_timeout_s: float) -> list[Member]:
        """Members of the current generation whose last heartbeat is older than the bound. A
        member whose training function returned (``finish``) beats no more on purpose and is
        never hung, however long its peers go on (a rank 0 that evaluates or uploads after the
        others returned); nor is one waiting in the round."""
        if self.current is None:
            return []
        waiting = {m.incarnation for m in self.pending.values()}
        return [
            member
            for member in self.current.members.values()
            if member.incarnation not in waiting
            and member.incarnation not in self.finished
            and now - self.beats.get(member.incarnation, (now, member))[0] > hang_timeout_s
        ]
