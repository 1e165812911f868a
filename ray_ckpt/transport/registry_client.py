"""RegistryClient: every call to the registry actor, typed, and riding out a registry restart.

Ray restarts a dead registry, which then rebuilds its view from the stores, and every registry
method is idempotent, so a call that finds the registry unavailable is retried until
RAY_CKPT_PEER_TIMEOUT_S. A ray_ckpt error the registry raised is raised here as itself
(``ray_ckpt.transport.remote``). Records come back parsed (``ray_ckpt.core.wire``). Used by the checkpointer,
the service, the kill tool and the dashboard alike.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from ray_ckpt import settings
from ray_ckpt.core.wire import (
    JobInfo,
    PlanAnswer,
    PlanQuery,
    RankLocation,
    RankRecord,
    RestorePlan,
    StageRequest,
    StageResult,
    ranks_from_wire,
)
from ray_ckpt.errors import StoreUnavailableError
from ray_ckpt.transport import naming, remote

logger = logging.getLogger(__name__)

SETTLED_ROUND_S = 10.0  # the longest one wait_settled call blocks the registry's thread


class RegistryClient:
    """The registry of ``namespace``; StoreUnavailableError at construction if it is not
    running (``ray_ckpt.start()`` deploys it)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        try:
            self.handle = naming.registry_handle(namespace)
        except ValueError:
            raise StoreUnavailableError(
                f"no ray_ckpt registry in namespace {namespace!r}: call ray_ckpt.start() on the cluster first",
                namespace=namespace,
            ) from None

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """``method(*args)`` on the registry; retried while Ray restarts it. StoreUnavailableError
        if it does not answer within ``timeout_s`` (default RAY_CKPT_PEER_TIMEOUT_S) or is gone."""
        budget = settings.peer_timeout_s() if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        while True:
            remaining = deadline - time.monotonic()
            try:
                return remote.get(getattr(self.handle, method).remote(*args), timeout=max(0.1, remaining))
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError) as error:
                if time.monotonic() >= deadline:
                    raise StoreUnavailableError(
                        f"the ray_ckpt registry did not answer {method} within {budget:.0f}s "
                        f"({type(error).__name__}); raise RAY_CKPT_PEER_TIMEOUT_S if it is only slow",
                        method=method,
                    ) from None
                time.sleep(0.2)
            except ray.exceptions.ActorDiedError:
                raise StoreUnavailableError(
                    f"the ray_ckpt registry is gone ({method}); run ray_ckpt.start() again to recreate it "
                    "(it rebuilds its view from the stores)",
                    method=method,
                ) from None

    def record(self, event: dict[str, Any]) -> None:
        """Send an event to the registry's log: fire and forget, never raises."""
        try:
            self.handle.record.remote(event)
        except Exception as error:  # observability must not break checkpointing
            logger.debug("could not record a %s event: %s", event.get("kind"), error)

    def note_reached(self, job: str, attempt: str | None, step: int) -> None:
        """Tell the registry rank 0 of ``attempt`` trained ``step`` (``Registry.note_reached``):
        fire and forget, never raises."""
        try:
            self.handle.note_reached.remote(job, attempt, step)
        except Exception as error:  # observability must not break training
            logger.debug("could not note step %s of job %r: %s", step, job, error)

    # ---- typed calls --------------------------------------------------------------------

    def steps_reached(self, job: str, attempt: str | None) -> tuple[int | None, int | None]:
        """(newest step staged, newest step the attempt before ``attempt`` trained): see
        ``Registry.steps_reached``."""
        staged, reached = self.call("steps_reached", job, attempt)
        return (None if staged is None else int(staged)), (None if reached is None else int(reached))

    def plan_restore(self, job: str, attempt: str | None) -> RestorePlan:
        return RestorePlan.from_wire(self.call("plan_restore", job, attempt))

    def plan_for_rank(self, job: str, attempt: str | None, rank: int) -> PlanAnswer:
        """The plan of ``attempt`` and ``rank``'s record of its step, in one call (a rank asks
        so itself when its node's store is gone; see ``StoreDirectory.plan``)."""
        return PlanAnswer.from_wire(self.call("plan_ranks", [PlanQuery(job, attempt, (rank,)).to_wire()])[0])

    def locate(self, job: str, step: int) -> dict[int, RankRecord]:
        """Every rank's record of a committed step (NoCheckpointError if it is not committed)."""
        return ranks_from_wire(self.call("locate", job, step))

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        """One rank's record of a committed step and the step's world size (NoCheckpointError if
        the step is not committed): what a restoring rank needs, whatever the world size."""
        return RankLocation.from_wire(self.call("locate_rank", job, step, rank))

    def latest_committed(self, job: str) -> int | None:
        latest = self.call("latest_committed", job)
        return None if latest is None else int(latest)

    def committed_steps(self, job: str, timeout_s: float | None = None) -> list[int]:
        """The job's committed steps the registry keeps (its newest ``keep_committed``), oldest first."""
        return [int(step) for step in self.call("committed_steps", job, timeout_s=timeout_s)]

    def jobs_of_run(self, run: str) -> list[str]:
        """The jobs with an attempt of the in-place run ``run`` (``Registry.jobs_of_run``)."""
        return [str(job) for job in self.call("jobs_of_run", run)]

    def wait_committed(self, job: str, step: int, timeout_s: float) -> bool:
        """True once ``step`` (or a newer one) committed; False after ``timeout_s``."""
        return bool(self.call("wait_committed", job, step, timeout_s, timeout_s=timeout_s + settings.peer_timeout_s()))

    def wait_settled(
        self, job: str, step: int, *, rank: int, attempt: str | None, world_size: int, passed: int, timeout_s: float
    ) -> str:
        """``Registry.wait_settled``: "committed", "torn" or "pending" (after ``timeout_s``). Asks in
        rounds of at most SETTLED_ROUND_S, so that a registry restarted meanwhile (it forgets
        which ranks went past a step) hears this rank's note again."""
        deadline = time.monotonic() + timeout_s
        while True:
            round_s = min(SETTLED_ROUND_S, max(0.0, deadline - time.monotonic()))
            answer = str(
                self.call(
                    "wait_settled", job, step, rank, attempt, world_size, passed, round_s,
                    timeout_s=round_s + settings.peer_timeout_s(),
                )
            )  # fmt: skip
            if answer != "pending" or time.monotonic() >= deadline:
                return answer

    def staged_ranks(self, job: str, step: int) -> list[int]:
        return [int(r) for r in self.call("staged_ranks", job, step)]

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None:
        return self.call("settle_backup_step", job, attempt, step)

    def mark_unrestorable(self, job: str, step: int) -> None:
        self.call("mark_unrestorable", job, step)

    def rollback(self, job: str, step: int) -> list[int]:
        return list(self.call("rollback", job, step))

    def jobs(self) -> dict[str, JobInfo]:
        """job -> what the registry knows of it (with ``interval`` when its ranks chose intervals)."""
        return {str(job): JobInfo.from_wire(info) for job, info in self.call("jobs").items()}

    def forget(self, job: str, timeout_s: float = 10.0) -> None:
        self.call("forget", job, timeout_s, timeout_s=2 * timeout_s)

    def events(self, since: int = 0) -> tuple[int, list[dict[str, Any]]]:
        following, records = self.call("events", since)
        return int(following), list(records)

    def stage_batch(self, requests: list[StageRequest]) -> list[StageResult]:
        """Stage several ranks' steps in one call (a node's store forwards its ranks' stages
        so); one result per request, in order. Retried across a registry restart like every
        call: a request the restarted registry already holds committed is acknowledged again."""
        return [StageResult.from_wire(r) for r in self.call("stage_batch", [r.to_wire() for r in requests])]
