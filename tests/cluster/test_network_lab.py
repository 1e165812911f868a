"""The network lab on this machine: nodes as hosts of their own, a shaped link, faults that close
no sockets, and nothing left behind. Skipped, with the reason, where namespaces are not allowed."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from support import pace
from support.cluster_ranks import shard_nodes

import ray_ckpt
from ray_ckpt import _ray_compat
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.errors import RayCkptError
from ray_ckpt.tools import link_faults, network_lab

pytestmark = pytest.mark.cluster

RATE_GBIT = 1.0
OBJECT_BYTES = 32 << 20


@pytest.fixture(scope="module")
def module_lab() -> Iterator[network_lab.NetworkLab]:
    """One lab of two nodes for the module; once it is taken down, nothing of it is left."""
    reason = network_lab.lab_unsupported()
    if reason is not None:
        pytest.skip(reason)
    with network_lab.NetworkLab(2, rate_gbit=RATE_GBIT) as made:
        made.start()
        yield made
    names = {made.state.bridge, *(n.namespace for n in made.state.nodes), *(n.link for n in made.state.nodes)}
    left = network_lab.sh("ip", "-o", "link", "show", check=False).stdout + network_lab.sh("ip", "netns").stdout
    assert not [name for name in names if name in left], left
    assert not made.state.path.exists()


@pytest.fixture
def lab(module_lab: network_lab.NetworkLab) -> Iterator[network_lab.NetworkLab]:
    """The module's lab, healed after the test: every link up at its rate, no rule, no frozen
    process, and a node Ray no longer lists alive (declared dead) started again."""
    yield module_lab
    for node in module_lab.nodes:
        link_faults.link_up(node)
        link_faults.thaw(node)
        if network_lab.nft_unsupported() is None:
            link_faults.uncut(node)
        network_lab.set_rate(node, RATE_GBIT)
        if module_lab.live_node_id(node) is None:
            module_lab.restart_node(node)


@ray.remote(num_cpus=0)
def where() -> str:
    return ray.util.get_node_ip_address()


@ray.remote(num_cpus=0)
def make(size: int) -> bytes:
    return b"x" * size


@ray.remote(num_cpus=0)
def size_of(data: bytes) -> int:
    return len(data)


def on(node: network_lab.LabNode) -> dict[str, dict[str, float]]:
    return {"resources": {node.resource: 0.01}}


def test_lab_nodes_are_hosts_of_their_own_links_take_their_rate_and_a_flap_closes_nothing(
    lab: network_lab.NetworkLab,
) -> None:
    first, second = lab.nodes
    assert [ray.get(where.options(**on(n)).remote()) for n in lab.nodes] == [first.address, second.address]
    data = make.options(**on(first)).remote(OBJECT_BYTES)
    ray.wait([data], fetch_local=False)
    started = time.monotonic()
    assert ray.get(size_of.options(**on(second)).remote(data)) == OBJECT_BYTES
    floor_s = OBJECT_BYTES * 8 / (RATE_GBIT * 1e9)
    assert time.monotonic() - started >= 0.9 * floor_s  # crossed the shaped links, not loopback

    pids = set(second.pids())
    link_faults.link_down(second)  # silent: the task sent there waits, nothing fails
    pending = where.options(**on(second)).remote()
    ready, _ = ray.wait([pending], timeout=2.0)
    assert not ready
    link_faults.link_up(second)
    assert ray.get(pending, timeout=pace.bound(60)) == second.address
    assert pids <= set(second.pids())  # the flap killed no process


def test_a_partition_from_the_head_silences_the_node_and_healing_brings_it_back(lab: network_lab.NetworkLab) -> None:
    if network_lab.nft_unsupported() is not None:
        pytest.skip(network_lab.nft_unsupported())
    node = lab.nodes[0]
    link_faults.cut(node, lab.state, "head")
    pending = where.options(**on(node)).remote()
    ready, _ = ray.wait([pending], timeout=2.0)
    assert not ready
    link_faults.uncut(node)
    assert ray.get(pending, timeout=pace.bound(60)) == node.address


def test_a_silent_node_declared_dead_is_out_at_once_and_cannot_come_back(lab: network_lab.NetworkLab) -> None:
    """Power lost (link down, processes frozen): Ray's health checks would take about a minute;
    ``declare_node_dead`` makes the GCS drop the node at once, and the node, its link and
    processes back, does not rejoin: its raylet learns it was declared dead and exits."""
    node = lab.nodes[1]
    node_id = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == node.address and n["Alive"])
    link_faults.link_down(node)
    link_faults.freeze(node)
    started = time.monotonic()
    assert _ray_compat.declare_node_dead(node_id, "a lab test: power lost")
    alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
    assert alive[node_id] is False, alive
    assert time.monotonic() - started < 2.0
    link_faults.link_up(node)
    link_faults.thaw(node)
    deadline = time.monotonic() + pace.bound(60)
    while node.pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not node.pids(), "the fenced node's processes outlived their raylet's verdict"
    alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
    assert alive[node_id] is False and sum(alive.values()) == 2, alive  # the head and the other node


def _state(step: int) -> dict[str, Any]:
    return {"w": torch.arange(2_000_000, dtype=torch.float32) + step}


def test_a_store_holder_losing_power_during_a_save_and_a_restore_costs_no_committed_step(
    lab: network_lab.NetworkLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RS(2,1) over the stores of the head and the two lab nodes, steps 0 and 1 committed. The
    lab node holding a data shard of step 1 loses power (link down, processes frozen): the save
    of step 2 either commits or fails with a ray_ckpt error, never half; a restore started while
    the node is silent waits on it until the node is declared dead (as the run's coordinator
    does after half a second of failed probes), then reads the parity shard instead and gives
    the newest committed step bit-exact, long before its store timeout."""
    monkeypatch.setenv("RAY_CKPT_PEER_TIMEOUT_S", "30")
    ray_ckpt.start(store_budget_bytes=128 << 20)
    job, config = "lab-power-holder", CheckpointConfig(data_shards=2, parity_shards=1, local_copy=False)
    saver = Checkpointer(job=job, rank=0, world_size=1, config=config)
    for step in (0, 1):
        saver.save(step, _state(step)).wait(timeout_s=pace.bound(60))
    holders = shard_nodes(ray_ckpt.settings.namespace(), job, 1)[0]
    by_id = {lab.node_id(node): node for node in lab.nodes}
    victim_id = next(holders[i] for i in (0, 1) if holders[i] in by_id)
    victim = by_id[victim_id]
    link_faults.link_down(victim)
    link_faults.freeze(victim)
    try:
        # the save's calls to the silent store time out after 5 s (the driver reads the setting
        # at each call); the restore's below after 30 s, which the test tells from routing around
        monkeypatch.setenv("RAY_CKPT_PEER_TIMEOUT_S", "5")
        try:
            saver.save(2, _state(2)).wait(timeout_s=pace.bound(90))
            newest = 2
        except RayCkptError:  # not committed: a save that cannot place its shards in time fails whole
            newest = 1
        with contextlib.suppress(RayCkptError):  # close() raises a failed save's error again
            saver.close()
    except BaseException:
        link_faults.link_up(victim)
        link_faults.thaw(victim)
        raise
    monkeypatch.setenv("RAY_CKPT_PEER_TIMEOUT_S", "30")
    try:
        result: dict[str, Any] = {}

        def restore() -> None:
            with Checkpointer(job=job, rank=0, world_size=1, config=config) as reader:
                started = time.monotonic()
                restored = reader.restore()
                result.update(restored=restored, took=time.monotonic() - started)

        reading = threading.Thread(target=restore)
        reading.start()
        time.sleep(1.0)  # the restore waits on the silent store
        assert _ray_compat.declare_node_dead(victim_id, "a lab test: power lost")
        reading.join(timeout=pace.bound(120))
        assert not reading.is_alive()
        restored = result["restored"]
        assert restored is not None and restored.step >= newest
        assert torch.equal(restored.state["w"], _state(restored.step)["w"])
        assert result["took"] < 20.0, result["took"]  # routed around, not the 30 s store timeout
    finally:
        link_faults.link_up(victim)
        link_faults.thaw(victim)
