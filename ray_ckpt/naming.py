"""Names of ray_ckpt's actors in their namespace, and looking them up in a running cluster."""

from __future__ import annotations

from typing import Any

import ray

REGISTRY_NAME = "registry"
STORE_PREFIX = "store:"


def store_name(node_id: str) -> str:
    return f"{STORE_PREFIX}{node_id}"


def alive_nodes() -> list[dict[str, Any]]:
    """Ray's records of the nodes that are alive now (works without the dashboard)."""
    return [n for n in ray.nodes() if n.get("Alive")]


def head_node_id() -> str | None:
    for node in alive_nodes():
        if "node:__internal_head__" in node.get("Resources", {}):
            return str(node["NodeID"])
    return None


def store_handles(namespace: str, node_ids: list[str] | None = None) -> dict[str, Any]:
    """node id -> store actor handle, for the given nodes (default: every alive node) that
    have a store. Nodes without a store are left out."""
    if node_ids is None:
        node_ids = [str(n["NodeID"]) for n in alive_nodes()]
    handles = {}
    for node_id in node_ids:
        try:
            handles[node_id] = ray.get_actor(store_name(node_id), namespace=namespace)
        except ValueError:
            continue
    return handles


def registry_handle(namespace: str) -> Any:
    """The registry actor; ValueError if ray_ckpt.start() has not run in this namespace."""
    return ray.get_actor(REGISTRY_NAME, namespace=namespace)
