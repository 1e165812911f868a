"""Checkpointer: one rank's ``save`` and ``restore``, over the save pipeline and the restorer."""

from __future__ import annotations

import logging
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray

from ray_ckpt import settings
from ray_ckpt.backup import ArrowBackup, Backup
from ray_ckpt.config import EVERY_AUTO, CheckpointConfig
from ray_ckpt.core import dtensor, events, snapshot
from ray_ckpt.core.identity import RankIdentity, WithIdentity
from ray_ckpt.core.interval import Decision, IntervalPolicy
from ray_ckpt.core.shard import check_step
from ray_ckpt.errors import CommitTimeoutError, ConfigError, RayCkptError, StoreUnavailableError, TornStepError
from ray_ckpt.process_copies import THIS_PROCESS
from ray_ckpt.ranges import RangeReader
from ray_ckpt.restore import Restored, Restorer
from ray_ckpt.save import SaveHandle, SavePipeline
from ray_ckpt.transport.registry_client import RegistryClient
from ray_ckpt.transport.store_directory import StoreDirectory

__all__ = ["Checkpointer", "Restored", "SaveHandle"]

logger = logging.getLogger(__name__)


class Checkpointer(WithIdentity):
    """Saves and restores one rank's state through the ray_ckpt service.

    ``save`` blocks only while the state is copied into a host buffer it reuses (pinned, with
    asynchronous device->host copies, when tensors live on a GPU); encoding, scattering the
    shards to peer stores, the local copy, staging and backups run on a background thread. At
    most one save is in flight: the next ``save`` waits for the previous one (recorded in
    ``last_save_phases_s["wait_previous"]``), or is skipped with ``on_busy="skip"``. A
    background failure is re-raised by a later ``save`` (at the latest the next one that saves),
    ``wait`` or ``close``.

    ``CheckpointConfig.every`` picks the steps saved: those divisible by an int, or by the
    interval ``every="auto"`` chooses (``ray_ckpt.core.interval``: every step of its warm-up,
    then the multiples of a power of two; whether a step is due never depends on timing, so
    every rank saves the steps of the grid). Any other step returns a skipped ``SaveHandle``
    without looking at the state.

    ``attempt`` names the incarnation of the job (one worker group): all ranks of one
    incarnation must pass the same value, and a new incarnation must pass a new one
    (``ray_ckpt.train.Checkpointer`` does this). Steps staged but not committed by an earlier
    incarnation are then discarded instead of being completed by the new one. Without one,
    ``restore`` gets the registry's (``attempt`` is then set): every rank must restore before
    it trains (docs/commit-protocol.md). A ``save`` before that is refused when the job has more
    than one rank (ConfigError); a one-rank Checkpointer's first save joins the registry's
    attempt itself, as ``restore`` would, loading nothing. ``writer``: this object's id, in its
    shards' keys.
    ``identity``: job, rank, world size, attempt and this rank's Ray node, one checked
    ``RankIdentity``; its fields read as attributes (``ckpt.rank``, ``ckpt.attempt``).

    ``backup``: where persistent backups go and a restore falls back to (any
    ``ray_ckpt.backup.Backup``); by default an ``ArrowBackup`` on ``config.backup_uri`` when that
    is set, else none. Pass one or the other, not both. Not thread-safe: one caller.
    """

    forced_step: int | None = None  # the newest step saved only because save() was forced

    def __init__(
        self,
        *,
        job: str,
        rank: int,
        world_size: int,
        config: CheckpointConfig | None = None,
        namespace: str | None = None,
        attempt: str | None = None,
        backup: Backup | None = None,
    ) -> None:
        RankIdentity.check(job=job, rank=rank, world_size=world_size, attempt=attempt)  # before Ray is needed
        if config is not None and not isinstance(config, CheckpointConfig):
            raise ConfigError(f"config must be a ray_ckpt.CheckpointConfig, got {type(config).__name__}")
        if backup is not None and not isinstance(backup, Backup):
            raise ConfigError(
                "backup must implement ray_ckpt.backup.Backup (write, complete_steps, saved_world_size, read, "
                f"prune), got {type(backup).__name__}"
            )
        if backup is not None and config is not None and config.backup_uri:
            raise ConfigError(
                f"pass either backup= or CheckpointConfig.backup_uri ({config.backup_uri!r}), not both: "
                "the backup backend is one of them"
            )
        if not ray.is_initialized():
            raise StoreUnavailableError("Ray is not initialized: call ray.init() and ray_ckpt.start() first")
        self.config = config or CheckpointConfig()
        if self.config.backup_every and not self.config.backup_uri and backup is None:
            raise ConfigError(
                f"backup_every={self.config.backup_every} needs a backup_uri (a path or pyarrow.fs URI) "
                "in CheckpointConfig, or a backup= backend; ray_ckpt.train.Checkpointer fills backup_uri in "
                "from the run's storage path"
            )
        self.namespace = namespace or settings.namespace()
        node_id = ray.get_runtime_context().get_node_id()
        self.identity = RankIdentity(job=job, rank=rank, world_size=world_size, attempt=attempt, node_id=node_id)
        self._registry = RegistryClient(self.namespace)
        self._stores = StoreDirectory(self.namespace)
        if backup is None and self.config.backup_uri:
            backup = ArrowBackup(self.config.backup_uri)
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ray_ckpt-save-{rank}")
        self.writer = uuid.uuid4().hex  # this Checkpointer's saves: no other save shares their shards' keys
        self._saves = SavePipeline(
            identity=self.identity,
            writer=self.writer,
            config=self.config,
            registry=self._registry,
            stores=self._stores,
            backup=backup,
            own_copies=THIS_PROCESS.own_copies,
            record=self._record,
        )
        self._restorer = Restorer(
            identity=self.identity,
            registry=self._registry,
            stores=self._stores,
            backup=backup,
            copies=THIS_PROCESS,
            background=self._background,
            timeout_s=settings.peer_timeout_s,
        )
        self._in_flight: Future[bool] | None = None
        self._in_flight_blocking = 0.0  # the in-flight save's blocking time, its wait for the previous left out
        self._in_flight_since = 0.0  # when it was handed to the background (perf_counter)
        self._background_ended = 0.0  # when the background work of the last save ended (its thread writes it)
        self._policy = (
            IntervalPolicy(max_interval_s=settings.auto_max_interval_s(), mtbf_prior_s=settings.auto_mtbf_s())
            if self.config.every == EVERY_AUTO
            else None
        )
        self._previous_call: tuple[int, float, bool] | None = None  # (step, when save returned, a save ran then)
        self._last_step: int | None = None
        self._reached: int | None = None  # the newest step ``note_step`` sent (rank 0)
        self._created = time.time()  # for the timeline: this rank's worker is running
        self._closed = False
        self.last_save_phases_s: dict[str, float] = {}
        self.last_restore_bytes = 0  # bytes the last restore read (from memory or a backup)

    @property
    def last_protection(self) -> int | None:
        """How many node losses the last save's placement survives (below parity_shards while
        fewer than k+m stores are alive); None before the first save completes."""
        return self._saves.last_protection

    # ---- save ---------------------------------------------------------------------------

    def save(self, step: int, state: Any, *, force: bool = False) -> SaveHandle:
        """Checkpoint ``state`` as ``step`` (steps must increase). Returns once the state is
        copied; see SaveHandle for completion. ``force``: save it even where
        ``CheckpointConfig.every`` or ``on_busy="skip"`` would skip it (every rank must force the
        same steps, or those steps never commit). Raises the previous save's background error, and
        on this Checkpointer's first save PlacementError when no node runs a store (nothing is
        saved then). Fewer stores than ``data_shards + parity_shards`` is no error: shards then
        share nodes and ``last_protection`` says what the step survives. Without an attempt and
        before ``restore()``: ConfigError with more than one rank; one rank joins the registry's
        attempt at its first save (see the class).

        A GPU tensor's copy to the host is queued on its device's current stream, and the
        background waits for an event on each such stream: work queued on those streams after
        ``save`` returns runs after the copies. Writes on any other stream are the caller's to
        order against the copies: one queued before ``save`` with
        ``torch.cuda.current_stream().wait_stream(side)`` first, one after it with
        ``side.wait_stream(torch.cuda.current_stream())``."""
        self._check_open()
        check_step(step)
        self._join_or_refuse()
        if self._last_step is not None and step <= self._last_step:
            raise ConfigError(f"step {step} is not newer than the last saved step {self._last_step}")
        self.note_step(step)
        started = time.perf_counter()
        reason = self._skip_reason(step, started)
        if reason is not None and not force:
            return self._skip(step, started, reason)
        self.forced_step = step if reason is not None else self.forced_step
        layout = snapshot.build_layout(state)  # validates before anything is waited for or touched
        self._saves.check_placement()
        busy = self._in_flight is not None and not self._in_flight.done()
        if self.config.on_busy == "skip" and busy and not force:
            return self._skip(step, started, "busy")
        self._finish_in_flight(step)
        copy_start = time.perf_counter()
        buffer, size, copied = self._saves.snapshot(layout)
        self._last_step = step
        phases = {"wait_previous": copy_start - started, "snapshot": time.perf_counter() - copy_start}
        phases["blocking"] = time.perf_counter() - started
        self.last_save_phases_s = phases
        returned = time.time()  # training goes on from here; the event says so after the commit
        self._in_flight_blocking = phases["blocking"] - phases["wait_previous"]  # the save's own cost
        self._in_flight_since = time.perf_counter()
        self._in_flight = self._background.submit(self._complete, step, buffer, size, copied, phases, returned)
        self._previous_call = (step, time.perf_counter(), True)
        return self._handle(step, self._in_flight)

    def _join_or_refuse(self) -> None:
        """Make sure this rank saves under an attempt, so that no step commits with records of
        two worker groups. Without one (never restored, or only ``restore(step=...)``, which
        joins nothing): one rank joins the registry's attempt as ``restore`` would (no peer can
        stage before it joins); more ranks are refused, since the registry tells their group from
        a replaced one only by restores made before any rank of it saves."""
        if self.attempt is not None:
            return
        if self.world_size > 1:
            raise ConfigError(
                f"job {self.job!r} rank {self.rank}: save() before restore() on a Checkpointer without an attempt; "
                "call restore() first or pass attempt=... (the same str on every rank of this worker group, a new "
                "one for each start of it). Without an attempt the registry tells one worker group of "
                f"{self.world_size} ranks from the next only by their restores, so a save before any restore could "
                "commit one step with ranks of two groups. restore() returns None while the job has no committed "
                "step; restore(step=...) plans nothing and joins no attempt",
                job=self.job,
                rank=self.rank,
                world_size=self.world_size,
            )
        self._restorer.join()
        self.identity = self._saves.identity = self._restorer.identity

    def _complete(self, *args: Any) -> bool:
        """The background work of one save (``SavePipeline.complete``), its end time noted."""
        try:
            return self._saves.complete(*args)
        finally:
            self._background_ended = time.perf_counter()

    def note_step(self, step: int) -> None:
        """Say that this rank trained ``step``, saved or not. Rank 0's newest such step is what
        the next attempt's restore counts the steps it must train again from (the ``restore``
        event's ``steps_lost``): with saves every N steps, the steps trained after the last
        save count too. ``save`` says it of every step it is given, skipped ones included;
        call it where steps are trained without a ``save`` call (a loop that calls ``dcp.save``
        every N steps). Rank 0 sends one fire-and-forget message per new step; other ranks and
        older steps send nothing. ConfigError for a ``step`` that is not an int in [0, 2**63)."""
        check_step(step)
        if self.rank != 0 or (self._reached is not None and step <= self._reached):
            return
        self._reached = step
        self._registry.note_reached(self.job, self.attempt, step)

    def _skip_reason(self, step: int, now: float) -> str | None:
        """Why ``step`` is not saved ("not due" by ``CheckpointConfig.every``), None when it is.
        Under "auto" this also feeds the policy the training time per step since the previous
        call; a save found complete is collected (``_finish_in_flight``) only after ``step`` was
        judged, so that its measurement, which arrives when it arrives, changes later steps only
        and every rank judges the same steps the same way."""
        every = self.config.every
        if self._policy is None:
            return None if isinstance(every, int) and step % every == 0 else "not due"
        previous = self._previous_call
        if previous is not None and step > previous[0]:
            self._policy.observe_step((now - previous[1]) / (step - previous[0]), during_save=previous[2])
        due = self._policy.due(step)
        if self._in_flight is not None and self._in_flight.done():
            self._finish_in_flight(step)
        return None if due else "not due"

    def _skip(self, step: int, started: float, reason: str) -> SaveHandle:
        self.last_save_phases_s = {"blocking": time.perf_counter() - started, "skipped": 1.0}
        busy = self._in_flight is not None and not self._in_flight.done()
        self._previous_call = (step, time.perf_counter(), busy)
        return self._handle(step, None, reason)

    def _announce(self, step: int, decision: Decision | None) -> None:
        """Log a new interval with its numbers and send it as an ``interval`` event."""
        if decision is None:
            return
        logger.log(
            logging.INFO if self.rank == 0 else logging.DEBUG,
            "job %r rank %d: saving every %d step(s) from step %d on; %s",
            self.job,
            self.rank,
            decision.interval,
            step,
            decision.describe(),
        )
        measured = decision.measured()
        self._record("interval", step=step, interval=decision.interval, reason=decision.reason, measured=measured)

    @property
    def interval(self) -> int:
        """The steps between saves: ``every`` as configured, or what "auto" chose so far (1
        during its warm-up)."""
        return self._policy.interval if self._policy is not None else int(self.config.every)

    def failures_seen(self, count: int, job_s: float | None = None) -> None:
        """Tell ``every="auto"`` that the job has seen ``count`` failures (restarts) in ``job_s``
        seconds of running (None: estimated as the step number times the measured step time).
        Until a count above 0 arrives, the MTBF is RAY_CKPT_AUTO_MTBF_S. No effect otherwise."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"count must be the number of failures the job has seen, an int >= 0, got {count!r}")
        if self._policy is not None:
            self._announce(self._last_step or 0, self._policy.observe_failures(count, job_s))

    def _handle(self, step: int, staged: Future[bool] | None, skip_reason: str | None = None) -> SaveHandle:
        return SaveHandle(step, staged, self._wait_committed, self.config.commit_timeout_s, skip_reason=skip_reason)

    def _finish_in_flight(self, step: int | None = None) -> None:
        """Collect the in-flight save (re-raising its background failure); under "auto" its
        cost feeds the policy, whose new interval, if any, is announced from ``step`` on."""
        if self._in_flight is not None:
            future, self._in_flight = self._in_flight, None
            future.result()  # re-raises a background failure
            if self._policy is not None:
                background_s = max(0.0, self._background_ended - self._in_flight_since)
                decision = self._policy.observe_save(self._in_flight_blocking, background_s)
                self._announce(step if step is not None else self._last_step or 0, decision)

    def _wait_committed(self, step: int, timeout_s: float) -> None:
        """Return once ``step`` (or a newer step) committed. TornStepError as soon as it never
        can (ranks that did not save it went past it), CommitTimeoutError after ``timeout_s``."""
        settled = self._settle(step, timeout_s)
        if settled == "committed":
            return
        missing = sorted(set(range(self.world_size)) - set(self._registry.staged_ranks(self.job, step)))
        if settled == "torn":
            raise TornStepError(
                f"job {self.job!r} step {step} will never commit: ranks {missing} went on without saving it "
                "(they chose a longer interval under every='auto', or skipped it under on_busy='skip'); the "
                f"newest committed step is {self._registry.latest_committed(self.job)}",
                job=self.job,
                step=step,
                missing_ranks=missing,
            )
        raise CommitTimeoutError(
            f"job {self.job!r} step {step} did not commit within {timeout_s:.1f}s: still waiting for "
            f"ranks {missing} to stage it (raise CheckpointConfig.commit_timeout_s if they are slow)",
            job=self.job,
            step=step,
            missing_ranks=missing,
        )

    def _settle(self, step: int, timeout_s: float) -> str:
        """``Registry.wait_settled`` for ``step``, noting the step this rank went past."""
        return self._registry.wait_settled(
            self.job,
            step,
            rank=self.rank,
            attempt=self.attempt,
            world_size=self.world_size,
            passed=self._passed_step(),
            timeout_s=timeout_s,
        )

    def _passed_step(self) -> int:
        """The newest step this rank went past: the newest step ``save`` was called with, or
        the one before a save still running (its stage may yet come)."""
        if self._in_flight is not None and not self._in_flight.done() and self._last_step is not None:
            return self._last_step - 1
        return self._previous_call[0] if self._previous_call is not None else -1

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until the last saved step settled (re-raising a background failure): it
        committed, or it never will because ranks that did not save it went on (a rank on a
        shorter interval than others under ``every="auto"``; logged at INFO): every step all
        ranks saved up to it has committed then. CommitTimeoutError after ``timeout_s``."""
        self._check_open()
        if self._last_step is None:
            return
        try:
            if self._in_flight is not None:
                self._handle(self._last_step, self._in_flight).wait(timeout_s)
                self._note_passed()  # its stage may have committed it: the registry was not asked
            else:  # its background work already collected (under "auto", by a later call)
                self._wait_committed(self._last_step, self.config.commit_timeout_s if timeout_s is None else timeout_s)
        except TornStepError as torn:
            logger.info("rank %d: %s", self.rank, torn.message)

    def _record(self, kind: events.EventKind, **fields: Any) -> None:
        """Send an event to the registry's log (fire and forget: never blocks or fails a save)."""
        fields.setdefault("rank", self.rank)
        self._registry.record(events.event(kind, job=self.job, attempt=self.attempt, node_id=self.node_id, **fields))

    # ---- restore ------------------------------------------------------------------------

    def _fill(self, restored: Restored, into: Any) -> Restored:
        if into is not None:
            return self._restorer.fill(restored, into)
        sharded = dtensor.holds_shards(restored.state)
        if sharded:
            raise ConfigError(
                f"this checkpoint holds DTensors ({', '.join(sharded[:3])}{', ...' if len(sharded) > 3 else ''}): "
                "restore them into your state dict, e.g. ckpt.restore(into={'model': model.state_dict()}) with the "
                "tree you saved (for FSDP2 with an optimizer: get_state_dict(model, optimizer))",
                keys=sharded,
            )
        return restored

    def latest_step(self) -> int | None:
        """The newest step committed by all ranks of this job, or None if none is."""
        return self._registry.latest_committed(self.job)

    def range_readers(self, step: int) -> dict[int, RangeReader]:
        """Byte-range readers of every rank's blob of the committed ``step`` (rank -> reader; see
        ``Restorer.range_readers``), for callers that read other ranks' payloads themselves (the
        DCP backend). NoCheckpointError when ``step`` is not committed."""
        self._check_open()
        check_step(step)
        return self._restorer.range_readers(step)

    def restore(self, step: int | None = None, *, into: Any = None) -> Restored | None:
        """Rebuild this rank's state of the newest step every rank can restore (or of ``step``),
        from its local copy on this node, else any k checksum-valid shards on live peers, else
        the newest complete persistent backup. All ranks of one attempt get the same step.

        ``into``: a state of the same tree the caller already has (``model.state_dict()``, or
        ``{"model": ..., "optim": ...}`` from DCP's ``get_state_dict(model, optimizer)``): the
        restored tensors are copied into its tensors and DTensors, which must have the same
        shapes and dtypes (``dtensor.load_into``); ``Restored.state`` is then that filled
        tree. A state saved with DTensors needs ``into`` (a DTensor needs the caller's device
        mesh); without it ConfigError names the DTensor keys. A step saved at another
        world size, or in another sharding (device mesh, placements), is resharded into
        ``into`` from peer memory: each rank reads only the byte ranges its new shards need
        (``Restored.from_world_size``, ``values_by_rank``).

        Returns None only when the job never committed a step and has no backup. Raises
        ConfigError, the same on every rank, when the step was saved at another world size
        and there is no ``into``, or the state holds no DTensors (per-rank state cannot be
        resharded; nothing is lost: the step stays restorable at its own size);
        InsufficientShardsError when a committed step can no longer be rebuilt and no backup
        exists; ShardsUnreachableError when stores that are alive did not answer in time (the
        step is kept: restarting the attempt reads it again). A failed restore is recorded as
        a failed recovery (a ``restore`` event with ``error``); a ``step`` that is not an int
        in [0, 2**63) is a ConfigError, not recorded."""
        self._check_open()
        if step is not None:
            check_step(step)
        try:
            restored, plan = self._restorer.restore(step, into)
            if restored is not None and restored.from_world_size is None:
                restored = self._fill(restored, into)
        except Exception as error:
            self._record(
                "restore",
                step=None,
                source=None,
                error=f"{type(error).__name__}: {error}",
                started=self._created,
                phases_s={},
            )
            raise
        self.last_restore_bytes = self._restorer.restored_bytes
        if self.attempt is None and self._restorer.attempt is not None:  # the registry gave this rank its attempt
            self.identity = self._saves.identity = self._restorer.identity
        self._saves.restart_counting()  # the next save is this incarnation's first step: always recorded
        if restored is not None and restored.from_world_size is None:
            self._saves.reserve(self._restorer.restored_bytes)  # mapped during the next step, not in its save
        self._record(
            "restore",
            step=None if restored is None else restored.step,
            source=None if restored is None else restored.source,
            steps_lost=(
                None
                if restored is None
                else self._steps_redone_asked(restored.step)  # an explicit step: no plan to read them from
                if plan is None
                else _steps_redone(restored.step, plan.newest_staged, plan.newest_reached)
            ),
            bytes=self._restorer.restored_bytes,
            pid=os.getpid(),
            started=self._created,
            phases_s={} if restored is None else restored.phases_s,
        )
        return restored

    def record_load(self, step: int, source: str, read_bytes: int, phases_s: dict[str, float]) -> None:
        """Record a load of the committed ``step`` that read this rank's state through
        ``range_readers`` (the DCP backend's ``dcp.load``) as this rank's restore, as
        ``restore`` records its own: on the timeline and the dashboard with its phases
        (``locate``, ``fetch``, ``decode``, ``load``) and the steps it makes the job train
        again. Never raises (observability must not fail a load)."""
        self._saves.restart_counting()  # the next save is this incarnation's first step: always recorded
        self._record(
            "restore",
            step=step,
            source=source,
            steps_lost=self._steps_redone_asked(step),
            bytes=int(read_bytes),
            pid=os.getpid(),
            started=self._created,
            phases_s=dict(phases_s),
        )

    def _steps_redone_asked(self, restored: int) -> int | None:
        """The steps a restore of ``restored`` without a plan makes the job train again, from
        the registry (``steps_reached``); None where it cannot say."""
        try:
            staged, reached = self._registry.steps_reached(self.job, self.attempt)
        except Exception as error:  # observability must not fail a restore
            logger.debug("job %r rank %d: reading the steps trained before a restore: %s", self.job, self.rank, error)
            return None
        return _steps_redone(restored, staged, reached)

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Finish the save in flight (re-raising its error), tell the registry this rank saves
        no more (see ``_note_passed``) and release the buffers."""
        if self._closed:
            return
        try:
            self._finish_in_flight()
            self._note_passed()
        finally:
            self._release(wait=True)

    def _note_passed(self) -> None:
        """Tell the registry which step this rank went past (``Registry.wait_settled``), so that
        ranks waiting for a step it did not save learn that it is torn: only where ranks may
        save different steps (``every="auto"``, ``on_busy="skip"``). Never raises."""
        if self._last_step is None or (self._policy is None and self.config.on_busy != "skip"):
            return
        try:
            self._settle(self._last_step, 0.0)
        except RayCkptError as error:
            logger.debug("rank %d: could not tell the registry it is done: %s", self.rank, error)

    def abandon(self) -> None:
        """Close without raising and without waiting, for a checkpointer whose worker group
        failed: a save in flight goes on in the background (a dead peer may hold it up for a
        while), its error, if any, logged, and the buffers are released once it ended, but for
        the newest staged step's blob, which a restore in this process then takes without a
        store (the process's ``ray_ckpt.process_copies.THIS_PROCESS``). Its unfinished step is
        discarded by the next attempt, which the registry also keeps from taking a stage of this
        one (``StaleAttemptError``)."""
        if self._closed:
            return
        in_flight, self._in_flight = self._in_flight, None
        self._closed = True

        def release(done: Future[bool] | None) -> None:
            error = None if done is None else done.exception()
            if error is not None:
                logger.info("rank %d: the abandoned save of step %s ended with %s", self.rank, self._last_step, error)
            self._release(wait=False, keep_for_rollback=True)

        if in_flight is None:
            release(None)
        else:
            in_flight.add_done_callback(release)

    def _release(self, *, wait: bool, keep_for_rollback: bool = False) -> None:
        self._closed = True
        self._background.shutdown(wait=wait)
        self._saves.release(keep_for_rollback=keep_for_rollback)
        self._stores.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Checkpointer is closed; create a new one")

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _steps_redone(restored: int, newest_staged: int | None, newest_reached: int | None) -> int | None:
    """The steps a job restored at ``restored`` trains again: up to the newest step it staged
    or said it trained (``Checkpointer.note_step``) before; None when neither is known."""
    known = [step for step in (newest_staged, newest_reached) if step is not None]
    return max(0, max(known) - restored) if known else None
