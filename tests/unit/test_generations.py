"""Generations of an in-place job, without Ray: who forms the next generation, and when."""

from __future__ import annotations

import pytest

from ray_ckpt.core import generations
from ray_ckpt.core.generations import Generations, Member


def member(rank: int, tag: str = "a", *, epoch: int = 1, node: str | None = None) -> Member:
    return Member(
        rank=rank, incarnation=f"{tag}{rank}", node_id=node or f"n{rank}", pid=1000 + rank, host="h", epoch=epoch
    )


def started(world_size: int = 3) -> Generations:
    gens = Generations()
    number = gens.begin(world_size, now=0.0)
    for rank in range(world_size):
        assert gens.register(member(rank), number, now=0.0)
    return gens


def test_the_next_generation_forms_only_when_every_rank_joined() -> None:
    gens = started()
    assert gens.join(member(0), now=1.0) is None and gens.join(member(1), now=1.1) is None
    assert not gens.complete()
    assert gens.join(member(2, "b"), now=5.0) is None  # the replacement of rank 2
    assert gens.complete()
    formed = gens.form(now=5.0)
    assert formed.number == 2 and formed.members[2].incarnation == "b2"
    assert gens.attempt(2).endswith(".g2") and gens.history[-1]["round_started"] == 1.0
    assert gens.pending == {}


def test_a_formed_generation_names_the_ranks_whose_process_was_replaced() -> None:
    """The wrapper tells a lost peer from the job's own error by this: the same processes
    rejoining replace no rank; a replacement of rank 2 is named."""
    gens = started()
    for rank in range(3):
        gens.join(member(rank), now=1.0)
    gens.form(now=1.0)
    assert gens.history[-1]["replaced"] == []
    gens.join(member(0), now=2.0)
    gens.join(member(1), now=2.0)
    gens.join(member(2, "b"), now=3.0)
    gens.form(now=3.0)
    assert gens.history[-1]["replaced"] == [2]


def test_a_newer_process_of_a_rank_replaces_the_older_one_in_the_round() -> None:
    gens = started()
    gens.join(member(0), now=1.0)
    gens.join(member(1), now=1.0)
    gens.join(member(1, "b"), now=2.0)  # rank 1 died while waiting and was replaced
    assert gens.pending[1].incarnation == "b1" and not gens.complete()


def test_members_on_dead_nodes_or_silent_are_dropped_from_the_round() -> None:
    gens = started()
    gens.join(member(0), now=1.0)
    gens.join(member(1), now=1.0)
    gens.join(member(2, "b", node="n9"), now=1.0)
    dropped = gens.drop_dead({"n0", "n9"}, now=2.0, beat_timeout_s=10)
    assert [m.rank for m in dropped] == [1] and sorted(gens.pending) == [0, 2]
    gens.beat(member(0), now=5.0)
    dropped = gens.drop_dead({"n0", "n9"}, now=12.5, beat_timeout_s=10)
    assert [m.rank for m in dropped] == [2]  # silent since 1.0; rank 0 beat at 5.0
    assert sorted(gens.pending) == [0]


def test_a_full_start_supersedes_the_round_and_its_epoch() -> None:
    gens = started()
    gens.join(member(0), now=1.0)
    number = gens.begin(3, now=2.0)
    assert gens.epoch == 2 and gens.pending == {}
    refused = gens.join(member(1), now=3.0)
    assert refused == generations.JoinReply(generations.JoinStatus.SUPERSEDED), (
        "a join from the previous epoch is refused"
    )
    assert not gens.register(member(0), number, now=3.0), "a member of the old epoch cannot register"
    assert gens.register(member(0, "c", epoch=2), number, now=3.0)


def test_a_waiter_that_gives_up_leaves_the_round() -> None:
    gens = started()
    gens.join(member(0), now=1.0)
    gens.join(member(1), now=1.0)
    gens.leave("a0")
    assert sorted(gens.pending) == [1]


def test_hung_members_are_those_silent_past_the_bound() -> None:
    gens = started()
    gens.beat(member(0), now=9.0)
    gens.beat(member(1), now=9.0)
    assert [m.rank for m in gens.hung(now=10.5, hang_timeout_s=10)] == [2]
    assert gens.hung(now=5.0, hang_timeout_s=10) == []


def test_the_hang_bound_grows_once_every_ranks_beat_would_overload_the_coordinator() -> None:
    """Every rank beats every bound / 4: the bound stays as asked while that is at most
    BEATS_PER_S beats a second, and grows with the world size beyond."""
    assert generations.hang_bound_s(10.0, 8) == 10.0
    largest = int(generations.BEATS_PER_S * 10.0 / 4)  # 500 ranks at 10 s
    assert generations.hang_bound_s(10.0, largest) == 10.0
    bound = generations.hang_bound_s(10.0, 32768)
    assert bound > 10.0 and 32768 / (bound / 4) == pytest.approx(generations.BEATS_PER_S)


def test_a_join_is_answered_formed_with_its_generation_or_superseded_or_given_up() -> None:
    """The coordinator's typed replies (``JoinReply``): FORMED once a newer generation holds
    this very member, SUPERSEDED once a full start ended its epoch, None while it waits, and
    TIMEOUT naming the missing ranks when it gives up (it leaves the round). FORMED names the
    ranks the generation before lost, and how."""
    gens = started()
    after = gens.current.number  # type: ignore[union-attr]
    gens.find_lost(now=0.5, alive_nodes={"n0", "n1"})
    gens.join(member(0), now=1.0)
    gens.join(member(1), now=1.5)
    assert gens.join_reply(member(0), after) is None
    timeout = gens.give_up(member(1))
    assert timeout == generations.JoinReply(generations.JoinStatus.TIMEOUT, missing=(2,))
    assert sorted(gens.pending) == [0]
    gens.join(member(1), now=2.0)
    gens.join(member(2, "b"), now=3.0)
    gens.form(now=3.5)
    reply = gens.join_reply(member(0), after)
    assert reply == generations.JoinReply(
        generations.JoinStatus.FORMED,
        generation=after + 1,
        attempt=gens.attempt(after + 1),
        formed_at=3.5,
        round_started=1.0,
        replaced=(2,),
        lost=((2, "node dead"),),
    )
    assert gens.join_reply(member(2), after) is None, "rank 2's old process is not the one that formed"
    # a poll carries the member's (rank, incarnation, epoch) only, and gets the same reply;
    # every member of the generation gets one object, which a batch of replies pickles once
    assert gens.join_reply(member(0).waiting, after) is reply is gens.join_reply(member(1), after)
    assert gens.join_reply(member(2).waiting, after) is None
    gens.begin(3, now=4.0)
    superseded = gens.join_reply(member(2), after)
    assert superseded is not None and superseded.status is generations.JoinStatus.SUPERSEDED
    assert gens.join_reply(member(2).waiting, after) == superseded


def test_the_coordinators_replies_come_back_whole_from_a_pickle() -> None:
    """They cross Ray by pickle: the status is the same enum member, so ``is`` compares it."""
    import pickle

    reply = generations.JoinReply(generations.JoinStatus.FORMED, generation=2, attempt="r.g2", replaced=(1,))
    back = pickle.loads(pickle.dumps(reply))
    assert back == reply and back.status is generations.JoinStatus.FORMED
    begun = generations.BeginReply(epoch=1, generation=1, attempt="r.g1")
    assert pickle.loads(pickle.dumps(begun)) == begun


def beat_all(gens: Generations, ranks: list[int], now: float, **kwargs: bool) -> None:
    for rank in ranks:
        gens.beat(member(rank), now=now, **kwargs)


def test_a_member_on_a_dead_node_is_lost_and_everyone_else_must_leave() -> None:
    gens = started()
    assert gens.find_lost(now=0.5, alive_nodes={"n0", "n1", "n2"}) == []
    assert not any(gens.must_leave(member(rank)) for rank in range(3))
    lost = gens.find_lost(now=0.6, alive_nodes={"n0", "n1"})
    assert [m.rank for m in lost] == [2] and gens.lost[2]["reason"] == "node dead"
    assert gens.must_leave(member(0)) and gens.must_leave(member(1))
    assert gens.find_lost(now=0.7, alive_nodes={"n0", "n1"}) == [], "found once"
    gens.join(member(0), now=0.8)
    assert not gens.must_leave(member(0)), "a member in the round has left already"
    assert not gens.must_leave(member(2, "b")), "a replacement is no member of the generation"


def first_loss(gens: Generations, first_tick: int, beating: tuple[int, ...] = (0, 1)) -> tuple[float, list[int]]:
    """The ``beating`` ranks beat every 0.1 s from ``first_tick``; when the first loss is found, and whose."""
    for tick in range(first_tick, 50):
        now = tick * 0.1
        beat_all(gens, list(beating), now)
        lost = gens.find_lost(now=now, alive_nodes=None)
        if lost:
            return now, [m.rank for m in lost]
    return now, []


def test_silence_after_a_closed_connection_is_a_loss_after_half_a_second_and_without_one_after_three() -> None:
    """Counted in the peers' beats and in seconds: rank 2 stops beating at 0.0; ranks 0 and 1
    beat every 0.1 s."""
    gens = started()
    now, lost = first_loss(gens, 1)
    assert lost == [2] and gens.lost[2]["reason"] == "silent"
    assert now == pytest.approx(3.1)  # past QUIET_MIN_S

    gens = started()
    beat_all(gens, [0, 1], 0.1)
    gens.beat(member(0), now=0.15, suspect=True)  # rank 0 saw a connection close
    now, lost = first_loss(gens, 2)
    assert lost == [2] and gens.lost[2]["reason"] == "silent after a closed connection"
    assert now == pytest.approx(0.6)  # past SILENT_MIN_S


def gloo_pair(low: int, high: int) -> tuple[generations.Connection, generations.Connection]:
    """The gloo connection between ranks ``low`` and ``high`` as each end sees it: ``low``
    dialed ``high``'s listener (one end written IPv6-mapped, as an IPv6 socket shows it)."""
    dialer, listener = ("10.0.0.1", 50000 + 10 * low + high), ("10.0.0.1", 40000 + high)
    return (dialer, listener), (("::ffff:10.0.0.1", listener[1]), dialer)


def reported(rank: int, world_size: int = 3, generation: int = 1) -> generations.Connections:
    """Rank ``rank``'s gloo connections, as its first beat of ``generation`` reports them."""
    ends = [gloo_pair(rank, peer)[0] for peer in range(rank + 1, world_size)]
    ends += [gloo_pair(peer, rank)[1] for peer in range(rank)]
    return (generation, tuple(ends))


def test_a_closed_connection_names_the_peer_that_reported_its_other_end_lost_after_a_quarter_second() -> None:
    """Ranks 0 and 1 see their connections with rank 2 close (rank 0 dialed it, rank 1 too,
    each seen from its own end); rank 2 stops beating at 0.0: it is lost past
    NAMED_SILENT_MIN_S, not SILENT_MIN_S, and rank 1, which beats, never is. Rank 2 closing the
    ones it accepted from 0 and 1 would name it just the same from their side."""
    for closer in (0, 1):
        gens = started()
        for rank in range(3):
            gens.take(generations.Beat(member(rank), connections=reported(rank)), now=0.0)
        beat_all(gens, [0, 1], 0.1)
        gens.take(generations.Beat(member(closer), closed=(gloo_pair(closer, 2)[0],)), now=0.15)
        now, lost = first_loss(gens, 2)
        assert lost == [2] and gens.lost[2]["reason"] == "silent after its connection closed"
        assert now == pytest.approx(0.3)  # past NAMED_SILENT_MIN_S = 0.25
        assert not gens.suspected, "a connection this rank made is no accepted one"
    gens = started()
    for rank in range(3):
        gens.take(generations.Beat(member(rank), connections=reported(rank)), now=0.0)
    gens.take(generations.Beat(member(2), closed=(gloo_pair(0, 2)[1],), suspect=True), now=0.0)  # 2 saw 0's close
    beat_all(gens, [1, 2], 0.1)
    now, lost = first_loss(gens, 2, beating=(1, 2))
    assert lost == [0] and now == pytest.approx(0.3)


def test_a_named_peer_that_keeps_beating_is_never_lost_and_other_closures_name_nobody() -> None:
    """A closure of rank 0's connection with rank 1 while rank 1 beats (it closed a group of
    its own), one that nobody reported from the other end (the same address pair reversed
    only), and connections reported for another generation: nobody is lost."""
    gens = started()
    for rank in (0, 1):
        gens.take(generations.Beat(member(rank), connections=reported(rank)), now=0.0)
    gens.take(generations.Beat(member(2), connections=reported(2, generation=7)), now=0.0)  # stale
    unknown = (("10.0.0.1", 40002), ("10.0.0.9", 1))  # 2's listener, but no connection 2 reported
    closed = (gloo_pair(0, 1)[0], gloo_pair(0, 2)[0], unknown)
    gens.take(generations.Beat(member(0), closed=closed), now=0.0)
    for tick in range(1, 20):
        beat_all(gens, [0, 1, 2], tick * 0.1)
        assert gens.find_lost(now=tick * 0.1, alive_nodes=None) == []
    gens.take(generations.Beat(member(2, "old"), connections=reported(2)), now=2.0)  # not a member
    assert set(gens.connections) == {"a0", "a1"}


def in_groups(connection: generations.Connection, group: int) -> generations.Connection:
    """``connection`` as gloo made it for process group ``group`` (0: WORLD; 1: a subgroup)."""
    (local_ip, local_port), (remote_ip, remote_port) = connection
    return ((local_ip, local_port + 1000 * group), (remote_ip, remote_port + 1000 * group))


def started_with_subgroups(world_size: int = 3) -> Generations:
    """``started``, every member having reported its pairs of WORLD and of one subgroup."""
    gens = started(world_size)
    for rank in range(world_size):
        _, ends = reported(rank, world_size)
        both = tuple(in_groups(end, group) for end in ends for group in (0, 1))
        gens.take(generations.Beat(member(rank), connections=(1, both)), now=0.0)
    return gens


def test_one_of_a_members_connections_closed_while_it_pauses_a_third_of_a_second_is_no_loss() -> None:
    """Rank 0 sees one of its two connections with rank 1 close (a subgroup destroyed, or a
    socket taken for another); rank 1's beat thread pauses 0.3 s (a GC) from 0.1 s: it is not
    lost, as one closure alone needs SILENT_MIN_S of silence. Had rank 1 stayed silent, it
    would be lost past SILENT_MIN_S, not NAMED_SILENT_MIN_S."""
    gens = started_with_subgroups()
    beat_all(gens, [0, 1, 2], 0.1)
    gens.take(generations.Beat(member(0), closed=(in_groups(gloo_pair(0, 1)[0], 1),)), now=0.15)
    for tick in range(2, 30):
        now = tick * 0.1
        beat_all(gens, [0, 2] if tick <= 4 else [0, 1, 2], now)
        assert gens.find_lost(now=now, alive_nodes=None) == [], now

    gens = started_with_subgroups()
    beat_all(gens, [0, 1, 2], 0.1)
    gens.take(generations.Beat(member(0), closed=(in_groups(gloo_pair(0, 1)[0], 1),)), now=0.15)
    now, lost = first_loss(gens, 2, beating=(0, 2))
    assert lost == [1] and gens.lost[1]["reason"] == "silent after its connection closed"
    assert now == pytest.approx(0.7)  # past SILENT_MIN_S since its last beat at 0.1


def test_a_peer_that_saw_every_connection_with_a_member_close_names_it_after_a_quarter_second() -> None:
    """Rank 0 sees both its connections with rank 1 close, one beat apart, as a dead process's
    close; rank 1's last beat, on its way before it died, is taken after the first: lost past
    NAMED_SILENT_MIN_S from that beat."""
    gens = started_with_subgroups()
    beat_all(gens, [0, 1, 2], 0.1)
    gens.take(generations.Beat(member(0), closed=(in_groups(gloo_pair(0, 1)[0], 0),)), now=0.15)
    gens.beat(member(1), now=0.2)  # late
    beat_all(gens, [0, 2], 0.2)
    closed = tuple(in_groups(gloo_pair(0, 1)[0], group) for group in (0, 1))
    gens.take(generations.Beat(member(0), closed=closed), now=0.25)
    now, lost = first_loss(gens, 3, beating=(0, 2))
    assert lost == [1] and gens.lost[1]["reason"] == "silent after its connection closed"
    assert now == pytest.approx(0.5)  # past NAMED_SILENT_MIN_S since 0.2


def test_a_closure_no_longer_counts_against_a_member_that_beat_twice_since() -> None:
    """Rank 0 sees its only connection with rank 1 close at 0.15 s while rank 1 beats on; from
    0.5 s rank 1 is silent: it is lost as any silent member is, past QUIET_MIN_S, not a
    quarter second after."""
    gens = started()
    for rank in range(3):
        gens.take(generations.Beat(member(rank), connections=reported(rank)), now=0.0)
    gens.take(generations.Beat(member(0), closed=(gloo_pair(0, 1)[0],)), now=0.15)
    for tick in range(1, 6):
        beat_all(gens, [0, 1, 2], tick * 0.1)
        assert gens.find_lost(now=tick * 0.1, alive_nodes=None) == []
    now, lost = first_loss(gens, 6, beating=(0, 2))
    assert lost == [1] and gens.lost[1]["reason"] == "silent" and now == pytest.approx(0.5 + 3.1)


def test_a_closure_its_witness_never_reported_among_its_own_connections_names_nobody() -> None:
    """Rank 0 reports a closed connection with rank 1 that is not among the connections it
    reported (no gloo pair of its own): rank 1, silent for a second, is not lost by it."""
    gens = started()
    for rank in range(3):
        ends = reported(rank)[1] if rank else tuple(reported(0)[1][1:])  # 0 left out its pair with 1
        gens.take(generations.Beat(member(rank), connections=(1, ends)), now=0.0)
    gens.take(generations.Beat(member(0), closed=(gloo_pair(0, 1)[0],)), now=0.15)
    for tick in range(1, 12):
        beat_all(gens, [0, 2], tick * 0.1)
        assert gens.find_lost(now=tick * 0.1, alive_nodes=None) == []
    assert not gens.closed


def test_a_beat_crosses_the_wire_as_a_plain_tuple() -> None:
    beat = generations.Beat(member(1), True, False, (gloo_pair(0, 1)[1],), reported(1))
    assert generations.Beat.from_wire(beat.to_wire()) == beat
    assert generations.Beat.from_wire(generations.Beat(member(0)).to_wire()) == generations.Beat(member(0))


def test_a_new_generation_forgets_the_closures_and_connections_of_the_one_before() -> None:
    gens = started()
    for rank in (0, 2):
        gens.take(generations.Beat(member(rank), connections=reported(rank)), now=0.0)
    gens.take(generations.Beat(member(0), closed=(gloo_pair(0, 2)[0],)), now=0.1)
    assert gens.closed and gens.connections
    for rank in range(3):
        gens.join(member(rank), now=0.2)
    gens.form(now=0.2)
    assert not gens.closed and not gens.connections


def test_a_coordinator_that_stalls_and_takes_a_backlog_of_beats_finds_nobody_silent() -> None:
    """Two seconds without any beat taken, then every member's queued beats at once: silence in
    seconds alone would lose them all; nobody's peers beat more than it did."""
    gens = started()
    gens.beat(member(0), now=0.0, suspect=True)
    assert gens.find_lost(now=2.0, alive_nodes=None) == []
    for rank in range(3):
        gens.beat(member(rank), now=2.0)
        assert gens.find_lost(now=2.0, alive_nodes=None) == []


def test_a_member_whose_function_returned_is_never_lost_by_silence() -> None:
    gens = started()
    gens.finish(member(2))
    for tick in range(1, 30):
        beat_all(gens, [0, 1], tick * 0.1, suspect=True)
        assert gens.find_lost(now=tick * 0.1, alive_nodes=None) == []
    assert not gens.must_leave(member(0))


def test_a_member_whose_function_returned_is_never_hung_while_its_peers_go_on() -> None:
    """Rank 2 returned first (rank 0 still evaluates): its beats stop on purpose, and however
    long the others go on past the hang bound it is neither hung (killed) nor lost; a rank that
    did not finish and stopped beating still is."""
    gens = started()
    gens.finish(member(2))
    for tick in range(1, 400):
        beat_all(gens, [0], tick * 0.1)
        gens.find_lost(now=tick * 0.1, alive_nodes=None)
    assert [m.rank for m in gens.hung(now=40.0, hang_timeout_s=10)] == [1]
    assert 2 not in gens.lost


def test_a_suspicion_from_outside_the_generation_is_ignored_and_a_new_generation_starts_clean() -> None:
    gens = started()
    gens.beat(member(1, "old"), now=0.1, suspect=True)  # a process of an older generation
    assert not gens.suspected
    gens.find_lost(now=0.2, alive_nodes={"n0", "n1"})
    for rank in range(2):
        gens.join(member(rank), now=0.3)
    gens.join(member(2, "b"), now=0.5)
    gens.form(now=0.5)
    assert gens.history[-1]["lost"] == [{"rank": 2, "pid": 1002, "reason": "node dead", "time": 0.2}]
    assert gens.lost == {} and not gens.suspected
    assert not any(gens.must_leave(m) for m in (member(0), member(1), member(2, "b")))


def test_an_open_round_tells_every_member_that_has_not_joined_to_leave_at_once() -> None:
    gens = started()
    gens.join(member(1), now=1.0)  # its collective failed first
    assert gens.must_leave(member(0)) and gens.must_leave(member(2))
    assert not gens.must_leave(member(1))


def test_the_beat_interval_is_a_tenth_of_a_second_until_the_coordinators_rate_caps_it() -> None:
    assert generations.beat_interval_s(10.0, 4) == generations.MIN_BEAT_INTERVAL_S
    assert generations.beat_interval_s(10.0, 400) == pytest.approx(400 / generations.BEATS_PER_S)
    assert generations.beat_interval_s(0.2, 4) == pytest.approx(0.05), "at least four beats per hang bound"
    # through the stores' relay tree the coordinator takes beats in batches: a large run beats far more often
    batched = generations.beat_interval_s(10.0, 8192, batched=True)
    assert batched == pytest.approx(8192 / generations.BATCHED_BEATS_PER_S)
    assert batched < generations.beat_interval_s(10.0, 8192) / 10
    assert generations.beat_interval_s(10.0, 4, batched=True) == generations.MIN_BEAT_INTERVAL_S


def test_a_member_whose_raylet_is_gone_is_lost_at_its_own_word() -> None:
    """Its worker process outlives its node's raylet a moment and says so in a beat; a process
    of another generation saying it changes nothing."""
    gens = started()
    gens.beat(member(2, "old"), now=0.1, orphaned=True)
    assert gens.lost == {}
    gens.beat(member(2), now=0.1, orphaned=True)
    assert gens.lost[2]["reason"] == "raylet gone"
    assert gens.must_leave(member(0)) and gens.must_leave(member(1))


def test_a_member_whose_node_is_going_cannot_join_and_leaves_the_round_it_is_in() -> None:
    """The failure that made a round form with a dying process: the killed node's worker, told
    to leave like every survivor, joined the round before it died."""
    gens = started()
    gens.beat(member(1), now=0.1, orphaned=True)
    assert gens.join(member(1), now=0.2) == generations.JoinReply(generations.JoinStatus.DOOMED)
    assert gens.join(member(0), now=0.2) is None and gens.join(member(2), now=0.2) is None
    assert not gens.complete() and sorted(gens.pending) == [0, 2]
    # one that joined first and says so after is taken out of the round
    gens.join(member(1, "b"), now=0.3)
    gens.beat(member(1, "b"), now=0.4, orphaned=True)
    assert sorted(gens.pending) == [0, 2]
    assert gens.join(member(1, "c"), now=0.5) is None and gens.complete(), "its replacement may join"


def test_a_member_found_on_a_dead_node_cannot_join() -> None:
    gens = started()
    assert [m.rank for m in gens.find_lost(now=0.5, alive_nodes={"n0", "n1"})] == [2]
    assert gens.join(member(2), now=0.6) == generations.JoinReply(generations.JoinStatus.DOOMED)
    gens.join(member(0), now=0.6)
    gens.join(member(1, "b", node="n9"), now=0.6)
    gens.drop_dead({"n0", "n2"}, now=0.7, beat_timeout_s=5.0)
    assert gens.join(member(1, "b", node="n9"), now=0.8) == generations.JoinReply(generations.JoinStatus.DOOMED)


def test_a_member_lost_by_silence_whose_node_then_dies_cannot_join() -> None:
    """Found by the loss-detection model: a member already lost (silent) was never looked at
    again, so its node's death did not doom it and its dying process could join."""
    gens = started()
    now, lost = first_loss(gens, 1)  # rank 2 never beats
    assert lost == [2]
    gens.find_lost(now=now + 0.1, alive_nodes={"n0", "n1"})
    assert gens.join(member(2), now=now + 0.2) == generations.JoinReply(generations.JoinStatus.DOOMED)


def test_a_recovery_is_under_way_from_a_loss_or_a_join_until_the_next_generation_forms() -> None:
    """What the controller's prompt polls follow (``GenerationCoordinator.await_recovery``)."""
    gens = started()
    assert not gens.recovering()
    gens.find_lost(now=0.6, alive_nodes={"n0", "n1"})
    assert gens.recovering(), "a member lost"
    for rank, tag in ((0, "a"), (1, "a"), (2, "b")):
        gens.join(member(rank, tag), now=1.0)
    gens.form(now=1.0)
    assert not gens.recovering(), "the next generation formed"
    gens.join(member(1), now=2.0)  # a survivor whose collective failed before any loss was found
    assert gens.recovering(), "a round is open"


def test_a_drain_is_told_to_every_member_and_names_the_ranks_on_the_draining_nodes() -> None:
    gens = started(4)
    gens.set_drains({"n2": 1000.0, "elsewhere": None})
    replies = gens.beat_many([generations.Beat(member(rank)) for rank in range(4)], 0.1, None)
    assert [reply.leave for reply in replies] == [False] * 4
    assert {reply.drain for reply in replies} == {generations.DrainNotice((2,), ("elsewhere", "n2"), 1000.0)}
    gens.set_drains({})
    assert gens.beat_many([generations.Beat(member(0))], 0.2, None) == [generations.STAY]


def test_a_handover_makes_the_rank_lost_and_doomed_and_its_peers_leave() -> None:
    gens = started(3)
    gens.set_drains({"n1": None})
    assert gens.live_on("n1") == [1]
    assert gens.hand_over(member(1), now=0.5)
    assert gens.lost[1]["reason"] == "drained" and gens.live_on("n1") == []
    assert gens.notice is not None and gens.notice.ranks == ()  # no live rank is left on a draining node
    assert [reply.leave for reply in gens.beat_many([generations.Beat(member(r)) for r in (0, 2)], 0.6, None)] == [
        True,
        True,
    ]
    assert gens.join(member(1), now=0.7) == generations.JoinReply(generations.JoinStatus.DOOMED)
    assert not gens.hand_over(member(1), now=0.8)  # once
    for rank in (0, 2):
        assert gens.join(member(rank), now=0.9) is None
    assert gens.join(member(1, "b", node="n9"), now=1.0) is None
    assert gens.complete()
    formed = gens.form(now=1.1)
    assert formed.members[1].node_id == "n9" and gens.history[-1]["replaced"] == [1]
    gens.set_drains({"n1": None})
    assert gens.notice is not None and gens.notice.ranks == ()  # the replacement is elsewhere


def test_a_member_that_is_not_in_the_generation_cannot_hand_over() -> None:
    gens = started(2)
    assert not gens.hand_over(member(1, "stranger"), now=0.1)
    assert not gens.lost


def test_a_handover_takes_every_live_rank_on_the_node_and_never_one_on_the_head() -> None:
    gens = Generations()
    number = gens.begin(4, now=0.0)
    nodes = ["n0", "shared", "shared", "head"]
    for rank, node in enumerate(nodes):
        assert gens.register(member(rank, node=node), number, now=0.0)
    gens.set_drains({"shared": 50.0, "head": 40.0, "stores-only": 30.0}, keep={"head"})
    assert gens.notice == generations.DrainNotice((1, 2), ("head", "shared", "stores-only"), 50.0)
    assert not gens.hand_over(member(3, node="head"), now=0.1)  # the head cannot be declared dead
    assert gens.hand_over(member(1, node="shared"), now=0.2)
    assert {rank: lost["reason"] for rank, lost in gens.lost.items()} == {1: "drained", 2: "drained"}
    assert gens.live_on("shared") == [] and gens.notice is not None and gens.notice.ranks == ()
    assert gens.join(member(2, node="shared"), now=0.3) == generations.JoinReply(generations.JoinStatus.DOOMED)


def test_a_node_that_only_runs_a_store_is_named_with_no_rank_to_hand_over() -> None:
    gens = started(2)
    gens.set_drains({"stores-only": None})
    assert gens.notice == generations.DrainNotice((), ("stores-only",), None)


def test_a_live_member_lost_while_its_probe_failed_rejoins_with_its_process_until_its_node_is_dead() -> None:
    """Rank 2 pauses (a busy host) while a probe of its node fails: it is lost ("node
    unreachable") but not doomed, so it rejoins with its process once it answers; only the
    node's death (a fence, Ray's verdict) refuses it a place."""
    gens = started()
    lost: list[Member] = []
    for tick in range(1, 20):
        now = tick * 0.1
        beat_all(gens, [0, 1], now)
        lost = gens.find_lost(now=now, alive_nodes={"n0", "n1", "n2"}, unreachable={"n2"})
        if lost:
            break
    assert [m.rank for m in lost] == [2] and gens.lost[2]["reason"] == "node unreachable"
    assert now == pytest.approx(0.6)  # past SILENT_MIN_S
    assert gens.join(member(2), now=now + 0.1) is None, "its process lives: it rejoins"
    assert gens.join(member(0), now=now + 0.1) is None and gens.join(member(1), now=now + 0.1) is None
    assert gens.complete()

    gens = started()
    for tick in range(1, 8):
        beat_all(gens, [0, 1], tick * 0.1)
        gens.find_lost(now=tick * 0.1, alive_nodes={"n0", "n1", "n2"}, unreachable={"n2"})
    gens.find_lost(now=0.8, alive_nodes={"n0", "n1"})  # its node is fenced: dead from now on
    assert gens.join(member(2), now=0.9) == generations.JoinReply(generations.JoinStatus.DOOMED)
