"""CoordinatorClient: every call to a run's generation coordinator, typed, and each one bounded.

The coordinator (``ray_ckpt.actors.generation_coordinator``, one per in-place run) is made by the run's
controller, which hands this client to every worker inside its role; nothing else calls the
actor. Each call has an explicit bound, so a coordinator that stopped answering (its node is
overloaded, the controller's process is stuck) is a ``CoordinatorTimeoutError`` naming the call,
never a worker that hangs: the in-place recovery then gives up as for any
``InPlaceRecoveryError``, and Ray Train restarts the worker group. The bounds:

- a call the coordinator answers as soon as it runs it (``epoch``, ``register``, ``publish``,
  ``report``): ``answer_s``, that is ``ANSWER_S`` plus ``QUEUE_S_PER_RANK`` for every rank of
  the run; ``begin``, the run's first call, also gets ``START_S``;
- a call that waits in the coordinator (``join``, ``address``): polls of at most ``POLL_S``
  each, each bounded by ``POLL_S`` plus ``answer_s``, until the wait it asks for is over;
- a heartbeat (``beat``): the caller's, its beat interval (a late beat is skipped; the next one
  is sent).

A worker's per-rank calls (register, beat, join, address) go through its node's store where
there is one, which merges them with its other ranks' and passes them up the stores' relay tree
(``ray_ckpt.core.coordinator_relay``), so the coordinator takes a call per batch, not per rank;
they go straight to the coordinator where the node has no store, or once its store failed.

A ray_ckpt error the actor raised is raised here as itself (``ray_ckpt.transport.remote``); any
other error (the actor died with the controller: the run is ending) as Ray raises it. The
replies are ``ray_ckpt.core.generations``' frozen records.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import ray

from ray_ckpt.core.coordinator_relay import OPS
from ray_ckpt.core.generations import POLL_S, Beat, BeatReply, BeginReply, CoordinatorReport, JoinReply, Member
from ray_ckpt.errors import CoordinatorTimeoutError
from ray_ckpt.transport import naming, remote

logger = logging.getLogger(__name__)

ANSWER_S = 30.0
"""How long a call the coordinator answers at once may take, before ``QUEUE_S_PER_RANK``: the
actor answers one within milliseconds, so only a coordinator that stopped answering reaches it."""

START_S = 60.0
"""Added to ``begin``'s bound: the controller makes the coordinator just before its first
``begin``, which therefore also waits for the actor's new process to start (seconds; more on a
loaded node)."""

QUEUE_S_PER_RANK = 0.004
"""Added to every bound for each rank of the run: where ranks call the actor directly (their
node has no store), it takes every rank's joins and beats in turn (about 2 ms a call on the
development machine, docs/in-place-recovery.md, "At scale"), so a call may queue behind one of
every rank's; twice that (131 s more at 32768 ranks). Through the stores it is far less."""


STORE_MISSES = 5
"""Calls in a row through the node's store that got no answer in time after which this process
calls the coordinator directly: half a second of beats at the shortest interval, well inside
the silence that makes a member lost (``generations.QUIET_MIN_S``), so a store that is stuck
while the worker lives does not get the worker taken for lost or killed as hung."""


class CoordinatorClient:
    """The generation coordinator behind ``handle`` (the actor the run's controller made), for
    a run of ``world_size`` ranks, which scales every bound (see the module docstring); ``run``
    names the coordinator where stores merge its calls (one id per coordinator). It pickles
    with its handle, so the controller hands it to the workers; a worker then routes its calls
    through its node's store (``use_node_store``)."""

    def __init__(self, handle: Any, world_size: int, run: str | None = None) -> None:
        self.handle = handle
        self.world_size = world_size
        self.run = run if run is not None else uuid.uuid4().hex
        self.store: Any = None  # this process's node's store, once ``use_node_store`` found it
        self._store_misses = 0  # calls through the store in a row that got no answer in time

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "store": None}  # a store is its node's: each process finds its own

    @property
    def answer_s(self) -> float:
        """The bound on a call the coordinator answers at once, for this run's size."""
        return ANSWER_S + QUEUE_S_PER_RANK * max(0, self.world_size)

    def use_node_store(self, namespace: str, node_id: str) -> bool:
        """Send this process's per-rank calls (register, beat, join, address) through the store
        of node ``node_id`` in ``namespace``, which merges them with its other ranks' and passes
        them up the stores' relay tree (``ray_ckpt.core.coordinator_relay``). False, and calls
        go straight to the coordinator, where that node has no store (``ray_ckpt.start()`` did
        not run there). A store that fails later, or leaves ``STORE_MISSES`` calls in a row
        unanswered, is dropped the same way."""
        self.store = naming.store_handles(namespace, [node_id]).get(node_id)
        return self.store is not None

    def _call(self, method: str, *args: Any, timeout_s: float) -> Any:
        try:
            return remote.get(getattr(self.handle, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise CoordinatorTimeoutError(
                f"the run's generation coordinator did not answer {method} within {timeout_s:.1f}s",
                method=method,
                timeout_s=timeout_s,
            ) from None

    def _per_rank(self, op: str, key: tuple[Any, ...], entry: Any, *, timeout_s: float) -> Any:
        """One rank's entry of ``op`` (``coordinator_relay.OPS``), through the node's store if
        there is one, else straight to the coordinator; its result."""
        store = self.store
        if store is not None:
            try:
                (result,) = remote.get(
                    store.coordinate.remote(self.run, self.handle, op, list(key), [entry]), timeout=timeout_s
                )
                self._store_misses = 0
                return result
            except ray.exceptions.GetTimeoutError:
                self._store_misses += 1
                if self._store_misses >= STORE_MISSES:  # a stuck store must not make this rank look hung
                    logger.warning(
                        "%d coordinator calls in a row through this node's store got no answer; calling it directly",
                        self._store_misses,
                    )
                    self.store = None
                raise CoordinatorTimeoutError(
                    f"the run's generation coordinator did not answer {op} (through this node's store) "
                    f"within {timeout_s:.1f}s",
                    method=op,
                    timeout_s=timeout_s,
                ) from None
            except Exception as error:  # the store failed, or the coordinator did: ask the coordinator
                logger.info("coordinator calls through this node's store failed (%s); calling it directly", error)
                self.store = None
        (result,) = self._call(OPS[op], *key, [entry], timeout_s=timeout_s)
        return result

    # ---- the controller's calls ------------------------------------------------------------

    def begin(self, world_size: int) -> BeginReply:
        """A full start of ``world_size`` workers: a new epoch and its first generation."""
        reply: BeginReply = self._call("begin", world_size, timeout_s=START_S + self.answer_s)
        return reply

    def epoch(self) -> int:
        """The run's epoch (its number of full starts), for a replacement's role."""
        return int(self._call("epoch", timeout_s=self.answer_s))

    def report(self) -> CoordinatorReport:
        """The generations formed after failures, the members killed as hung, and the round."""
        reply: CoordinatorReport = self._call("report", timeout_s=self.answer_s)
        return reply

    def await_recovery(self, known: bool) -> bool:
        """Whether a recovery is under way in the run; answers once that differs from
        ``known``, or after ``POLL_S``."""
        return bool(self._call("await_recovery", known, timeout_s=self.answer_s + POLL_S))

    # ---- a worker's calls ------------------------------------------------------------------

    def register(self, member: Member, generation: int) -> bool:
        """A worker of a full start announces itself; False if its generation is superseded."""
        return bool(self._per_rank("register", (generation,), member.to_wire(), timeout_s=self.answer_s))

    def beat(self, beat: Beat, timeout_s: float) -> BeatReply:
        """A heartbeat (``Beat`` says what it carries); the reply says whether its member must
        leave its generation now (a peer of it is lost, or a round to replace it is open) and
        the drain under way, if any. CoordinatorTimeoutError after ``timeout_s``."""
        reply = self._per_rank("beat", (), beat.to_wire(), timeout_s=timeout_s)
        return reply if isinstance(reply, BeatReply) else BeatReply(bool(reply))

    def hand_over(self, member: Member) -> bool:
        """``member`` leaves its place because its node drains; False where it was no live
        member of the current generation."""
        return bool(self._call("hand_over", member, timeout_s=self.answer_s))

    def finish(self, member: Member) -> None:
        """``member``'s training function returned; its heartbeats stop."""
        self._call("finish", member, timeout_s=self.answer_s)

    def join(self, member: Member, timeout_s: float) -> JoinReply:
        """Wait up to ``timeout_s`` for the next generation with ``member`` (the reply says
        whether it formed, the wait ran out, or a full start overtook it): the join, then polls
        of at most ``POLL_S`` each until the reply, then, if the time ran out, giving up."""
        deadline = time.monotonic() + timeout_s
        after, refused = self._per_rank("join", (), member.to_wire(), timeout_s=self.answer_s)
        if refused is not None:
            return refused
        while time.monotonic() < deadline:
            reply = self._per_rank("await", (after,), member.waiting, timeout_s=POLL_S + self.answer_s)
            if reply is not None:
                return reply
        given_up: JoinReply = self._call("give_up", member, after, timeout_s=self.answer_s)
        return given_up

    def publish(self, generation: int, address: str) -> None:
        """Rank 0 publishes ``generation``'s rendezvous address (host:port)."""
        self._call("publish", generation, address, timeout_s=self.answer_s)

    def address(self, generation: int, timeout_s: float) -> str | None:
        """``generation``'s rendezvous address once rank 0 published it; None if the generation
        is superseded or its address did not come within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            address = self._per_rank("address", (generation,), 0, timeout_s=POLL_S + self.answer_s)
            if address == "":  # superseded
                return None
            if address is not None:
                return str(address)
            if time.monotonic() >= deadline:
                return None
