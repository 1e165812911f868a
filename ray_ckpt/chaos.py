"""Killing things on purpose: simulated failures for testing recovery (``ray-ckpt kill-node``).

- ``kill_node`` / ``kill_nodes``: hard crashes of whole nodes. On each victim a NodeCrasher actor
  (actors/node_crasher.py, pinned there with ``NodeAffinitySchedulingStrategy(soft=False)``)
  SIGKILLs the node's raylet and every process under it (workers, agents), then itself. No
  process shuts down cleanly, so Ray finds out only by missed health checks, as for a machine
  crash. This works the same on a simulated cluster (``ray.cluster_utils.Cluster``: one raylet
  per simulated node, all on one host) and on a real multi-host cluster. Crashers are started
  on every victim first and fired together, so several kills land within milliseconds. A
  victim whose raylet runs on this process's host (every node of a simulated cluster) is
  killed from this process with the same SIGKILLs (``local=True``, the default): no crasher
  has to start, which takes a new worker process (about a second), so the kill lands right away.
- ``kill_store`` / ``kill_stores``: only the ray_ckpt store actor of a node (its shards are
  gone; the node and everything else on it live on).
- ``pick_nodes``: random alive non-head nodes, optionally preferring holders of a job's shards.
- ``kill_loop``: random node kills at exponentially distributed gaps with mean ``mtbf_s`` (a
  Poisson process of failures for the whole cluster).
- ``kill_during_save``: a node dies while a step of a job is staged by some but not all ranks.

The head node (it runs the GCS: losing it takes the whole cluster down) and the node this
process is connected through are never picked, and killing them is refused (the head is
allowed with ``allow_head=True``). When the ray_ckpt service runs in the namespace, each kill is
recorded in the registry as a ``kill`` event (mode ``node`` or ``store``) and, once Ray declares
the node dead, a ``node_dead`` event stamped with the time this process saw it dead (polling
``ray.nodes()`` every 50 ms). Without the service the kills happen all the same.

Every kill returns ``{"node_id", "kill_time", "dead_time", "mode", "host", "recorded"}``: Unix
times (kill_time on the victim's clock: when the SIGKILLs were sent); ``dead_time`` is None
when not waited for; ``recorded`` tells whether the events went to the registry.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.node_crasher import NodeCrasher, kill_tree, local_raylets
from ray_ckpt import events, naming, remote, service, settings
from ray_ckpt.errors import ConfigError, KillError, KillTimeoutError
from ray_ckpt.wire import StoreHoldings

logger = logging.getLogger(__name__)

DEFAULT_BY = "ray-ckpt kill-node"
FIRE_DELAY_S = 0.25  # crashers fire this long after being told to, so their replies get out first
POLL_S = 0.05  # how often ray.nodes() is polled for deaths
ARM_TIMEOUT_S = 60.0  # starting a crasher needs a worker process on the victim
PREARM_MAX = 64  # kill_during_save arms crashers on at most this many candidate nodes up front
_RPC_TIMEOUT_S = 10.0

Progress = Callable[[str, dict[str, Any]], None]
"""Called as ``progress("kill", result)`` right after a kill and ``progress("dead", result)``
when the victim is declared dead (or its store is gone)."""


@dataclass
class _Armed:
    """A victim ready to be killed: by its NodeCrasher (``handle``), or from this process when
    its raylet runs on this host (``raylet``)."""

    node_id: str
    handle: Any | None
    host: str
    raylet: psutil.Process | None = None


# ---- nodes -----------------------------------------------------------------------------------


def _alive_ids() -> set[str]:
    return {str(n["NodeID"]) for n in naming.alive_nodes()}


def _own_node_id() -> str | None:
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # not attached to a node (e.g. Ray Client)
        return None


def _check_victims(node_ids: list[str], *, allow_head: bool) -> None:
    if not node_ids:
        raise ConfigError("no node to kill was given")
    if len(set(node_ids)) != len(node_ids):
        raise ConfigError(f"a node is named twice in {node_ids}")
    alive = _alive_ids()
    head = naming.head_node_id()
    own = _own_node_id()
    for node_id in node_ids:
        if node_id not in alive:
            raise ConfigError(f"node {node_id} is not an alive node of this cluster (see `ray.nodes()`)")
        if node_id == head and not allow_head:
            raise ConfigError(
                f"node {node_id} is the head node: it runs the GCS, and losing the head takes the whole "
                "cluster down; pass allow_head=True (--allow-head) to kill its raylet anyway"
            )
        if node_id == own:
            raise ConfigError(
                f"this process is connected to Ray through node {node_id}; killing that node would cut "
                "it off before it could see the result: run the kill from a process on another node"
            )


def _candidates(exclude: Iterable[str]) -> list[str]:
    """Alive nodes that may be picked: not the head, not this process's node, not excluded."""
    skip = set(exclude) | {naming.head_node_id(), _own_node_id()}
    return sorted(_alive_ids() - skip)


def _registry(namespace: str) -> Any | None:
    try:
        return naming.registry_handle(namespace)
    except ValueError:
        return None


def _holders_of_latest(job: str, namespace: str) -> set[str]:
    """Nodes holding shards (or a local copy) of ``job``'s latest committed step."""
    registry = _registry(namespace)
    if registry is None:
        raise ConfigError(f"no ray_ckpt registry in namespace {namespace!r}: cannot tell which nodes hold job {job!r}")
    if job not in remote.get(registry.jobs.remote(), timeout=_RPC_TIMEOUT_S):
        raise ConfigError(f"the registry in namespace {namespace!r} knows no job {job!r}")
    step = remote.get(registry.latest_committed.remote(job), timeout=_RPC_TIMEOUT_S)
    if step is None:
        return set()
    located = remote.get(registry.locate.remote(job, step), timeout=_RPC_TIMEOUT_S)
    holders: set[str] = set()
    for record in located.values():
        holders.update(str(n) for n in record["nodes"].values())
        if record.get("local_node"):
            holders.add(str(record["local_node"]))
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


# ---- the machinery of a node kill ------------------------------------------------------------


def _local(node_ids: list[str]) -> dict[str, _Armed]:
    """The victims whose raylet runs on this host (same node IP, found among this host's
    processes): this process kills them itself, with no crasher to start."""
    here = ray.util.get_node_ip_address()
    addresses = {str(n["NodeID"]): n.get("NodeManagerAddress") for n in naming.alive_nodes()}
    if not any(addresses.get(node_id) == here for node_id in node_ids):
        return {}
    raylets = local_raylets()
    host = socket.gethostname()
    return {n: _Armed(n, None, host, raylets[n]) for n in node_ids if addresses.get(n) == here and n in raylets}


def _arm(node_ids: list[str], timeout_s: float = ARM_TIMEOUT_S, *, local: bool = True) -> dict[str, _Armed]:
    """Make each node ready to be killed: from this process when its raylet runs on this host
    (and ``local``), else by a NodeCrasher started on it, waiting until every crasher has found
    its raylet. On any failure, the started crashers are removed and KillError is raised:
    nothing is killed."""
    armed = _local(node_ids) if local else {}
    node_ids = [n for n in node_ids if n not in armed]
    handles = {
        node_id: NodeCrasher.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(node_id)
        for node_id in node_ids
    }
    refs = {node_id: handle.describe.remote() for node_id, handle in handles.items()}
    try:
        infos = ray.get(list(refs.values()), timeout=timeout_s)
    except Exception as error:
        _disarm(handles.values())
        if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
            error = error.cause
        raise KillError(f"could not start a node crasher on every node of {node_ids}: {error}") from None
    armed.update((node_id, _Armed(node_id, handles[node_id], str(info["host"]))) for node_id, info in zip(refs, infos))
    return armed


def _disarm(handles: Iterable[Any]) -> None:
    for handle in handles:
        if handle is None:  # a victim this process kills itself: nothing was started
            continue
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already gone
            continue


def _fire(armed: list[_Armed], delay_s: float = FIRE_DELAY_S) -> dict[str, float]:
    """Tell every crasher to fire ``delay_s`` from now and kill the local victims at that same
    moment (at once when there is no crasher); node id -> kill time. A crasher whose reply is
    lost (it fired anyway) gets this process's estimate."""
    sent = time.time()
    refs = {a.node_id: a.handle.crash.remote(delay_s) for a in armed if a.handle is not None}
    times = {}
    if refs and any(a.raylet is not None for a in armed):
        time.sleep(max(0.0, sent + delay_s - time.time()))
    for victim in armed:
        if victim.raylet is not None:
            times[victim.node_id] = time.time()
            kill_tree(victim.raylet, kill_self=False)
    for node_id, ref in refs.items():
        try:
            times[node_id] = float(ray.get(ref, timeout=delay_s + _RPC_TIMEOUT_S))
        except Exception as error:
            logger.warning("no kill time from the crasher on node %s (%s); using an estimate", node_id, error)
            times[node_id] = sent + delay_s
    return times


def _record(registry: Any | None, record: dict[str, Any]) -> bool:
    """Append one event to the registry (waiting, so events from here stay in order)."""
    if registry is None:
        return False
    try:
        remote.get(registry.record.remote(record), timeout=_RPC_TIMEOUT_S)
        return True
    except Exception as error:
        logger.warning("could not record a %s event in the registry: %s", record["kind"], error)
        return False


def _result(node_id: str, mode: str, host: str | None, kill_time: float) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "kill_time": kill_time,
        "dead_time": None,
        "mode": mode,
        "host": host,
        "recorded": False,
    }


def _announce_kills(results: list[dict[str, Any]], registry: Any | None, by: str, progress: Progress | None) -> None:
    for result in sorted(results, key=lambda r: r["kill_time"]):
        kill = events.event("kill", node_id=result["node_id"], mode=result["mode"], by=by, time=result["kill_time"])
        result["recorded"] = _record(registry, kill)
        if progress is not None:
            progress("kill", result)


def _poll_deaths(
    pending: dict[str, dict[str, Any]],
    until: float,
    registry: Any | None,
    progress: Progress | None,
    *,
    stop_when_none_left: bool = True,
) -> None:
    """Poll ray.nodes() until ``until`` (time.monotonic()); each pending node seen dead gets its
    dead_time, a node_dead event, and leaves ``pending``."""
    while True:
        if pending:
            alive = _alive_ids()
            now = time.time()
            for node_id in sorted(set(pending) - alive):
                result = pending.pop(node_id)
                result["dead_time"] = now
                dead = events.event("node_dead", node_id=node_id, time=now)
                result["recorded"] = _record(registry, dead) and result["recorded"]
                if progress is not None:
                    progress("dead", result)
        left = until - time.monotonic()
        if left <= 0 or (stop_when_none_left and not pending):
            return
        time.sleep(min(POLL_S, left))


def _not_dead_error(pending: dict[str, dict[str, Any]], wait_dead_s: float) -> KillTimeoutError:
    return KillTimeoutError(
        f"node(s) {sorted(pending)} were killed but Ray did not declare them dead within {wait_dead_s:g}s "
        "(detection takes about RAY_health_check_period_ms x RAY_health_check_failure_threshold: 15 s by default)"
    )


def _wait_for_deaths(
    results: list[dict[str, Any]],
    wait_dead_s: float | None,
    registry: Any | None,
    progress: Progress | None,
) -> None:
    if not wait_dead_s:
        return
    pending = {r["node_id"]: r for r in results}
    _poll_deaths(pending, time.monotonic() + wait_dead_s, registry, progress)
    if pending:
        raise _not_dead_error(pending, wait_dead_s)


# ---- node kills --------------------------------------------------------------------------------


def kill_nodes(
    node_ids: Iterable[str],
    *,
    namespace: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    allow_head: bool = False,
    progress: Progress | None = None,
    local: bool = True,
) -> list[dict[str, Any]]:
    """Crash the given nodes at the same moment (see the module doc); results in input order.

    A crasher is started on every node first (nothing is killed if one cannot start), then all
    fire together; with ``local``, nodes whose raylet runs on this host need no crasher. Waits
    up to ``wait_dead_s`` (None or 0: not at all) until Ray declares every victim dead, else
    KillTimeoutError (a TimeoutError). ConfigError for an unknown or dead node, this process's
    node, or the head node without ``allow_head``.
    """
    service._require_ray()
    node_ids = [str(n) for n in node_ids]
    _check_victims(node_ids, allow_head=allow_head)
    namespace = namespace or settings.namespace()
    armed = _arm(node_ids, local=local)
    times = _fire([armed[n] for n in node_ids])
    results = [_result(n, "node", armed[n].host, times[n]) for n in node_ids]
    registry = _registry(namespace)
    _announce_kills(results, registry, by, progress)
    _wait_for_deaths(results, wait_dead_s, registry, progress)
    return results


def kill_node(
    node_id: str,
    *,
    namespace: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    allow_head: bool = False,
    progress: Progress | None = None,
    local: bool = True,
) -> dict[str, Any]:
    """Crash one node: SIGKILL its raylet and every process under it, as a machine crash.
    Returns ``{"node_id", "kill_time", "dead_time", ...}`` (see the module doc)."""
    return kill_nodes(
        [node_id],
        namespace=namespace,
        wait_dead_s=wait_dead_s,
        by=by,
        allow_head=allow_head,
        progress=progress,
        local=local,
    )[0]


# ---- store kills ------------------------------------------------------------------------------


def kill_stores(
    node_ids: Iterable[str],
    *,
    namespace: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Kill the ray_ckpt store actors of the given nodes (``ray.kill(no_restart=True)``); the
    nodes stay alive. ``dead_time``: when the store's name stopped resolving (the actor is dead).
    ConfigError if a node has no store in the namespace."""
    service._require_ray()
    namespace = namespace or settings.namespace()
    node_ids = [str(n) for n in node_ids]
    if not node_ids:
        raise ConfigError("no node to kill the store of was given")
    handles = {}
    for node_id in node_ids:
        try:
            handles[node_id] = ray.get_actor(naming.store_name(node_id), namespace=namespace)
        except ValueError:
            raise ConfigError(f"no ray_ckpt store on node {node_id} in namespace {namespace!r}") from None
    hosts = {str(n["NodeID"]): n.get("NodeManagerHostname") for n in ray.nodes()}
    results = []
    for node_id, handle in handles.items():
        kill_time = time.time()
        ray.kill(handle, no_restart=True)
        results.append(_result(node_id, "store", hosts.get(node_id), kill_time))
    registry = _registry(namespace)
    _announce_kills(results, registry, by, progress)
    if not wait_dead_s:
        return results
    pending = {r["node_id"]: r for r in results}
    deadline = time.monotonic() + wait_dead_s
    while pending and time.monotonic() < deadline:
        for node_id in list(pending):
            try:
                ray.get_actor(naming.store_name(node_id), namespace=namespace)
            except ValueError:
                result = pending.pop(node_id)
                result["dead_time"] = time.time()
                if progress is not None:
                    progress("dead", result)
        if pending:
            time.sleep(POLL_S)
    if pending:
        raise KillTimeoutError(
            f"the store(s) on node(s) {sorted(pending)} were still registered {wait_dead_s:g}s after ray.kill"
        )
    return results


def kill_store(
    node_id: str,
    *,
    namespace: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Kill only the ray_ckpt store actor on ``node_id`` (event mode ``store``); see kill_stores."""
    return kill_stores([node_id], namespace=namespace, wait_dead_s=wait_dead_s, by=by, progress=progress)[0]


# ---- schedules ----------------------------------------------------------------------------------


def kill_loop(
    mtbf_s: float,
    kills: int,
    *,
    seed: int | None = None,
    namespace: str | None = None,
    exclude: Iterable[str] = (),
    job: str | None = None,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Crash ``kills`` random nodes, one at a time, after exponentially distributed gaps with
    mean ``mtbf_s`` (the first gap counts from the call): failures as a Poisson process with
    mean time between failures ``mtbf_s`` for the whole cluster. Each victim is picked as by
    ``pick_nodes`` (never one killed before) and its crasher started ahead of its time, so kills
    land on schedule unless a gap is shorter than starting a crasher. Deaths are watched while
    waiting; after the last kill, waits up to ``wait_dead_s`` for the remaining ones. The same
    ``seed`` gives the same gaps (and, on the same cluster state, the same victims)."""
    service._require_ray()
    if not mtbf_s > 0:
        raise ConfigError(f"mtbf_s must be > 0, got {mtbf_s!r}")
    if kills < 1:
        raise ConfigError(f"kills must be >= 1, got {kills}")
    namespace = namespace or settings.namespace()
    rng = random.Random(seed)
    registry = _registry(namespace)
    excluded = set(exclude)
    results: list[dict[str, Any]] = []
    pending: dict[str, dict[str, Any]] = {}
    due = time.monotonic()
    for _ in range(kills):
        due += rng.expovariate(1.0 / mtbf_s)
        victim = pick_nodes(1, rng=rng, exclude=excluded, job=job, namespace=namespace)[0]
        armed = _arm([victim])
        _poll_deaths(pending, due, registry, progress, stop_when_none_left=False)
        if victim not in _alive_ids():  # died on its own meanwhile: pick another, now
            _disarm([armed[victim].handle])
            excluded.add(victim)
            victim = pick_nodes(1, rng=rng, exclude=excluded, job=job, namespace=namespace)[0]
            armed = _arm([victim])
        excluded.add(victim)
        kill_time = _fire([armed[victim]])[victim]
        result = _result(victim, "node", armed[victim].host, kill_time)
        _announce_kills([result], registry, by, progress)
        results.append(result)
        pending[victim] = result
    if wait_dead_s:
        _poll_deaths(pending, time.monotonic() + wait_dead_s, registry, progress)
        if pending:
            raise _not_dead_error(pending, wait_dead_s)
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
    namespace: str | None = None,
    min_step: int | None = None,
    seed: int | None = None,
    exclude: Iterable[str] = (),
    timeout_s: float = 600.0,
    poll_s: float = 0.02,
    wait_dead_s: float | None = 60.0,
    by: str = DEFAULT_BY,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Crash a node while a save of ``job`` is in flight.

    Definition: "in flight" is a step (>= ``min_step`` if given) that the registry shows as
    staged by at least one but not all ranks: some ranks have stored all their shards, the
    step is not committed yet. As soon as one is seen (polling the registry every ``poll_s``),
    the victim is a random node (seeded) among those whose stores hold shards of that step from
    the ranks that already staged it, so the save loses shards it has already written; if no
    pickable node holds any (e.g. they are all excluded), a random pickable node. The newest such
    step is taken if several are. Crashers are started up front on up to PREARM_MAX pickable
    nodes, so the kill lands milliseconds after the partial step is seen.

    Returns the kill result plus ``job``, ``step``, ``staged_ranks`` (when seen), ``world_size``
    and ``shards_on_victim``. KillTimeoutError (a TimeoutError) if no save was caught in flight
    within ``timeout_s``.
    Needs the ray_ckpt service (ConfigError without a registry in the namespace).
    """
    service._require_ray()
    namespace = namespace or settings.namespace()
    registry = _registry(namespace)
    if registry is None:
        raise ConfigError(f"no ray_ckpt registry in namespace {namespace!r}: nothing tells when a save is in flight")
    rng = random.Random(seed)
    candidates = _candidates(exclude)
    if not candidates:
        raise ConfigError("no alive node qualifies for a kill (the head node and this process's node are never picked)")
    rng.shuffle(candidates)
    armed = _arm(candidates[:PREARM_MAX])
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = remote.get(registry.jobs.remote(), timeout=_RPC_TIMEOUT_S)
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
            armed.update(_arm([victim]))
        else:
            victim = rng.choice(sorted(armed))
        crasher = armed.pop(victim)
        kill_time = _fire([crasher])[victim]
    finally:
        _disarm(a.handle for a in armed.values())
    result = _result(victim, "node", crasher.host, kill_time)
    result.update(
        job=job, step=step, staged_ranks=ranks, world_size=world_size, shards_on_victim=holders.get(victim, 0)
    )
    _announce_kills([result], registry, by, progress)
    _wait_for_deaths([result], wait_dead_s, registry, progress)
    return result
