"""Finding lost members (``Generations.find_lost``, ``must_leave``) under generated
interleavings: hypothesis drives a generation of 2-5 members, each pair joined by two gloo
connections (WORLD's and a subgroup's), through beat ticks in random orders, late beats, pauses
of a live member's beat thread (a GC), beats taken in batches of 1-5 (``beat_many``: the stores
merge them on the way up), coordinator stalls that deliver a backlog at once, closed-connection
reports (of an accepted connection naming nobody; of some or all of a witness's connections with
a member, live or dead; of one connection with a live member that is no evidence of anything, as
a reused descriptor's or a connection that is not gloo's would be), process deaths, node deaths,
dying members that join, live members whose node is fenced (declared dead by the coordinator
while they still beat through their peers: a node cut off from the head), fences Ray refuses
(the node listed alive again once its members were lost), nodes Ray drains and members there
that hand their place over (their node then declared dead), finished functions and rounds, and
checks after every event:

- safety: a member that is alive is lost only after a pause of its beats longer than the bound
  its evidence allows, checked as the coordinator finds it lost: ``QUIET_MIN_S`` without any
  report; ``SILENT_MIN_S`` after a closed accepted connection naming nobody or a closure naming
  it that still counts (one that a live member beat twice since no longer does), so a pause
  under that bound (a GC's) is never a loss on one report; ``NAMED_SILENT_MIN_S`` only once one
  witness saw every connection it shares with the member close. Never one whose function
  finished before, nor one in the round;
- a live member is lost without a pause only when its node was fenced (then within the next
  tick's node table), and it is refused a place in any later round;
- liveness: a dead member is lost within the bound that applies (a witness that saw all its
  connections with it close, some of them, a closed accepted connection naming nobody, none
  reported, its node dead, its node silent to the coordinator's probes: power lost, a link
  down, a partition, which close nothing), counted in the time the coordinator was taking beats;
- probes that time out for a live node (a loaded host) never make its member lost before a
  pause of its beats longer than ``SILENT_MIN_S``, and a live member lost that way is never
  refused a place in a later round: it rejoins with its process;
- ``must_leave``: exactly the current members not in the round, once one is lost or a round is
  open;
- the hang watcher: a member whose function finished is never hung, however long the others go
  on; every other current member outside the round that falls silent is;
- a member whose node is going (it said its raylet is gone, or the node table showed its node
  dead while it was outside the round, or it handed its place over) is refused a place in the
  round, and leaves the round it joined before it said so: no generation forms with a dying process;
- drains: every beat reply carries the generation's drain notice, which names exactly the
  current members on draining nodes that are neither lost nor finished as of the coordinator's
  last read of the drains; a handover is taken exactly from such a live member of the current
  generation, makes it lost ("drained") at once, and makes every other member outside the round leave.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ray_ckpt.core import generations
from ray_ckpt.core.generations import Beat, Generations, Member

INTERVAL_S = 0.1
GROUPS = (0, 1)  # the process groups every pair of members has a gloo connection in: WORLD, a subgroup
PAUSE_TICKS = 6  # the longest pause of a live member's beat thread generated: past SILENT_MIN_S
EXAMPLES = int(os.environ.get("RAY_CKPT_LOSS_EXAMPLES", "1000"))

NAMED_S = max(generations.NAMED_SILENT_MIN_S, (generations.SILENT_BEATS + 1) * INTERVAL_S)
SILENT_S = max(generations.SILENT_MIN_S, (generations.SILENT_BEATS + 1) * INTERVAL_S)
QUIET_S = max(generations.QUIET_MIN_S, (generations.QUIET_BEATS + 1) * INTERVAL_S)


def host(rank: int) -> str:
    return f"10.0.0.{rank + 1}"


def connection(rank: int, peer: int, group: int) -> generations.Connection:
    """Member ``rank``'s gloo connection with ``peer`` in ``group``, as ``rank`` sees it."""
    return ((host(rank), 40000 + 100 * rank + 10 * peer + group), (host(peer), 40000 + 100 * peer + 10 * rank + group))


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
        self.taken = dict.fromkeys(range(world_size), 0)  # beats (joins too) the coordinator took of each
        self.tick_no = 0  # beat intervals so far
        self.queued: dict[int, list[int]] = {r: [] for r in range(world_size)}  # ticks its calls were sent in
        self.taken_sent = dict.fromkeys(range(world_size), 0)  # tick the last call taken of each was sent in
        for member in self.members:
            assert self.gens.register(member, number, now=self.now)
            ends = tuple(connection(member.rank, p, g) for p in range(world_size) if p != member.rank for g in GROUPS)
            self.gens.take(Beat(member, connections=(number, ends)), now=self.now)
            self.taken[member.rank] += 2
        self.dead: dict[int, float] = {}  # rank -> when it died
        self.dead_nodes: set[str] = set()
        self.finished: set[int] = set()
        self.finished_unlost: set[int] = set()  # finished before any loss of theirs was found
        self.joined: set[int] = set()  # in the round
        self.orphaned: set[int] = set()  # said their raylet is gone, as the coordinator took it
        self.seen_on_dead_nodes: set[int] = set()  # outside the round when the node table showed their node dead
        self.missed = dict.fromkeys(range(world_size), 0)  # beats missed in a row
        self.worst_missed = dict.fromkeys(range(world_size), 0)
        self.suspected_at: float | None = None  # the first closed accepted connection naming nobody
        # (witness, named, group) -> the named member's beats taken and the time when the
        # coordinator first took that closure
        self.closures: dict[tuple[int, int, int], tuple[int, float]] = {}
        self.checked: set[int] = set()  # lost ranks whose loss was checked as it was found
        self.backlog: list[tuple[str, Beat]] = []  # calls not yet taken: beat or join
        self.stalling = False
        self.stalled_s = 0.0  # time the coordinator took no beat since the first death
        self.powered_off: dict[int, float] = {}  # rank -> when its node went silent (no probe answers)
        self.spurious: set[str] = set()  # live nodes whose probe times out (a loaded host, a slow link)
        self.unreachable: set[str] = set()  # the coordinator's view: probed silent members' nodes
        self.fenced: dict[int, float] = {}  # live rank -> when its node was declared dead (cut off)
        self.draining: set[str] = set()  # nodes Ray drains
        self.handed_over: set[int] = set()  # ranks whose handover the coordinator took

    def doomed(self) -> set[int]:
        """The members whose node the coordinator knows is going. Not those lost while their node
        did not answer a probe: a live one (its probe timed out on a loaded host) rejoins with
        its process."""
        return self.orphaned | self.seen_on_dead_nodes | self.handed_over

    def _beating(self) -> list[int]:
        return [r for r in range(len(self.members)) if r not in self.dead and r not in self.finished]

    def _standing(self, named: int) -> dict[int, dict[int, float]]:
        """The closures still counting against ``named``: witness -> group -> when first taken
        (a closure no longer counts once the coordinator took two of its beats after it)."""
        found: dict[int, dict[int, float]] = {}
        for (witness, rank, group), (taken, when) in self.closures.items():
            if rank == named and self.taken[named] - taken <= 1:
                found.setdefault(witness, {})[group] = when
        return found

    def _evidence_at(self, named: int) -> tuple[float | None, float | None]:
        """When the standing closures against ``named`` began to count: some of them, and a
        witness's all (None: not so)."""
        standing = self._standing(named)
        some = min((when for groups in standing.values() for when in groups.values()), default=None)
        every = min((max(groups.values()) for groups in standing.values() if len(groups) == len(GROUPS)), default=None)
        return some, every

    def _bound_s(self, rank: int) -> float:
        """The least silence that may make live member ``rank`` lost, by its evidence now."""
        some, every = self._evidence_at(rank)
        if every is not None:
            return NAMED_S
        if some is not None or self.suspected_at is not None or self.members[rank].node_id in self.unreachable:
            return SILENT_S
        return QUIET_S

    def _check_losses(self) -> None:
        """Safety, as the coordinator finds a member lost: a live one only after a pause longer
        than its bound. Its pause is counted in ticks from the one it sent the last call the
        coordinator took in to the one it sent its next in (now, if none waits in the queue):
        the coordinator's clock moves at most a beat interval a tick."""
        for rank in set(self.gens.lost) - self.checked:
            self.checked.add(rank)
            if self.gens.lost[rank]["reason"] == "node unreachable":
                assert self.members[rank].node_id in self.unreachable, (rank, self.unreachable)
            assert rank not in self.finished_unlost, (rank, self.gens.lost)
            if rank in self.handed_over:
                assert self.gens.lost[rank]["reason"] == "drained", (rank, self.gens.lost)
                continue
            if rank in self.dead:
                continue
            if rank in self.fenced and self.gens.lost[rank]["reason"] == "node dead":
                continue  # lost by the verdict on its node, not by a pause
            # else (fenced or not) lost by silence, found in a batch of beats before the next
            # node table: only after a pause longer than its bound
            resumed = self.queued[rank][0] if self.queued[rank] else self.tick_no
            pause_s = (resumed - self.taken_sent[rank]) * INTERVAL_S
            assert pause_s > self._bound_s(rank) - 1e-9, (rank, pause_s, self._bound_s(rank), self.gens.lost)

    def _probe(self) -> None:
        """The actor's probes, as it runs them each tick: the nodes of the members silent for
        ``PROBE_AFTER_S`` are unreachable if they lost power (or a probe of theirs times out)."""
        silent = {m.node_id for m in self.gens.silent(self.now)}
        powered_off = {self.members[r].node_id for r in self.powered_off}
        self.unreachable = {node for node in silent if node in powered_off or node in self.spurious}

    def _send(self, beat: Beat, call: str = "beat") -> None:
        """A call reaches the coordinator's queue; taken at once unless it is stalled."""
        self.backlog.append((call, beat))
        self.queued[beat.member.rank].append(self.tick_no)
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
                self.taken_sent[beat.member.rank] = self.queued[beat.member.rank].pop(0)
                refused = self.gens.join(beat.member, now=self.now)
                assert (refused is None) == (beat.member.rank not in self.doomed()), (beat.member, refused)
                if refused is None:
                    self.joined.add(beat.member.rank)
                    self.taken[beat.member.rank] += 1
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
        failing = self.gens.recovering()  # closures count until the generation fails
        for beat in beats:
            rank = beat.member.rank
            self.taken[rank] += 1
            self.taken_sent[rank] = self.queued[rank].pop(0)
            if not failing:
                if beat.suspect and not beat.closed:
                    self.suspected_at = self.now if self.suspected_at is None else self.suspected_at
                for local, remote in beat.closed:  # ``rank``'s connection with ``named`` closed
                    named = next(p for p in range(len(self.members)) if remote[0] == host(p))
                    group = local[1] % 10
                    self.closures.setdefault((rank, named, group), (self.taken[named], self.now))
            if beat.orphaned and rank not in self.gens.lost:
                failing = True
        replies = self.gens.beat_many(beats, self.now, None, self.unreachable)
        self._check_losses()
        for beat in beats:
            if beat.orphaned:
                self.orphaned.add(beat.member.rank)
                self.joined.discard(beat.member.rank)
        assert [reply.leave for reply in replies] == [self.gens.must_leave(beat.member) for beat in beats]
        assert all(reply.drain == self.gens.notice for reply in replies), (replies, self.gens.notice)

    @rule(order=st.permutations(range(5)), late=st.sets(st.integers(0, 4), max_size=2), stall=st.booleans())
    def tick(self, order: list[int], late: set[int], stall: bool) -> None:
        """One beat interval: every live member beats, in some order, but the late ones; a
        stalled coordinator queues them, else it takes its queue and this tick's beats."""
        self.now += INTERVAL_S
        self.tick_no += 1
        self.stalling = stall
        if stall and (self.dead or self.fenced):
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
            self._probe()
            self.gens.find_lost(self.now, {m.node_id for m in self.members} - self.dead_nodes, self.unreachable)
            self._check_losses()
            self.seen_on_dead_nodes.update(
                r for r, m in enumerate(self.members) if m.node_id in self.dead_nodes and r not in self.joined
            )
            self._read_drains()

    def _read_drains(self) -> None:
        """The actor's read of the draining nodes; the notice names the live ranks there."""
        self.gens.set_drains(dict.fromkeys(self.draining, 100.0))
        current = self.gens.current.members if self.gens.current is not None else {}
        expected = sorted(
            r
            for r, m in current.items()
            if m.node_id in self.draining and r not in self.gens.lost and m.incarnation not in self.gens.finished
        )
        notice = self.gens.notice
        assert (notice.ranks if notice is not None else ()) == tuple(expected), (notice, expected)

    @rule(count=st.integers(5, 40))
    def ticks(self, count: int) -> None:
        """``count`` beat intervals in which every live member beats in rank order: time for the
        longest silence bound (``QUIET_MIN_S``) to pass within a run's steps."""
        for _ in range(count):
            self.tick(list(range(5)), set(), False)

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4), ticks=st.integers(1, PAUSE_TICKS))
    def pause(self, index: int, ticks: int) -> None:
        """A live member's beat thread stops for ``ticks`` beat intervals (a GC pause, a busy
        host) while the others beat in rank order."""
        rank = self._beating()[index % len(self._beating())]
        for _ in range(ticks):
            self.tick(list(range(5)), {rank}, False)

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4), die_with_node=st.booleans())
    def die(self, index: int, die_with_node: bool) -> None:
        """A member's process dies (its node too, or not): it beats no more."""
        rank = self._beating()[index % len(self._beating())]
        self.dead[rank] = self.now
        if die_with_node:
            self.dead_nodes.add(self.members[rank].node_id)

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4))
    def loses_power(self, index: int) -> None:
        """A member's node loses power (or its link, or its route to the head): the member beats
        no more, no connection closes, and the node no longer answers the coordinator's probes."""
        rank = self._beating()[index % len(self._beating())]
        self.dead[rank] = self.now
        self.powered_off[rank] = self.now

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4))
    def node_cut_off_and_fenced(self, index: int) -> None:
        """A member's node is cut off from the head and declared dead (fenced) while the member
        lives on and beats through its peers' stores."""
        rank = self._beating()[index % len(self._beating())]
        self.dead_nodes.add(self.members[rank].node_id)
        self.fenced.setdefault(rank, self.now)

    @precondition(lambda self: any(r in self.gens.lost for r in self.fenced))
    @rule(index=st.integers(0, 4))
    def ray_refuses_a_fence(self, index: int) -> None:
        """Ray refuses the declaration of a fenced node (its members already lost, at the fence):
        the node is in the node table again, its member still beating through its peers."""
        refused = sorted(r for r in self.fenced if r in self.gens.lost)
        self.dead_nodes.discard(self.members[refused[index % len(refused)]].node_id)

    @rule(index=st.integers(0, 4), times_out=st.booleans())
    def a_probe_of_a_live_node_times_out(self, index: int, times_out: bool) -> None:
        """Probes of a live member's node time out (a loaded host, a slow link), or answer again."""
        node = self.members[index % len(self.members)].node_id
        if times_out:
            self.spurious.add(node)
        else:
            self.spurious.discard(node)

    @precondition(lambda self: any(r not in self.finished for r in self.dead))
    @rule(index=st.integers(0, 4))
    def dying_says_its_raylet_is_gone(self, index: int) -> None:
        """A member whose node is going beats once more, saying its raylet is gone."""
        dying = [r for r in self.dead if r not in self.finished]
        self._send(Beat(self.members[dying[index % len(dying)]], orphaned=True))

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(
        index=st.integers(0, 4),
        accepted=st.booleans(),
        named=st.none() | st.integers(0, 4),
        groups=st.sets(st.sampled_from(GROUPS), min_size=1),
    )
    def report_closed(self, index: int, accepted: bool, named: int | None, groups: set[int]) -> None:
        """A live member saw connections close: one it accepted on a gloo listener (naming
        nobody), or its connections in ``groups`` with member ``named``: a dead peer's, one a
        finished peer closed, or (the worst case for safety) a live peer's that left or
        destroyed a group."""
        witness = self._beating()[index % len(self._beating())]
        if named is None or named >= len(self.members) or named == witness:
            if accepted:
                self._send(Beat(self.members[witness], suspect=True))
            return
        closed = tuple(connection(witness, named, group) for group in sorted(groups))
        self._send(Beat(self.members[witness], suspect=accepted, closed=closed))

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4), named=st.integers(0, 4), group=st.sampled_from(GROUPS))
    def report_a_stray_closure(self, index: int, named: int, group: int) -> None:
        """A live member reports one of its connections with a live member closed though nothing
        happened to that member: a reused descriptor's or a connection that is not gloo's
        that got past the worker's checks. One socket: never all of a witness's."""
        beating = self._beating()
        witness = beating[index % len(beating)]
        others = [r for r in beating if r != witness]
        self._send(Beat(self.members[witness], closed=(connection(witness, others[named % len(others)], group),)))

    @precondition(lambda self: bool(self.dead) and bool(self._beating()))
    @rule(index=st.integers(0, 4), dead=st.integers(0, 4), groups=st.sets(st.sampled_from(GROUPS), min_size=1))
    def report_a_dead_peers_connections_closed(self, index: int, dead: int, groups: set[int]) -> None:
        """What a dead process's survivors see: their connections with it closed, all at once
        or one beat at a time."""
        ranks = sorted(self.dead)
        self.report_closed(index, accepted=False, named=ranks[dead % len(ranks)], groups=groups)

    @precondition(lambda self: len(self._beating()) > 1)
    @rule(index=st.integers(0, 4))
    def node_drains(self, index: int) -> None:
        """Ray is told that a member's node will go (a preemption notice): the coordinator reads it."""
        rank = self._beating()[index % len(self._beating())]
        self.draining.add(self.members[rank].node_id)
        self._read_drains()

    @precondition(lambda self: any(self.members[r].node_id in self.draining for r in self._beating()))
    @rule(index=st.integers(0, 4))
    def hands_over(self, index: int) -> None:
        """A member on a draining node hands its place over (a step saved after the notice
        committed); once taken, its node is declared dead and its process ends with it."""
        ranks = [r for r in self._beating() if self.members[r].node_id in self.draining]
        rank = ranks[index % len(ranks)]
        member = self.members[rank]
        live = self.gens.current is not None and self.gens.current.members.get(rank) == member
        expected = live and rank not in self.gens.lost and rank not in self.joined
        assert self.gens.hand_over(member, now=self.now) == expected, (rank, self.gens.lost, self.joined)
        if expected:
            self.handed_over.add(rank)
            self.checked.discard(rank)
            self._check_losses()
            self.dead[rank] = self.now
            self.dead_nodes.add(member.node_id)

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
    def a_member_whose_function_returned_is_never_hung(self) -> None:
        """The hang watcher never kills a member that finished (its beats stop on purpose),
        however long the others go on; one that did not finish and went silent is hung."""
        if getattr(self, "gens", None) is None or self.gens.current is None:
            return
        later = self.now + 3600.0  # an hour on: every member still in the generation is long silent
        hung = {m.rank for m in self.gens.hung(later, hang_timeout_s=10.0)}
        current = self.gens.current.members
        finished = {r for r in self.finished if current.get(r) == self.members[r]}
        assert not hung & finished, (hung, finished)
        waiting = {m.rank for m in self.gens.pending.values()}
        expected = {r for r, m in current.items() if r not in finished and r not in waiting}
        assert hung == expected, (hung, expected, finished, waiting)

    @invariant()
    def no_member_whose_node_is_going_is_in_the_round(self) -> None:
        if getattr(self, "gens", None) is None:
            return
        for rank, member in self.gens.pending.items():
            assert rank not in self.orphaned and member.incarnation not in self.gens.doomed, (rank, self.orphaned)
        assert sorted(self.gens.pending) == sorted(self.joined)

    @invariant()
    def every_loss_was_checked_as_it_was_found(self) -> None:
        """The safety checks of ``_check_losses`` ran for every loss (no loss slipped past)."""
        if getattr(self, "gens", None) is None:
            return
        assert set(self.gens.lost) == self.checked, (self.gens.lost, self.checked)

    @invariant()
    def a_dead_member_is_lost_within_its_bound(self) -> None:
        if getattr(self, "gens", None) is None or self.gens.lost:
            return
        for rank, died in self.dead.items():
            if rank in self.finished or rank in self.joined:
                continue
            bounds = [QUIET_S + 2 * INTERVAL_S]
            if self.members[rank].node_id in self.dead_nodes:
                bounds.append(2 * INTERVAL_S)  # the next tick's node table
            if rank in self.powered_off:  # probed once silent, lost once silent past SILENT_MIN_S
                bounds.append(SILENT_S + 2 * INTERVAL_S)
            if self.suspected_at is not None:
                bounds.append(SILENT_S + INTERVAL_S + max(0.0, self.suspected_at - died))
            some, every = self._evidence_at(rank)
            if some is not None:
                bounds.append(SILENT_S + INTERVAL_S + max(0.0, some - died))
            if every is not None:
                bounds.append(NAMED_S + INTERVAL_S + max(0.0, every - died))
            bound = min(bounds)
            bound += self.stalled_s + INTERVAL_S * max(self.worst_missed.values())
            assert self.now - died <= bound + 1e-9, (rank, died, self.now, bound, self.gens.lost)

    @invariant()
    def a_member_whose_node_was_fenced_is_lost_at_the_next_node_table(self) -> None:
        if getattr(self, "gens", None) is None or self.gens.lost:
            return
        for rank, fenced in self.fenced.items():
            if rank in self.finished or rank in self.joined or rank in self.dead:
                continue
            assert self.now - fenced <= 2 * INTERVAL_S + self.stalled_s + 1e-9, (rank, fenced, self.now)

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
