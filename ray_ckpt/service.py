"""Deploying, inspecting and removing the ray_ckpt service (stores + registry) on a Ray cluster."""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ckpt import settings
from ray_ckpt.actors import store_actor
from ray_ckpt.actors.registry_actor import RegistryActor
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.protection import cluster_margin
from ray_ckpt.core.wire import StoreStatus, step_protection
from ray_ckpt.errors import ConfigError, NoCheckpointError, StoreUnavailableError
from ray_ckpt.transport import naming, remote
from ray_ckpt.transport.registry_client import RegistryClient

logger = logging.getLogger(__name__)


def _require_ray() -> None:
    if not ray.is_initialized():
        raise StoreUnavailableError("Ray is not initialized: call ray.init() (or ray.init(address='auto')) first")


def start(
    *,
    store_budget_bytes: int | None = None,
    store_budget_fraction: float | None = None,
    namespace: str | None = None,
    events_path: str | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Deploy one store per alive node and the registry; idempotent.

    Calling it again picks up nodes that joined since (and leaves existing stores untouched);
    the registry also starts a store on every node that joins later, by itself
    (RAY_CKPT_STORE_WATCH_INTERVAL_S).
    ``events_path``: the JSON-lines events file the registry writes (default: under Ray's
    session folder on the registry's node; ``registry.events_path()`` tells where).
    Budget per store: ``store_budget_bytes`` if given, else ``store_budget_fraction`` (default
    RAY_CKPT_STORE_BUDGET_FRACTION) of the node's total memory. Returns
    ``{"namespace", "stores": [node ids], "registry_node_id", "margin"}``; ``margin`` says, also
    in the log, how many node losses the cluster absorbs before a step's protection drops.
    """
    _require_ray()
    if store_budget_bytes is not None and (not isinstance(store_budget_bytes, int) or store_budget_bytes < 0):
        raise ConfigError(f"store_budget_bytes must be an int >= 0, got {store_budget_bytes!r}")
    fraction = settings.store_budget_fraction() if store_budget_fraction is None else store_budget_fraction
    if not 0 < fraction <= 0.9:
        raise ConfigError(f"store_budget_fraction must be in (0, 0.9], got {fraction!r}")
    namespace = namespace or settings.namespace()
    nodes = [node.node_id for node in naming.alive_nodes()]
    handles = [store_actor.deploy(namespace, node_id, store_budget_bytes, fraction) for node_id in nodes]
    head = naming.head_node_id()
    # the head node: it hosts the GCS, so it lives exactly as long as the cluster
    strategy = NodeAffinitySchedulingStrategy(head, soft=False) if head else "DEFAULT"
    registry = RegistryActor.options(
        name=naming.REGISTRY_NAME,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=strategy,
    ).remote(namespace, events_path, store_budget_bytes=store_budget_bytes, store_budget_fraction=fraction)
    # the stores and the registry start together (each is a new worker process: about 1 s of CPU)
    remote.get([h.ready.remote() for h in [*handles, registry]], timeout=timeout_s)
    default = CheckpointConfig()
    spare, protection = cluster_margin(len(nodes), default.data_shards, default.parity_shards)
    margin = (
        f"{len(nodes)} store node(s): with the default RS({default.data_shards},{default.parity_shards}) a step "
        f"survives {protection} node loss(es), and the cluster can lose {spare} node(s) before that drops "
        f"(RS(k,m) keeps full protection with k+m store nodes; each node beyond absorbs one loss)"
    )
    # information only: a job may use another code; its rank 0 warns at its first save when
    # its own code has no spare nodes (SavePipeline.check_placement)
    logger.info("ray_ckpt: %s", margin)
    return {"namespace": namespace, "stores": nodes, "registry_node_id": head, "margin": margin}


def drop(job: str, *, namespace: str | None = None, timeout_s: float = 10.0) -> None:
    """Remove one job's checkpoints from the registry and every store; other jobs are
    untouched. NoCheckpointError if the registry knows no such job."""
    _require_ray()
    namespace = namespace or settings.namespace()
    registry = RegistryClient(namespace)
    jobs = registry.jobs()
    if job not in jobs:
        raise NoCheckpointError(
            f"job {job!r} has no checkpoints in namespace {namespace!r} (jobs: {sorted(jobs)})", job=job
        )
    registry.forget(job, timeout_s)


def shutdown(*, namespace: str | None = None) -> None:
    """Kill the registry and every store in the namespace (their checkpoints are gone)."""
    _require_ray()
    namespace = namespace or settings.namespace()
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] != namespace:
            continue
        name = entry["name"]
        if name == naming.REGISTRY_NAME or name.startswith(naming.STORE_PREFIX):
            try:
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
            except ValueError:
                continue


def status(*, namespace: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Per node: bytes used / budget, shards, jobs. Per job: committed steps and how many more
    node failures its latest committed step survives (``protection``, from where its shards
    really are, see ray_ckpt.core.protection; negative means some rank can no longer be rebuilt from
    memory) against ``full_protection`` (parity_shards: less means degraded placement)."""
    _require_ray()
    namespace = namespace or settings.namespace()
    stores = naming.store_handles(namespace)
    refs = {node_id: h.stats.remote() for node_id, h in stores.items()}
    nodes: dict[str, Any] = {}
    for node_id, ref in refs.items():
        try:
            nodes[node_id] = StoreStatus.from_wire(remote.get(ref, timeout=timeout_s)).to_wire()
        except Exception as error:  # an unreachable store is reported, not fatal
            nodes[node_id] = {"node_id": node_id, "error": repr(error)}
    try:
        registry = RegistryClient(namespace)
    except StoreUnavailableError:
        return {"namespace": namespace, "nodes": nodes, "jobs": {}, "registry": "missing"}
    alive = naming.alive_node_ids()
    jobs: dict[str, dict[str, Any]] = {}
    for job, known in registry.jobs().items():
        info = jobs[job] = known.to_wire()
        committed = known.committed_steps
        info["latest_committed"] = committed[-1] if committed else None
        info["protection"] = None
        if committed:
            located = registry.locate(job, committed[-1])
            info["protection"] = step_protection(located, alive)
            info["full_protection"] = next(iter(located.values())).parity_shards
            info["payload_bytes_per_step"] = sum(r.payload_size for r in located.values())
    return {"namespace": namespace, "nodes": nodes, "jobs": jobs, "registry": "alive"}
