"""The network lab's bookkeeping, without building one: its checks at the boundary, the state
file it writes before it makes anything, and the lab faults' options."""

from __future__ import annotations

import pathlib

import pytest

from ray_ckpt.errors import ConfigError
from ray_ckpt.tools import link_faults, network_lab


def test_a_lab_refuses_bad_sizes_and_rates_before_it_makes_anything() -> None:
    for options in ({"nodes": 0}, {"nodes": 2, "cpus": 0}, {"nodes": 2, "rate_gbit": 0.0}):
        with pytest.raises(ConfigError):
            network_lab.NetworkLab(**options)  # type: ignore[arg-type]


def test_every_name_a_lab_makes_carries_its_run_and_fits_an_interface_name() -> None:
    lab = network_lab.NetworkLab(12)
    state = lab.state
    names = [state.bridge, *(n.namespace for n in state.nodes), *(n.link for n in state.nodes)]
    assert all(name.startswith(network_lab.PREFIX + state.run) for name in names)
    assert all(len(name) <= 15 for name in names), names  # Linux interface names: 15 bytes at most
    assert len(set(names)) == len(names)


def test_the_state_file_round_trips_and_labs_finds_a_node_by_its_address(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(network_lab.STATE_DIR_ENV, str(tmp_path))
    state = network_lab.NetworkLab(2).state
    state.subnet = "10.200.7"
    state.nodes = [
        network_lab.LabNode(index=n.index, namespace=n.namespace, link=n.link, address=f"10.200.7.{10 + n.index}")
        for n in state.nodes
    ]
    state.node_pgids = {0: 123}
    state.write()
    (read,) = network_lab.labs()
    assert read == state
    assert read.head_ip == "10.200.7.1"
    found = network_lab.find_node("10.200.7.11")
    assert found is not None and found[1].index == 1 and found[1].resource == "lab_node_1"
    assert network_lab.find_node("10.200.7.99") is None


def test_lab_faults_check_their_options() -> None:
    with pytest.raises(ConfigError):
        link_faults.Partition(side="nowhere")
    with pytest.raises(ConfigError):
        link_faults.Slow(fraction=1.5)
    with pytest.raises(ConfigError):
        link_faults.Flap(duration_s=0.0)
    with pytest.raises(ConfigError):
        link_faults.Power(duration_s=-1.0)
    assert set(link_faults.LAB_FAULTS) == {"power", "partition", "slow", "flap"}
