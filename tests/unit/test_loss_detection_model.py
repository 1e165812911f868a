"""Finding lost members (``Generations.find_lost``, ``must_leave``) under generated
interleavings: hypothesis drives a generation of 2-5 members through beat ticks in random
orders, late beats, beats taken in batches of 1-5 (``beat_many``: the stores merge them on the
way up), coordinator stalls that deliver a backlog at once, closed-connection
reports (of an accepted connection, naming nobody, or of one whose other end a member reported,
naming that member, live or dead), process deaths, node deaths, dying members that join, finished functions and rounds,
and checks after every event:

- safety: with nobody dead, a member that is alive and beats is never lost unless it was silent
  for a whole quiet bound (it missed ``QUIET_BEATS`` beats in a row; one beat once a closed
  connection was reported), nor one whose function finished, nor one in the round;
- liveness: a dead member is lost within the bound that applies (a closed connection naming
  it, one naming nobody, or none reported), counted in the time the coordinator was taking
  beats;
- ``must_leave``: exactly the current members not in the round, once one is lost or a round is
  open;
- a member whose node is going (it said its raylet is gone, or the node table showed its node
  dead while it was outside the round) is refused a place in the round, and leaves the round it
  joined before it said so: no generation forms with a dying process.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ray_ckpt.core import generations
from ray_ckpt.core.generations import Beat, Generations, Member

INTERVAL_S = 0.1
EXAMPLES = int(os.environ.get("RAY_CKPT_LOSS_EXAMPLES", "1000"))


class LossDetection(RuleBasedStateMachine):
    @initialize(world_size=st.integers(2, 5), batch=st.integers(1, 5))
    def start(self, world_size: int, batch: int) -> None:
        self.gens = Generations()
        self.batch = batch  # beats the coordinator takes in one call (merged by the stores), at most
        self.now = 0.0
        number = self.gens.begin(world_size, now=self.now, interval_s=INTERVAL_S)
        self.members = [
            Member(rank=r, incarnation=f"p{r}", node_id=f"n{r}", pid=r, host="h", epoch=1) for r in range(world_size)
        ]
        for member in self.members:
            assert self.gens.register(member, number, now=self.now)
            self.gens.take(Beat(member, connections=(number, (self._connection(member.rank),))), now=self.now)
        self.dead: dict[int, float] = {}  # rank -> when it died
        self.dead_nodes: set[str] = set()
        self.finished: set[int] = set()
        self.finished_unlost: set[int] = set()  # finished before any loss of theirs was found
        self.joined: set[int] = set()  # in the round
        self.orphaned: set[int] = set()  # said their raylet is gone, as the coordinator took it
        self.seen_on_dead_nodes: set[int] = set()  # outside the round when the node table showed their node dead
        self.missed = dict.fromkeys(range(world_size), 0)  # beats missed in a row
        self.worst_missed = dict.fromkeys(range(world_size), 0)
        self.suspected_at: float | None = None  # the first report of a closed accepted connection
        self.reported_at: float | None = None  # the first closed-connection report, naming someone or not
        self.named_at: dict[int, float] = {}  # rank -> the first report of a closed connection to its endpoint
        self.backlog: list[tuple[str, Beat]] = []  # calls not yet taken: beat or join
        self.stalling = False
        self.stalled_s = 0.0  # time the coordinator took no beat since the first death

    def doomed(self) -> set[int]:
        """The members whose node the coordinator knows is going."""
        return self.orphaned | self.seen_on_dead_nodes

    def _beating(self) -> list[int]:
        return [r for r in range(len(self.members)) if r not in self.dead and r not in self.finished]

    @staticmethod
    def _connection(rank: int) -> generations.Connection:
        """A connection of member ``rank`` (to some peer), as it reports it."""
        return (("10.0.0.1", 40000 + rank), ("10.0.0.2", 50000 + rank))

    @property
    def named_by(self) -> dict[tuple[str, int], int]:
        """Member by the peer's end of its connection (what a closure report names it by)."""
        return {self._connection(rank)[1]: rank for rank in range(len(self.members))}

    def _send(self, beat: Beat, call: str = "beat") -> None:
        """A call reaches the coordinator's queue; taken at once unless it is stalled."""
        self.backlog.append((call, beat))
        self._flush()

    def _flush(self) -> None:
        """Take the queued calls in the order they came; runs of beats in calls of up to
        ``batch`` beats (``beat_many``), as stores merge them on the way up."""
        if self.stalling:
            return
        beats: list[Beat] = []
        for call, beat in self.backlog:
            if call == "join":
                self._take_beats(beats)
                beats = []
                refused = self.gens.join(beat.member, now=self.now)
                assert (refused is None) == (beat.member.rank not in self.doomed()), (beat.member, refused)
                if refused is None:
                    self.joined.add(beat.member.rank)
                continue
            beats.append(beat)
            if len(beats) == self.batch:
                self._take_beats(beats)
                beats = []
        self._take_beats(beats)
        self.backlog = []

    def _take_beats(self, beats: list[Beat]) -> None:
        if not beats:
            return
        if not self.gens.recovering():  # closures count until the generation fails (no join splits a batch)
            for beat in beats:
                if beat.suspect and not beat.closed:
                    self.suspected_at = self.now if self.suspected_at is None else self.suspected_at
                for local, _ in beat.closed:  # seen from the other end: ``local`` is the named member's peer
                    self.named_at.setdefault(self.named_by[local], self.now)
        leave = self.gens.beat_many(beats, self.now, None)
        for beat in beats:
            if beat.orphaned:
                self.orphaned.add(beat.member.rank)
                self.joined.discard(beat.member.rank)
        assert leave == [self.gens.must_leave(beat.member) for beat in beats]

    @rule(order=st.permutations(range(5)), late=st.sets(st.integers(0, 4), max_size=2), stall=st.booleans())
    def tick(self, order: list[int], late: set[int], stall: bool) -> None:
        """One beat interval: every live member beats, in some order, but the late ones; a
        stalled coordinator queues them, else it takes its queue and this tick's beats."""
        self.now += INTERVAL_S
        self.stalling = stall
        if stall and self.dead:
            self.stalled_s += INTERVAL_S
        self._flush()
        for rank in [r for r in order if r in self._beating()]:
            if rank in late:
                self.missed[rank] += 1
                self.worst_missed[rank] = max(self.worst_missed[rank], self.missed[rank])
                continue
            self.missed[rank] = 0
            self._send(Beat(self.members[rank]))
        if not stall:
            self.gens.find_lost(self.now, {m.node_id for m in self.members} - self.dead_nodes)
            self.seen_on_dead_nodes.update(
                r for r, m in enumerate(self.members) if m.node_id in self.dead_nodes and r not in self.joined
            )

    @rule(count=st.integers(5, 40))
    def ticks(self, count: int) -> None:
        """``count`` beat intervals in which every live member beats in rank order: time for the
        longest silence bound (``QUIET_MIN_S``) to pass within a run's steps."""
        for _ in range(count):
            self.tick(list(range(5)), set(), False)

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4), node=st.booleans())
    def die(self, index: int, node: bool) -> None:
        """A member's process dies (its node too, or not): it beats no more."""
        rank = self._beating()[index % len(self._beating())]
        self.dead[rank] = self.now
        if node:
            self.dead_nodes.add(self.members[rank].node_id)

    @precondition(lambda self: any(r not in self.finished for r in self.dead))
    @rule(index=st.integers(0, 4))
    def dying_says_its_raylet_is_gone(self, index: int) -> None:
        """A member whose node is going beats once more, saying its raylet is gone."""
        dying = [r for r in self.dead if r not in self.finished]
        self._send(Beat(self.members[dying[index % len(dying)]], orphaned=True))

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4), accepted=st.booleans(), named=st.none() | st.integers(0, 4))
    def report_closed(self, index: int, accepted: bool, named: int | None) -> None:
        """A live member saw one of its connections close: one it accepted on a gloo listener
        (naming nobody), or one whose other end member ``named`` reported; a dead peer's, one a
        finished peer closed, or (the worst case for safety) a live peer's."""
        rank = self._beating()[index % len(self._beating())]
        if not accepted and named is None:
            return
        self.reported_at = self.now if self.reported_at is None else self.reported_at
        closed: tuple[generations.Connection, ...] = ()
        if named is not None and named < len(self.members):
            local, remote = self._connection(named)
            closed = ((remote, local),)  # seen from the other end
        self._send(Beat(self.members[rank], suspect=accepted, closed=closed))

    @precondition(lambda self: bool(self.dead) and bool(self._beating()))
    @rule(index=st.integers(0, 4), dead=st.integers(0, 4))
    def report_a_dead_peers_connection_closed(self, index: int, dead: int) -> None:
        """What a dead process's survivors see most: their connection with it closed."""
        ranks = sorted(self.dead)
        self.report_closed(index, accepted=False, named=ranks[dead % len(ranks)])

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4))
    def finish(self, index: int) -> None:
        rank = self._beating()[index % len(self._beating())]
        self.gens.finish(self.members[rank])
        self.finished.add(rank)
        if rank not in self.gens.lost:
            self.finished_unlost.add(rank)

    @precondition(lambda self: len(self._beating()) > 0)
    @rule(index=st.integers(0, 4))
    def join(self, index: int) -> None:
        """A member whose collective failed joins the next round."""
        rank = self._beating()[index % len(self._beating())]
        self._send(Beat(self.members[rank]), call="join")

    @precondition(lambda self: any(r not in self.finished for r in self.dead))
    @rule(index=st.integers(0, 4))
    def dying_joins(self, index: int) -> None:
        """A member whose node is going fails its collective and joins the round before it dies."""
        dying = [r for r in self.dead if r not in self.finished]
        self._send(Beat(self.members[dying[index % len(dying)]]), call="join")

    @invariant()
    def no_member_whose_node_is_going_is_in_the_round(self) -> None:
        if getattr(self, "gens", None) is None:
            return
        for rank, member in self.gens.pending.items():
            assert rank not in self.orphaned and member.incarnation not in self.gens.doomed, (rank, self.orphaned)
        assert sorted(self.gens.pending) == sorted(self.joined)

    @invariant()
    def nobody_alive_and_beating_is_lost_without_a_death(self) -> None:
        if getattr(self, "gens", None) is None:
            return
        for rank in self.gens.lost:
            assert rank not in self.finished_unlost, (rank, self.gens.lost)
            if rank in self.dead or self.dead:
                continue
            # no death at all: a false loss needs a whole quiet bound of missed beats
            assert self.worst_missed[rank] >= generations.SILENT_BEATS, (rank, self.worst_missed, self.gens.lost)
            if self.reported_at is None:
                assert self.worst_missed[rank] >= generations.QUIET_BEATS, (rank, self.worst_missed)

    @invariant()
    def a_dead_member_is_lost_within_its_bound(self) -> None:
        if getattr(self, "gens", None) is None or self.gens.lost:
            return
        for rank, died in self.dead.items():
            if rank in self.finished or rank in self.joined:
                continue
            bounds = [max(generations.QUIET_MIN_S, generations.QUIET_BEATS * INTERVAL_S) + 2 * INTERVAL_S]
            if self.members[rank].node_id in self.dead_nodes:
                bounds.append(2 * INTERVAL_S)  # the next tick's node table
            if self.suspected_at is not None:
                silent = max(generations.SILENT_MIN_S, (generations.SILENT_BEATS + 1) * INTERVAL_S) + INTERVAL_S
                bounds.append(silent + max(0.0, self.suspected_at - died))
            if rank in self.named_at:
                named = max(generations.NAMED_SILENT_MIN_S, (generations.SILENT_BEATS + 1) * INTERVAL_S) + INTERVAL_S
                bounds.append(named + max(0.0, self.named_at[rank] - died))
            bound = min(bounds)
            bound += self.stalled_s + INTERVAL_S * max(self.worst_missed.values())
            assert self.now - died <= bound + 1e-9, (rank, died, self.now, bound, self.gens.lost)

    @invariant()
    def exactly_the_members_outside_the_round_must_leave_once_one_is_lost_or_a_round_is_open(self) -> None:
        if getattr(self, "gens", None) is None:
            return
        failing = bool(self.gens.lost) or bool(self.gens.pending)
        for member in self.members:
            assert self.gens.must_leave(member) == (failing and member.rank not in self.joined), member


LossDetection.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_finding_lost_members_holds_under_generated_interleavings = LossDetection.TestCase
