"""A deterministic, pure-Python simulation of the whole commit protocol (no Ray).

The real ``Registry``, one real ``ShardStore`` per simulated node and the real restore path
(``Restorer``) run under a ``World`` whose methods are the events of a run: a rank puts its
shards (``put``) and later stages them (``stage``), so a save can be torn (the rank dies in
between) or abandoned and still running (its stage arrives after a new incarnation started);
ranks restore at any time; nodes die, come back and their stores restart; the registry
restarts and rebuilds from the stores (some of which answer late); a new incarnation starts
with or without restoring first, with an attempt or without (``attempt=None``). What the
registry actor and the store actors do between those classes (drop the steps a join or a
rollback discards, push commit marks down to the stores, evict) is done here the same way.

``World.check()`` asserts the protocol's invariants (docs/commit-protocol.md) after every
event; ``tests/unit/test_protocol_model.py`` drives it with hypothesis, and
``scripts/protocol_campaign.py`` runs it long.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ray_ckpt.core import blob, snapshot
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.core.placement import Node, place
from ray_ckpt.core.registry import Registry
from ray_ckpt.core.shard import ShardAddress
from ray_ckpt.core.store import ShardStore
from ray_ckpt.core.wire import (
    FoundShard,
    PlanAnswer,
    PlanMark,
    PlanQuery,
    RankLocation,
    RankRecord,
    RestorePlan,
    StageGroup,
    StageRequest,
    StoreHoldings,
)
from ray_ckpt.errors import RayCkptError
from ray_ckpt.process_copies import ProcessCopies
from ray_ckpt.reader import Reader
from ray_ckpt.restore import Restorer
from ray_ckpt.save import local_copy_meta, shard_metas

JOB = "job"
KEEP = 2


class Violation(AssertionError):
    """An invariant of the commit protocol does not hold."""


@dataclasses.dataclass
class Process:
    """One rank's worker process: ``incarnation`` is the worker group it was started in (the
    ground truth the invariants are judged by); ``attempt`` what it tells ray_ckpt."""

    rank: int
    incarnation: int
    attempt: str | None
    writer: str
    node: str
    restores_first: bool  # its worker group restores before training (else it saves from step 0)
    alive: bool = True
    next_step: int = 0
    saved: bool = False  # it put a save (it restores no more: a training loop restores first)
    asked: bool = False  # it asked the registry for its plan (a restore, or its first save without an attempt)
    restored: int | None = None  # the step it restored (None: none yet, or nothing to restore)
    pending: StageRequest | None = None  # a save whose shards are put and whose stage is not sent
    last_staged: int | None = None  # the newest step whose stage it sent and was not refused
    restorer: Restorer | None = None


class World:
    """One job of ``world_size`` ranks, RS(k, m), on ``nodes`` simulated nodes."""

    def __init__(
        self, *, nodes: int = 5, world_size: int = 2, k: int = 2, m: int = 1, seed: int = 0, local_copy: bool = True
    ) -> None:
        self.k, self.m, self.world_size, self.local_copy = k, m, world_size, local_copy
        self.random = random.Random(seed)
        self.node_ids = [f"n{i}" for i in range(nodes)]
        self.alive = set(self.node_ids)
        self.stores = {n: self._new_store(n) for n in self.node_ids}
        self.attempt_ids = (f"auto{n}" for n in itertools.count())
        self.registry = self._new_registry()
        self.pool = ThreadPoolExecutor(1)
        self.processes: list[Process] = []  # every process ever started, zombies included
        self.incarnations = itertools.count()
        self.current_incarnation = -1
        self.saves: dict[tuple[int, int, str], bytes] = {}  # (step, rank, writer) -> blob of that save
        self.put_done: dict[tuple[int, int, str], int] = {}  # (step, rank, writer) -> incarnation
        self.commits: dict[int, dict[int, str]] = {}  # step -> rank -> writer, as each commit was seen
        self.holders: dict[int, dict[int, set[tuple[str, int]]]] = {}  # step -> rank -> (node, its epoch) at the commit
        self.epochs = dict.fromkeys(self.node_ids, 0)  # a node's epoch: its kills and store restarts
        self.put_epochs: dict[tuple[int, int, str], dict[str, int]] = {}  # a save's holders' epochs at its puts
        self.dropped: set[int] = set()  # committed steps legitimately gone (rolled back or evicted)
        self.unrestorable: set[int] = set()
        self.restores: dict[tuple[int, str | None], dict[int, int]] = {}  # see _group: rank -> step restored
        self.marks: list[tuple[int, tuple[int, ...]]] = []  # commit marks not yet pushed to the stores
        self.log: list[str] = []
        self.plan_seq = 0  # the newest plan mark handed to the stores
        self.amnesic: set[tuple[int, str | None]] = set()  # groups whose plan no store kept over a registry restart
        self.torn: set[tuple[int, str | None]] = set()  # (step, attempt) wait_settled called torn
        self.skipped: set[tuple[int, int, str | None]] = set()  # (step, rank, attempt) a rank trained unsaved
        self.notes: dict[tuple[str | None, int], int] = {}  # (attempt, rank) -> the step it went past, since a restart
        self.paused: set[str] = set()  # live nodes whose store answers no call (a frozen process, swapping)
        self.short_of_memory = False  # the next restore's output buffer cannot be mapped (MemoryError)
        self._restoring_short = False  # the restore under way is that one (read by allocations on any thread)

    # ---- helpers ------------------------------------------------------------------------

    def _new_registry(self) -> Registry:
        return Registry(new_attempt_id=lambda: next(self.attempt_ids))

    @staticmethod
    def _new_store(node: str) -> ShardStore:
        return ShardStore(node_id=node, budget_bytes=1 << 30)

    def live(self) -> list[Process]:
        return [p for p in self.processes if p.alive and p.incarnation == self.current_incarnation]

    def zombies(self) -> list[Process]:
        return [p for p in self.processes if p.alive and p.incarnation != self.current_incarnation]

    def drop_discarded(self) -> None:
        """The registry actor's glue: the stores drop what the registry discarded and keep its
        new restore plans."""
        for gone in self.registry.take_discarded():
            for node in self.alive:
                self.stores[node].drop(gone.job, list(gone.steps), gone.attempts, gone.writers)
        for job, mark in self.registry.take_plan_marks().items():
            self.plan_seq = mark.seq
            for node in self.alive:
                self.stores[node].note_plan(job, mark.to_wire())

    def _plan(self, job: str, attempt: str | None, rank: int) -> PlanAnswer:
        """The registry actor's plan_ranks for one rank's query."""
        try:
            return self.registry.plan_ranks(PlanQuery(job, attempt, (rank,)), set(self.alive))
        finally:
            self.drop_discarded()

    # ---- events -------------------------------------------------------------------------

    def may_restore(self, process: Process) -> bool:
        return process.alive and process.restores_first and not process.asked

    def may_train(self, process: Process) -> bool:
        """A rank trains a step only with every rank of its group (collectives): a group that
        restores first trains once all its ranks restored (or died after restoring)."""
        if not process.alive:
            return False
        group = [p for p in self.processes if p.incarnation == process.incarnation]
        return not process.restores_first or all(p.asked for p in group)

    def may_put(self, process: Process) -> bool:
        return process.pending is None and self.may_train(process)

    def start_incarnation(self, *, with_attempt: bool, restores_first: bool = True) -> None:
        """A new worker group. Without an attempt it restores first: a job that passes no
        attempt must (docs/commit-protocol.md, *Attempts without an attempt*)."""
        restores_first = restores_first or not with_attempt
        """Every rank's process of the current incarnation dies (its pending stage may still
        arrive: a zombie) and a new worker group starts on live nodes."""
        for process in self.live():
            process.alive = self.random.random() < 0.5  # some linger as zombies with a save in flight
        incarnation = next(self.incarnations)
        self.current_incarnation = incarnation
        attempt = f"a{incarnation}" if with_attempt else None
        hosts = sorted(self.alive)
        if not hosts:
            return
        for rank in range(self.world_size):
            writer = f"w{incarnation}-{rank}"
            node = hosts[(rank + incarnation) % len(hosts)]
            process = Process(rank, incarnation, attempt, writer, node, restores_first)
            process.restorer = self._restorer(process)
            self.processes.append(process)
        self.log.append(f"incarnation {incarnation} attempt={attempt} restores_first={restores_first}")

    def _restorer(self, process: Process) -> Restorer:
        return Restorer(
            identity=RankIdentity(
                job=JOB, rank=process.rank, world_size=self.world_size, attempt=process.attempt, node_id=process.node
            ),
            registry=_RegistryView(self, process),
            stores=_Stores(self),
            backup=None,
            copies=ProcessCopies(),
            background=self.pool,
            timeout_s=lambda: 5.0,
            allocate=self._allocate,
        )

    def _allocate(self, size: int) -> np.ndarray:
        """A restore's output buffer. The restore's background thread may run it after the
        restore failed on another path: it reads a flag that only ``restore`` sets and clears, so
        when it runs never changes the world (the model stays deterministic)."""
        if self._restoring_short:
            raise MemoryError(f"cannot map {size} bytes while the old workers exit")
        return np.empty(size, dtype=np.uint8)

    def read(self, rank: int) -> None:
        """An outside reader (an evaluation sidecar) reads ``rank``'s newest committed step, as
        it stands, while the job runs. Invariant 9: the read changes nothing in the registry or
        the stores, and what it returns is byte-equal to the committed save of that step."""
        before = self._fingerprint()
        registry = _ReadOnlyRegistry(self.registry)
        reader = Reader(JOB, registry=registry, stores=_Stores(self), timeout_s=lambda: 5.0, allocate=self._allocate)
        try:
            restored = reader.read(rank=rank)
        except (RayCkptError, MemoryError) as error:
            self.log.append(f"outside read of rank {rank}: {type(error).__name__}")
            restored = None
        if registry.changing_calls:
            raise Violation(f"an outside read called {registry.changing_calls} on the registry")
        if self._fingerprint() != before:
            raise Violation(f"an outside read changed the registry or the stores: {self.log[-6:]}")
        if restored is None:
            return
        data = bytes(restored.state["blob"].numpy().tobytes())
        record = self.registry.locate(JOB, restored.step).get(rank)  # still committed: the read changed nothing
        writer = None if record is None else record.first.writer
        if writer is None or self.saves.get((restored.step, rank, writer)) != data:
            raise Violation(
                f"an outside read of rank {rank} got step {restored.step} with bytes that are not its committed save"
            )
        self.log.append(f"outside read of rank {rank}: step {restored.step}")

    def _fingerprint(self) -> str:
        """Everything a read must leave as it was: the registry's records, attempts and plans,
        and every live store's holdings and marks."""
        registry = self.registry
        stores = [
            (n, sorted(repr(m) for m in self.stores[n].inventory()), self._holdings([n])) for n in sorted(self.alive)
        ]
        return repr((registry._jobs, registry._incarnations, registry._plan_marks, registry._discarded, stores))

    def pause_store(self, node: str) -> None:
        """The node's store stops answering (SIGSTOP, swap, a long GC): alive, but silent."""
        if node in self.alive:
            self.paused.add(node)
            self.log.append(f"pause store {node}")

    def resume_store(self, node: str) -> None:
        if node in self.paused:
            self.paused.discard(node)
            self.log.append(f"resume store {node}")

    def run_short_of_memory(self) -> None:
        """The next restore fails to map its output buffer: an error that says nothing of the step."""
        self.short_of_memory = True
        self.log.append("the next restore is short of memory")

    def restore(self, process: Process) -> None:
        assert process.restorer is not None
        process.asked = True
        self._restoring_short, self.short_of_memory = self.short_of_memory, False
        try:
            restored, _ = process.restorer.restore()
        except (RayCkptError, MemoryError) as error:
            self.log.append(f"rank {process.rank}@{process.incarnation} restore: {type(error).__name__}")
            process.alive = False  # the rank fails; its group is restarted later
            return
        finally:
            self._restoring_short = False
        process.attempt = process.restorer.attempt
        if restored is None:
            self.log.append(f"rank {process.rank}@{process.incarnation} restore: nothing")
            process.restored, process.next_step = None, 0
            self.restores.setdefault(self._group(process), {})[process.rank] = -1
            return
        data = bytes(restored.state["blob"].numpy().tobytes())
        self.log.append(f"rank {process.rank}@{process.incarnation} restored step {restored.step} ({restored.source})")
        self._check_restored(process, restored.step, data)
        process.restored, process.next_step = restored.step, restored.step + 1
        self.restores.setdefault(self._group(process), {})[process.rank] = restored.step

    def _group(self, process: Process) -> tuple[int, str | None]:
        """Whose ranks must restore the same step (invariant 2): a worker group with an attempt;
        without one, the ranks the registry gave one attempt (it cannot tell groups apart; a
        rank of a group that restored under another attempt is refused at its first stage)."""
        if process.restorer is not None and process.attempt is not None and process.attempt.startswith("auto"):
            return (-1, process.attempt)
        return (process.incarnation, None)

    def put(self, process: Process) -> None:
        """The first half of a save: encode and put every shard and the local copy."""
        process.saved = True
        step = process.next_step
        process.next_step += 1
        state = {"blob": torch.frombuffer(bytearray(self.random.randbytes(48)), dtype=torch.uint8)}
        header, payload = snapshot.snapshot(state)
        size = blob.blob_size(len(header), payload.size)
        shard_size = -(-size // self.k)
        buffer = np.zeros(shard_size * self.k, dtype=np.uint8)
        offset = blob.write_prefix(buffer, header)
        buffer[offset : offset + payload.size] = payload
        data = [buffer[i * shard_size : (i + 1) * shard_size] for i in range(self.k)]
        shards = data + ReedSolomon(self.k, self.m).encode_parity(data, None)
        common: dict[str, Any] = {
            "job": JOB, "step": step, "rank": process.rank, "world_size": self.world_size,
            "attempt": process.attempt or "", "writer": process.writer,
        }  # fmt: skip
        metas = shard_metas(shards, size, data_shards=self.k, **common)
        local = local_copy_meta(buffer[:size], metas[: self.k], **common)
        self.saves[(step, process.rank, process.writer)] = bytes(state["blob"].numpy().tobytes())
        hosts = [Node(n) for n in sorted(self.alive)]
        if not hosts:
            return
        targets = place(hosts, shards=len(shards), rank=process.rank, rank_node_id=process.node, data_shards=self.k)
        for node, meta, shard in zip(targets, metas, shards):
            self.stores[node].put(meta, shard)
        own = self.local_copy and process.node in self.alive
        if own:
            self.stores[process.node].put(local, buffer[:size], local=True)
        process.pending = StageRequest(
            metas=tuple(metas),
            nodes=dict(enumerate(targets)),
            keep_committed=KEEP,
            attempt=process.attempt,
            local=local if own else None,
            local_node=process.node if own else None,
        )
        self.put_done[(step, process.rank, process.writer)] = process.incarnation
        self.put_epochs[(step, process.rank, process.writer)] = dict(self.epochs)
        self.log.append(f"rank {process.rank}@{process.incarnation} put step {step}")

    def skip(self, process: Process) -> None:
        """A step the rank trains without saving it (not on its interval; or busy under
        ``on_busy="skip"``, its previous save still pending)."""
        self.skipped.add((process.next_step, process.rank, process.attempt))
        process.next_step += 1
        self.log.append(f"rank {process.rank}@{process.incarnation} skip step {process.next_step - 1}")

    def passed(self, process: Process) -> int:
        """The step the rank went past (``Checkpointer._passed_step``)."""
        return process.pending.metas[0].step - 1 if process.pending is not None else process.next_step - 1

    def wait_settled(self, process: Process) -> None:
        """The rank waits for its newest staged step (at the end of a run, or a handle's wait):
        it notes the step it went past, and asks at once."""
        step = process.last_staged
        if step is None:
            return
        passed = self.passed(process)
        settled = self.registry.wait_settled(
            JOB, step, rank=process.rank, attempt=process.attempt, world_size=self.world_size, passed=passed,
            timeout_s=0.0,
        )  # fmt: skip
        key = (process.attempt, process.rank)
        self.notes[key] = max(passed, self.notes.get(key, -1))
        self.log.append(
            f"rank {process.rank}@{process.incarnation} wait_settled step {step} passed {passed}: {settled}"
        )
        if settled == "torn":
            self.torn.add((step, process.attempt))
        went_past = all(self.notes.get((process.attempt, r), -1) >= step for r in range(self.world_size))
        skipped = any((step, r, process.attempt) in self.skipped for r in range(self.world_size))
        if settled == "pending" and went_past and skipped:  # 7
            raise Violation(f"step {step}: a rank skipped it and every rank went past it, but it is still pending")

    def stage(self, process: Process) -> None:
        """The second half of a save: the stage (through the store actor's glue)."""
        request, process.pending = process.pending, None
        if request is None:
            return
        (group,) = StageGroup.of([request])
        (outcome,) = self.registry.stage_groups([group])
        self.drop_discarded()
        step = request.metas[0].step
        refused = outcome.refused.get(process.rank)
        self.log.append(
            f"rank {process.rank}@{process.incarnation} stage step {step}: "
            + (
                type(refused).__name__
                if refused
                else "committed"
                if outcome.decision and outcome.decision.committed
                else "staged"
            )
        )
        if refused is not None:
            process.alive = False  # a refused stage fails the rank's next save
            return
        process.last_staged = step
        decision = outcome.decision
        if decision is not None and decision.committed and self.registry.is_committed(JOB, step):
            self._saw_commit(step, decision.keep_steps)
        if decision is not None and decision.keep_steps and process.node in self.alive:
            # the store actor's glue: the rank's own store, which relayed the stage, keeps the
            # mark (with the committing attempt when it is this step) before the rank hears back
            keep = decision.keep_steps
            by = group.attempt if decision.committed and keep[-1] == step else None
            self.stores[process.node].mark_committed(JOB, keep[-1], list(keep), by)

    def _saw_commit(self, step: int, keep: tuple[int, ...]) -> None:
        records = self.registry.locate(JOB, step)
        writers = {rank: record.first.writer for rank, record in records.items()}
        earlier = self.commits.get(step)
        if (
            earlier is not None
            and earlier != writers
            and step not in self.dropped
            and self._physically_restorable(step, earlier)
        ):
            raise Violation(f"step {step} committed twice: {earlier} then {writers}")
        by = self.registry.committed_by(JOB, step)
        if (step, by) in self.torn:  # 7
            raise Violation(f"step {step} of attempt {by} committed after wait_settled called it torn")
        incarnations = {self._incarnation_of(w) for w in writers.values()}
        if len(incarnations) > 1:
            raise Violation(f"step {step} committed with records of incarnations {sorted(incarnations)}: {writers}")
        self.commits[step] = writers
        self.holders[step] = {
            rank: {(node, self.put_epochs[(step, rank, record.first.writer)][node]) for node in record.nodes.values()}
            for rank, record in records.items()
        }
        self.dropped.discard(step)
        for old in list(self.commits):
            if old not in keep and old < step:
                self.dropped.add(old)  # evicted: superseded by newer commits
        self.marks.append((step, keep))

    def _incarnation_of(self, writer: str) -> int:
        return int(writer[1:].split("-")[0])

    def push_marks(self) -> None:
        """The commit marks travel down the relay tree to every live store."""
        for step, keep in self.marks:
            for node in self.alive:
                self.stores[node].mark_committed(JOB, step, list(keep), self.registry.committed_by(JOB, step))
        self.marks.clear()

    def kill_node(self, node: str) -> None:
        if node not in self.alive or len(self.alive) == 1:
            return
        self.alive.discard(node)
        self.paused.discard(node)
        self.epochs[node] += 1
        self.stores[node] = self._new_store(node)  # its memory is gone
        for process in self.processes:
            if process.node == node:
                process.alive = False
        self.log.append(f"kill node {node}")

    def revive_node(self, node: str) -> None:
        self.alive.add(node)
        self.log.append(f"revive node {node}")

    def restart_store(self, node: str) -> None:
        if node in self.alive:
            self.paused.discard(node)
            self.epochs[node] += 1
            self.stores[node] = self._new_store(node)
            self.log.append(f"restart store {node}")

    def restart_registry(self) -> None:
        """The registry actor restarts and rebuilds from the live stores (it asks a slow store
        again until it answers). The commit marks in flight are lost with it."""
        self.marks.clear()
        self.notes.clear()  # the registry forgets them; the ranks note again when they ask again
        kept = [PlanMark.from_wire(m).seq for n in self.alive if (m := self.stores[n].plan_marks().get(JOB))]
        if max(kept, default=0) < self.plan_seq:  # no live store kept the newest plan: it is gone
            self.amnesic.update(self.restores)
            self.log.append("the newest plan mark died with every store that held it")
        self.registry = self._new_registry()
        self.registry.rebuild(self._holdings(sorted(self.alive)))
        self.plan_seq = max(kept, default=0)
        self.log.append("restart registry")

    def _holdings(self, nodes: Iterable[str]) -> list[StoreHoldings]:
        return [
            StoreHoldings.from_wire(
                {
                    "node_id": n,
                    "metas": [m.to_dict() for m in self.stores[n].inventory()],
                    "committed": self.stores[n].committed_marks(),
                    "plans": self.stores[n].plan_marks(),
                    "committed_by": self.stores[n].committed_attempts(),
                }
            )
            for n in nodes
        ]

    # ---- invariants ---------------------------------------------------------------------

    def _check_restored(self, process: Process, step: int, data: bytes) -> None:
        """Invariants 4 and 6: the bytes are one save's, of a step every rank of one
        incarnation completed (committed, or complete in the stores)."""
        saves = {w for (s, r, w) in self.saves if s == step and r == process.rank and self.saves[(s, r, w)] == data}
        if not saves:
            raise Violation(f"rank {process.rank} restored step {step} with bytes that no save of it wrote")
        if step not in self.commits:
            complete = [
                inc
                for inc in {i for (s, _, _), i in self.put_done.items() if s == step}
                if all(
                    any(s == step and r == rank and i == inc for (s, r, _), i in self.put_done.items())
                    for rank in range(self.world_size)
                )
            ]
            if not complete:
                raise Violation(f"rank {process.rank} restored step {step}, which no incarnation completed (torn)")

    def check(self) -> None:
        # 2: one step per incarnation (unless its plan died with every store and the registry:
        # a loss beyond the failure model, see docs/commit-protocol.md)
        for incarnation, steps in self.restores.items():
            if len(set(steps.values())) > 1 and incarnation not in self.amnesic:
                raise Violation(f"incarnation {incarnation}'s ranks restored different steps: {steps}")
        # 1: a committed step whose ranks each keep k holders (no loss or restart since the
        # commit) stays in the stores, and the registry keeps it or a newer commit
        latest = self.registry.latest_committed(JOB)
        for step, writers in sorted(self.commits.items(), reverse=True):
            if step in self.dropped or step in self.unrestorable or not self._survives(step):
                continue
            if not self._physically_restorable(step, writers):
                raise Violation(f"committed step {step} lost shards that no failure took: {self.log[-6:]}")
            if latest is None or latest < step:
                raise Violation(
                    f"committed step {step} is restorable from the stores but the registry's newest "
                    f"committed step is {latest}"
                )
            break

    def _survives(self, step: int) -> bool:
        """Whether every rank of the commit of ``step`` kept k holders through the failures."""
        return all(
            len({node for node, epoch in held if self.epochs[node] == epoch and node in self.alive}) >= self.k
            for held in self.holders[step].values()
        )

    def _physically_restorable(self, step: int, writers: dict[int, str]) -> bool:
        return all(self._rank_restorable(step, rank, writers) for rank in writers)

    def _rank_restorable(self, step: int, rank: int, writers: dict[int, str]) -> bool:
        """Whether live stores (paused ones too: slow is not gone) hold k shards of ``rank``'s
        committed save of ``step``."""
        writer = writers.get(rank)
        held = 0
        for node in self.alive:
            for meta in self.stores[node].inventory(JOB):
                if meta.step == step and meta.rank == rank and meta.writer == writer:
                    held += 1
        return held >= self.k


class _RegistryView:
    """What the Restorer asks of the registry (``RegistryClient`` in production), answered by
    the world's registry with the registry actor's glue (drops)."""

    def __init__(self, world: World, process: Process) -> None:
        self.world, self.process = world, process

    def plan_restore(self, job: str, attempt: str | None) -> RestorePlan:
        return self.plan_for_rank(job, attempt, self.process.rank).plan

    def plan_for_rank(self, job: str, attempt: str | None, rank: int) -> PlanAnswer:
        return self.world._plan(job, attempt, rank)

    def locate(self, job: str, step: int) -> dict[int, RankRecord]:
        return self.world.registry.locate(job, step)

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        return self.world.registry.locate_rank(job, step, rank)

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None:
        return self.world.registry.settle_backup_step(job, attempt, step)

    def mark_unrestorable(self, job: str, step: int) -> None:
        world = self.world
        writers = world.commits.get(step)
        rank = self.process.rank
        if writers is not None and step not in world.dropped and world._rank_restorable(step, rank, writers):
            # 8: a step is given up only on proof (fewer than k intact shards in live stores)
            raise Violation(
                f"rank {self.process.rank} gave up step {step} although k intact shards of it sit in live "
                f"stores (paused: {sorted(world.paused)}): {world.log[-6:]}"
            )
        self.world.unrestorable.add(step)
        self.world.registry.mark_unrestorable(job, step)

    def rollback(self, job: str, step: int) -> list[int]:
        world = self.world
        dropped = world.registry.rollback(job, step)
        world.drop_discarded()
        mine = world.restores.get(world._group(self.process), {})
        hit = [s for s in dropped if s in mine.values()]
        if hit:  # 5
            raise Violation(
                f"a rollback to step {step} dropped steps {hit} that incarnation {self.process.incarnation} restored"
            )
        world.dropped.update(dropped)
        world.log.append(f"rollback to {step}: dropped {list(dropped)}")
        return list(dropped)


class _ReadOnlyRegistry:
    """The registry as an outside reader reaches it: the queries a ``Reader`` may make are
    answered; any other call is recorded (``changing_calls``) and refused."""

    QUERIES = ("latest_committed", "locate_rank")

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.changing_calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in self.QUERIES:
            return getattr(self._registry, name)
        self.changing_calls.append(name)
        raise AttributeError(f"an outside reader may not call Registry.{name}")


class _Stores:
    """What the Restorer asks of the stores (``StoreDirectory`` in production)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def live(self, node_ids: Iterable[str]) -> set[str]:
        return set(node_ids) & self.world.alive

    def plan(self, node_id: str, job: str, attempt: str | None, rank: int) -> Future[Any]:
        raise KeyError(node_id)  # plans go to the registry directly

    def get(self, node_id: str, address: ShardAddress, into: Any = None) -> Future[Any]:
        future: Future[Any] = Future()
        if node_id not in self.world.alive:
            future.set_exception(RuntimeError("dead store"))
            return future
        if node_id in self.world.paused:
            future.set_exception(TimeoutError("the store did not answer in time"))
            return future
        found = self.world.stores[node_id].get(address)
        future.set_result(None if found is None else FoundShard(*found))
        return future

    def get_ranges(self, *args: Any, **kwargs: Any) -> Future[Any]:
        raise NotImplementedError("the simulation restores at the saved world size")
