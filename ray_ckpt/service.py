"""Deploying, inspecting and removing the ray_ckpt service (stores + registry) on a Ray cluster."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.registry_actor import RegistryActor
from actors.store_actor import ShardStoreActor
from ray_ckpt import naming, settings
from ray_ckpt.errors import ConfigError, StoreUnavailableError
from ray_ckpt.placement import Node


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

    Calling it again picks up nodes that joined since (and leaves existing stores untouched).
    ``events_path``: the JSON-lines events file the registry writes (default: under Ray's
    session folder on the registry's node; ``registry.events_path()`` tells where).
    Budget per store: ``store_budget_bytes`` if given, else ``store_budget_fraction`` (default
    RAY_CKPT_STORE_BUDGET_FRACTION) of the node's total memory. Returns
    ``{"namespace", "stores": [node ids], "registry_node_id"}``.
    """
    _require_ray()
    if store_budget_bytes is not None and (not isinstance(store_budget_bytes, int) or store_budget_bytes < 0):
        raise ConfigError(f"store_budget_bytes must be an int >= 0, got {store_budget_bytes!r}")
    fraction = settings.store_budget_fraction() if store_budget_fraction is None else store_budget_fraction
    if not 0 < fraction <= 0.9:
        raise ConfigError(f"store_budget_fraction must be in (0, 0.9], got {fraction!r}")
    namespace = namespace or settings.namespace()
    nodes = naming.alive_nodes()
    handles = []
    for node in nodes:
        node_id = str(node["NodeID"])
        handles.append(
            ShardStoreActor.options(  # type: ignore[attr-defined]
                name=naming.store_name(node_id),
                namespace=namespace,
                lifetime="detached",
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(node_id, store_budget_bytes, fraction)
        )
    ray.get([h.ready.remote() for h in handles], timeout=timeout_s)
    head = naming.head_node_id()
    # the head node: it hosts the GCS, so it lives exactly as long as the cluster
    strategy = NodeAffinitySchedulingStrategy(head, soft=False) if head else "DEFAULT"
    registry = RegistryActor.options(  # type: ignore[attr-defined]
        name=naming.REGISTRY_NAME,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=strategy,
    ).remote(namespace, events_path)
    ray.get(registry.ready.remote(), timeout=timeout_s)
    return {"namespace": namespace, "stores": [str(n["NodeID"]) for n in nodes], "registry_node_id": head}


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


def storage_nodes(namespace: str, failure_domain_label: str | None) -> list[Node]:
    """The alive nodes that run a store, with their failure domain from the node label (two
    GCS calls, whatever the cluster's size)."""
    stores = naming.store_node_ids(namespace)
    result = []
    for node in naming.alive_nodes():
        node_id = str(node["NodeID"])
        if node_id in stores:
            labels = node.get("Labels") or {}
            domain = labels.get(failure_domain_label) if failure_domain_label else None
            result.append(Node(node_id, domain))
    return result


def status(*, namespace: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Per node: bytes used / budget, shards, jobs. Per job: committed steps and how many more
    node failures its latest committed step survives (``protection``: min over ranks of live
    shards - k; negative means some rank can no longer be rebuilt from memory)."""
    _require_ray()
    namespace = namespace or settings.namespace()
    stores = naming.store_handles(namespace)
    refs = {node_id: h.stats.remote() for node_id, h in stores.items()}
    nodes: dict[str, Any] = {}
    for node_id, ref in refs.items():
        try:
            nodes[node_id] = ray.get(ref, timeout=timeout_s)
        except Exception as error:  # an unreachable store is reported, not fatal
            nodes[node_id] = {"node_id": node_id, "error": repr(error)}
    try:
        registry = naming.registry_handle(namespace)
    except ValueError:
        return {"namespace": namespace, "nodes": nodes, "jobs": {}, "registry": "missing"}
    jobs = ray.get(registry.jobs.remote(), timeout=timeout_s)
    alive = {str(n["NodeID"]) for n in naming.alive_nodes()}
    for job, info in jobs.items():
        committed = info["committed_steps"]
        info["latest_committed"] = committed[-1] if committed else None
        info["protection"] = None
        if committed:
            located = ray.get(registry.locate.remote(job, committed[-1]), timeout=timeout_s)
            margins = []
            for record in located.values():
                k = next(iter(record["metas"].values()))["data_shards"]
                live = sum(1 for n in record["nodes"].values() if n in alive)
                margins.append(live - k)
            info["protection"] = min(margins) if margins else None
            info["payload_bytes_per_step"] = sum(
                next(iter(r["metas"].values()))["payload_size"] for r in located.values()
            )
    return {"namespace": namespace, "nodes": nodes, "jobs": jobs, "registry": "alive"}
