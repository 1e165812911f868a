"""Ray's record of one node, typed: ``RayNode``, parsed once from a ``ray.nodes()`` entry.

``ray.nodes()`` (public Ray API) returns one dict per node the cluster ever had, alive or dead,
with CamelCase keys. ``RayNode.from_ray`` is the one place those keys are read; everything
else works with the record. Listing the nodes is transport's (``ray_ckpt.transport.naming``:
``nodes``, ``alive_nodes``); which node is the head is a Ray internal
(``ray_ckpt._ray_compat.is_head_node``). Pure: no Ray import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class RayNode:
    """One node as Ray reports it: ``node_id`` (``NodeID``), whether it is ``alive``
    (``Alive``), its ``host`` name (``NodeManagerHostname``) and ``address``
    (``NodeManagerAddress``, its IP), its raylet's port (``raylet_port``,
    ``NodeManagerPort``), its ``resources`` (``Resources``: name -> amount) and ``labels``
    (``Labels``: name -> value, e.g. a failure domain). Fields Ray left out are None (host,
    address, raylet_port) or empty."""

    node_id: str
    alive: bool
    host: str | None = None
    address: str | None = None
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    raylet_port: int | None = None

    @property
    def raylet_address(self) -> str | None:
        """Where its raylet serves calls ("address:port"), None if Ray did not say."""
        if self.address is None or self.raylet_port is None:
            return None
        return f"{self.address}:{self.raylet_port}"

    @classmethod
    def from_ray(cls, record: Mapping[str, Any]) -> RayNode:
        """The record of one entry of ``ray.nodes()``."""
        host, address = record.get("NodeManagerHostname"), record.get("NodeManagerAddress")
        port = record.get("NodeManagerPort")
        return cls(
            node_id=str(record["NodeID"]),
            alive=bool(record.get("Alive")),
            host=None if host is None else str(host),
            address=None if address is None else str(address),
            resources=dict(record.get("Resources") or {}),
            labels=dict(record.get("Labels") or {}),
            raylet_port=None if port is None else int(port),
        )
