"""Registry: per job, which ranks staged which step, where their shards live, what committed."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from ray_ckpt.core.generations import run_of
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.core.wire import (
    GroupResult,
    JobInfo,
    PlanAnswer,
    PlanMark,
    PlanQuery,
    RankLocation,
    RankRecord,
    RestorePlan,
    StageGroup,
    StagePart,
    StageRequest,
    StoreHoldings,
)
from ray_ckpt.errors import ConfigError, InsufficientShardsError, NoCheckpointError, RayCkptError, StaleAttemptError

REACHED_ATTEMPTS = 8  # per job, how many attempts' trained steps (``Registry.note_reached``) are kept


class StepRecord:
    """One step of a job: which ranks staged it and their records, whether it committed, and
    the attempt (job incarnation) that staged it. Records arrive packed (``StagePart``) and are
    unpacked only when asked for (``ranks``): staging a step costs O(parts), not O(ranks)."""

    def __init__(self, world_size: int, records: dict[int, RankRecord] | None = None) -> None:
        self.world_size = world_size
        self.committed = False
        self.attempt: str | None = None
        self._records: dict[int, RankRecord] = dict(records or {})
        self._packed: list[StagePart] = []  # not unpacked yet, in arrival order
        self._staged: set[int] = set(self._records)
        self._protection = min((r.protection() for r in self._records.values()), default=None)
        self._nodes: set[str] = set().union(*(r.holders() for r in self._records.values()))

    @property
    def protection(self) -> int | None:
        """The weakest rank's protection, from where its shards were placed (None: no rank)."""
        return self._protection

    @property
    def nodes(self) -> set[str]:
        """Every node holding a shard or a local copy of this step (do not change it)."""
        return self._nodes

    @property
    def staged(self) -> set[int]:
        """The ranks that staged this step (a read-only view: do not change it)."""
        return self._staged

    def add(self, parts: Iterable[StagePart]) -> None:
        for part in parts:
            self._packed.append(part)
            self._staged.update(part.ranks)
            self._nodes.update(part.nodes)
            self._protection = part.protection if self._protection is None else min(self._protection, part.protection)

    def clear(self) -> None:
        self._records.clear()
        self._packed.clear()
        self._staged.clear()
        self._nodes.clear()
        self._protection = None

    def code(self) -> tuple[int, int]:
        """(k, m) of the step's shards, read from one record."""
        first = next(iter(self._records.values()), None)
        if first is None:
            first = self._packed[0].requests(limit=1)[0].record()
        return first.data_shards, first.parity_shards

    def ranks(self) -> dict[int, RankRecord]:
        """rank -> its record (a rank that staged twice: its newest stage)."""
        for part in self._packed:
            for request in part.requests():
                self._records[request.metas[0].rank] = request.record()
        self._packed.clear()
        return self._records


Settled = Literal["committed", "torn", "pending"]  # what ``Registry.wait_settled`` found


@dataclasses.dataclass
class _Incarnations:
    """Which incarnation (attempt) of a job is current, and what each decided to restore."""

    current: str | None = None
    seen: set[str] = dataclasses.field(default_factory=set)
    plans: dict[str, RestorePlan] = dataclasses.field(default_factory=dict)
    backup_steps: dict[str, int | None] = dataclasses.field(default_factory=dict)
    unrestorable: set[int] = dataclasses.field(default_factory=set)
    newest_staged: int | None = None  # the newest step any rank ever staged
    # attempt ("" for none) -> the newest step its rank 0 said it trained (``note_reached``),
    # in the order the attempts first said so; the newest REACHED_ATTEMPTS kept
    reached: dict[str, int] = dataclasses.field(default_factory=dict)
    auto: str | None = None  # the attempt the registry opened for ranks restoring without one
    auto_ranks: set[int] = dataclasses.field(default_factory=set)  # the ranks that restored under it
    plan_seq: int = 0  # orders the job's plan marks (see PlanMark)


@dataclasses.dataclass(frozen=True)
class Discarded:
    """Steps of ``job`` the registry forgot whose shards the stores drop: those saved under one
    of ``attempts`` ("" for saves without one) or by one of ``writers``. Never "every shard of
    the step but the discarding attempt's": an attempt the registry has not heard of yet (a
    later group whose puts came before an older zombie's first stage) may hold shards of the
    same step number, and its save will commit."""

    job: str
    steps: tuple[int, ...]
    attempts: tuple[str, ...] = ()
    writers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CommitDecision:
    """What a stage call changed: whether the step committed, and which steps of the job the
    stores should now evict (superseded commits beyond keep_committed, and torn steps)."""

    committed: bool
    keep_steps: tuple[int, ...]
    evict_steps: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class StageOutcome:
    """What one stage of a batch did: its ``decision``, or the ``error`` that refused it (then
    nothing changed for that stage), and ``torn``: the steps its attempt's join discarded (their
    shards are to be dropped from the stores; see ``Registry.join``)."""

    decision: CommitDecision | None = None
    error: RayCkptError | None = None
    torn: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class GroupOutcome:
    """What one ``StageGroup`` did: its ``decision`` (None when every stage of it was
    refused), the ranks whose stage was refused and why, the steps its attempt's join
    discarded (``torn``, as in ``StageOutcome``) and the job's kept committed steps after it."""

    decision: CommitDecision | None = None
    refused: dict[int, RayCkptError] = dataclasses.field(default_factory=dict)
    torn: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()

    def result(self) -> GroupResult:
        """The group's outcome for the stores that relayed it."""
        committed = bool(self.decision and self.decision.committed)
        return GroupResult(committed=committed, keep_steps=self.kept, refused=self.refused)


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """A committed step at a glance: world size, code, the weakest rank's placement protection
    (counting every node as live) and every node holding its shards or local copies."""

    world_size: int
    data_shards: int
    parity_shards: int
    protection: int | None
    nodes: frozenset[str]


class Registry:
    """The two-phase commit of checkpoints: a step commits only when all ``world_size`` ranks
    staged it; the newest ``keep_committed`` committed steps are kept; a step that was staged
    but is older than the newest commit is torn and evicted. Thread-safe."""

    def __init__(self, new_attempt_id: Callable[[], str] = lambda: f"auto-{uuid.uuid4().hex[:16]}") -> None:
        """``new_attempt_id`` names the attempts the registry opens for ranks without one."""
        self._new_attempt_id = new_attempt_id
        self._lock = threading.Condition()
        self._jobs: dict[str, dict[int, StepRecord]] = {}
        self._incarnations: dict[str, _Incarnations] = {}
        self._discarded: list[Discarded] = []
        self._plan_marks: dict[str, PlanMark] = {}
        self._passed: dict[str, dict[tuple[str | None, int], int]] = {}  # job -> (attempt, rank) -> step (wait_settled)

    def take_plan_marks(self) -> dict[str, PlanMark]:
        """Per job, its newest restore plan if it changed since the last call: the caller (the
        registry actor) hands it to every store, so that a restarted registry gives the ranks
        still to restore the plan the others restored (``rebuild``)."""
        with self._lock:
            taken, self._plan_marks = self._plan_marks, {}
            return taken

    def take_discarded(self) -> list[Discarded]:
        """The steps whose shards the stores must drop since the last call (torn steps a join
        discarded, committed steps a rollback forgot), each with the attempt whose own shards of
        those steps stay. The caller (the registry actor) sends them to every store."""
        with self._lock:
            taken, self._discarded = self._discarded, []
            return taken

    def stage(
        self,
        metas: list[ShardMeta],
        nodes: dict[int, str],
        *,
        keep_committed: int,
        attempt: str | None = None,
        local: ShardMeta | None = None,
        local_node: str | None = None,
    ) -> CommitDecision:
        """Record that one rank stored all its shards of one step (``nodes``: index -> node id),
        plus optionally its full local copy. With an ``attempt``, the stage joins that
        incarnation first (see ``join``); a stage from a superseded one raises StaleAttemptError."""
        request = StageRequest(tuple(metas), nodes, keep_committed, attempt, local, local_node)
        with self._lock:
            outcome = self._stage_request_locked(request, acknowledge_retries=False)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.decision is not None  # no error: a decision
        return outcome.decision

    def stage_batch(self, requests: Sequence[StageRequest]) -> list[StageOutcome]:
        """Stage several ranks' steps (a node's ranks, forwarded by its store) under one lock
        acquisition: each request in order exactly as ``join`` (with its attempt) then ``stage``
        would, so the two-phase commit, the attempts and StaleAttemptError are the same per
        request; a refused request changes nothing and does not stop the others. One exception,
        for retries after a registry restart: a request identical (same shard metadata) to the
        record its rank already holds in a committed step is acknowledged as committed again
        instead of refused as not newer than the newest commit."""
        with self._lock:
            return [self._stage_request_locked(request, acknowledge_retries=True) for request in requests]

    def _refused_locked(self, group: StageGroup, outcome: GroupOutcome) -> GroupOutcome:
        """``outcome``, after queueing the refused saves' shards to be dropped (but those of a
        save the step's record holds): nothing will ever read them, and a rebuild must not
        take them for a save of the step."""
        if outcome.refused:
            record = self._jobs.get(group.job, {}).get(group.step)
            held = {r.first.writer for r in record.ranks().values()} if record is not None else set()
            for request in (r for part in group.parts for r in part.requests()):
                writer = request.metas[0].writer
                if request.metas[0].rank in outcome.refused and writer not in held:  # never a recorded save
                    self._discarded.append(Discarded(group.job, (group.step,), writers=(writer,)))
        return outcome

    def _stage_request_locked(self, request: StageRequest, *, acknowledge_retries: bool) -> StageOutcome:
        try:
            request.check()
            outcome = self._stage_group_locked(StageGroup.of([request])[0], acknowledge_retries)
        except RayCkptError as error:
            return StageOutcome(error=error)
        refusal = next(iter(outcome.refused.values()), None)
        return StageOutcome(decision=None if refusal else outcome.decision, error=refusal, torn=outcome.torn)

    def stage_groups(self, groups: Sequence[StageGroup]) -> list[GroupOutcome]:
        """Stage relayed groups (``StageGroup``: many ranks' stages of one step, packed) under
        one lock acquisition, in order, each as its ranks' stages one by one would be (same
        commits, attempts, refusals and acknowledged retries as ``stage_batch``) but at a cost
        that does not grow with the ranks: stages are counted, their records unpacked later."""
        with self._lock:
            return [
                dataclasses.replace(
                    self._stage_group_locked(group, acknowledge_retries=True),
                    kept=self._kept_locked(group.job, group.keep_committed),
                )
                for group in groups
            ]

    def _stage_group_locked(self, group: StageGroup, acknowledge_retries: bool) -> GroupOutcome:
        return self._refused_locked(group, self._staged_locked(group, acknowledge_retries))

    def _staged_locked(self, group: StageGroup, acknowledge_retries: bool) -> GroupOutcome:
        job, step = group.job, group.step
        try:
            torn = () if group.attempt is None else self._join_locked(job, group.attempt)
        except StaleAttemptError as stale:
            return GroupOutcome(refused=dict.fromkeys(group.ranks, stale))
        steps = self._jobs.setdefault(job, {})
        record = steps.get(step)
        newest = self._latest_locked(job)
        if newest is not None and step <= newest:
            return self._restage_locked(group, record if acknowledge_retries else None, newest, torn)
        if record is None:
            record = steps[step] = StepRecord(world_size=group.world_size)
        if record.world_size != group.world_size:
            mismatch: RayCkptError = ConfigError(
                f"job {job!r} step {step}: ranks {group.ranks} say world_size={group.world_size}, but other "
                f"ranks staged it with world_size={record.world_size}; every rank must use the same world size",
                job=job,
                step=step,
            )
            return GroupOutcome(refused=dict.fromkeys(group.ranks, mismatch), torn=torn)
        if record.attempt != group.attempt and record.staged:
            record.clear()  # staged by another incarnation (attempt=None callers): start the step afresh
        record.attempt = group.attempt
        incarnation = self._incarnations.setdefault(job, _Incarnations())
        incarnation.newest_staged = max(step, incarnation.newest_staged or 0)
        record.add(group.parts)
        self._lock.notify_all()  # a commit, or a stage that may settle a step (``wait_settled``)
        if len(record.staged) < record.world_size:
            return GroupOutcome(decision=CommitDecision(False, (), ()), torn=torn)
        record.committed = True
        return GroupOutcome(decision=self._retire_locked(job, group.keep_committed), torn=torn)

    def _restage_locked(
        self, group: StageGroup, record: StepRecord | None, newest: int, torn: tuple[int, ...]
    ) -> GroupOutcome:
        """A group of a step not newer than the newest commit: a retry of stages the registry
        holds committed in ``record`` (identical shard metadata) is acknowledged; every other
        stage refused."""
        held = record.ranks() if record is not None and record.committed else {}
        refused: dict[int, RayCkptError] = {}
        for request in (r for part in group.parts for r in part.requests()):
            rank = request.metas[0].rank
            if rank not in held or dict(held[rank].metas) != {m.index: m for m in request.metas}:
                refused[rank] = ConfigError(
                    f"job {group.job!r}: step {group.step} is not newer than the newest committed step {newest}; "
                    "a committed step cannot be overwritten: save steps in increasing order",
                    job=group.job,
                    step=group.step,
                )
        acknowledged = len(refused) < len(group.ranks)
        decision = self._acknowledge_locked(group.job, group.keep_committed) if acknowledged else None
        return GroupOutcome(decision=decision, refused=refused, torn=torn)

    def _acknowledge_locked(self, job: str, keep_committed: int) -> CommitDecision:
        """The decision of a step that committed already: the kept steps, nothing new to evict."""
        return CommitDecision(True, self._kept_locked(job, keep_committed), ())

    def _kept_locked(self, job: str, keep_committed: int) -> tuple[int, ...]:
        """The newest ``keep_committed`` committed steps of ``job``."""
        return tuple(sorted(s for s, r in self._jobs.get(job, {}).items() if r.committed)[-keep_committed:])

    def _retire_locked(self, job: str, keep_committed: int) -> CommitDecision:
        steps = self._jobs[job]
        committed = sorted(s for s, r in steps.items() if r.committed)
        keep = committed[-keep_committed:]
        newest = keep[-1]
        evict = [s for s in steps if s < newest and s not in keep]
        for s in evict:
            del steps[s]
        notes = self._passed.get(job)
        if notes:  # a note no newer than the newest commit settles nothing any more
            self._passed[job] = {key: passed for key, passed in notes.items() if passed > newest}
        return CommitDecision(True, tuple(keep), tuple(sorted(evict)))

    # ---- incarnations and restore plans -----------------------------------------------

    def join(self, job: str, attempt: str) -> tuple[int, ...]:
        """Make ``attempt`` the current incarnation of ``job`` (all ranks of one worker group
        share it). The first call of a new attempt discards the steps that never committed,
        since the ranks of the old incarnation that staged them are gone, and returns those
        steps so their shards can be dropped. Joining a superseded attempt raises
        StaleAttemptError (a zombie worker of an old group)."""
        with self._lock:
            return self._join_locked(job, attempt)

    def _join_locked(self, job: str, attempt: str) -> tuple[int, ...]:
        state = self._incarnations.setdefault(job, _Incarnations())
        if attempt == state.current:
            return ()
        if attempt in state.seen:
            raise StaleAttemptError(
                f"job {job!r}: attempt {attempt} was superseded by attempt {state.current}; this "
                "worker belongs to a worker group that was replaced",
                job=job,
                attempt=attempt,
            )
        state.seen.add(attempt)
        state.current = attempt
        steps = self._jobs.get(job, {})
        torn = tuple(sorted(s for s, r in steps.items() if not r.committed and r.attempt != attempt))
        if torn:
            self._discarded.append(self._discard_locked(job, state, torn, keep=attempt))
        self._note_plan_locked(job, state, None)  # the stores keep the new history
        return torn

    def plan_restore(
        self, job: str, attempt: str | None, live_nodes: set[str], ranks: Iterable[int] = ()
    ) -> RestorePlan:
        """The step every rank of ``attempt`` restores, decided once per attempt so that all
        ranks agree (see RestorePlan). source "peers": the newest committed step whose every
        rank still has k shards (or its local copy) on live nodes and was not marked
        unrestorable; source "backup": none is, use the newest complete persistent backup;
        source None: nothing was ever committed. ``ranks`` asking without an attempt get the
        registry's (``RestorePlan.attempt``): the attempt it opened for the job, which every rank
        restoring after it joins, until a rank restores a second time (it was restarted), which
        opens the next one (docs/commit-protocol.md)."""
        with self._lock:
            state = self._incarnations.setdefault(job, _Incarnations())
            auto = attempt is None and bool(ranks)
            if auto:
                attempt = self._auto_attempt_locked(state, ranks)
            if attempt is not None:
                self._join_locked(job, attempt)
                if attempt in state.plans:
                    if auto:
                        self._note_plan_locked(job, state, state.plans[attempt])
                    return state.plans[attempt]
            steps = self._jobs.get(job, {})
            committed = sorted((s for s, r in steps.items() if r.committed), reverse=True)
            ever_committed = bool(committed) or bool(state.unrestorable)
            chosen = next(
                (s for s in committed if s not in state.unrestorable and self._rebuildable(steps[s], live_nodes)), None
            )
            plan = RestorePlan(
                step=chosen,
                source="peers" if chosen is not None else "backup" if ever_committed else None,
                ever_committed=ever_committed,
                newest_committed=committed[0] if committed else None,
                newest_staged=state.newest_staged,
                newest_reached=self._reached_before_locked(state, attempt),
                world_size=None if chosen is None else steps[chosen].world_size,
                attempt=attempt,
            )
            if attempt is not None:
                state.plans[attempt] = plan
                self._note_plan_locked(job, state, plan)
            return plan

    def _note_plan_locked(self, job: str, state: _Incarnations, plan: RestorePlan | None) -> None:
        """A new plan mark of ``job`` for the stores: its current attempt and ``plan``, and every
        attempt it superseded."""
        state.plan_seq += 1
        ranks = tuple(sorted(state.auto_ranks)) if state.current is not None and state.current == state.auto else ()
        steps = self._jobs.get(job, {})
        newest = max(steps, default=state.newest_staged)
        superseded = tuple(sorted(state.seen - {state.current}))
        self._plan_marks[job] = PlanMark(state.plan_seq, plan, ranks, newest, state.current, superseded)

    def _auto_attempt_locked(self, state: _Incarnations, ranks: Iterable[int]) -> str:
        """The attempt of ranks restoring without one: the open one, or a new one when the open
        one was superseded or one of them restored under it already."""
        for rank in ranks:
            superseded = state.auto != state.current and state.auto in state.seen
            if state.auto is None or superseded or rank in state.auto_ranks:
                state.auto, state.auto_ranks = self._new_attempt_id(), set()
            state.auto_ranks.add(rank)
        assert state.auto is not None
        return state.auto

    def plan_ranks(self, query: PlanQuery, live_nodes: set[str]) -> PlanAnswer:
        """The plan of the query's attempt (``plan_restore``, the ranks asking without one get
        the registry's) and, when it restores a step from memory, the asking ranks' records of
        it (``locate_rank``)."""
        with self._lock:
            plan = self.plan_restore(query.job, query.attempt, live_nodes, query.ranks)
            if plan.source != "peers" or plan.step is None:
                return PlanAnswer(plan)
            record = self._jobs.get(query.job, {}).get(plan.step)
            if record is None or not record.committed:
                raise InsufficientShardsError(
                    f"job {query.job!r}: step {plan.step}, which this attempt's other ranks restored, is no longer "
                    "committed (a registry restart found too few of its shards); this attempt cannot go on: "
                    "restart every rank, and they restore an older step",
                    job=query.job,
                    step=plan.step,
                )
            return PlanAnswer(plan, {rank: self.locate_rank(query.job, plan.step, rank) for rank in query.ranks})

    @staticmethod
    def _rebuildable(record: StepRecord, live_nodes: set[str]) -> bool:
        return all(
            rank.live_shards(live_nodes) >= rank.data_shards or rank.local_node in live_nodes
            for rank in record.ranks().values()
        )

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None:
        """The backup step of ``attempt``'s plan: the first rank's proposal wins, later calls
        get it back, so all ranks load the same backup step."""
        with self._lock:
            if attempt is None:
                return step
            return self._incarnations.setdefault(job, _Incarnations()).backup_steps.setdefault(attempt, step)

    def mark_unrestorable(self, job: str, step: int) -> None:
        """A rank could not rebuild ``step`` (e.g. corrupted shards beyond m): no later plan
        picks it."""
        with self._lock:
            self._incarnations.setdefault(job, _Incarnations()).unrestorable.add(step)

    def rollback(self, job: str, step: int) -> tuple[int, ...]:
        """After falling back to backup ``step``: forget the committed steps newer than it that
        earlier incarnations wrote (they can no longer be rebuilt), so training can save those
        step numbers again. Returns the steps dropped."""
        with self._lock:
            current = self._incarnations.get(job, _Incarnations()).current
            steps = self._jobs.get(job, {})
            doomed = tuple(
                sorted(s for s, r in steps.items() if s > step and (r.attempt != current or current is None))
            )
            if doomed:
                state = self._incarnations.setdefault(job, _Incarnations())
                self._discarded.append(self._discard_locked(job, state, doomed, keep=current))
            return doomed

    def _discard_locked(self, job: str, state: _Incarnations, steps: tuple[int, ...], keep: str | None) -> Discarded:
        """Forget ``steps`` of ``job``; what the stores drop of them: the shards of every attempt
        the registry knows but ``keep`` and, of saves without an attempt, the recorded ones."""
        records = self._jobs.get(job, {})
        writers = {
            meta.writer
            for step in steps
            for rank in records[step].ranks().values()
            for meta in (*rank.metas.values(), *([rank.local] if rank.local is not None else []))
            if not meta.attempt
        }
        for step in steps:
            del records[step]
        return Discarded(job, steps, tuple(sorted(state.seen - {keep})), tuple(sorted(writers)))

    # ---- progress -----------------------------------------------------------------------

    def note_reached(self, job: str, attempt: str | None, step: int) -> None:
        """Rank 0 of ``attempt`` of ``job`` trained ``step`` (saved or not): what a later
        attempt's restore counts its steps redone from (``RestorePlan.newest_reached``). Kept
        in memory only, for the newest ``REACHED_ATTEMPTS`` attempts of the job."""
        key = attempt or ""
        with self._lock:
            reached = self._incarnations.setdefault(job, _Incarnations()).reached
            if step > reached.get(key, -1):
                reached[key] = step
            while len(reached) > REACHED_ATTEMPTS:
                del reached[next(iter(reached))]

    def steps_reached(self, job: str, attempt: str | None) -> tuple[int | None, int | None]:
        """(newest step any rank staged, newest step the attempt before ``attempt`` said it
        trained), as a restore plan of ``attempt`` gives them, without planning anything."""
        with self._lock:
            state = self._incarnations.get(job)
            if state is None:
                return None, None
            return state.newest_staged, self._reached_before_locked(state, attempt)

    @staticmethod
    def _reached_before_locked(state: _Incarnations, attempt: str | None) -> int | None:
        """The newest step trained by the attempt that last began saying so, other than
        ``attempt`` (the one restoring, whose rank 0 says nothing before its restore)."""
        key = attempt or ""
        return next((step for other, step in reversed(state.reached.items()) if other != key), None)

    # ---- queries ------------------------------------------------------------------------

    def latest_committed(self, job: str) -> int | None:
        with self._lock:
            return self._latest_locked(job)

    def jobs_of_run(self, run: str) -> list[str]:
        """The jobs that saved or restored under an attempt of the in-place run ``run`` (its
        generations' attempt ids are ``<run>.g<n>``, ``generations.run_of``), sorted."""
        with self._lock:
            return sorted(job for job, state in self._incarnations.items() if any(run_of(a) == run for a in state.seen))

    def committed_by(self, job: str, step: int) -> str | None:
        """The attempt that committed ``step`` (None: none, or the step is not committed)."""
        with self._lock:
            record = self._jobs.get(job, {}).get(step)
            return record.attempt if record is not None and record.committed else None

    def committed_steps(self, job: str) -> list[int]:
        with self._lock:
            return sorted(s for s, r in self._jobs.get(job, {}).items() if r.committed)

    def wait_committed(self, job: str, step: int, timeout_s: float) -> bool:
        """Block until ``step`` (or a newer step) of ``job`` committed; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._committed_at_least_locked(job, step), timeout=timeout_s)

    def wait_settled(
        self,
        job: str,
        step: int,
        *,
        rank: int,
        attempt: str | None,
        world_size: int,
        passed: int,
        timeout_s: float,
    ) -> Settled:
        """Note that ``rank`` of ``attempt`` went past step ``passed``: it staged every step up
        to ``passed`` that it will ever stage (its saves of them are staged or failed, and it
        called ``save`` with a newer step or none). Then block until ``step`` settled:
        "committed" once it or a newer step committed; "torn" once it never can, because some
        rank has not staged it and every such rank went past it (noted so, or staged a newer
        step of the same attempt: a rank stages its steps in order). Every step that all ranks save up to a torn
        one has committed by then. "pending" after ``timeout_s``.

        Ranks that chose different intervals under ``every="auto"`` save steps the others do
        not; a rank whose last save was such a step learns here that it is torn instead of
        waiting for a commit that cannot come. The notes are not rebuilt after a restart: the
        caller asks again (``RegistryClient.wait_settled``), which notes its rank again. A note
        no newer than the newest commit is dropped."""
        with self._lock:
            notes = self._passed.setdefault(job, {})
            if notes.get((attempt, rank), -1) < passed:
                notes[(attempt, rank)] = passed
                self._lock.notify_all()
            settled = self._lock.wait_for(lambda: self._settled_locked(job, step, attempt, world_size), timeout_s)
            return settled or "pending"

    def _settled_locked(self, job: str, step: int, attempt: str | None, world_size: int) -> Settled | None:
        if self._committed_at_least_locked(job, step):
            return "committed"
        steps = self._jobs.get(job, {})
        record = steps.get(step)
        staged = record.staged if record is not None and record.attempt == attempt else set()
        missing = set(range(world_size)) - staged
        if not missing:  # every rank's shards are there (a rebuilt registry): the last stages may yet come
            return None
        passed = self._passed.get(job, {})
        newer = [r.staged for s, r in steps.items() if s > step and r.attempt == attempt]
        for rank in missing:
            if passed.get((attempt, rank), -1) < step and not any(rank in ranks for ranks in newer):
                return None
        return "torn"

    def _committed_at_least_locked(self, job: str, step: int) -> bool:
        latest = self._latest_locked(job)
        return latest is not None and latest >= step

    def staged_ranks(self, job: str, step: int) -> list[int]:
        """Ranks that staged ``step`` so far (all of them once it committed)."""
        with self._lock:
            record = self._jobs.get(job, {}).get(step)
            return sorted(record.staged) if record else []

    def is_committed(self, job: str, step: int) -> bool:
        with self._lock:
            record = self._jobs.get(job, {}).get(step)
            return bool(record and record.committed)

    def locate(self, job: str, step: int) -> dict[int, RankRecord]:
        """Every rank's shard records of a committed step; NoCheckpointError if not committed."""
        with self._lock:
            return dict(self._committed_record_locked(job, step).ranks())

    def summary(self, job: str, step: int) -> StepSummary:
        """What a status page needs of a committed step, without reading every rank's record
        (NoCheckpointError if not committed)."""
        with self._lock:
            record = self._committed_record_locked(job, step)
            k, m = record.code()
            return StepSummary(record.world_size, k, m, record.protection, frozenset(record.nodes))

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        """One rank's shard records of a committed step and the number of ranks that saved it
        (what a restoring rank needs: O(1) in the world size); NoCheckpointError if not
        committed. ``record`` is None when ``rank`` did not save the step."""
        with self._lock:
            record = self._committed_record_locked(job, step)
            return RankLocation(world_size=len(record.staged), record=record.ranks().get(rank))

    def _committed_record_locked(self, job: str, step: int) -> StepRecord:
        record = self._jobs.get(job, {}).get(step)
        if record is None or not record.committed:
            known = sorted(s for s, r in self._jobs.get(job, {}).items() if r.committed)
            raise NoCheckpointError(
                f"job {job!r} has no committed step {step} (committed: {known})", job=job, step=step
            )
        return record

    def jobs(self) -> dict[str, JobInfo]:
        """Per job: committed steps, staged-only steps with the ranks that staged them, world size."""
        with self._lock:
            return {
                job: JobInfo(
                    committed_steps=tuple(sorted(s for s, r in steps.items() if r.committed)),
                    staged={s: tuple(sorted(r.staged)) for s, r in steps.items() if not r.committed},
                    world_size=max((r.world_size for r in steps.values()), default=0),
                )
                for job, steps in self._jobs.items()
            }

    def forget(self, job: str) -> None:
        with self._lock:
            self._jobs.pop(job, None)
            self._incarnations.pop(job, None)
            self._passed.pop(job, None)

    # ---- rebuilding ---------------------------------------------------------------------

    def rebuild(self, holdings: Iterable[StoreHoldings]) -> None:
        """Replace the whole view with one rebuilt from the stores' self-describing shards.

        ``holdings``: what every live store holds. Per (step, rank) only the shards of one save
        count (one writer, of the step's attempt), so two saves are never merged. A step is
        committed when every rank has shards of its attempt and either some store was told it
        committed (commits are ordered: a mark covers the older steps too) or every rank still
        has k shards: either way every rank finished its puts. Other steps come back as staged
        by the ranks whose shards are present. Every attempt a shard names is remembered as
        superseded, but the attempt of the newest step, which stays current: a zombie of an
        older one is refused as before the restart. Which save of a step counts:
        ``_rebuilt_step``.
        """
        found: dict[str, dict[int, dict[tuple[int, str], tuple[dict[int, ShardMeta], dict[int, str]]]]] = {}
        marks: dict[str, int] = {}
        marked_by: dict[str, str] = {}  # job -> the attempt that committed its newest marked step
        for held in holdings:
            for job, step in held.committed.items():
                if job in held.committed_by and step >= marks.get(job, step):
                    marked_by[job] = held.committed_by[job]
                marks[job] = max(step, marks.get(job, step))
            for meta in held.metas:
                saves = found.setdefault(meta.job, {}).setdefault(meta.step, {})
                metas, nodes = saves.setdefault((meta.rank, meta.writer), ({}, {}))
                metas[meta.index] = meta
                nodes[meta.index] = held.node_id
        plans: dict[str, PlanMark] = {}
        for held in holdings:
            for job, plan_mark in held.plans.items():
                if job not in plans or plans[job].seq < plan_mark.seq:
                    plans[job] = plan_mark
        rebuilt: dict[str, dict[int, StepRecord]] = {}
        incarnations: dict[str, _Incarnations] = {}
        for job, steps in found.items():
            newest_attempt = _attempt_of(steps[max(steps)])
            known = _known_attempts(plans.get(job), marked_by.get(job))
            for step, saves in sorted(steps.items()):
                mark = marks.get(job)
                marked = marked_by.get(job) if mark is not None and step <= mark else None
                record = _rebuilt_step(saves, marked=marked, newest=newest_attempt, known=known)
                complete = len(record.staged) == record.world_size
                whole = all(len(r.metas) >= r.data_shards for r in record.ranks().values())
                record.committed = complete and ((mark is not None and step <= mark) or whole)
                rebuilt.setdefault(job, {})[step] = record
            committed = [s for s, r in rebuilt[job].items() if r.committed]
            current = rebuilt[job][max(committed) if committed else max(steps)].attempt
            seen = {next(iter(metas.values())).attempt for saves in steps.values() for metas, _ in saves.values()}
            seen.discard("")
            incarnations[job] = _Incarnations(
                current=current, seen=seen | ({current} if current else set()), newest_staged=max(steps)
            )
        for job, plan_mark in plans.items():
            _restore_plan(incarnations.setdefault(job, _Incarnations()), plan_mark, rebuilt.get(job, {}))
        with self._lock:
            self._jobs = rebuilt
            self._incarnations = incarnations
            self._lock.notify_all()

    def _latest_locked(self, job: str) -> int | None:
        committed = [s for s, r in self._jobs.get(job, {}).items() if r.committed]
        return max(committed) if committed else None


def _attempt_of(saves: dict[tuple[int, str], tuple[dict[int, ShardMeta], dict[int, str]]]) -> str | None:
    """The attempt with the most shards among one step's saves (None: saved without one)."""
    counts: dict[str, int] = {}
    for metas, _ in saves.values():
        attempt = next(iter(metas.values())).attempt
        counts[attempt] = counts.get(attempt, 0) + len(metas)
    best = max(sorted(counts), key=lambda a: counts[a])
    return best or None


def _known_attempts(plan_mark: PlanMark | None, marked_by: str | None) -> set[str]:
    """The attempts the old registry had heard of, as far as the stores' marks tell: only such an
    attempt can have committed a step (a stage joins its attempt, and a join's plan mark reaches
    the stores before the stage is answered)."""
    known = {marked_by} if marked_by else set()
    if plan_mark is not None:
        known.update(plan_mark.superseded)
        if plan_mark.current is not None:
            known.add(plan_mark.current)
        if plan_mark.plan is not None and plan_mark.plan.attempt is not None:
            known.add(plan_mark.plan.attempt)
    return known


def _rebuilt_step(
    saves: dict[tuple[int, str], tuple[dict[int, ShardMeta], dict[int, str]]],
    *,
    marked: str | None,
    newest: str | None,
    known: set[str],
) -> StepRecord:
    """One step's record from the shards of its saves, of one attempt; per rank the save
    (writer) of that attempt with the most shards. The attempt, by order of precedence: one that
    saved every rank of the step; the one a commit mark names (``marked``); one whose every rank
    keeps k shards (a save that can be restored over one that cannot); one the old registry had
    heard of (``known``: an attempt it never heard of never staged, so its save of a step another
    attempt committed is not the commit, even when it has more shards); the attempt with the most
    shards in the job's newest step (``newest``); the most shards."""
    by_attempt: dict[str | None, dict[int, tuple[dict[int, ShardMeta], dict[int, str]]]] = {}
    world_sizes: dict[str | None, int] = {}
    for (rank, _writer), (metas, nodes) in sorted(saves.items()):
        first = next(iter(metas.values()))
        world_sizes[first.attempt or None] = first.world_size
        ranks = by_attempt.setdefault(first.attempt or None, {})
        if rank not in ranks or len(metas) > len(ranks[rank][0]):
            ranks[rank] = (metas, nodes)

    def precedence(attempt: str | None) -> tuple[bool, bool, bool, bool, bool, int]:
        ranks = by_attempt[attempt]
        complete = len(ranks) == world_sizes[attempt]
        whole = all(len(metas) >= next(iter(metas.values())).data_shards for metas, _ in ranks.values())
        shards = sum(len(metas) for metas, _ in ranks.values())
        return (complete, attempt == marked, complete and whole, attempt in known, attempt == newest, shards)

    attempt = max(sorted(by_attempt, key=str), key=precedence)
    records = {rank: RankRecord(metas, nodes) for rank, (metas, nodes) in by_attempt[attempt].items()}
    record = StepRecord(world_size=world_sizes[attempt], records=records)
    record.attempt = attempt
    return record


def _restore_plan(state: _Incarnations, mark: PlanMark, steps: dict[int, StepRecord]) -> None:
    """Take the newest plan mark back into a rebuilt job: the attempts it superseded (so
    their zombies stay refused), its attempt's plan (and, for the registry's own attempt, the
    ranks that restored under it), and its attempt as the current one unless another attempt,
    not one it superseded, saved a step newer than the mark (it came later)."""
    state.plan_seq = mark.seq
    superseded = set(mark.superseded)
    state.seen |= superseded
    attempt = mark.current if mark.current is not None else mark.plan.attempt if mark.plan is not None else None
    if attempt is None:
        return
    if mark.plan is not None:
        state.plans[attempt] = mark.plan
    state.seen.add(attempt)
    later = [
        s
        for s, r in steps.items()
        if (mark.newest_step is None or s > mark.newest_step) and r.attempt != attempt and r.attempt not in superseded
    ]
    if not later or state.current in superseded:
        state.current = attempt
    if mark.ranks:
        state.auto, state.auto_ranks = attempt, set(mark.ranks)
