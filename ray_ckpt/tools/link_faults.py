"""Failures that close no sockets, on the nodes of a network lab (``ray_ckpt.tools.network_lab``).

Primitives on one ``LabNode`` (each undone by its pair):

- ``link_down`` / ``link_up``: the node's link on the bridge goes down (no FIN, no RST: every
  connection to it just goes silent) or comes back;
- ``freeze`` / ``thaw``: SIGSTOP / SIGCONT every process in the node's namespace;
- ``kill``: SIGKILL every process in the node's namespace (today's process kill: sockets close);
- ``cut`` / ``uncut``: drop every packet between the node and the head (``side="head"``: the
  GCS, the driver, every actor on the head node) or between the node and the other lab nodes
  (``side="peers"``), with nftables rules inside the node's namespace (they go with it);
- ``network_lab.set_rate``: the link's rate (``slow`` lowers it for a while).

Faults, as ``ray-ckpt kill-node --fault KIND`` and ``chaos.inject`` strike them (``Fault``
classes, ``LAB_FAULTS``; the command line offers them beside ``faults.FAULTS``):

- ``power``: link down and processes frozen: a machine that lost power. Left so, or its
  processes killed after ``duration_s`` (``gone`` reports it struck at once; Ray declares it
  dead after its own health checks).
- ``partition``: cut from the head (``side="peers"``: cut from its peers), for ``duration_s``
  (0: until ``uncut``).
- ``slow``: the link at ``fraction`` (default 1%) of its rate for ``duration_s``.
- ``flap``: the link down for ``duration_s``, processes running, then up again.

Timed faults heal themselves from a background thread of the process that struck them; that
process must outlive ``duration_s`` (the command line waits).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import typing
from typing import Any

from ray_ckpt.errors import ConfigError, KillError
from ray_ckpt.tools.faults import Armed, Fault
from ray_ckpt.tools.network_lab import LabNode, LabState, find_node, nft_unsupported, set_rate, sh
from ray_ckpt.transport import naming

NOMINAL_GBIT = 10.0  # the rate ``slow`` takes a fraction of when the lab's links are unshaped
TABLE = "rckl_partition"


def link_down(node: LabNode) -> None:
    sh("ip", "link", "set", node.link, "down")


def link_up(node: LabNode) -> None:
    sh("ip", "link", "set", node.link, "up")


def freeze(node: LabNode) -> int:
    """SIGSTOP every process of the node; how many."""
    return node.signal_all(signal.SIGSTOP)


def thaw(node: LabNode) -> int:
    """SIGCONT every process of the node; how many."""
    return node.signal_all(signal.SIGCONT)


def kill(node: LabNode) -> int:
    """SIGKILL every process of the node (frozen ones die too); how many."""
    return node.kill()


def cut(node: LabNode, lab: LabState, side: str = "head") -> None:
    """Drop every packet between the node and the head (``side="head"``) or its peers
    (``side="peers"``), both ways, from inside its namespace. ConfigError without ``nft``."""
    if side not in ("head", "peers"):
        raise ConfigError(f"a partition cuts a node from 'head' or 'peers', not {side!r}")
    reason = nft_unsupported()
    if reason is not None:
        raise ConfigError(reason)
    if side == "head":
        match_in, match_out = f"ip saddr {lab.head_ip}", f"ip daddr {lab.head_ip}"
    else:
        peers = f"{lab.subnet}.0/24"
        match_in = f"ip saddr {peers} ip saddr != {lab.head_ip}"
        match_out = f"ip daddr {peers} ip daddr != {lab.head_ip}"
    rules = (
        f"table inet {TABLE} {{\n"
        f"  chain input {{ type filter hook input priority 0; policy accept; {match_in} drop; }}\n"
        f"  chain output {{ type filter hook output priority 0; policy accept; {match_out} drop; }}\n"
        "}\n"
    )
    uncut(node)
    done = _nft(node, rules)
    if done.returncode != 0:
        raise KillError(f"could not cut node {node.address} from its {side}: {done.stderr.strip()}")


def _nft(node: LabNode, rules: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", node.namespace, "nft", "-f", "-"], input=rules, capture_output=True, text=True
    )


def uncut(node: LabNode) -> None:
    """Remove the node's partition rules, if any."""
    sh("nft", "delete", "table", "inet", TABLE, namespace=node.namespace, check=False)


def _later(delay_s: float, action: Any) -> None:
    """Run ``action`` after ``delay_s`` from a daemon thread (the heal of a timed fault)."""
    timer = threading.Timer(delay_s, action)
    timer.daemon = True
    timer.start()


class LabFault(Fault):
    """A fault on lab nodes; its victims must be alive worker nodes of a lab on this machine."""

    death_hint = "(a lab fault strikes at once; nothing waits for Ray to declare the node dead)"

    def __init__(self, *, duration_s: float = 0.0) -> None:
        if duration_s < 0:
            raise ConfigError(f"a fault's duration must be >= 0 s, not {duration_s!r}")
        self.duration_s = duration_s

    def check(self, node_ids: list[str], *, namespace: str, allow_head: bool) -> None:
        super().check(node_ids, namespace=namespace, allow_head=allow_head)
        addresses = {n.node_id: n.address or "" for n in naming.alive_nodes()}
        for node_id in node_ids:
            if node_id not in addresses:
                raise ConfigError(f"node {node_id} is not an alive node of this cluster (see `ray.nodes()`)")
            if find_node(addresses[node_id]) is None:
                raise ConfigError(
                    f"node {node_id} ({addresses[node_id]}) is not a node of a network lab on this machine: "
                    f"--fault {self.mode} needs one (scripts/lab.py; docs/failure-simulation.md)"
                )

    def arm(self, node_ids: list[str], *, namespace: str) -> dict[str, Armed]:
        addresses = {n.node_id: n.address or "" for n in naming.alive_nodes()}
        armed = {}
        for node_id in node_ids:
            found = find_node(addresses.get(node_id, ""))
            if found is None:
                raise KillError(f"node {node_id} left the lab before it could be struck")
            armed[node_id] = Armed(node_id, addresses[node_id], target=found)
        return armed

    def fire(self, armed: list[Armed]) -> dict[str, float]:
        times = {}
        for victim in armed:
            lab, node = typing.cast(tuple[LabState, LabNode], victim.target)
            times[victim.node_id] = time.time()
            self.strike(lab, node)
        return times

    def strike(self, lab: LabState, node: LabNode) -> None:
        raise NotImplementedError

    def gone(self, node_ids: set[str], *, namespace: str) -> set[str]:
        return set(node_ids)


class Power(LabFault):
    """Link down and every process frozen: nothing closes. ``duration_s`` > 0: the processes
    are killed after that long (a machine that stays down), the link stays down."""

    mode = "power"

    def strike(self, lab: LabState, node: LabNode) -> None:
        link_down(node)
        freeze(node)
        if self.duration_s:
            _later(self.duration_s, lambda: kill(node))


class Partition(LabFault):
    """Cut from the head (or from ``side="peers"``) for ``duration_s`` (0: until ``uncut``)."""

    mode = "partition"

    def __init__(self, *, duration_s: float = 0.0, side: str = "head") -> None:
        super().__init__(duration_s=duration_s)
        if side not in ("head", "peers"):
            raise ConfigError(f"a partition cuts a node from 'head' or 'peers', not {side!r}")
        self.side = side

    def strike(self, lab: LabState, node: LabNode) -> None:
        cut(node, lab, self.side)
        if self.duration_s:
            _later(self.duration_s, lambda: uncut(node))


class Slow(LabFault):
    """The link at ``fraction`` of its rate for ``duration_s`` (default 30 s), then back."""

    mode = "slow"

    def __init__(self, *, duration_s: float = 30.0, fraction: float = 0.01) -> None:
        super().__init__(duration_s=duration_s)
        if not 0 < fraction < 1:
            raise ConfigError(f"a slow link runs at a fraction in (0, 1) of its rate, not {fraction!r}")
        self.fraction = fraction

    def strike(self, lab: LabState, node: LabNode) -> None:
        rate = lab.rate_gbit or NOMINAL_GBIT
        set_rate(node, rate * self.fraction)
        if self.duration_s:
            _later(self.duration_s, lambda: set_rate(node, lab.rate_gbit))


class Flap(LabFault):
    """The link down for ``duration_s`` (default 3 s), processes running, then up again."""

    mode = "flap"

    def __init__(self, *, duration_s: float = 3.0) -> None:
        super().__init__(duration_s=duration_s)
        if not duration_s > 0:
            raise ConfigError(f"a flap keeps the link down for > 0 s, not {duration_s!r}")

    def strike(self, lab: LabState, node: LabNode) -> None:
        link_down(node)
        _later(self.duration_s, lambda: link_up(node))


LAB_FAULTS: dict[str, type[LabFault]] = {"power": Power, "partition": Partition, "slow": Slow, "flap": Flap}
"""The lab's fault kinds that need a lab node (``kill`` works on any node: ``faults.NodeCrash``)."""
