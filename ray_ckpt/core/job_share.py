"""JobShare: how a store's budget is shared among the jobs holding shards there, and which
superseded steps a put may evict to fit (pure; ``ShardStore`` applies it under its lock).

The rule, with ``RAY_CKPT_STORE_JOB_FRACTION`` at its default ``fair``:

1. A job's share is ``budget // jobs present``: the jobs holding shards, local copies or puts
   in flight in the store, the putting job included. A job alone may use the whole budget.
   A fixed fraction in (0, 1] makes the share ``fraction x budget`` whatever the number of
   jobs (1: no per-job limit, one job may fill the store).
2. A job's steps older than its newest committed step (as the store was told) are
   *superseded*. Its newest committed step and the steps after it (saves in flight) are never
   evicted here.
3. A put that would take its job past its share first evicts that job's own superseded steps
   (only those older than the put's step), oldest first. If that is not enough, it is
   refused: ``share``.
4. A put within its share that does not fit the budget evicts superseded steps of jobs over
   their share (the job furthest over first, its oldest step first), then its own job's. If
   that is not enough, it is refused: ``budget``. So a job's newest committed step, its saves
   in flight, and anything of a job within its share are never evicted for another job.
5. Steps are evicted whole (all their shards and local copies in the store), and a refused
   put evicts nothing.

A single job's usual pattern (``keep_committed`` steps plus one in flight) fits exactly as
without the rule: alone, its share is the whole budget, and a put that fits evicts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

FAIR = "fair"  # the knob's value for the fair share (the default)


@dataclass(frozen=True)
class JobHoldings:
    """What one job holds in a store: bytes per step (shards, local copies and their metadata),
    bytes of its puts in flight (not yet a step it holds, never evicted), and the newest step
    the store was told it committed (None: none)."""

    step_bytes: Mapping[int, int] = field(default_factory=dict)
    in_flight_bytes: int = 0
    committed: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.step_bytes.values()) + self.in_flight_bytes

    def superseded(self, before: int | None = None) -> list[int]:
        """Its steps older than its newest committed step (and than ``before`` when given),
        oldest first: the only ones that may be evicted to make room."""
        if self.committed is None:
            return []
        limit = self.committed if before is None else min(self.committed, before)
        return sorted(step for step in self.step_bytes if step < limit)


@dataclass(frozen=True)
class Room:
    """The answer for one put: the (job, step) pairs to evict before taking it, or why it is
    refused (``budget``: the store cannot hold it; ``share``: its job would pass its share),
    with the numbers an error names (``job_bytes``/``used_bytes``: held before the put,
    puts in flight included)."""

    evict: tuple[tuple[str, int], ...]
    refused: Literal["budget", "share"] | None
    share_bytes: int
    jobs_present: int
    job_bytes: int
    used_bytes: int


def job_share(budget_bytes: int, jobs_present: int, fraction: float | None) -> int:
    """The bytes one job may hold in a store of ``budget_bytes`` with ``jobs_present`` jobs
    (at least 1) holding shards there: ``budget // jobs`` when ``fraction`` is None (fair),
    else ``fraction x budget``."""
    if fraction is None:
        return budget_bytes // max(1, jobs_present)
    return int(fraction * budget_bytes)


def make_room(
    holdings: Mapping[str, JobHoldings],
    *,
    job: str,
    step: int,
    need_bytes: int,
    replaced_bytes: int = 0,
    budget_bytes: int,
    fraction: float | None,
) -> Room:
    """Where a put of ``need_bytes`` for ``step`` of ``job`` fits (``replaced_bytes``: what the
    shard it replaces, if any, frees), by the rule in the module docstring. ``holdings``: every
    job's holdings in the store (jobs absent from it hold nothing)."""
    present = {name for name, held in holdings.items() if held.total_bytes > 0} | {job}
    share = job_share(budget_bytes, len(present), fraction)
    held = {name: holdings[name].total_bytes if name in holdings else 0 for name in present}
    job_bytes, used_bytes = held[job], sum(held.values())
    own = holdings.get(job, JobHoldings())
    own_steps = own.superseded(before=step)
    candidates = {name: holdings[name].superseded() for name in present if name != job}
    evict: list[tuple[str, int]] = []

    def give_up(name: str, victim: int) -> None:
        evict.append((name, victim))
        held[name] -= holdings[name].step_bytes[victim]

    added = need_bytes - replaced_bytes
    while held[job] + added > share and own_steps:
        give_up(job, own_steps.pop(0))
    while sum(held.values()) + added > budget_bytes:
        over = [name for name, steps in candidates.items() if steps and held[name] > share]
        if over:
            name = max(over, key=lambda n: (held[n] - share, n))
            give_up(name, candidates[name].pop(0))
        elif own_steps:
            give_up(job, own_steps.pop(0))
        else:
            break
    refused: Literal["budget", "share"] | None = None
    if sum(held.values()) + added > budget_bytes:
        refused = "budget"
    elif held[job] + added > share:
        refused = "share"
    return Room(
        evict=() if refused else tuple(evict),
        refused=refused,
        share_bytes=share,
        jobs_present=len(present),
        job_bytes=job_bytes,
        used_bytes=used_bytes,
    )
