"""Fault kinds: what a simulated failure does to its victims, behind one small interface.

A ``Fault`` checks its victims, gets ready to strike them (``arm``: nothing has happened yet,
and ``disarm`` undoes it), strikes every armed victim at the same moment (``fire``, returning
each kill time), and tells which victims are gone (``gone``). ``ray_ckpt.tools.chaos`` runs any
fault: at once (``inject``), as a Poisson process (``kill_loop``) or while a save is in flight
(``kill_during_save``), and records each kill as an event whose ``mode`` is the fault's.

Kinds (``FAULTS`` maps the command line's names to them):

- ``NodeCrash`` ("node"): a machine crash. Every process of the node is SIGKILLed (its raylet,
  workers, agents) by a NodeCrasher actor pinned there, or from this process when the node's
  raylet runs on this host (every node of a simulated cluster). Gone: Ray declared it dead.
- ``StoreKill`` ("store"): only the ray_ckpt store actor of the node (``ray.kill``); the node
  lives on. Gone: the store's name no longer resolves.
- ``ClusterNodeRemoval`` ("node"): ``ray.cluster_utils.Cluster.remove_node(allow_graceful=False)``
  of a simulated cluster, the hard kill tests use. Gone: Ray declared it dead.

A new kind (a hung node, corrupted shards) is one class here plus a row in ``FAULTS``; see
docs/design.md, "Where it goes".
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ckpt.actors.node_crasher import NodeCrasher, kill_tree, local_raylets
from ray_ckpt.errors import ConfigError, KillError
from ray_ckpt.transport import naming

logger = logging.getLogger(__name__)

FIRE_DELAY_S = 0.25  # crashers fire this long after being told to, so their replies get out first
ARM_TIMEOUT_S = 60.0  # starting a crasher needs a worker process on the victim
RPC_TIMEOUT_S = 10.0


@dataclasses.dataclass
class Armed:
    """A victim ready to be struck: ``host`` it runs on; ``handle`` of its NodeCrasher, or
    ``raylet`` when this process strikes it itself; ``target`` for other kinds."""

    node_id: str
    host: str | None
    handle: Any | None = None
    raylet: psutil.Process | None = None
    target: Any | None = None


def alive_node_ids() -> set[str]:
    return naming.alive_node_ids()


def own_node_id() -> str | None:
    """The node this process is attached to (None outside a Ray worker or driver)."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # not attached to a node (e.g. Ray Client)
        return None


class Fault(ABC):
    """One kind of failure. ``mode`` names it in kill events; ``death_hint`` ends the error
    when a victim is not gone in time."""

    mode: ClassVar[str]
    death_hint: ClassVar[str] = ""

    def check(self, node_ids: list[str], *, namespace: str, allow_head: bool) -> None:
        """ConfigError unless every victim is an alive node this process may strike."""
        if not node_ids:
            raise ConfigError("no node to strike was given")
        if len(set(node_ids)) != len(node_ids):
            raise ConfigError(f"a node is named twice in {node_ids}")

    @abstractmethod
    def arm(self, node_ids: list[str], *, namespace: str) -> dict[str, Armed]:
        """Get ready to strike every victim; KillError (nothing struck) if that fails."""

    def disarm(self, armed: Iterable[Armed]) -> None:
        """Undo ``arm`` for victims that will not be struck (kinds that start nothing: no-op)."""
        return None

    @abstractmethod
    def fire(self, armed: list[Armed]) -> dict[str, float]:
        """Strike every armed victim at the same moment; node id -> kill time (Unix s)."""

    @abstractmethod
    def gone(self, node_ids: set[str], *, namespace: str) -> set[str]:
        """Which of these victims are gone now."""


class _NodeDeath(Fault):
    """Faults that take a whole node: checked against the head and this process's node."""

    mode = "node"
    death_hint = (
        "(detection takes about RAY_health_check_period_ms x RAY_health_check_failure_threshold: 15 s by default)"
    )

    def check(self, node_ids: list[str], *, namespace: str, allow_head: bool) -> None:
        super().check(node_ids, namespace=namespace, allow_head=allow_head)
        alive, head, own = alive_node_ids(), naming.head_node_id(), own_node_id()
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

    def gone(self, node_ids: set[str], *, namespace: str) -> set[str]:
        return node_ids - alive_node_ids()


class NodeCrash(_NodeDeath):
    """A machine crash: SIGKILL to the node's raylet and every process under it. With
    ``local``, nodes whose raylet runs on this host are struck from this process (no crasher
    actor to start: the kill lands right away)."""

    def __init__(self, *, local: bool = True, delay_s: float = FIRE_DELAY_S) -> None:
        self.local = local
        self.delay_s = delay_s

    def _on_this_host(self, node_ids: list[str]) -> dict[str, Armed]:
        here = ray.util.get_node_ip_address()
        addresses = {n.node_id: n.address for n in naming.alive_nodes()}
        if not any(addresses.get(node_id) == here for node_id in node_ids):
            return {}
        raylets = local_raylets()
        host = socket.gethostname()
        return {n: Armed(n, host, raylet=raylets[n]) for n in node_ids if addresses.get(n) == here and n in raylets}

    def arm(self, node_ids: list[str], *, namespace: str, timeout_s: float = ARM_TIMEOUT_S) -> dict[str, Armed]:
        """Local victims need nothing; the others get a NodeCrasher, ready once it found its
        raylet. On any failure the started crashers are removed and KillError is raised."""
        armed = self._on_this_host(node_ids) if self.local else {}
        remote_ids = [n for n in node_ids if n not in armed]
        handles = {
            node_id: NodeCrasher.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(node_id)
            for node_id in remote_ids
        }
        refs = {node_id: handle.describe.remote() for node_id, handle in handles.items()}
        try:
            infos = ray.get(list(refs.values()), timeout=timeout_s)
        except Exception as error:
            self.disarm(Armed(n, None, handle=h) for n, h in handles.items())
            if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
                error = error.cause
            raise KillError(f"could not start a node crasher on every node of {remote_ids}: {error}") from None
        armed.update((n, Armed(n, str(info["host"]), handle=handles[n])) for n, info in zip(refs, infos))
        return armed

    def disarm(self, armed: Iterable[Armed]) -> None:
        for victim in armed:
            if victim.handle is None:  # struck from this process: nothing was started
                continue
            try:
                ray.kill(victim.handle, no_restart=True)
            except Exception:  # already gone
                continue

    def fire(self, armed: list[Armed]) -> dict[str, float]:
        """Crashers fire ``delay_s`` from now; local victims are struck at that same moment (at
        once when there is no crasher). A crasher whose reply is lost gets an estimate."""
        sent = time.time()
        refs = {a.node_id: a.handle.crash.remote(self.delay_s) for a in armed if a.handle is not None}
        times = {}
        if refs and any(a.raylet is not None for a in armed):
            time.sleep(max(0.0, sent + self.delay_s - time.time()))
        for victim in armed:
            if victim.raylet is not None:
                times[victim.node_id] = time.time()
                kill_tree(victim.raylet, kill_self=False)
        for node_id, ref in refs.items():
            try:
                times[node_id] = float(ray.get(ref, timeout=self.delay_s + RPC_TIMEOUT_S))
            except Exception as error:
                logger.warning("no kill time from the crasher on node %s (%s); using an estimate", node_id, error)
                times[node_id] = sent + self.delay_s
        return times


class ClusterNodeRemoval(_NodeDeath):
    """``cluster.remove_node(node, allow_graceful=False)`` on a ``ray.cluster_utils.Cluster``:
    the hard kill of a simulated node, as the cluster tests and benchmarks strike."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def arm(self, node_ids: list[str], *, namespace: str) -> dict[str, Armed]:
        nodes = {str(n.node_id): n for n in self.cluster.worker_nodes}
        missing = [n for n in node_ids if n not in nodes]
        if missing:
            raise ConfigError(f"only worker nodes of this simulated cluster can be removed; {missing} is not one")
        return {n: Armed(n, socket.gethostname(), target=nodes[n]) for n in node_ids}

    def fire(self, armed: list[Armed]) -> dict[str, float]:
        times = {}
        for victim in armed:
            times[victim.node_id] = time.time()
            self.cluster.remove_node(victim.target, allow_graceful=False)
        return times


class StoreKill(Fault):
    """Only the ray_ckpt store actor of each node (``ray.kill(no_restart=True)``); the node and
    everything else on it live on."""

    mode = "store"

    def arm(self, node_ids: list[str], *, namespace: str) -> dict[str, Armed]:
        hosts = {n.node_id: n.host for n in naming.nodes()}
        armed = {}
        for node_id in node_ids:
            try:
                handle = ray.get_actor(naming.store_name(node_id), namespace=namespace)
            except ValueError:
                raise ConfigError(f"no ray_ckpt store on node {node_id} in namespace {namespace!r}") from None
            armed[node_id] = Armed(node_id, hosts.get(node_id), target=handle)
        return armed

    def fire(self, armed: list[Armed]) -> dict[str, float]:
        times = {}
        for victim in armed:
            times[victim.node_id] = time.time()
            handle: Any = victim.target
            ray.kill(handle, no_restart=True)
        return times

    def gone(self, node_ids: set[str], *, namespace: str) -> set[str]:
        return node_ids - naming.store_node_ids(namespace)


FAULTS: dict[str, type[Fault]] = {"node": NodeCrash, "kill": NodeCrash, "store": StoreKill}
"""The fault kinds the command line offers (``ray-ckpt kill-node --fault NAME``)."""
