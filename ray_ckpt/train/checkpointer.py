"""ray_ckpt.train.Checkpointer: a Checkpointer that takes job, rank and world size from the run."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.fs as pafs
import ray.train
from ray.train.collective import broadcast_from_rank_zero

from ray_ckpt import _ray_compat, checkpointer
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.generations import DrainNotice, generation_of
from ray_ckpt.errors import CommitTimeoutError, ConfigError, HandedOver, TornStepError
from ray_ckpt.save import SaveHandle
from ray_ckpt.train import inplace

__all__ = ["Checkpointer", "SharedRankZero", "default_backup_uri", "job_name"]

_SCHEMES = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs", "abfs": "abfs"}
DRAIN_MARGIN_S = 2.0  # a draining rank hands over at least this long before its node's deadline
DEFAULT_DRAIN_S = 120.0  # a drain without a deadline is taken to end this long after the notice (Ray Train's default)
HOLD_AFTER_DEADLINE_S = 60.0  # how long past the deadline a draining rank without in place waits to be ended
HOLD_POLL_S = 0.5
# without in place, a draining rank trains on (saving every step) until the deadline is this many
# of its steps (save included) plus DRAIN_MARGIN_S away: a step, its commit, and one of slack
HOLD_STEPS = 3

logger = logging.getLogger(__name__)

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _shielded(method: _Method) -> _Method:
    """``method`` run where in-place recovery's ``PeerLost`` cannot cut it short (it is raised
    when the call returns instead; ``ray_ckpt.train.interrupts``)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with inplace.shielded():
            return method(*args, **kwargs)

    return call  # type: ignore[return-value]


def job_name(experiment_name: str) -> str:
    """The ray_ckpt job for a Ray Train experiment name: '%' becomes '%25', then '/' becomes
    '%2F' (percent-encoding of just those two), so the job never contains '/', names with
    neither character are kept as they are, and distinct names give distinct jobs
    (``"team/exp1"`` -> ``"team%2Fexp1"``; ``"team%2Fexp1"`` -> ``"team%252Fexp1"``)."""
    if not isinstance(experiment_name, str) or not experiment_name:
        raise ConfigError(f"the experiment name must be a non-empty str, got {experiment_name!r}")
    return experiment_name.replace("%", "%25").replace("/", "%2F")


def default_backup_uri() -> str | None:
    """``<run's storage path>/<experiment>/ray_ckpt``, as a URI pyarrow.fs understands, or
    None when the run's filesystem has no URI form (pass backup_uri explicitly then)."""
    storage = ray.train.get_context().get_storage()
    fs = storage.storage_filesystem
    path = f"{storage.experiment_fs_path.rstrip('/')}/ray_ckpt"
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    scheme = _SCHEMES.get(fs.type_name)
    return f"{scheme}://{path}" if scheme else None


class Checkpointer(checkpointer.Checkpointer):
    """``ray_ckpt.Checkpointer`` for use inside ``train_loop_per_worker``.

    job = ``job`` if given (used as is: a non-empty str without '/'), else
    ``job_name(<the run's experiment name>)``; rank/world size = the worker's world rank and
    size; node identity = this worker's Ray node id. Every worker group (each restart of the
    run) gets a fresh attempt id, chosen by rank 0 and broadcast to all ranks, so steps torn by
    a failed group are discarded rather than completed by the next one. Under
    ``InPlaceRecovery`` the attempt is the generation's (no broadcast), and a failure of the
    generation abandons this checkpointer. Must be constructed by every rank, with the same
    ``job`` (the broadcast is a collective). ``backup_uri`` defaults to the run's storage path.
    ``config.every`` is used as given; under ``InPlaceRecovery`` an ``every="auto"`` interval
    counts the run's failures from the generation number (every generation after the first
    follows one); outside it, restarts are not counted and the prior RAY_CKPT_AUTO_MTBF_S
    stands (``failures_seen`` takes a count from the caller). Under ``InPlaceRecovery`` no
    ``PeerLost`` lands inside its methods: one that comes during a call is raised as it returns.
    """

    _last_save_at: float | None = None  # when save() was last called (time.monotonic())
    _step_s = 0.0  # the time between this rank's last two save() calls: a step and its save

    @_shielded
    def __init__(
        self, config: CheckpointConfig | None = None, *, job: str | None = None, namespace: str | None = None
    ) -> None:
        self._drain_first: int | None = None  # the first step this rank saved after a drain notice
        self._forced_since_notice: set[int] = set()  # steps saved since then only because of it
        self._every_rank_forces = False  # one of those committed: every rank saves each step
        self._held = False  # this rank held for a restart at a drain's deadline that never came
        if job is not None and (not isinstance(job, str) or not job or "/" in job):
            raise ConfigError(
                f"job must be a non-empty str without '/', got {job!r}; leave job out to use the "
                "experiment name, or pass ray_ckpt.train.job_name(<name>) to map a name that has '/'"
            )
        context = ray.train.get_context()
        if job is None:
            job = job_name(context.get_experiment_name())
        super().__init__(
            job=job,
            rank=context.get_world_rank(),
            world_size=context.get_world_size(),
            config=_with_run_backup(config or CheckpointConfig()),
            namespace=namespace,
            attempt=_run_attempt(),
        )
        generation = generation_of(inplace.current_attempt())
        if generation is not None:
            self.failures_seen(max(0, generation - 1))
        _follow_generation(self, context.get_world_rank())

    def save(self, step: int, state: Any, *, force: bool = False) -> SaveHandle:
        """``ray_ckpt.Checkpointer.save``, and what a drain needs: while Ray drains the node of
        a rank of this run (a preemption notice, a maintenance drain: ``_drain_notice``), every
        step is saved whatever ``config.every`` says, and no new shard goes to a draining node's
        store while another store runs. A rank on a draining node, at its first save of a step
        every rank saves (one ``every`` saves anyway, or any once a step ``every`` skips
        committed after the notice), waits for it to commit, then under ``InPlaceRecovery``
        hands its place over: ``HandedOver`` is raised, ``InPlaceRecovery.wrap`` ends the rank,
        and its replacement restores this step. Without in place it holds here until Ray Train
        ends the workers at the deadline and restarts them from this step (its preemption
        handling); it trains on, saving every step, until the deadline is ``HOLD_STEPS`` of its
        steps plus ``DRAIN_MARGIN_S`` away, so the notice's window is not spent idle. Either way
        no step is trained twice. Where the step does not commit in time, it tries again at the
        next step."""
        handle, handed_over = self._save_or_hand_over(step, state, force)
        if handed_over is not None:
            raise handed_over
        return handle

    @_shielded
    def _save_or_hand_over(self, step: int, state: Any, force: bool) -> tuple[SaveHandle, HandedOver | None]:
        """``save``'s work: the handle, and the ``HandedOver`` to raise once the shield is left.
        A draining rank waits for ``step`` to commit only where every rank saves it: it is due by
        ``config.every`` anyway, or a step that ``every`` skips committed after the notice (so
        every rank had the notice and saves each step). Without in place it waits only once the
        deadline is near (``_hold_is_due``)."""
        called = time.monotonic()
        if self._last_save_at is not None:
            self._step_s = called - self._last_save_at
        self._last_save_at = called
        notice = self._drain_notice()
        self._saves.avoid = frozenset() if notice is None else frozenset(notice.nodes)
        if notice is None or not notice.ranks:  # no drain, or only stores drain: saves as asked
            self._drain_first, self._forced_since_notice = None, set()
            return self._save(step, state, force), None
        handle = self._save(step, state, True)
        if handle.skipped or self._held:
            return handle, None
        if self.forced_step == step:
            self._forced_since_notice.add(step)
        if self._drain_first is None:
            self._drain_first = step
            if self.rank in notice.ranks:
                logger.warning(
                    "rank %d: this node drains (deadline %s); saving every step from step %d",
                    self.rank,
                    "none" if notice.deadline is None else f"in {notice.deadline - time.time():.1f} s",
                    step,
                )
        if self.rank not in notice.ranks:
            return handle, None
        if self.forced_step == step and not self._every_rank_forces:
            self._every_rank_forces = self._registry.latest_committed(self.job) in self._forced_since_notice
            if not self._every_rank_forces:
                return handle, None
        in_place = inplace.current_attempt() is not None
        if not in_place and not self._hold_is_due(notice):
            return handle, None
        left = self.config.commit_timeout_s
        if notice.deadline is not None:
            left = max(1.0, min(left, notice.deadline - time.time() - DRAIN_MARGIN_S))
        try:
            handle.wait(left)
        except (CommitTimeoutError, TornStepError) as error:
            logger.warning("rank %d: step %d did not commit (%s); trying at the next step", self.rank, step, error)
            return handle, None
        if not in_place:
            self._hold(step, notice)
            return handle, None
        return handle, inplace.hand_over()  # None where not taken: this generation is failing already

    def _hold_is_due(self, notice: DrainNotice) -> bool:
        """Without in place: whether a draining rank should hold at this step, rather than train
        on and save the next. Yes once the deadline is ``HOLD_STEPS`` steps (as this rank's last
        step and save took) plus ``DRAIN_MARGIN_S`` away, or when the drain has no deadline."""
        if notice.deadline is None:
            return True
        return time.time() + DRAIN_MARGIN_S + HOLD_STEPS * self._step_s >= notice.deadline

    def _drain_notice(self) -> DrainNotice | None:
        """The drain under way: the in-place run's coordinator's word, or else what Ray Train's
        preemption watcher told this worker (``_ray_compat.preemption_notice``)."""
        if inplace.current_attempt() is not None:
            return inplace.drain_notice()
        told = _ray_compat.preemption_notice()
        if told is None:
            return None
        nodes, deadline = told
        ranks = tuple(sorted({rank for ranks in nodes.values() for rank in ranks}))
        return DrainNotice(ranks, tuple(sorted(nodes)), deadline)

    def _hold(self, step: int, notice: DrainNotice) -> None:
        """Without in place, once ``step`` (saved after the drain notice) committed: wait for Ray
        Train to end the workers at the deadline (it restarts them, and they restore this step),
        so that no step after it is trained only to be trained again; past the deadline by
        ``HOLD_AFTER_DEADLINE_S`` (nobody ended them), train on."""
        deadline = notice.deadline if notice.deadline is not None else time.time() + DEFAULT_DRAIN_S
        logger.warning(
            "rank %d: step %d committed after this node's drain notice; holding until the workers are restarted "
            "at the deadline (in %.1f s), so that no step is trained twice",
            self.rank,
            step,
            deadline - time.time(),
        )
        while time.time() < deadline + HOLD_AFTER_DEADLINE_S:
            time.sleep(HOLD_POLL_S)
        self._held = True
        logger.warning("rank %d: nobody ended the workers after the drain's deadline; training on", self.rank)

    @_shielded
    def _save(self, step: int, state: Any, force: bool) -> SaveHandle:
        return checkpointer.Checkpointer.save(self, step, state, force=force)

    wait = _shielded(checkpointer.Checkpointer.wait)
    restore = _shielded(checkpointer.Checkpointer.restore)
    close = _shielded(checkpointer.Checkpointer.close)


class SharedRankZero(checkpointer.Checkpointer):
    """A ``ray_ckpt.Checkpointer`` of rank 0 in a world of 1, of ``job``, that every worker of
    the run makes: for a trainer whose checkpoint is one dict that global rank 0 saves and
    every rank loads (Lightning's). Must be made by every rank (the attempt is broadcast from
    rank 0, a collective), except under ``InPlaceRecovery``, where the attempt is the
    generation's, a failure of the generation abandons it, and its process's entry into the
    generation is recorded (the ``rejoin`` event, under the process's world rank) so that the
    recovery shows as in place. ``backup_uri`` defaults to the run's storage path. No
    ``PeerLost`` lands inside its methods, as in ``Checkpointer``."""

    @_shielded
    def __init__(self, config: CheckpointConfig, *, job: str) -> None:
        super().__init__(job=job, rank=0, world_size=1, config=_with_run_backup(config), attempt=_run_attempt())
        _follow_generation(self, ray.train.get_context().get_world_rank())

    save = _shielded(checkpointer.Checkpointer.save)
    wait = _shielded(checkpointer.Checkpointer.wait)
    restore = _shielded(checkpointer.Checkpointer.restore)
    close = _shielded(checkpointer.Checkpointer.close)


def _with_run_backup(config: CheckpointConfig) -> CheckpointConfig:
    """``config`` with ``backup_uri`` set to the run's storage path where it has backups but no
    URI (``default_backup_uri``)."""
    if config.backup_every and not config.backup_uri:
        uri = default_backup_uri()
        if uri is not None:
            return dataclasses.replace(config, backup_uri=uri)
    return config


def _run_attempt() -> str:
    """The attempt of this worker group: the in-place generation's, else a fresh id rank 0
    broadcasts (a collective: every rank must ask)."""
    attempt = inplace.current_attempt()
    return attempt if attempt is not None else broadcast_from_rank_zero(uuid.uuid4().hex)


def _follow_generation(ckpt: checkpointer.Checkpointer, world_rank: int) -> None:
    """Under ``InPlaceRecovery``: a failure of the generation abandons ``ckpt``, and the
    process's entry into the generation is recorded (``rejoin``, under its world rank) by the
    first Checkpointer it makes there."""
    if inplace.current_attempt() is None:
        return
    inplace.track(ckpt)
    rejoin = inplace.take_rejoin()
    if rejoin is not None:
        ckpt._record("rejoin", **{**rejoin.to_wire(), "rank": world_rank})
