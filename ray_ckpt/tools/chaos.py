"""Simulated failures on a schedule, for testing recovery (``ray-ckpt kill-node``).

What a failure does is a fault kind (``ray_ckpt.tools.faults``: a node crash, a store kill, a
simulated node's removal); this module decides when and whom to strike, for any kind:

- ``inject(fault, node_ids)``: strike the given nodes at the same moment (``kill_nodes`` /
  ``kill_node``: NodeCrash; ``kill_stores`` / ``kill_store``: StoreKill).
- ``pick_nodes``: random alive non-head nodes, optionally preferring holders of a job's shards.
- ``kill_loop``: random victims at exponentially distributed gaps with mean ``mtbf_s`` (a
  Poisson process of failures for the whole cluster).
- ``kill_during_save``: a victim struck while a step of a job is staged by some but not all
  ranks.

The head node (it runs the GCS: losing it takes the whole cluster down) and the node this
process is connected through are never picked, and killing them is refused (the head is
allowed with ``allow_head=True``). When the ray_ckpt service runs in the namespace, each kill is
recorded in the registry as a ``kill`` event (``mode``: the fault's) and, once Ray declares a
node dead, a ``node_dead`` event stamped with the time this process saw it dead (polling
every 50 ms). Without the service the kills happen all the same.

Every kill returns a ``ray_ckpt.core.wire.KillResult``: kill_time on the victim's clock (when the
SIGKILLs were sent), ``dead_time`` (None when not waited for), ``recorded`` (whether the
events went to the registry).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

from ray_ckpt import _ray_compat, service, settings
from ray_ckpt.core import events
from ray_ckpt.core.wire import KillResult, StoreHoldings
from ray_ckpt.errors import ConfigError, KillTimeoutError, StoreUnavailableError
from ray_ckpt.tools.faults import Fault, NodeCrash, StoreKill, alive_node_ids, own_node_id
from ray_ckpt.transport import naming, remote
from ray_ckpt.transport.registry_client import RegistryClient

logger = logging.getLogger(__name__)

DEFAULT_BY = "ray-ckpt kill-node"
POLL_S = 0.05  # how often ray.nodes() is polled for deaths
PREARM_MAX = 64  # kill_during_save arms crashers on at most this many candidate nodes up front
_RPC_TIMEOUT_S = 10.0

Progress = Callable[[str, KillResult], None]
"""Called as ``progress("kill", result)`` right after a kill and ``progress("dead", result)``
when the victim is gone (declared dead, or its store is gone)."""


def _candidates(exclude: Iterable[str]) -> list[str]:
    """Alive nodes that may be picked: not the head, not this process's node, not excluded."""
    skip = set(exclude) | {naming.head_node_id(), own_node_id()}
    return sorted(alive_node_ids() - skip)


def _registry(namespace: str) -> RegistryClient | None:
    try:
        return RegistryClient(namespace)
    except StoreUnavailableError:
        return None


def _holders_of_latest(job: str, namespace: str) -> set[str]:
    """Nodes holding shards (or a local copy) of ``job``'s latest committed step."""
    registry = _registry(namespace)
    if registry is None:
        raise ConfigError(f"no ray_ckpt registry in namespace {namespace!r}: cannot tell which nodes hold job {job!r}")
    if job not in registry.jobs():
        raise ConfigError(f"the registry in namespace {namespace!r} knows no job {job!r}")
    step = registry.latest_committed(job)
    if step is None:
        return set()
    holders: set[str] = set()
    for record in registry.locate(job, step).values():
        holders.update(record.nodes.values())
        if record.local_node:
            holders.add(record.local_node)
    return holders


def pick_nodes(
    count: int,
    *,
    seed: int | None = None,
    exclude: Iterable[str] = (),
    job: str | None = None,
    namespace: str | None = None,
    rng: random.Random | None = None,
) -> list[str]:
    """``count`` distinct random alive nodes, never the head nor this process's node nor any in
    ``exclude``. With ``job``, nodes holding shards or local copies of the job's latest committed
    step come first (in random order), then the others. Deterministic for a given ``seed`` and
    cluster state; ``rng`` overrides ``seed``."""
    service._require_ray()
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    rng = rng or random.Random(seed)
    candidates = _candidates(exclude)
    if len(candidates) < count:
        raise ConfigError(
            f"asked for {count} node(s) to kill, but only {len(candidates)} alive node(s) qualify "
            "(the head node, this process's node and excluded or already killed nodes are never picked)"
        )
    preferred = _holders_of_latest(job, namespace or settings.namespace()) & set(candidates) if job else set()
    first = sorted(preferred)
    rest = sorted(set(candidates) - preferred)
    rng.shuffle(first)
    rng.shuffle(rest)
    return (first + rest)[:count]


# ---- recording and watching ---------------------------------------------------------------------


def _record(registry: RegistryClient | None, record: dict[str, Any]) -> bool:
    """Append one event to the registry (waiting, so events from here stay in order)."""
    if registry is None:
        return False
    try:
        registry.call("record", record, timeout_s=_RPC_TIMEOUT_S)
        return True
    except Exception as error:
        logger.warning("could not record a %s event in the registry: %s", record["kind"], error)
        return False


def _announce_kills(
    results: list[KillResult], registry: RegistryClient | None, by: str, progress: Progress | None
) -> None:
    for result in sorted(results, key=lambda r: r.kill_time):
        kill = events.event("kill", node_id=result.node_id, mode=result.mode, by=by, time=result.kill_time)
        result.recorded = _record(registry, kill)
        if progress is not None:
            progress("kill", result)


def _poll_gone(
    fault: Fault,
    pending: dict[str, KillResult],
    until: float,
    namespace: str,
    registry: RegistryClient | None,
    progress: Progress | None,
    *,
    stop_when_none_left: bool = True,
) -> None:
    """Poll until ``until`` (time.monotonic()); each pending victim seen gone gets its
    dead_time (and, for a node, a node_dead event) and leaves ``pending``."""
    while True:
        if pending:
            now = time.time()
            for node_id in sorted(fault.gone(set(pending), namespace=namespace)):
                result = pending.pop(node_id)
                result.dead_time = now
                if fault.mode == "node":
                    dead = events.event("node_dead", node_id=node_id, time=now)
                    result.recorded = _record(registry, dead) and result.recorded
                if progress is not None:
                    progress("dead", result)
        left = until - time.monotonic()
        if left <= 0 or (stop_when_none_left and not pending):
            return
        time.sleep(min(POLL_S, left))


def _not_gone_error(fault: Fault, pending: dict[str, KillResult], wait_dead_s: float) -> KillTimeoutError:
    what = "the store(s) on node(s)" if fault.mode == "store" else "node(s)"
    return KillTimeoutError(
        f"{what} {sorted(pending)} were struck but not gone within {wait_dead_s:g}s {fault.death_hint}".rstrip()
    )


def _wait_gone(
    fault: Fault,
    results: list[KillResult],
    wait_dead_s: float | None,
    namespace: str,
    registry: RegistryClient | None,
    progress: Progress | None,
) -> None:
    if not wait_dead_s:
        return
    pending = {r.node_id: r for r in results}
    _poll_gone(fault, pending, time.monotonic() + wait_dead_s, namespace, registry, progress)
    if pending:
        raise _not_gone_error(fault, pending, wait_dead_s)


# ---- striking now ------------------------------------------------------------------------------


def inject(
    fault: Fault,
    node_ids: Iterable[str],
    *,
    namespace: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    allow_head: bool = False,
    progress: Progress | None = None,
    record: bool = True,
) -> list[KillResult]:
    """Strike the given nodes with ``fault`` at the same moment; results in input order.

    Every victim is armed first (nothing is struck if one cannot be), then all are struck
    together. Waits up to ``wait_dead_s`` (None or 0: not at all) until every victim is gone,
    else KillTimeoutError (a TimeoutError). ConfigError for an unknown or dead node, this
    process's node, or the head node without ``allow_head``. ``record=False`` keeps the kill
    out of the registry's events (a test harness striking between the events it checks)."""
    service._require_ray()
    node_ids = [str(n) for n in node_ids]
    namespace = namespace or settings.namespace()
    fault.check(node_ids, namespace=namespace, allow_head=allow_head)
    armed = fault.arm(node_ids, namespace=namespace)
    times = fault.fire([armed[n] for n in node_ids])
    results = [KillResult(n, times[n], fault.mode, armed[n].host) for n in node_ids]
    registry = _registry(namespace) if record else None
    _announce_kills(results, registry, by, progress)
    _wait_gone(fault, results, wait_dead_s, namespace, registry, progress)
    return results


def drain_then_inject(
    fault: Fault,
    node_ids: Iterable[str],
    drain_s: float,
    *,
    namespace: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
    record: bool = True,
) -> list[KillResult]:
    """A planned loss, as a cloud's preemption notice gives one: Ray is told that each node
    drains with a deadline ``drain_s`` seconds away (``_ray_compat.drain_node``, the call
    ``ray drain-node`` makes: Ray starts nothing new there; ray_ckpt's in-place runs save and
    hand the node's ranks over), then ``fault`` strikes the nodes at the deadline, as the cloud
    would. Victims are armed before the drain (nothing new starts on a draining node). Each
    drain is recorded as a ``kill`` event of mode "drain" (with its ``deadline``), the strike as
    ``inject`` records it; a node already gone at the deadline (an in-place run declared it dead
    once its ranks handed over) is still struck, its result's details saying
    ``gone_before_kill``. Results and errors as ``inject``'s; ConfigError where Ray refuses a
    drain (nothing is struck then)."""
    if not drain_s > 0:
        raise ConfigError(f"a drain needs a deadline > 0 seconds away, got {drain_s!r}")
    service._require_ray()
    node_ids = [str(n) for n in node_ids]
    namespace = namespace or settings.namespace()
    fault.check(node_ids, namespace=namespace, allow_head=False)
    armed = fault.arm(node_ids, namespace=namespace)
    registry = _registry(namespace) if record else None
    deadline = time.time() + drain_s
    drained: list[str] = []
    for node_id in node_ids:
        try:
            refused = _ray_compat.drain_node(node_id, deadline, f"{by}: a drain with a {drain_s:g} s deadline")
        except Exception as error:
            refused = f"{type(error).__name__}: {error}"
        if refused is not None:
            fault.disarm(armed.values())
            left = f"; node(s) {drained} drain already, and Ray keeps them draining" if drained else ""
            raise ConfigError(f"Ray did not accept the drain of node {node_id}: {refused}{left}; nothing was struck")
        drained.append(node_id)
        notice = KillResult(node_id, time.time(), "drain", armed[node_id].host)
        drain = events.event("kill", node_id=node_id, mode="drain", by=by, time=notice.kill_time, deadline=deadline)
        notice.recorded = _record(registry, drain)
        if progress is not None:
            progress("drain", notice)
    time.sleep(max(0.0, deadline - time.time()))
    try:  # an in-place run declares a node dead once its ranks handed over: gone before the strike
        gone_before = fault.gone(set(node_ids), namespace=namespace)
    except Exception:  # the GCS did not answer: the strike goes on, the note is left out
        gone_before = set()
    times = fault.fire([armed[n] for n in node_ids])
    results = [
        KillResult(
            n, times[n], fault.mode, armed[n].host, details={"gone_before_kill": True} if n in gone_before else {}
        )
        for n in node_ids
    ]
    _announce_kills(results, registry, by, progress)
    _wait_gone(fault, results, wait_dead_s, namespace, registry, progress)
    return results


def kill_nodes(node_ids: Iterable[str], *, local: bool = True, **options: Any) -> list[KillResult]:
    """Crash the given nodes at the same moment: ``inject(NodeCrash(local=local), ...)``."""
    return inject(NodeCrash(local=local), node_ids, **options)


def kill_node(node_id: str, **options: Any) -> KillResult:
    """Crash one node: SIGKILL its raylet and every process under it, as a machine crash."""
    return kill_nodes([node_id], **options)[0]


def kill_stores(node_ids: Iterable[str], **options: Any) -> list[KillResult]:
    """Kill the ray_ckpt store actors of the given nodes; the nodes stay alive. ConfigError if
    a node has no store in the namespace."""
    return inject(StoreKill(), node_ids, **options)


def kill_store(node_id: str, **options: Any) -> KillResult:
    """Kill only the ray_ckpt store actor on ``node_id`` (event mode ``store``)."""
    return kill_stores([node_id], **options)[0]


# ---- schedules ----------------------------------------------------------------------------------


def kill_loop(
    mtbf_s: float,
    kills: int,
    *,
    fault: Fault | None = None,
    seed: int | None = None,
    namespace: str | None = None,
    exclude: Iterable[str] = (),
    job: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
) -> list[KillResult]:
    """Strike ``kills`` random nodes with ``fault`` (default a NodeCrash), one at a time, after
    exponentially distributed gaps with mean ``mtbf_s`` (the first gap counts from the call):
    failures as a Poisson process with mean time between failures ``mtbf_s`` for the whole
    cluster. Each victim is picked as by ``pick_nodes`` (never one struck before) and armed
    ahead of its time, so kills land on schedule unless a gap is shorter than arming. Deaths
    are watched while waiting; after the last kill, waits up to ``wait_dead_s`` for the
    remaining ones. The same ``seed`` gives the same gaps (and, on the same cluster state, the
    same victims)."""
    service._require_ray()
    if not mtbf_s > 0:
        raise ConfigError(f"mtbf_s must be > 0, got {mtbf_s!r}")
    if kills < 1:
        raise ConfigError(f"kills must be >= 1, got {kills}")
    fault = fault or NodeCrash()
    namespace = namespace or settings.namespace()
    rng = random.Random(seed)
    registry = _registry(namespace)
    excluded = set(exclude)
    results: list[KillResult] = []
    pending: dict[str, KillResult] = {}
    due = time.monotonic()
    for _ in range(kills):
        due += rng.expovariate(1.0 / mtbf_s)
        victim = pick_nodes(1, rng=rng, exclude=excluded, job=job, namespace=namespace)[0]
        armed = fault.arm([victim], namespace=namespace)
        _poll_gone(fault, pending, due, namespace, registry, progress, stop_when_none_left=False)
        if victim not in alive_node_ids():  # died on its own meanwhile: pick another, now
            fault.disarm(armed.values())
            excluded.add(victim)
            victim = pick_nodes(1, rng=rng, exclude=excluded, job=job, namespace=namespace)[0]
            armed = fault.arm([victim], namespace=namespace)
        excluded.add(victim)
        kill_time = fault.fire([armed[victim]])[victim]
        result = KillResult(victim, kill_time, fault.mode, armed[victim].host)
        _announce_kills([result], registry, by, progress)
        results.append(result)
        pending[victim] = result
    if wait_dead_s:
        _poll_gone(fault, pending, time.monotonic() + wait_dead_s, namespace, registry, progress)
        if pending:
            raise _not_gone_error(fault, pending, wait_dead_s)
    return results


def _staged_holders(job: str, step: int, ranks: list[int], namespace: str) -> dict[str, int]:
    """node id -> how many shards of ``step`` from ``ranks`` its store holds (asked of every
    store: the registry locates committed steps only)."""
    stores = naming.store_handles(namespace)
    refs = {node_id: handle.holdings.remote() for node_id, handle in stores.items()}
    wanted = set(ranks)
    counts: dict[str, int] = {}
    for node_id, ref in refs.items():
        try:
            holdings = StoreHoldings.from_wire(remote.get(ref, timeout=_RPC_TIMEOUT_S))
        except Exception:  # an unreachable store holds nothing we can use
            continue
        held = sum(1 for m in holdings.metas if m.job == job and m.step == step and m.rank in wanted)
        if held:
            counts[node_id] = held
    return counts


def _partial_step(info: dict[str, Any] | None, min_step: int | None) -> tuple[int, list[int]] | None:
    """The newest step staged by at least one but not all ranks (and >= min_step), with its ranks."""
    if not info:
        return None
    world_size = int(info.get("world_size") or 0)
    partial = [
        (int(step), sorted(ranks))
        for step, ranks in (info.get("staged") or {}).items()
        if 0 < len(ranks) < world_size and (min_step is None or int(step) >= min_step)
    ]
    return max(partial) if partial else None


def kill_during_save(
    job: str,
    *,
    fault: Fault | None = None,
    namespace: str | None = None,
    min_step: int | None = None,
    seed: int | None = None,
    exclude: Iterable[str] = (),
    timeout_s: float = 600.0,
    poll_s: float = 0.02,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
) -> KillResult:
    """Strike a node with ``fault`` (default a NodeCrash) while a save of ``job`` is in flight.

    Definition: "in flight" is a step (>= ``min_step`` if given) that the registry shows as
    staged by at least one but not all ranks: some ranks have stored all their shards, the
    step is not committed yet. As soon as one is seen (polling the registry every ``poll_s``),
    the victim is a random node (seeded) among those whose stores hold shards of that step from
    the ranks that already staged it, so the save loses shards it has already written; if no
    pickable node holds any (e.g. they are all excluded), a random pickable node. The newest such
    step is taken if several are. Up to PREARM_MAX pickable nodes are armed up front, so the
    kill lands milliseconds after the partial step is seen.

    The result's ``details`` hold ``job``, ``step``, ``staged_ranks``, ``world_size`` and
    ``shards_on_victim``. KillTimeoutError (a TimeoutError) if no save was caught in flight
    within ``timeout_s``. Needs the ray_ckpt service (ConfigError without a registry).
    """
    service._require_ray()
    fault = fault or NodeCrash()
    namespace = namespace or settings.namespace()
    registry = _registry(namespace)
    if registry is None:
        raise ConfigError(f"no ray_ckpt registry in namespace {namespace!r}: nothing tells when a save is in flight")
    rng = random.Random(seed)
    candidates = _candidates(exclude)
    if not candidates:
        raise ConfigError("no alive node qualifies for a kill (the head node and this process's node are never picked)")
    rng.shuffle(candidates)
    armed = fault.arm(candidates[:PREARM_MAX], namespace=namespace)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = registry.call("jobs", timeout_s=_RPC_TIMEOUT_S)
            found = _partial_step(jobs.get(job), min_step)
            if found is not None:
                break
            if time.monotonic() >= deadline:
                raise KillTimeoutError(
                    f"no step of job {job!r} was staged by only some of its ranks within {timeout_s:g}s"
                )
            time.sleep(poll_s)
        step, ranks = found
        world_size = int(jobs[job]["world_size"])
        holders = _staged_holders(job, step, ranks, namespace)
        eligible = sorted(n for n in holders if n in armed)
        late = sorted(set(holders) & set(candidates) - set(armed))  # pickable holders not armed yet
        if eligible:
            victim = rng.choice(eligible)
        elif late:
            victim = rng.choice(late)
            armed.update(fault.arm([victim], namespace=namespace))
        else:
            victim = rng.choice(sorted(armed))
        struck = armed.pop(victim)
        kill_time = fault.fire([struck])[victim]
    finally:
        fault.disarm(armed.values())
    details = {
        "job": job,
        "step": step,
        "staged_ranks": ranks,
        "world_size": world_size,
        "shards_on_victim": holders.get(victim, 0),
    }
    result = KillResult(victim, kill_time, fault.mode, struck.host, details=details)
    _announce_kills([result], registry, by, progress)
    _wait_gone(fault, [result], wait_dead_s, namespace, registry, progress)
    return result
