"""Registry: per job, which ranks staged which step, where their shards live, what committed."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ray_ckpt.errors import ConfigError, NoCheckpointError, RayCkptError, StaleAttemptError
from ray_ckpt.shard import ShardMeta
from ray_ckpt.wire import RankLocation, RankRecord, RestorePlan, StageRequest, StoreHoldings


@dataclasses.dataclass
class StepRecord:
    world_size: int
    ranks: dict[int, RankRecord] = dataclasses.field(default_factory=dict)
    committed: bool = False
    attempt: str | None = None  # the job incarnation that staged it


@dataclasses.dataclass
class _Incarnations:
    """Which incarnation (attempt) of a job is current, and what each decided to restore."""

    current: str | None = None
    seen: set[str] = dataclasses.field(default_factory=set)
    plans: dict[str, RestorePlan] = dataclasses.field(default_factory=dict)
    backup_steps: dict[str, int | None] = dataclasses.field(default_factory=dict)
    unrestorable: set[int] = dataclasses.field(default_factory=set)
    newest_staged: int | None = None  # the newest step any rank ever staged


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


class Registry:
    """The two-phase commit of checkpoints: a step commits only when all ``world_size`` ranks
    staged it; the newest ``keep_committed`` committed steps are kept; a step that was staged
    but is older than the newest commit is torn and evicted. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._jobs: dict[str, dict[int, StepRecord]] = {}
        self._incarnations: dict[str, _Incarnations] = {}

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
        if not metas:
            raise ConfigError("stage needs the metadata of at least one shard")
        first = metas[0]
        job, step, rank, world_size = first.job, first.step, first.rank, first.world_size
        if any((m.job, m.step, m.rank, m.world_size) != (job, step, rank, world_size) for m in metas):
            raise ConfigError("all shards staged together must share job, step, rank and world_size")
        if set(nodes) != {m.index for m in metas}:
            raise ConfigError("nodes must name the node of every staged shard index, and only those")
        with self._lock:
            if attempt is not None:
                self._join_locked(job, attempt)
            steps = self._jobs.setdefault(job, {})
            newest = self._latest_locked(job)
            if newest is not None and step <= newest:
                raise ConfigError(
                    f"job {job!r}: step {step} is not newer than the newest committed step {newest}; "
                    "a committed step cannot be overwritten: save steps in increasing order",
                    job=job,
                    step=step,
                )
            record = steps.setdefault(step, StepRecord(world_size=world_size))
            if record.world_size != world_size:
                raise ConfigError(
                    f"job {job!r} step {step}: rank {rank} says world_size={world_size}, but other "
                    f"ranks staged it with world_size={record.world_size}; every rank must use the same "
                    "world size",
                    job=job,
                    step=step,
                )
            if record.attempt != attempt and record.ranks:
                # staged by another incarnation (attempt=None callers): start the step afresh
                record.ranks.clear()
            record.attempt = attempt
            incarnation = self._incarnations.setdefault(job, _Incarnations())
            incarnation.newest_staged = max(step, incarnation.newest_staged or 0)
            record.ranks[rank] = RankRecord({m.index: m for m in metas}, dict(nodes), local, local_node)
            if len(record.ranks) < world_size:
                return CommitDecision(False, (), ())
            record.committed = True
            self._lock.notify_all()
            return self._retire_locked(job, keep_committed)

    def stage_batch(self, requests: Sequence[StageRequest]) -> list[StageOutcome]:
        """Stage several ranks' steps (a node's ranks, forwarded by its store) under one lock
        acquisition: each request in order exactly as ``join`` (with its attempt) then ``stage``
        would, so the two-phase commit, the attempts and StaleAttemptError are the same per
        request; a refused request changes nothing and does not stop the others. One exception,
        for retries after a registry restart: a request identical (same shard metadata) to the
        record its rank already holds in a committed step is acknowledged as committed again
        instead of refused as not newer than the newest commit."""
        outcomes = []
        with self._lock:
            for request in requests:
                try:
                    outcomes.append(self._stage_one_locked(request))
                except RayCkptError as error:
                    outcomes.append(StageOutcome(error=error))
        return outcomes

    def _stage_one_locked(self, request: StageRequest) -> StageOutcome:
        if not request.metas:
            raise ConfigError("stage needs the metadata of at least one shard")
        first = request.metas[0]
        torn = () if request.attempt is None else self._join_locked(first.job, request.attempt)
        record = self._jobs.get(first.job, {}).get(first.step)
        held = None if record is None or not record.committed else record.ranks.get(first.rank)
        if held is not None and dict(held.metas) == {m.index: m for m in request.metas}:
            return StageOutcome(decision=self._acknowledge_locked(first.job, request.keep_committed), torn=torn)
        decision = self.stage(
            list(request.metas),
            dict(request.nodes),
            keep_committed=request.keep_committed,
            attempt=request.attempt,
            local=request.local,
            local_node=request.local_node,
        )
        return StageOutcome(decision=decision, torn=torn)

    def _acknowledge_locked(self, job: str, keep_committed: int) -> CommitDecision:
        """The decision of a step that committed already: the kept steps, nothing new to evict."""
        committed = sorted(s for s, r in self._jobs[job].items() if r.committed)
        return CommitDecision(True, tuple(committed[-keep_committed:]), ())

    def _retire_locked(self, job: str, keep_committed: int) -> CommitDecision:
        steps = self._jobs[job]
        committed = sorted(s for s, r in steps.items() if r.committed)
        keep = committed[-keep_committed:]
        newest = keep[-1]
        evict = [s for s in steps if s < newest and s not in keep]
        for s in evict:
            del steps[s]
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
        torn = tuple(sorted(s for s, r in steps.items() if not r.committed))
        for step in torn:
            del steps[step]
        return torn

    def plan_restore(self, job: str, attempt: str | None, live_nodes: set[str]) -> RestorePlan:
        """The step every rank of ``attempt`` restores, decided once per attempt so that all
        ranks agree (see RestorePlan). source "peers": the newest committed step whose every
        rank still has k shards (or its local copy) on live nodes and was not marked
        unrestorable; source "backup": none is, use the newest complete persistent backup;
        source None: nothing was ever committed."""
        with self._lock:
            state = self._incarnations.setdefault(job, _Incarnations())
            if attempt is not None:
                self._join_locked(job, attempt)
                if attempt in state.plans:
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
                world_size=None if chosen is None else steps[chosen].world_size,
            )
            if attempt is not None:
                state.plans[attempt] = plan
            return plan

    @staticmethod
    def _rebuildable(record: StepRecord, live_nodes: set[str]) -> bool:
        return all(
            rank.live_shards(live_nodes) >= rank.data_shards or rank.local_node in live_nodes
            for rank in record.ranks.values()
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
            for s in doomed:
                del steps[s]
            return doomed

    # ---- queries ------------------------------------------------------------------------

    def latest_committed(self, job: str) -> int | None:
        with self._lock:
            return self._latest_locked(job)

    def committed_steps(self, job: str) -> list[int]:
        with self._lock:
            return sorted(s for s, r in self._jobs.get(job, {}).items() if r.committed)

    def wait_committed(self, job: str, step: int, timeout_s: float) -> bool:
        """Block until ``step`` (or a newer step) of ``job`` committed; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._committed_at_least_locked(job, step), timeout=timeout_s)

    def _committed_at_least_locked(self, job: str, step: int) -> bool:
        latest = self._latest_locked(job)
        return latest is not None and latest >= step

    def staged_ranks(self, job: str, step: int) -> list[int]:
        """Ranks that staged ``step`` so far (all of them once it committed)."""
        with self._lock:
            record = self._jobs.get(job, {}).get(step)
            return sorted(record.ranks) if record else []

    def is_committed(self, job: str, step: int) -> bool:
        with self._lock:
            record = self._jobs.get(job, {}).get(step)
            return bool(record and record.committed)

    def locate(self, job: str, step: int) -> dict[int, RankRecord]:
        """Every rank's shard records of a committed step; NoCheckpointError if not committed."""
        with self._lock:
            return dict(self._committed_record_locked(job, step).ranks)

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        """One rank's shard records of a committed step and the number of ranks that saved it
        (what a restoring rank needs: O(1) in the world size); NoCheckpointError if not
        committed. ``record`` is None when ``rank`` did not save the step."""
        with self._lock:
            record = self._committed_record_locked(job, step)
            return RankLocation(world_size=len(record.ranks), record=record.ranks.get(rank))

    def _committed_record_locked(self, job: str, step: int) -> StepRecord:
        record = self._jobs.get(job, {}).get(step)
        if record is None or not record.committed:
            known = sorted(s for s, r in self._jobs.get(job, {}).items() if r.committed)
            raise NoCheckpointError(
                f"job {job!r} has no committed step {step} (committed: {known})", job=job, step=step
            )
        return record

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Per job: committed steps, staged-only steps with the ranks that staged them."""
        with self._lock:
            return {
                job: {
                    "committed_steps": sorted(s for s, r in steps.items() if r.committed),
                    "staged": {s: sorted(r.ranks) for s, r in steps.items() if not r.committed},
                    "world_size": max((r.world_size for r in steps.values()), default=0),
                }
                for job, steps in self._jobs.items()
            }

    def forget(self, job: str) -> None:
        with self._lock:
            self._jobs.pop(job, None)
            self._incarnations.pop(job, None)

    # ---- rebuilding ---------------------------------------------------------------------

    def rebuild(self, holdings: Iterable[StoreHoldings]) -> None:
        """Replace the whole view with one rebuilt from the stores' self-describing shards.

        ``holdings``: what every live store holds. A step counts as committed when some store
        was told so, or when it is not newer than such a step (commits are ordered); steps
        newer than every commit mark come back as staged by the ranks whose shards are present.
        """
        found: dict[str, dict[int, dict[int, tuple[dict[int, ShardMeta], dict[int, str]]]]] = {}
        marks: dict[str, int] = {}
        for held in holdings:
            for job, step in held.committed.items():
                marks[job] = max(step, marks.get(job, step))
            for meta in held.metas:
                metas, nodes = found.setdefault(meta.job, {}).setdefault(meta.step, {}).setdefault(meta.rank, ({}, {}))
                metas[meta.index] = meta
                nodes[meta.index] = held.node_id
        rebuilt: dict[str, dict[int, StepRecord]] = {}
        for job, staged in found.items():
            for step, ranks in staged.items():
                world_size = next(iter(next(iter(ranks.values()))[0].values())).world_size
                record = rebuilt.setdefault(job, {}).setdefault(step, StepRecord(world_size=world_size))
                record.ranks = {rank: RankRecord(metas, nodes) for rank, (metas, nodes) in ranks.items()}
        for job, steps in rebuilt.items():
            mark = marks.get(job)
            for step, record in steps.items():
                record.committed = mark is not None and step <= mark and len(record.ranks) == record.world_size
        with self._lock:
            self._jobs = rebuilt
            self._lock.notify_all()

    def _latest_locked(self, job: str) -> int | None:
        committed = [s for s, r in self._jobs.get(job, {}).items() if r.committed]
        return max(committed) if committed else None
