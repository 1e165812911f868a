"""The generation coordinator: the per-run Ray actor over ``ray_ckpt.core.generations.Generations``
(its module docstring tells the rendezvous and the hang watcher this actor serves). Its replies
are that module's frozen records; callers reach it through
``ray_ckpt.transport.coordinator_client.CoordinatorClient``, which bounds every call."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import ray

from ray_ckpt import _ray_compat
from ray_ckpt.core.generations import (
    POLL_S,
    Beat,
    BeatReply,
    BeatWire,
    BeginReply,
    CoordinatorReport,
    Generations,
    JoinReply,
    Member,
    MemberWire,
    Waiting,
    beat_interval_s,
    hang_bound_s,
)
from ray_ckpt.transport import naming

T = TypeVar("T")
logger = logging.getLogger(__name__)

RECOVERY_CHECK_S = 0.05  # how often ``await_recovery`` looks (losses and joins are not all notified)
PROBE_TIMEOUT_S = 0.3  # a raylet that does not accept a connection this long is unreachable
FENCE_AFTER_S = 0.5  # a member's node whose raylet stayed unreachable this long is declared dead ...
FENCE_PROBES = 3  # ... after at least this many failed probes in a row (a lost SYN costs one probe, not three)
SWEEP_EVERY_S = 0.1  # how often the node of every member is probed while fencing is on (``_sweep``)
SWEEP_PER_TICK = 64  # the most nodes a sweep probes at once
PROBES_IN_FLIGHT = 3  # the most probes of one node at once (``_reprobe``) ...
REPROBE_S = 0.1  # ... one more every this long while one is unanswered or the node's streak of failures lasts
REFUSED_FENCE_AFTER_S = _ray_compat.REFUSED_FENCE_AFTER_S  # a member's node whose raylet's host refused ...
REFUSED_PROBES = 2  # ... this many probes in a row over this long: its raylet is gone (not one still starting)
DRAIN_POLL_S = 0.5  # how often the watcher asks the GCS which nodes drain
DECLARE_TRIES = 5  # how many times a drained node's declaration is tried while Ray lists it alive


# what ``probe`` finds of a raylet; a refusal is named as the controller's blocking probe names it
ANSWERS, REFUSED, SILENT = "answers", _ray_compat.REFUSED, "silent"


async def reachable(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the host at ``address`` ("ip:port", a raylet) answers a TCP connection within
    ``timeout_s`` (``probe``): a listener or a refusal (the host is up), True. Only silence is
    False, as a node that lost power, its link, or its route to this process gives."""
    return await probe(address, timeout_s) != SILENT


async def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """What the host at ``address`` ("ip:port", a raylet) answers a TCP connection within
    ``timeout_s``: ``ANSWERS`` (something listens), ``REFUSED`` (the host is up and nothing
    listens there: the raylet is gone) or ``SILENT`` (no answer, no route).

    The verdict is read from the socket, not from when this loop got round to it: once
    ``timeout_s`` has passed, a handshake the kernel completed counts as an answer, however
    late a loaded host let this loop see it. A busy coordinator never takes a live node for a
    silent one; it only takes longer to find a silent one."""
    host, _, port = address.rpartition(":")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return SILENT
    loop = asyncio.get_running_loop()
    try:
        sock.setblocking(False)
        code = sock.connect_ex((host.strip("[]"), int(port)))
        if code in (0, errno.ECONNREFUSED):
            return ANSWERS if code == 0 else REFUSED
        if code not in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            return SILENT  # no route, network unreachable: the host cannot be reached
        settled: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not settled.done():
                settled.set_result(None)

        loop.add_writer(sock, settle)
        try:
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(settled, timeout_s)
        finally:
            loop.remove_writer(sock)
        settled_now = select.poll()  # now, from the kernel: did it settle? (poll: any descriptor number)
        settled_now.register(sock, select.POLLOUT)
        if not settled_now.poll(0):
            return SILENT
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return ANSWERS if error == 0 else REFUSED if error == errno.ECONNREFUSED else SILENT
    except (OSError, ValueError):
        return SILENT
    finally:
        sock.close()


def refused_fences(
    members: dict[int, Member],
    refused_since: dict[str, float],
    refusals: dict[str, int],
    now: float,
) -> list[tuple[int, str, float]]:
    """The members whose node's raylet is gone: its host has refused ``REFUSED_PROBES`` probes
    in a row over at least ``REFUSED_FENCE_AFTER_S`` (``now`` and ``refused_since`` on one
    monotonic clock; one refusal alone may be a raylet still starting). As (rank, node id,
    seconds refused), a node once (its first such rank). A raylet does not come back on its
    port, and the workers of a node without one end, so such a node is dead whatever Ray says
    yet: declaring it dead costs nothing and starts the replacement of its ranks before Ray's
    health checks would, and before its ranks' silence has lasted long enough to lose them."""
    fences: list[tuple[int, str, float]] = []
    for rank, member in sorted(members.items()):
        since = refused_since.get(member.node_id)
        if since is None or any(node == member.node_id for _, node, _ in fences):
            continue
        if now - since >= REFUSED_FENCE_AFTER_S and refusals.get(member.node_id, 0) >= REFUSED_PROBES:
            fences.append((rank, member.node_id, now - since))
    return fences


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@ray.remote(num_cpus=0, max_restarts=0)
class GenerationCoordinator:
    """The per-run actor over ``Generations`` (see the module docstring)."""

    def __init__(
        self, hang_timeout_s: float, watch_interval_s: float = 0.25, *, fence_silent_nodes: bool = False
    ) -> None:
        self._gens = Generations()
        self._changed = asyncio.Condition()
        self._hang_timeout_s = hang_timeout_s  # as asked; the bound used is hang_bound_s of it
        self._hang_s = hang_timeout_s
        self._beat_s = beat_interval_s(hang_timeout_s, 1)
        self._watch_interval_s = watch_interval_s
        self._killed: list[dict[str, Any]] = []
        self._watcher: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._alive: set[str] | None = None  # alive node ids as of the watcher's last tick
        self._raylets: dict[str, str] = {}  # node id -> its raylet's address, as of the last tick
        self._unreachable: set[str] = set()  # nodes whose raylet did not answer the last probe
        self._silent_nodes: set[str] = set()  # nodes of the members silent at the watcher's last tick
        self._probing: dict[str, int] = {}  # node id -> its probes in flight
        self._reprobing: set[str] = set()  # nodes probed again every REPROBE_S (``_reprobe``)
        self._background: set[asyncio.Task[None]] = set()  # probes in flight (the loop keeps only weak references)
        self._unreachable_since: dict[str, float] = {}  # node id -> the first failed probe of its streak
        self._failed_probes: dict[str, int] = {}  # node id -> failed probes in the streak
        self._probed_at: dict[str, float] = {}  # node id -> when its last probe ended
        self._refused_since: dict[str, float] = {}  # node id -> the first refusal of its streak (its raylet gone)
        self._refusals: dict[str, int] = {}  # node id -> refused probes in the streak
        self._fence = fence_silent_nodes
        self._fenced: list[dict[str, Any]] = []
        self._fence_held = False  # most nodes fail their probes: fencing is held (logged once)
        self._drains_read = 0.0  # when the watcher last asked the GCS which nodes drain
        self._handed_over: list[dict[str, Any]] = []  # rank, pid, node_id, time of each handover
        self._losses_logged: set[tuple[int, int, int]] = set()  # (generation, rank, pid) of each loss logged

    def _log_losses(self) -> None:
        """Log each member found lost, once, with the reason: the record of why a rank's process
        was left behind or replaced (``report`` keeps it per generation formed)."""
        current = self._gens.current
        if current is None:
            return
        for rank, lost in sorted(self._gens.lost.items()):
            key = (current.number, rank, int(lost["pid"]))
            if key not in self._losses_logged:
                self._losses_logged.add(key)
                logger.warning(
                    "ray_ckpt: rank %d (pid %d) of generation %d is lost: %s",
                    rank,
                    lost["pid"],
                    current.number,
                    lost["reason"],
                )

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
        if self._sweeper is None and self._fence:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

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

    # Every call a worker makes per rank takes a list of entries, one per rank (members as
    # ``Member.to_wire`` tuples, which Ray moves faster in bulk than objects): a worker sends
    # its own, and a store relaying up the tree (``ray_ckpt.core.coordinator_relay``) sends the
    # merged entries of its node's ranks and of the stores below it, so the coordinator takes
    # one call per batch however many ranks the run has.

    async def register_many(self, number: int, members: list[MemberWire]) -> list[bool]:
        """Workers of a full start announce themselves; False for each whose generation
        ``number`` is superseded."""
        async with self._changed:
            now = time.time()
            return [self._gens.register(Member.from_wire(member), number, now) for member in members]

    async def beat_many(self, beats: list[BeatWire]) -> list[BeatReply]:
        """Heartbeats (``Beat.to_wire``); per member, whether it must leave its generation now
        (``Generations.must_leave``: a peer is lost or a round to replace the generation is open
        without it) and the drain under way in its generation (``Generations.notice``)."""
        return self._gens.beat_many(
            [Beat.from_wire(beat) for beat in beats], time.time(), self._alive, self._unreachable
        )

    async def hand_over(self, member: Member) -> bool:
        """``member`` leaves its place because its node drains (``Generations.hand_over``):
        its peers leave the generation at their next beat. False where it was no live member."""
        async with self._changed:
            now = time.time()
            handed = self._gens.hand_over(member, now)
            if handed:
                entry = {"rank": member.rank, "pid": member.pid, "node_id": member.node_id, "time": now}
                self._handed_over.append(entry)
                logger.warning("ray_ckpt: rank %d hands its place over: its node drains", member.rank)
                self._changed.notify_all()
                if not self._gens.live_on(member.node_id):
                    self._in_background(self._declare_drained(entry))
            return handed

    async def _declare_drained(self, entry: dict[str, Any]) -> None:
        """Every rank on a draining node handed its place over: declare the node dead to Ray
        now, not at its deadline. Its placement-group bundles move to other nodes only then, so
        the replacements can start (Ray starts nothing in a bundle on a draining node). Its
        ranks' processes end with it; a node Ray refuses to declare dead goes at its deadline."""
        for _ in range(DECLARE_TRIES):
            await self._declare_dead(entry, "ray_ckpt: the node drains and its ranks handed their places over")
            if entry["declared"] or entry["node_id"] not in (self._alive or set()):
                return
            await asyncio.sleep(self._watch_interval_s)

    async def finish(self, member: Member) -> None:
        """``member``'s training function returned: its beats stop and that is no loss."""
        self._gens.finish(member)

    async def join_many(self, members: list[MemberWire]) -> list[tuple[int, JoinReply | None]]:
        """Members ask to be in the next generation. Per member: the generation current when it
        joined (``after``, for ``await_formed``) and None while it waits in the round, or the
        final reply if it is refused (``SUPERSEDED``, ``DOOMED``). Answered at once: waiting is
        ``await_formed``'s, so a member's join never waits behind another's wait."""
        self._ensure_watcher()
        async with self._changed:
            now = time.time()
            after = 0 if self._gens.current is None else self._gens.current.number
            replies = [(after, self._gens.join(Member.from_wire(member), now)) for member in members]
            if self._gens.complete():  # the watcher drops dead members from a round still filling up
                self._try_form(now)
            return replies

    async def await_formed(self, after: int, members: list[Waiting]) -> list[JoinReply | None]:
        """Per member (its ``Member.waiting`` key) that joined while generation ``after`` was
        current: ``FORMED`` once a generation formed with it, ``SUPERSEDED`` once a full start
        overtook it, None while it still waits. Answers when any of them has its reply, or
        after ``POLL_S``."""

        def replies() -> tuple[list[JoinReply | None], bool]:
            found = [self._gens.join_reply(member, after) for member in members]
            return found, any(reply is not None for reply in found)

        return await self._answer_when(replies)

    async def give_up(self, member: Member, after: int) -> JoinReply:
        """``member`` stops waiting: its reply if its generation formed meanwhile, else it
        leaves the round with the ``TIMEOUT`` reply naming the ranks missing from it."""
        async with self._changed:
            reply = self._gens.join_reply(member, after)
            return reply if reply is not None else self._gens.give_up(member)

    async def publish(self, number: int, address: str) -> None:
        async with self._changed:
            if self._gens.current is not None and self._gens.current.number == number:
                self._gens.current.address = address
                self._changed.notify_all()

    async def address_many(self, number: int, ranks: list[int]) -> list[str | None]:
        """Generation ``number``'s rendezvous address, once per rank asking: the address once
        rank 0 published it, "" if the generation is superseded, None if it did not come within
        ``POLL_S`` (ask again)."""

        def addresses() -> tuple[list[str | None], bool]:
            current = self._gens.current
            if current is None or current.number != number:
                return [""] * len(ranks), True
            return [current.address] * len(ranks), current.address is not None

        return await self._answer_when(addresses)

    async def await_recovery(self, known: bool) -> bool:
        """Whether a recovery is under way (``Generations.recovering``); answers once that
        differs from ``known`` (checked every ``RECOVERY_CHECK_S``), or after ``POLL_S``. The
        controller watches it to poll its workers promptly during a recovery."""

        def recovering() -> tuple[bool, bool]:
            now = self._gens.recovering()
            return now, now != known

        return await self._answer_when(recovering, check_s=RECOVERY_CHECK_S)

    async def _answer_when(self, answer: Callable[[], tuple[T, bool]], check_s: float = POLL_S) -> T:
        """``answer()``'s value once it says it is ready, or as it is after ``POLL_S``; asked
        again whenever the state changes (the condition is notified) and every ``check_s``."""
        deadline = time.monotonic() + POLL_S
        async with self._changed:
            while True:
                value, ready = answer()
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return value
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, check_s))

    async def report(self) -> CoordinatorReport:
        """The generations formed after failures, the members killed as hung, and the round."""
        return CoordinatorReport(
            epoch=self._gens.epoch,
            generation=None if self._gens.current is None else self._gens.current.number,
            history=tuple(self._gens.history),
            hung_killed=tuple(self._killed),
            pending=tuple(sorted(self._gens.pending)),
            fenced=tuple(self._fenced),
            handed_over=tuple(self._handed_over),
        )

    def _fence_silent_nodes(self, now: float) -> None:
        """Declare dead to Ray (``_ray_compat.declare_node_dead``, in the background, once per
        node) each node of a current member whose raylet has failed ``FENCE_PROBES`` probes in a
        row over ``FENCE_AFTER_S``, and that is either lost there as "node unreachable" (power,
        link) or still beats through other nodes (cut off from the head and this actor, not from
        its peers). From then on the node counts as dead here: its members are lost at once, so
        their peers leave their collectives without waiting for Ray's answer. Ray's own verdict
        would come after its health checks, about a minute, and until then the lost rank's
        placement-group bundle, where its replacement goes, stays on the node. Off unless the
        run asked for it (``fence_silent_nodes``). Never while more than half of the members'
        nodes fail their probes: then this actor's own node is the likelier one cut off, and
        Ray's health checks decide."""
        if not self._fence or self._gens.current is None:
            return
        fenced = {entry["node_id"] for entry in self._fenced}
        nodes = {m.node_id for m in self._gens.current.members.values()} - fenced
        failing = {n for n in nodes if self._failed_probes.get(n, 0) > 0}
        if 2 * len(failing) > len(nodes):
            if not self._fence_held:
                self._fence_held = True
                logger.warning(
                    "ray_ckpt: %d of the run's %d nodes fail their probes at once; fencing none of them "
                    "(this node may be the one cut off), Ray's health checks decide",
                    len(failing),
                    len(nodes),
                )
            return
        self._fence_held = False
        lost = self._gens.lost
        members = self._gens.current.members
        for rank, node_id, refused_s in refused_fences(members, self._refused_since, self._refusals, time.monotonic()):
            if node_id not in fenced and members[rank].incarnation not in self._gens.finished:
                how = "lost" if rank in lost else "not yet found lost"
                reason = (
                    f"ray_ckpt: rank {rank} {how}, and this node's raylet refused connections for {refused_s:.1f} s"
                )
                self._fence_node(node_id, rank, now, reason)
                fenced.add(node_id)
        for rank, member in sorted(members.items()):
            node_id = member.node_id
            since = self._unreachable_since.get(node_id)
            if node_id in fenced or since is None or member.incarnation in self._gens.finished:
                continue
            if rank in lost and lost[rank]["reason"] != "node unreachable":
                continue  # lost otherwise: its node's fate is Ray's verdict
            silent_s = time.monotonic() - since
            if silent_s < FENCE_AFTER_S or self._failed_probes.get(node_id, 0) < FENCE_PROBES:
                continue
            how = "lost" if rank in lost else "still beating through its peers (cut off from the head)"
            self._fence_node(
                node_id, rank, now, f"ray_ckpt: rank {rank} {how}, and this node's raylet silent for {silent_s:.1f} s"
            )
            fenced.add(node_id)

    def _fence_node(self, node_id: str, rank: int, now: float, reason: str) -> None:
        """Declare ``node_id`` dead in the background (``_declare_dead``) and count it dead from
        now on: its members are lost at once, not once Ray answers."""
        entry = {"node_id": node_id, "rank": rank, "time": now, "declared": None}
        self._fenced.append(entry)
        self._in_background(self._declare_dead(entry, reason))
        if self._alive is not None:
            self._alive = self._alive - {node_id}
            self._gens.find_lost(now, self._alive, self._unreachable)

    def _to_probe(self, silent: list[Member]) -> set[str]:
        """The nodes to probe this tick: those of silent members, those whose last probe
        failed, and, while fencing is on, every member's node once per ``SWEEP_EVERY_S`` (a node
        cut off from the head whose ranks beat through their peers is silent only to a probe)."""
        nodes = {member.node_id for member in silent}
        if not self._fence or self._gens.current is None:
            return nodes
        fenced = {entry["node_id"] for entry in self._fenced}
        members = {m.node_id for m in self._gens.current.members.values()} - fenced
        nodes |= members & set(self._unreachable_since)
        due = sorted(
            (self._probed_at.get(n, 0.0), n)
            for n in members
            if time.monotonic() - self._probed_at.get(n, 0.0) >= 0.8 * SWEEP_EVERY_S  # a probe takes a little
        )
        nodes |= {n for _, n in due[:SWEEP_PER_TICK]}
        return nodes

    def _fenced_out(self) -> set[str]:
        """The fenced nodes counted dead: all but those whose declaration Ray refused."""
        return {entry["node_id"] for entry in self._fenced if entry["declared"] is not False}

    async def _declare_dead(self, entry: dict[str, Any], reason: str) -> None:
        """Declare the node dead. Its members were lost when it was fenced (the survivors leave
        their collectives without waiting for this call); where Ray refuses the declaration the
        node counts as alive again from the next node table, and its lost members' replacements
        wait for Ray's own verdict."""
        loop = asyncio.get_running_loop()
        entry["declared"] = await loop.run_in_executor(None, _ray_compat.declare_node_dead, entry["node_id"], reason)

    def _probe(self, silent: list[Member]) -> None:
        """Probe the raylets of ``_to_probe``'s nodes (in the background: a node once at a time;
        while fencing is on, a node whose probe is unanswered or failed gets one more every
        ``REPROBE_S``, up to ``PROBES_IN_FLIGHT`` at once, ``_reprobe``). ``find_lost`` is told
        of the silent members' nodes whose last probe failed; a node whose members all beat
        again leaves that set (its streak of failed probes, kept for fencing, ends only with a
        probe that succeeds or when no member is left there)."""
        silent_nodes = {member.node_id for member in silent}
        self._silent_nodes = silent_nodes
        self._unreachable &= silent_nodes
        kept = (
            silent_nodes
            if self._gens.current is None
            else silent_nodes | {m.node_id for m in self._gens.current.members.values()}
        )
        self._unreachable_since = {n: t for n, t in self._unreachable_since.items() if n in kept}
        self._failed_probes = {n: c for n, c in self._failed_probes.items() if n in kept}
        self._refused_since = {n: t for n, t in self._refused_since.items() if n in kept}
        self._refusals = {n: c for n, c in self._refusals.items() if n in kept}
        for node_id in self._to_probe(silent):
            address = self._raylets.get(node_id)
            if address is not None and not self._probing.get(node_id):
                self._start_probe(node_id, address, node_id in silent_nodes)

    def _start_probe(self, node_id: str, address: str, silent: bool) -> None:
        self._probing[node_id] = self._probing.get(node_id, 0) + 1
        self._in_background(self._probe_node(node_id, address, silent))
        if self._fence and node_id not in self._reprobing:
            self._reprobing.add(node_id)
            self._in_background(self._reprobe(node_id, address, silent))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reprobe(self, node_id: str, address: str, silent: bool) -> None:
        """While a probe of ``node_id`` is unanswered (a raylet's host answers a connection in
        well under ``REPROBE_S`` on a working network) or its streak of failed probes lasts, and
        it may still be fenced, start one more probe of it every ``REPROBE_S``
        (``PROBES_IN_FLIGHT`` at most at once), so that a node that went silent fails
        ``FENCE_PROBES`` probes in about ``FENCE_AFTER_S``, not in as many probe bounds one
        after the other."""
        try:
            while True:
                await asyncio.sleep(REPROBE_S)
                fenced = any(entry["node_id"] == node_id for entry in self._fenced)
                suspect = node_id in self._unreachable_since or self._probing.get(node_id, 0) > 0
                if fenced or not suspect or self._gens.current is None:
                    return
                if self._probing.get(node_id, 0) < PROBES_IN_FLIGHT:
                    self._start_probe(node_id, address, silent or node_id in self._silent_nodes)
        finally:
            self._reprobing.discard(node_id)

    async def _probe_node(self, node_id: str, address: str, silent: bool) -> None:
        """One probe (``probe``: its verdict holds however late this loop ran it). A refusal
        counts as an answer here, and towards ``refused_fences``."""
        started = time.monotonic()
        try:
            verdict = await probe(address)
            ended = time.monotonic()
            self._probed_at[node_id] = ended
            if verdict == REFUSED:
                self._refused_since.setdefault(node_id, started)
                self._refusals[node_id] = self._refusals.get(node_id, 0) + 1
            else:
                self._refused_since.pop(node_id, None)
                self._refusals.pop(node_id, None)
            if verdict != SILENT:
                self._unreachable.discard(node_id)
                self._unreachable_since.pop(node_id, None)
                self._failed_probes.pop(node_id, None)
                if verdict == REFUSED and self._fence:
                    async with self._changed:  # a node whose raylet is gone fenced now rather than a tick later
                        now = time.time()
                        self._fence_silent_nodes(now)
                        self._log_losses()
                        self._try_form(now)
            else:
                self._unreachable_since.setdefault(node_id, started)
                self._failed_probes[node_id] = self._failed_probes.get(node_id, 0) + 1
                if silent or node_id in self._silent_nodes:
                    self._unreachable.add(node_id)
                async with self._changed:  # its silent members lost, and it fenced, now rather than a tick later
                    now = time.time()
                    self._gens.find_lost(now, self._alive, self._unreachable)
                    self._fence_silent_nodes(now)
                    self._log_losses()
                    self._try_form(now)
        finally:
            left = self._probing.get(node_id, 1) - 1
            if left > 0:
                self._probing[node_id] = left
            else:
                self._probing.pop(node_id, None)

    async def _sweep(self) -> None:
        """Probe the members' nodes every ``SWEEP_EVERY_S`` (``_probe``), between the watcher's
        ticks, which also ask the GCS for its node table: a node cut off from the head is probed
        at most this long after the cut, and fenced ``FENCE_AFTER_S`` after that probe."""
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            if self._alive is None:
                continue
            try:
                async with self._changed:
                    self._probe(self._gens.silent(time.time()))
            except Exception:  # the next sweep tries again; the watcher's ticks probe too
                logger.exception("ray_ckpt: a sweep of the run's nodes failed")

    def _read_drains(self, now: float) -> dict[str, float | None] | None:
        """The nodes Ray drains (``_ray_compat.draining_nodes``), read at most every
        ``DRAIN_POLL_S``; None when not read this tick (too soon, or the GCS did not answer)."""
        if now - self._drains_read < DRAIN_POLL_S:
            return None
        self._drains_read = now
        try:
            return _ray_compat.draining_nodes()
        except Exception as error:  # the next read tries again
            logger.debug("ray_ckpt: reading the draining nodes: %s", error)
            return None

    async def _watch(self) -> None:
        """Form a generation when its round is complete; kill hung members."""
        while True:
            await asyncio.sleep(self._watch_interval_s)
            now = time.time()
            try:
                nodes = naming.alive_nodes()
            except Exception:  # the GCS is briefly unreachable: try again next tick
                continue
            alive = {node.node_id for node in nodes} - self._fenced_out()
            self._alive = alive
            heads = {node.node_id for node in nodes if _ray_compat.is_head_node(node)}
            drains = self._read_drains(now)
            self._raylets = {node.node_id: node.raylet_address for node in nodes if node.raylet_address}
            async with self._changed:
                self._probe(self._gens.silent(now))
                self._gens.find_lost(now, alive, self._unreachable)
                if drains is not None:
                    self._gens.set_drains(drains, heads)
                self._fence_silent_nodes(now)
                self._log_losses()
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
