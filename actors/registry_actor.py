"""RegistryActor: the cluster's one registry of staged and committed checkpoint steps."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
import time
from typing import Any

import ray
from ray_ckpt.actors import store_actor

from ray_ckpt import settings
from ray_ckpt.core import events, interval, relay
from ray_ckpt.core.registry import Registry
from ray_ckpt.core.wire import (
    GroupResult,
    PlanAnswer,
    PlanQuery,
    RestorePlan,
    StageGroup,
    StageRequest,
    StageResult,
    StoreHoldings,
    StoreStats,
    StoreStatus,
    ranks_to_wire,
    step_protection,
)
from ray_ckpt.errors import ConfigError, RayCkptError
from ray_ckpt.transport import metrics, naming

logger = logging.getLogger(__name__)

_HANDLES_TTL_S = 1.0  # how stale the commit fan-out's list of stores may be
# Stages serialize on the registry's lock anyway: a few threads take them, so that hundreds of
# concurrent batches do not convoy on the GIL; blocking calls (wait_committed, wait_settled) use the others.
_STAGE_THREADS = 4
PLAN_MARK_WAIT_S = 2.0  # how long a plan call waits for the stores to keep its plan
REBUILD_ROUNDS = 3  # times a store that does not answer the rebuild in time is asked


@dataclasses.dataclass(frozen=True)
class _Announcement:
    """A commit sent to the root of the relay tree (``tree[0]``): ``sent``, its call, at
    ``sent_at`` (monotonic); ``number`` orders the registry's announcements."""

    number: int
    job: str
    keep: tuple[int, ...]
    attempt: str | None
    tree: list[str]
    sent: Any
    sent_at: float


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_concurrency=64, concurrency_groups={"stage": _STAGE_THREADS}
)
class RegistryActor:
    """On (re)start it rebuilds its view from every live store's self-describing shards, so a
    killed registry comes back with the same committed steps. A watch thread starts stores on
    nodes that join later, with the budget ``ray_ckpt.start()`` was given. Threaded: ``wait_committed``
    blocks one thread while stage calls proceed on others."""

    def __init__(
        self,
        namespace: str,
        events_path: str | None = None,
        rebuild_timeout_s: float = 10.0,
        *,
        store_budget_bytes: int | None = None,
        store_budget_fraction: float | None = None,
    ) -> None:
        self._namespace = namespace
        self._registry = Registry()
        self._store_budget = (store_budget_bytes, store_budget_fraction or settings.store_budget_fraction())
        if events_path is None:  # next to Ray's own logs of this cluster, on the registry's node
            context = ray.get_runtime_context()
            events_path = f"{context.get_temp_dir()}/{context.get_session_name()}/ray_ckpt/events-{namespace}.jsonl"
        self._events = events.EventLog(events_path)
        self._status_snapshots = events.Coalescer(self._record_status, events.STATUS_EVERY_S)
        self._handles_lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._handles_at = float("-inf")
        self._announcements: queue.SimpleQueue[_Announcement] = queue.SimpleQueue()
        self._announced: dict[str, int] = {}  # job -> the number of its latest announcement
        self._numbers = itertools.count()
        self._stage_calls = 0
        self._intervals_lock = threading.Lock()
        self._intervals: dict[str, dict[int, tuple[int, str]]] = {}  # job -> rank -> its newest "auto" interval
        self._rebuild(rebuild_timeout_s)
        threading.Thread(target=self._confirm_announcements, name="ray_ckpt-announce", daemon=True).start()
        if settings.store_watch_interval_s() > 0:
            threading.Thread(target=self._watch_stores, name="ray_ckpt-store-watch", daemon=True).start()

    def _watch_stores(self) -> None:
        """Start a store on every alive node that has none (a node joined or rejoined), so
        saves return to full spreading without anyone calling ``ray_ckpt.start()`` again."""
        while True:
            time.sleep(settings.store_watch_interval_s())
            try:
                missing = naming.alive_node_ids() - naming.store_node_ids(self._namespace)
                for node_id in sorted(missing):
                    store_actor.deploy(self._namespace, node_id, *self._store_budget)
                    logger.info("started a ray_ckpt store on node %s, which joined the cluster", node_id)
            except Exception as error:  # the watch must outlive GCS hiccups
                logger.debug("store watch: %s", error)

    def _rebuild(self, timeout_s: float, rounds: int = REBUILD_ROUNDS) -> None:
        """Rebuild the view from every live store's holdings. A store that does not answer
        within ``timeout_s`` is asked again, up to ``rounds`` times, while Ray still lists it
        (calls to this actor wait meanwhile): a slow store left out could make a committed step
        look torn, and the next attempt would discard it. A dead store is simply absent."""
        holdings: dict[str, StoreHoldings] = {}
        for attempt in range(rounds):
            stores = {n: h for n, h in naming.store_handles(self._namespace).items() if n not in holdings}
            refs = {node_id: handle.holdings.remote() for node_id, handle in stores.items()}
            for node_id, ref in refs.items():
                try:
                    holdings[node_id] = StoreHoldings.from_wire(ray.get(ref, timeout=timeout_s))
                except Exception as error:
                    logger.warning(
                        "registry rebuild: store on node %s did not answer (try %d of %d): %s",
                        node_id,
                        attempt + 1,
                        rounds,
                        error,
                    )
            if set(refs) <= set(holdings):  # every store Ray lists answered
                break
        self._registry.rebuild(list(holdings.values()))
        self._observe_jobs()

    def ready(self) -> bool:
        return True

    def record(self, event: dict[str, Any]) -> None:
        """Append one event of a caller (see ray_ckpt.core.events) to the log and its file. A
        malformed one (``events.check``), one larger than RAY_CKPT_EVENT_MAX_BYTES, or a
        ``status`` event (the registry records its own) raises ConfigError naming the field,
        and nothing is recorded."""
        self._events.append(event, max_bytes=settings.event_max_bytes(), kinds=events.CALLER_KINDS)
        metrics.observe_event(event)
        if event.get("kind") == "interval":
            with self._intervals_lock:
                self._intervals.setdefault(event["job"], {})[event["rank"]] = (event["interval"], event["reason"])
        if event.get("kind") == "node_dead":
            self._observe_jobs(live_only=True)

    def _observe_jobs(self, jobs: list[str] | None = None, live_only: bool = False) -> None:
        """Export the jobs' (default: all) newest committed step and its protection; with
        ``live_only`` shards on dead nodes do not count (every rank's record is read then, so
        only when a node died). Never raises (metrics must not)."""
        try:
            live = naming.alive_node_ids() if live_only else None
            for job in self._registry.jobs() if jobs is None else jobs:
                step = self._registry.latest_committed(job)
                if step is None:
                    continue
                if live is None:
                    metrics.observe_job(job, step, self._registry.summary(job, step).protection)
                else:
                    metrics.observe_committed(job, step, self._registry.locate(job, step), live)
        except Exception as error:
            logger.debug("could not export job metrics: %s", error)

    def events(self, since: int = 0) -> tuple[int, list[dict[str, Any]]]:
        """(next sequence number, events from sequence number ``since`` on)."""
        return self._events.since(since)

    def events_path(self) -> str | None:
        return None if self._events.path is None else str(self._events.path)

    @ray.method(concurrency_group="stage")
    def stage_batch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Stage ranks' shards sent by the ranks themselves (``StageRequest``s on the wire, checked
        here; a rank does this only when its node's store is gone): a ``StageResult`` on the wire
        per request, in order, each request staged as a group of its own (``stage_groups``)."""
        return self._stage_requests(requests)

    def _stage_requests(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._stage_calls += 1
        parsed: list[StageRequest | RayCkptError] = []
        for values in requests:
            try:
                request = StageRequest.from_wire(values)
                request.check()
                parsed.append(request)
            except RayCkptError as error:
                parsed.append(error)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                parsed.append(ConfigError(f"malformed stage request ({type(error).__name__}: {error})"))
        groups = [StageGroup.of([r])[0] for r in parsed if isinstance(r, StageRequest)]
        staged = iter(self._stage_groups(groups))
        return [
            StageResult(error=r).to_wire()
            if isinstance(r, RayCkptError)
            else next(staged).result(r.metas[0].rank).to_wire()
            for r in parsed
        ]

    @ray.method(concurrency_group="stage")
    def stage_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Stages relayed by the stores (``StageGroup``s on the wire, their requests checked by
        the store that packed them): a ``GroupResult`` on the wire per group, in order. Torn
        steps of a new attempt are dropped from the stores; then, per job that committed, the
        newest commit of the call goes to the root of the relay tree, which hands it on
        (``ray_ckpt.core.relay``). The work per call grows with the groups' parts, not their ranks:
        metrics and the status snapshot are coalesced off this path."""
        self._stage_calls += 1
        return [result.to_wire() for result in self._stage_groups([StageGroup.from_wire(g) for g in groups])]

    def stage_calls(self) -> int:
        """Stage calls this registry process has served (its control-plane load)."""
        return self._stage_calls

    def _stage_groups(self, groups: list[StageGroup]) -> list[GroupResult]:
        outcomes = self._registry.stage_groups(groups)
        self._drop_discarded()
        commits: dict[str, tuple[int, ...]] = {}
        for group, outcome in zip(groups, outcomes):
            decision = outcome.decision
            newest = commits.get(group.job, (-1,))[-1]
            if decision is not None and decision.committed and decision.keep_steps[-1] >= newest:
                commits[group.job] = decision.keep_steps
        for job, keep in commits.items():
            self._announce_commit(job, keep)
            self._status_snapshots.request(job)  # metrics and status: off the stage path, at most one per job a second
        return [outcome.result() for outcome in outcomes]

    def _announce_commit(self, job: str, keep: tuple[int, ...]) -> None:
        """Send a commit to the root of the relay tree, with the tree: every live store, sorted
        (as looked up at most ``_HANDLES_TTL_S`` ago), and the fan-in (RAY_CKPT_RELAY_FANIN).
        Sent at once, not waited for: ``_confirm_announcements`` checks that the root took it."""
        handles = self._store_handles()
        tree = sorted(handles)
        if not tree:
            return
        attempt = self._registry.committed_by(job, keep[-1])
        with self._handles_lock:
            number = self._announced[job] = next(self._numbers)
        sent = self._send_commit(handles[tree[0]], job, keep, attempt, tree)
        self._announcements.put(_Announcement(number, job, keep, attempt, tree, sent, time.monotonic()))

    @staticmethod
    def _send_commit(handle: Any, job: str, keep: tuple[int, ...], attempt: str | None, tree: list[str]) -> Any:
        return handle.mark_committed.remote(job, keep[-1], list(keep), tree, None, settings.relay_fanin(), attempt)

    def _confirm_announcements(self) -> None:
        """Check, in turn, that the root of each announced commit took it within
        RAY_CKPT_RELAY_TIMEOUT_S of its sending. A commit a root did not take (dead, stuck) goes
        to the next store of the live stores looked up again (``relay.announce``), until one
        takes it; unless another commit of its job was announced since (a newer one evicts all
        it would; after a rollback, it is the job's newest). So one dead store never keeps a
        commit's evictions from the stores below it (those of nodes without ranks learn them
        from commits alone)."""
        while True:
            announcement = self._announcements.get()
            try:
                self._confirm(announcement)
            except Exception as error:  # the thread must outlive GCS hiccups; the next commit carries these evictions
                logger.warning("could not announce a commit of job %s: %s", announcement.job, error)

    def _confirm(self, announcement: _Announcement) -> None:
        job, keep = announcement.job, announcement.keep
        sent = {announcement.tree[0]: (announcement.sent, announcement.sent_at)}  # the call made at the commit

        def deliver(tree: list[str]) -> bool:
            ref, sent_at = sent.pop(tree[0], (None, time.monotonic()))
            if ref is None:
                handle = self._store_handles().get(tree[0])
                if handle is None:
                    return False
                ref = self._send_commit(handle, job, keep, announcement.attempt, tree)
            try:
                ray.get(ref, timeout=max(0.0, sent_at + settings.relay_timeout_s() - time.monotonic()))
                return True
            except Exception as error:  # dead, or slower than RAY_CKPT_RELAY_TIMEOUT_S
                logger.info("the store on node %s did not take commit %d of %s (%s)", tree[0], keep[-1], job, error)
                return False

        def superseded() -> bool:
            return self._announced.get(job) != announcement.number

        def still_to_try() -> list[str]:
            return [] if superseded() else sorted(self._store_handles(refresh=True))

        if relay.announce(announcement.tree, deliver, still_to_try) is None and not superseded():
            logger.warning("no store took commit %d of job %s: its evictions wait for the next commit", keep[-1], job)

    def _record_status(self, job: str) -> None:
        """Record a ``status`` event of ``job``'s newest committed step (``events.status_event``):
        placement, protection, store memory and hosts, so an events file alone shows them. A
        job of more than ``events.PLACEMENT_MAX_RANKS`` ranks gets a summary, read without
        unpacking its ranks' records unless a node holding its shards is gone."""
        step = self._registry.latest_committed(job)
        if step is None:  # forgotten meanwhile
            return
        self._observe_jobs([job])
        summary = self._registry.summary(job, step)
        refs = {node_id: h.stats.remote() for node_id, h in naming.store_handles(self._namespace).items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=5.0) if refs else ([], [])
        stores: dict[str, StoreStats | str] = {}  # node id -> its store's usage, or why it is unknown
        for node_id, ref in refs.items():
            try:
                stores[node_id] = (
                    StoreStatus.from_wire(ray.get(ref, timeout=0)).usage if ref in ready else "no answer within 5 s"
                )
            except Exception as error:  # a dead store is reported, not fatal
                stores[node_id] = f"{type(error).__name__}"
        ray_nodes = naming.nodes()
        live = {n.node_id for n in ray_nodes if n.alive} & set(stores)
        shards = local_nodes = None
        protection = summary.protection
        if summary.world_size <= events.PLACEMENT_MAX_RANKS:
            located = self._registry.locate(job, step)
            shards = {rank: dict(r.nodes) for rank, r in located.items()}
            local_nodes = {rank: r.local_node if r.local is not None else None for rank, r in located.items()}
        elif not summary.nodes <= live:
            protection = step_protection(self._registry.locate(job, step), live)
        recorded = self._events.append_status(  # a delta against the job's previous snapshot, mostly
            events.status_event(
                job,
                step,
                world_size=summary.world_size,
                data_shards=summary.data_shards,
                parity_shards=summary.parity_shards,
                shards=shards,
                local_nodes=local_nodes,
                stores=stores,
                ray_nodes=ray_nodes,
                summary=(protection, summary.nodes),
            )
        )
        metrics.observe_event(recorded)

    def _store_handles(self, refresh: bool = False) -> dict[str, Any]:
        """The live stores' handles for commit announcements, looked up at most once every
        ``_HANDLES_TTL_S`` (a lookup is one GCS call per store; a commit must not pay it), or now
        with ``refresh`` (a store of the list failed)."""
        with self._handles_lock:
            now = time.monotonic()
            if refresh or now - self._handles_at > _HANDLES_TTL_S:
                self._handles = naming.store_handles(self._namespace)
                self._handles_at = now
            return self._handles

    def _drop_discarded(self) -> None:
        """Have every store drop the shards of the steps the registry discarded (torn steps a
        join discarded, steps a rollback forgot), but the discarding attempt's own; and keep
        the jobs' new restore plans, waiting (a little) until they have them: a registry that
        restarts takes them back from there."""
        discarded = self._registry.take_discarded()
        plans = self._registry.take_plan_marks()
        if not discarded and not plans:
            return
        handles = list(naming.store_handles(self._namespace).values())
        for gone in discarded:
            for handle in handles:
                handle.drop.remote(gone.job, list(gone.steps), list(gone.attempts), list(gone.writers))
        noted = [handle.note_plan.remote(job, mark.to_wire()) for job, mark in plans.items() for handle in handles]
        if noted:
            ray.wait(noted, num_returns=len(noted), timeout=PLAN_MARK_WAIT_S)

    def plan_restore(self, job: str, attempt: str | None) -> dict[str, Any]:
        """The step all ranks of ``attempt`` restore: a ``RestorePlan`` on the wire."""
        live = naming.store_node_ids(self._namespace)  # one GCS call, whatever the cluster's size
        plan = self._registry.plan_restore(job, attempt, live).to_wire()
        self._drop_discarded()
        return plan

    def plan_ranks(self, queries: list[list[Any]]) -> list[dict[str, Any]]:
        """Restore plans for ranks, as the stores pass them up the relay tree (``PlanQuery``s on
        the wire): a ``PlanAnswer`` on the wire per query, with the plan of its attempt (joined
        as ``plan_restore`` joins it) and the asking ranks' records of its step."""
        live = naming.store_node_ids(self._namespace)
        answers = []
        for query in (PlanQuery.from_wire(q) for q in queries):
            try:
                answers.append(self._registry.plan_ranks(query, live).to_wire())
            except RayCkptError as error:  # this query's alone (a zombie of a replaced attempt)
                answers.append(PlanAnswer(RestorePlan(), error=error).to_wire())
        self._drop_discarded()
        return answers

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None:
        return self._registry.settle_backup_step(job, attempt, step)

    def mark_unrestorable(self, job: str, step: int) -> None:
        self._registry.mark_unrestorable(job, step)

    def rollback(self, job: str, step: int) -> list[int]:
        dropped = self._registry.rollback(job, step)
        self._drop_discarded()
        return list(dropped)

    def wait_committed(self, job: str, step: int, timeout_s: float) -> bool:
        return self._registry.wait_committed(job, step, timeout_s)

    def wait_settled(
        self, job: str, step: int, rank: int, attempt: str | None, world_size: int, passed: int, timeout_s: float
    ) -> str:
        return self._registry.wait_settled(
            job, step, rank=rank, attempt=attempt, world_size=world_size, passed=passed, timeout_s=timeout_s
        )

    def latest_committed(self, job: str) -> int | None:
        return self._registry.latest_committed(job)

    def note_reached(self, job: str, attempt: str | None, step: int) -> None:
        """Rank 0 of ``attempt`` trained ``step`` (``Registry.note_reached``); a malformed call
        is dropped (it only feeds the steps-redone count)."""
        ok_step = isinstance(step, int) and not isinstance(step, bool) and step >= 0
        if isinstance(job, str) and (attempt is None or isinstance(attempt, str)) and ok_step:
            self._registry.note_reached(job, attempt, step)

    def steps_reached(self, job: str, attempt: str | None) -> tuple[int | None, int | None]:
        return self._registry.steps_reached(job, attempt)

    def jobs_of_run(self, run: str) -> list[str]:
        return self._registry.jobs_of_run(run)

    def committed_steps(self, job: str) -> list[int]:
        return self._registry.committed_steps(job)

    def staged_ranks(self, job: str, step: int) -> list[int]:
        return self._registry.staged_ranks(job, step)

    def locate(self, job: str, step: int) -> dict[int, dict[str, Any]]:
        """rank -> its ``RankRecord`` on the wire, for a committed step."""
        return ranks_to_wire(self._registry.locate(job, step))

    def locate_rank(self, job: str, step: int, rank: int) -> dict[str, Any]:
        """One rank's records of a committed step and its world size: a ``RankLocation`` on the wire."""
        return self._registry.locate_rank(job, step, rank).to_wire()

    def jobs(self) -> dict[str, dict[str, Any]]:
        """The registry's jobs, job -> a ``JobInfo`` on the wire; with ``interval``
        (``ray_ckpt.core.interval.summarize``) for a job whose ranks sent ``interval`` events
        since this actor started."""
        jobs = self._registry.jobs()
        with self._intervals_lock:
            summaries = {job: interval.summarize(self._intervals.get(job, {})) for job in jobs}
        return {job: dataclasses.replace(info, interval=summaries[job]).to_wire() for job, info in jobs.items()}

    def forget(self, job: str, timeout_s: float = 10.0) -> None:
        """Forget ``job`` and wait until every live store dropped its shards (a store that does
        not answer within ``timeout_s`` is skipped: its shards are unreachable anyway)."""
        self._registry.forget(job)
        with self._intervals_lock:
            self._intervals.pop(job, None)
        with self._handles_lock:
            self._announced.pop(job, None)
        refs = [handle.drop.remote(job, None) for handle in naming.store_handles(self._namespace).values()]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
