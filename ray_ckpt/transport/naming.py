"""Names of ray_ckpt's actors in their namespace, and looking them (and the cluster's nodes,
as ``RayNode`` records) up in a running cluster."""

from __future__ import annotations

from typing import Any

import ray

from ray_ckpt import _ray_compat
from ray_ckpt.core.nodes import RayNode

REGISTRY_NAME = "registry"
STORE_PREFIX = "store:"


def store_name(node_id: str) -> str:
    return f"{STORE_PREFIX}{node_id}"


def nodes() -> list[RayNode]:
    """Ray's records of every node the cluster has had, alive or dead (``ray.nodes()``, which
    works without the dashboard)."""
    return [RayNode.from_ray(n) for n in ray.nodes()]


def alive_nodes() -> list[RayNode]:
    """Ray's records of the nodes that are alive now."""
    return [n for n in nodes() if n.alive]


def alive_node_ids() -> set[str]:
    """The ids of the nodes that are alive now."""
    return {n.node_id for n in alive_nodes()}


def head_node_id() -> str | None:
    """The id of the head node if it is alive, else None."""
    for node in alive_nodes():
        if _ray_compat.is_head_node(node):
            return node.node_id
    return None


def store_node_ids(namespace: str) -> set[str]:
    """Ids of the nodes whose store is registered (alive) in ``namespace``: one GCS call, however
    many nodes the cluster has."""
    return {
        entry["name"][len(STORE_PREFIX) :]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == namespace and entry["name"].startswith(STORE_PREFIX)
    }


def store_handles(namespace: str, node_ids: list[str] | None = None) -> dict[str, Any]:
    """node id -> store actor handle, for the given nodes (default: every node) whose store is
    alive. Nodes without a live store are left out. One GCS call to list the stores plus one
    lookup per store returned: pass ``node_ids`` on hot paths."""
    live = store_node_ids(namespace)
    handles = {}
    for node_id in sorted(live if node_ids is None else live.intersection(node_ids)):
        try:
            handles[node_id] = ray.get_actor(store_name(node_id), namespace=namespace)
        except ValueError:  # died since the listing
            continue
    return handles


def registry_handle(namespace: str) -> Any:
    """The registry actor; ValueError if ray_ckpt.start() has not run in this namespace."""
    return ray.get_actor(REGISTRY_NAME, namespace=namespace)
