"""A model of ray_ckpt at scale: save stall, memory overhead, the control plane, recovery time
(in place, and with a full restart) and wasted time for 16 to 4096 nodes, against recovery
from remote (shared) storage. Pure computation, no Ray.

Inputs (``Params``; command-line options of the same names): per-node state size, GPUs (ranks)
per node, NIC bandwidth per node, aggregate shared-storage bandwidth, per-node MTBF, device->
host copy bandwidth per GPU, encode bandwidth per rank, Ray's detect+restart time and its growth
per node, the in-place detect and replace times, the control plane's costs (a registry call, a
rank's stage through one relay, the generation coordinator's work per member of a rendezvous),
the relay tree's fan-in and linger, the code RS(k, m), steps kept and the local copy, the
training step time. Calibration (``--calibration PATH ...``)
replaces defaults with what this repository's benchmarks measured (the JSON of
scripts/bench_recovery.py, bench_memory.py, bench_goodput.py, bench_control_plane.py,
bench_rendezvous.py):

    restore_efficiency   restore speed / raw Ray transfer speed (bench_recovery, 1 node killed,
                         largest size), i.e. the share of the network a peer restore achieves
    detect_restart_s     kill -> new worker group running, mean over failures (bench_goodput)
    detect_s, replace_s  in place: kill -> a survivor sees the failure; then -> every rank back at
                         its restore (the replacement's start and the rendezvous), means over the
                         in-place failures (bench_goodput)
    control_call_s       the registry's CPU per stage call (bench_control_plane, relay path,
                         largest N: registry CPU per step / registry calls per step)
    plan_s_per_rank      the registry's CPU for one rank's restore plan and record when every
                         rank asks (same row)
    coordinator_s_per_member  the generation coordinator's CPU per member for a rendezvous
                         (bench_rendezvous, relay path, largest N)
    relay_s_per_rank     a relay's CPU per rank it passes on (same row: the stores' CPU per step
                         / ranks / 2, each stage crossing two relays there)
    memory multiple      peer memory per step / state for the code (bench_memory)

Bandwidths are hardware figures and are never taken from the 2-core test machine (its
"network" is loopback). Without calibration the defaults are the documented figures from
the project's anchors (restart ~15 s with Ray's default health checks, ISA-L encode 7 GB/s per
core), this machine's measurements for the control plane and the in-place phases, and the
assumptions stated in ``Params``.

The formulas, per node count N (S = state per node, r = ranks per node, R = N * r ranks,
M = N-node MTBF, F = relay fan-in, D = relay depth: store levels between a leaf store and the
root of the relay tree):

    save stall            (S / r) / d2h                         (blocking copy; same for every N)
    commit latency        linger + sum over l = 0..D of (control_call + R / F^l * relay_per_rank)
                          (the call at level l carries the stages of R / F^l ranks; l = 0 is the
                          root's call to the registry)
    save background       max((k+m)/k * S / NIC, (S / r) / encode, commit latency)
                          (runs behind training)
    peer memory per node  keep * ((k+m)/k + local) * S
    restore plan          R * plan_per_rank                 (every rank asks its plan and its record;
                                                         the one registry answers them in turn)
    fetch                 S / (min(NIC, k * peer_send) * restore_efficiency)
                          (the failed node's ranks pull k shards each from k distinct peers in
                          parallel; every other rank reloads its local copy at the same time;
                          with one failed node no decode is needed: a rank's shards never live on
                          its own node)
    full restart          detect_restart + restart_per_node * N
    recovery, ray_ckpt    full restart + restore plan + fetch + load
    rendezvous            3 * sum over l = 0..D of (control_call + R / F^l * relay_per_rank)
                          + R * coordinator_per_member
                          (every rank's join climbs the relay tree merged with its subtree's, as
                          stages do; the answer that the generation formed and then its address
                          come down the same way; the run's one coordinator does a member's
                          bookkeeping in turn)
    recovery, in place    detect + replace + rendezvous + restore plan + fetch + load
                          (one worker replaced whatever N)
    recovery, storage     full restart + N * S / storage + load (every rank rereads its state)
    load                  (S / r) / d2h                         (host -> device, all ranks at once)
    checkpoint interval   Young's optimum sqrt(2 * stall * M), but no shorter than a step and
                          than one save takes: ray_ckpt max(step, save background, Young);
                          storage max(step, N * S / storage, Young) (async upload: same stall)
    waste per failure     recovery + interval / 2               (half an interval of work redone)
    wasted fraction       stall / interval + waste per failure / M   (capped at 1)

GEMINI (SOSP'23) setup, reproduced with ``--gemini``: 16 p4d.24xlarge nodes (8 A100 each),
400 Gbps network, FSx at 20 Gbps aggregate; GPT-2 100B, whose model states we take as 12 bytes
per parameter (fp32 master weights + two Adam moments; the same 12 B/param makes GEMINI's
quoted "42 minutes to checkpoint MT-NLG 530B at 20 Gbps"), i.e. 1.2 TB in all, 75 GB per node.
GEMINI reports 13x faster recovery than remote storage there.

    python scripts/scale_model.py [--calibration bench_recovery.json bench_goodput.json ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from benchutil import ROOT, add_json_flag, draw_plot, int_list, pyplot, render_table, save_figure, write_json

GB = 1e9
GBIT = 1e9 / 8
HOUR = 3600.0
COORDINATOR_S_PER_MEMBER = 1.2e-5  # see Params.coordinator_s_per_member
NODE_COUNTS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QUICK_NODE_COUNTS = (16, 256, 4096)
GEMINI_NODES = 16
GEMINI_CLAIM = 13.0
GEMINI_PARAMS = 100e9
BYTES_PER_PARAM = 12  # fp32 master weights + Adam m and v


@dataclasses.dataclass(frozen=True)
class Params:
    """Model inputs (SI units: bytes, bytes/s, seconds). Defaults: GEMINI's published setup."""

    state_per_node_bytes: float = GEMINI_PARAMS * BYTES_PER_PARAM / GEMINI_NODES  # 75 GB
    ranks_per_node: int = 8  # p4d.24xlarge: 8 A100
    nic_bytes_per_s: float = 400 * GBIT  # 400 Gbps = 50 GB/s
    peer_send_bytes_per_s: float | None = None  # what one peer sends one puller; None: the NIC
    storage_bytes_per_s: float = 20 * GBIT  # FSx, aggregate: 20 Gbps = 2.5 GB/s
    node_mtbf_s: float = 6000 * HOUR  # assumption: ~1 interruption per 6000 node-hours
    d2h_bytes_per_s: float = 12 * GB  # per GPU, all 8 copying at once (assumption: PCIe 4 x16 shared)
    encode_bytes_per_s: float = 7 * GB  # per rank (one core, ISA-L; anchors: 7-10 GB/s)
    detect_restart_s: float = 15.0  # anchors: Ray Train hard node kill -> new group ~15-20 s
    restart_per_node_s: float = 0.01  # assumption: the controller's, GCS's and rank 0's serial work per node
    detect_s: float = 0.5  # in place, measured here: a survivor's collective fails
    replace_s: float = 1.6  # in place, measured here: the replacement's start in a warm spare + the rendezvous
    control_call_s: float = 2.0e-3  # measured here: the registry's CPU per stage call (bench_control_plane)
    plan_s_per_rank: float = 6.5e-5  # measured here: the registry's CPU for one rank's plan and record
    coordinator_s_per_member: float = COORDINATOR_S_PER_MEMBER  # measured here (bench_rendezvous)
    relay_s_per_rank: float = 5e-6  # measured here: a relay's CPU per rank it passes on
    relay_fanin: int = 16  # RAY_CKPT_RELAY_FANIN
    relay_linger_s: float = 0.005  # RAY_CKPT_RELAY_LINGER_S
    restore_efficiency: float = 0.7  # restore speed / raw transfer speed (the project's goal)
    data_shards: int = 4
    parity_shards: int = 2
    keep_committed: int = 2
    local_copy: bool = True
    memory_multiple: float | None = None  # measured peer memory / state per step; None: (k+m)/k
    step_time_s: float = 10.0  # assumption, for the interval and wasted-time columns only

    def __post_init__(self) -> None:
        for name in (
            "state_per_node_bytes",
            "nic_bytes_per_s",
            "storage_bytes_per_s",
            "node_mtbf_s",
            "d2h_bytes_per_s",
            "encode_bytes_per_s",
            "step_time_s",
            "control_call_s",
            "plan_s_per_rank",
            "relay_s_per_rank",
            "coordinator_s_per_member",
        ):
            _positive(name, getattr(self, name))
        for name in ("restart_per_node_s", "detect_s", "replace_s", "relay_linger_s"):
            _finite(name, getattr(self, name))
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        _int("relay_fanin", self.relay_fanin, 1)
        if self.peer_send_bytes_per_s is not None:
            _positive("peer_send_bytes_per_s", self.peer_send_bytes_per_s)
        if self.memory_multiple is not None:
            _positive("memory_multiple", self.memory_multiple)
        _finite("detect_restart_s", self.detect_restart_s)
        if self.detect_restart_s < 0:
            raise ValueError(f"detect_restart_s must be >= 0, got {self.detect_restart_s!r}")
        _finite("restore_efficiency", self.restore_efficiency)
        if not 0 < self.restore_efficiency <= 1:
            raise ValueError(f"restore_efficiency must be in (0, 1], got {self.restore_efficiency!r}")
        _int("ranks_per_node", self.ranks_per_node, 1)
        _int("data_shards", self.data_shards, 1)
        _int("parity_shards", self.parity_shards, 0)
        _int("keep_committed", self.keep_committed, 1)
        if not isinstance(self.local_copy, bool):
            raise ValueError(f"local_copy must be a bool, got {self.local_copy!r}")

    @property
    def code_overhead(self) -> float:
        """Peer memory (and network) per saved byte: (k+m)/k, or the measured multiple."""
        if self.memory_multiple is not None:
            return self.memory_multiple
        return (self.data_shards + self.parity_shards) / self.data_shards


def _finite(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _positive(name: str, value: Any) -> None:
    _finite(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def relay_depth(nodes: int, fanin: int) -> int:
    """Store levels between the deepest leaf store and the root of the relay tree of ``nodes``
    stores (``ray_ckpt.core.relay.subtrees``: the rest split into ``fanin`` near-equal runs)."""
    depth = 0
    while nodes > 1:
        nodes = -(-(nodes - 1) // fanin)
        depth += 1
    return depth


def commit_latency(nodes: int, params: Params) -> float:
    """From a step's last stage to its commit: up the relay tree to the registry (see the formulas)."""
    ranks = nodes * params.ranks_per_node
    calls = range(relay_depth(nodes, params.relay_fanin) + 1)
    carried = (ranks / params.relay_fanin**level for level in calls)
    return params.relay_linger_s + sum(params.control_call_s + r * params.relay_s_per_rank for r in carried)


def rendezvous_latency(nodes: int, params: Params) -> float:
    """From the last rank's join to every rank holding the new generation's address: up and down
    the relay tree (see the formulas)."""
    ranks = nodes * params.ranks_per_node
    calls = range(relay_depth(nodes, params.relay_fanin) + 1)
    climb = sum(params.control_call_s + ranks / params.relay_fanin**level * params.relay_s_per_rank for level in calls)
    return 3 * climb + ranks * params.coordinator_s_per_member


def model(nodes: int, params: Params) -> dict[str, Any]:
    """One row of the model for ``nodes`` nodes (see the module docstring for the formulas)."""
    _int("nodes", nodes, 2)
    k, m = params.data_shards, params.parity_shards
    if nodes < k + m + 1:
        raise ValueError(
            f"RS({k},{m}) needs k+m+1 = {k + m + 1} nodes (shards on k+m distinct nodes other than the "
            f"rank's own), got {nodes}"
        )
    state = params.state_per_node_bytes
    per_rank = state / params.ranks_per_node
    nic = params.nic_bytes_per_s
    peer = params.peer_send_bytes_per_s if params.peer_send_bytes_per_s is not None else nic
    cluster_mtbf = params.node_mtbf_s / nodes

    ranks = nodes * params.ranks_per_node
    stall = per_rank / params.d2h_bytes_per_s
    commit = commit_latency(nodes, params)
    background = max(params.code_overhead * state / nic, per_rank / params.encode_bytes_per_s, commit)
    memory_multiple = params.keep_committed * (params.code_overhead + (1.0 if params.local_copy else 0.0))
    load = per_rank / params.d2h_bytes_per_s
    fetch = state / (min(nic, k * peer) * params.restore_efficiency)
    plan = ranks * params.plan_s_per_rank
    restart = params.detect_restart_s + params.restart_per_node_s * nodes
    recovery_ours = restart + plan + fetch + load
    joins = rendezvous_latency(nodes, params)
    rejoin = params.detect_s + params.replace_s + joins
    recovery_in_place = rejoin + plan + fetch + load
    storage_read = nodes * state / params.storage_bytes_per_s
    recovery_storage = restart + storage_read + load

    young = math.sqrt(2 * stall * cluster_mtbf)  # the interval that minimises stall + redone work
    interval_ours = max(params.step_time_s, background, young)
    storage_write = nodes * state / params.storage_bytes_per_s
    interval_storage = max(params.step_time_s, storage_write, young)
    waste_ours = recovery_ours + interval_ours / 2
    waste_in_place = recovery_in_place + interval_ours / 2
    waste_storage = recovery_storage + interval_storage / 2
    return {
        "nodes": nodes,
        "ranks": ranks,
        "total_state_bytes": nodes * state,
        "save_stall_s": stall,
        "commit_s": commit,
        "relay_depth": relay_depth(nodes, params.relay_fanin),
        "save_background_s": background,
        "peer_memory_bytes_per_node": memory_multiple * state,
        "peer_memory_multiple": memory_multiple,
        "restore_plan_s": plan,
        "in_place_joins_s": joins,
        "restart_s": restart,
        "recovery_ray_ckpt_s": recovery_ours,
        "recovery_in_place_s": recovery_in_place,
        "recovery_storage_s": recovery_storage,
        "recovery_speedup": recovery_storage / recovery_ours,
        "recovery_speedup_in_place": recovery_storage / recovery_in_place,
        "retrieval_speedup": (storage_read + load) / (fetch + load),
        "cluster_mtbf_s": cluster_mtbf,
        "interval_ray_ckpt_s": interval_ours,
        "interval_storage_s": interval_storage,
        "waste_per_failure_ray_ckpt_s": waste_ours,
        "waste_per_failure_in_place_s": waste_in_place,
        "waste_per_failure_storage_s": waste_storage,
        "wasted_fraction_ray_ckpt": min(1.0, stall / interval_ours + waste_ours / cluster_mtbf),
        "wasted_fraction_in_place": min(1.0, stall / interval_ours + waste_in_place / cluster_mtbf),
        "wasted_fraction_storage": min(1.0, stall / interval_storage + waste_storage / cluster_mtbf),
    }


def sweep(params: Params, node_counts: Sequence[int] = NODE_COUNTS) -> list[dict[str, Any]]:
    if not node_counts:
        raise ValueError("node_counts must not be empty")
    return [model(n, params) for n in node_counts]


def gemini(params: Params | None = None) -> dict[str, Any]:
    """GEMINI's setup (16 p4d, 400 Gbps, FSx 20 Gbps, GPT-2 100B at 12 B/param) with the
    calibrated ray_ckpt figures from ``params`` (restart, efficiency, code), against the 13x claim."""
    base = params or Params()
    setup = dataclasses.replace(
        base,
        state_per_node_bytes=GEMINI_PARAMS * BYTES_PER_PARAM / GEMINI_NODES,
        ranks_per_node=8,
        nic_bytes_per_s=400 * GBIT,
        peer_send_bytes_per_s=None,
        storage_bytes_per_s=20 * GBIT,
    )
    row = model(GEMINI_NODES, setup)
    # the detect+restart time at which the model gives GEMINI's ratio: (R + A) / (R + B) = claim
    storage_part = row["recovery_storage_s"] - row["restart_s"]
    ours_part = row["recovery_ray_ckpt_s"] - row["restart_s"]
    restart_for_claim = (storage_part - GEMINI_CLAIM * ours_part) / (GEMINI_CLAIM - 1)
    return {
        "setup": {
            "nodes": GEMINI_NODES,
            "gpus_per_node": 8,
            "model_params": GEMINI_PARAMS,
            "bytes_per_param": BYTES_PER_PARAM,
            "total_state_bytes": GEMINI_PARAMS * BYTES_PER_PARAM,
            "nic_gbps": 400,
            "storage_gbps": 20,
            "detect_restart_s": setup.detect_restart_s,
            "restore_efficiency": setup.restore_efficiency,
            "code": [setup.data_shards, setup.parity_shards],
        },
        "row": row,
        "claim": GEMINI_CLAIM,
        "model_speedup": row["recovery_speedup"],
        "model_vs_claim": row["recovery_speedup"] / GEMINI_CLAIM,
        "restart_s_for_claim": restart_for_claim - setup.restart_per_node_s * GEMINI_NODES,
    }


# ---- calibration ----------------------------------------------------------------------------------


def calibrate(params: Params, documents: Sequence[dict[str, Any]]) -> tuple[Params, dict[str, Any]]:
    """Replace defaults with measured figures from benchmark JSON documents (recognised by their
    ``benchmark`` key). Returns the new params and what was taken from where."""
    changes: dict[str, Any] = {}
    used: dict[str, Any] = {}
    for doc in documents:
        if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "registry_cpu_s_per_step" in doc[0]:
            doc = {"benchmark": "control_plane", "rows": doc}  # bench_control_plane writes its rows alone
        if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "rendezvous_s" in doc[0]:
            doc = {"benchmark": "rendezvous", "rows": doc}  # so does bench_rendezvous
        kind = doc.get("benchmark") if isinstance(doc, dict) else None
        if kind == "recovery":
            ratios = [r for r in doc.get("ratios", []) if r.get("killed") == 1 and r.get("vs_raw")]
            if ratios:
                largest = max(ratios, key=lambda r: r["size_bytes"])
                changes["restore_efficiency"] = min(1.0, float(largest["vs_raw"]))
                used["restore_efficiency"] = f"bench_recovery, {largest['size_bytes']} B, 1 node killed"
        elif kind == "goodput":
            phases = [
                f["phases"]
                for f in doc.get("ray_ckpt", {}).get("failures", [])
                if f.get("phases", {}).get("restart") is not None
            ]
            if phases:
                values = [float(p.get("detect") or 0.0) + float(p["restart"]) for p in phases]
                changes["detect_restart_s"] = sum(values) / len(values)
                used["detect_restart_s"] = f"bench_goodput, mean of {len(values)} failures"
            rejoins = [
                f["phases"]
                for f in doc.get("in_place", {}).get("failures", [])
                if f.get("phases", {}).get("replace") is not None
            ]
            if rejoins:
                changes["detect_s"] = sum(float(p.get("detect") or 0.0) for p in rejoins) / len(rejoins)
                changes["replace_s"] = sum(
                    float(p["replace"]) + float(p.get("rendezvous") or 0.0) for p in rejoins
                ) / len(rejoins)
                used["detect_s"] = used["replace_s"] = f"bench_goodput, mean of {len(rejoins)} in-place failures"
        elif kind == "control_plane":
            rows = [r for r in doc.get("rows", []) if r.get("path") == "relay" and r.get("registry_calls_per_step")]
            if rows:
                largest = max(rows, key=lambda r: r["ranks"])
                changes["control_call_s"] = float(largest["registry_cpu_s_per_step"]) / float(
                    largest["registry_calls_per_step"]
                )
                changes["relay_s_per_rank"] = float(largest["relay_cpu_s_per_step"]) / largest["ranks"] / 2
                if largest.get("registry_cpu_s_per_plan"):
                    changes["plan_s_per_rank"] = float(largest["registry_cpu_s_per_plan"])
                    used["plan_s_per_rank"] = f"bench_control_plane, {largest['ranks']} ranks, every rank's plan"
                used["control_call_s"] = used["relay_s_per_rank"] = (
                    f"bench_control_plane, {largest['ranks']} ranks, relay path"
                )
        elif kind == "rendezvous":
            rows = [r for r in doc.get("rows", []) if r.get("path") == "relay" and r.get("members")]
            if rows:
                largest = max(rows, key=lambda r: r["members"])
                changes["coordinator_s_per_member"] = float(largest["coordinator_cpu_s_per_member"]["rendezvous"])
                used["coordinator_s_per_member"] = f"bench_rendezvous, {largest['members']} members, relay path"
        elif kind == "memory":
            for row in doc.get("rows", []):
                if (row.get("data_shards"), row.get("parity_shards")) == (params.data_shards, params.parity_shards):
                    changes["memory_multiple"] = float(row["multiple"])
                    used["memory_multiple"] = f"bench_memory, RS({params.data_shards},{params.parity_shards})"
        else:
            raise ValueError(f"not a benchmark JSON of this repository (no known 'benchmark' key): {kind!r}")
    return dataclasses.replace(params, **changes), used


# ---- output ---------------------------------------------------------------------------------------


def _human_bytes(value: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _seconds(value: float) -> str:
    if value >= 2 * HOUR:
        return f"{value / HOUR:.1f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.2f} s"


def _peer_memory(row: dict[str, Any]) -> str:
    return f"{_human_bytes(row['peer_memory_bytes_per_node'])} ({row['peer_memory_multiple']:.1f}x)"


def format_table(rows: list[dict[str, Any]]) -> str:
    columns: list[tuple[str, Any]] = [
        ("nodes", lambda r: str(r["nodes"])),
        ("total state", lambda r: _human_bytes(r["total_state_bytes"])),
        ("stall", lambda r: _seconds(r["save_stall_s"])),
        ("commit", lambda r: _seconds(r["commit_s"])),
        ("bg/save", lambda r: _seconds(r["save_background_s"])),
        ("peer mem/node", _peer_memory),
        ("plan", lambda r: _seconds(r["restore_plan_s"])),
        ("restart", lambda r: _seconds(r["restart_s"])),
        ("recover in place", lambda r: _seconds(r["recovery_in_place_s"])),
        ("recover restart", lambda r: _seconds(r["recovery_ray_ckpt_s"])),
        ("recover storage", lambda r: _seconds(r["recovery_storage_s"])),
        ("speedup", lambda r: f"{r['recovery_speedup']:.1f}x"),
        ("cluster MTBF", lambda r: _seconds(r["cluster_mtbf_s"])),
        ("waste/fail in place", lambda r: _seconds(r["waste_per_failure_in_place_s"])),
        ("waste/fail restart", lambda r: _seconds(r["waste_per_failure_ray_ckpt_s"])),
        ("waste/fail storage", lambda r: _seconds(r["waste_per_failure_storage_s"])),
        ("wasted% in place", lambda r: f"{100 * r['wasted_fraction_in_place']:.1f}"),
        ("wasted% restart", lambda r: f"{100 * r['wasted_fraction_ray_ckpt']:.1f}"),
        ("wasted% storage", lambda r: f"{100 * r['wasted_fraction_storage']:.1f}"),
    ]
    lines = [tuple(name for name, _ in columns)] + [tuple(cell(r) for _, cell in columns) for r in rows]
    return render_table(lines)


def plot(rows: list[dict[str, Any]], comparison: dict[str, Any], path: pathlib.Path) -> None:
    plt = pyplot()
    nodes = [r["nodes"] for r in rows]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    left.plot(nodes, [r["recovery_in_place_s"] for r in rows], "o-", label="ray_ckpt in place")
    left.plot(nodes, [r["recovery_ray_ckpt_s"] for r in rows], "^-", label="ray_ckpt, full restart")
    left.plot(nodes, [r["recovery_storage_s"] for r in rows], "s-", label="remote storage (full restart)")
    gem = comparison["row"]
    left.plot(
        [GEMINI_NODES],
        [gem["recovery_storage_s"] / GEMINI_CLAIM],
        "*",
        markersize=14,
        label=f"GEMINI claim: storage / {GEMINI_CLAIM:.0f}",
    )
    left.set_yscale("log")
    left.set_ylabel("recovery time per failure, s")
    left.set_title("Recovery after one node failure (model)")
    middle.plot(nodes, [r["commit_s"] for r in rows], "o-", label="commit latency (relay tree)")
    middle.plot(nodes, [r["restore_plan_s"] for r in rows], "s-", label="restore plans of all ranks")
    middle.plot(nodes, [r["in_place_joins_s"] for r in rows], "d-", label="in place: the rendezvous up the relay tree")
    middle.plot(nodes, [r["restart_s"] for r in rows], "^-", label="detect + full restart")
    middle.set_yscale("log")
    middle.set_ylabel("seconds")
    middle.set_title("Control plane and restart (model)")
    right.plot(nodes, [100 * r["wasted_fraction_in_place"] for r in rows], "o-", label="ray_ckpt in place")
    right.plot(nodes, [100 * r["wasted_fraction_ray_ckpt"] for r in rows], "^-", label="ray_ckpt, full restart")
    right.plot(nodes, [100 * r["wasted_fraction_storage"] for r in rows], "s-", label="remote storage")
    right.set_ylabel("wasted share of training time, %")
    right.set_title("Stall + redone work + recovery (model)")
    for axis in (left, middle, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("nodes")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    save_figure(fig, path)


def _node_counts(text: str) -> list[int]:
    return int_list(text, "node counts", 2)


def main(argv: list[str] | None = None) -> int:
    defaults = Params()
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )

    def option(flag: str, field: str, kind: type, text: str) -> None:
        """``flag`` for the Params ``field`` of another name: in the field's units, with the
        field's default; the help names its value after the flag."""
        metavar = flag.removeprefix("--").replace("-", "_").upper()
        parser.add_argument(flag, dest=field, metavar=metavar, type=kind, default=getattr(defaults, field), help=text)

    parser.add_argument("--nodes", type=_node_counts, default=list(NODE_COUNTS), help="node counts, comma-separated")
    parser.add_argument("--state-gb", type=float, default=defaults.state_per_node_bytes / GB, help="state per node")
    parser.add_argument("--ranks-per-node", type=int, default=defaults.ranks_per_node, help="GPUs (ranks) per node")
    parser.add_argument("--nic-gbps", type=float, default=defaults.nic_bytes_per_s / GBIT, help="NIC per node")
    parser.add_argument(
        "--storage-gbps", type=float, default=defaults.storage_bytes_per_s / GBIT, help="shared storage, aggregate"
    )
    parser.add_argument("--mtbf-hours", type=float, default=defaults.node_mtbf_s / HOUR, help="per-node MTBF")
    parser.add_argument("--d2h-gbs", type=float, default=defaults.d2h_bytes_per_s / GB, help="GB/s per GPU")
    parser.add_argument("--encode-gbs", type=float, default=defaults.encode_bytes_per_s / GB, help="GB/s per rank")
    option("--restart-s", "detect_restart_s", float, "detect + restart")
    parser.add_argument(
        "--restart-per-node-s", type=float, default=defaults.restart_per_node_s, help="restart's growth per node"
    )
    parser.add_argument("--detect-s", type=float, default=defaults.detect_s, help="in place: detection")
    parser.add_argument("--replace-s", type=float, default=defaults.replace_s, help="in place: replace + rendezvous")
    parser.add_argument("--control-call-s", type=float, default=defaults.control_call_s, help="registry CPU per call")
    parser.add_argument("--plan-s-per-rank", type=float, default=defaults.plan_s_per_rank, help="registry CPU per plan")
    parser.add_argument(
        "--relay-s-per-rank", type=float, default=defaults.relay_s_per_rank, help="relay CPU per rank passed on"
    )
    parser.add_argument(
        "--coordinator-s-per-member",
        type=float,
        default=defaults.coordinator_s_per_member,
        help="generation coordinator CPU per member of a rendezvous",
    )
    option("--fanin", "relay_fanin", int, "relay tree fan-in")
    option("--efficiency", "restore_efficiency", float, "restore / raw speed")
    option("--k", "data_shards", int, "data shards")
    option("--m", "parity_shards", int, "parity shards")
    option("--keep", "keep_committed", int, "committed steps kept")
    parser.add_argument("--no-local-copy", action="store_true", help="model CheckpointConfig(local_copy=False)")
    option("--step-s", "step_time_s", float, "training step time")
    parser.add_argument(
        "--calibration",
        type=pathlib.Path,
        nargs="+",
        metavar="PATH",
        help=(
            "JSON written by bench_recovery.py / bench_memory.py / bench_goodput.py / bench_control_plane.py / "
            "bench_rendezvous.py (--json)"
        ),
    )
    parser.add_argument("--quick", action="store_true", help=f"node counts {QUICK_NODE_COUNTS} only, no plot")
    add_json_flag(parser)
    parser.add_argument("--plots", type=pathlib.Path, default=ROOT / "docs" / "img", metavar="DIR", help="PNG folder")
    args = parser.parse_args(argv)
    fields = {field.name for field in dataclasses.fields(Params)}
    try:
        params = Params(
            # the flags in their fields' units: named after their fields, or routed to them by option()
            **{name: value for name, value in vars(args).items() if name in fields},
            state_per_node_bytes=args.state_gb * GB,
            nic_bytes_per_s=args.nic_gbps * GBIT,
            storage_bytes_per_s=args.storage_gbps * GBIT,
            node_mtbf_s=args.mtbf_hours * HOUR,
            d2h_bytes_per_s=args.d2h_gbs * GB,
            encode_bytes_per_s=args.encode_gbs * GB,
            local_copy=not args.no_local_copy,
        )
        used: dict[str, Any] = {}
        if args.calibration:
            documents = [json.loads(path.read_text()) for path in args.calibration]
            params, used = calibrate(params, documents)
        rows = sweep(params, QUICK_NODE_COUNTS if args.quick else args.nodes)
        comparison = gemini(params)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"state {params.state_per_node_bytes / GB:.1f} GB/node on {params.ranks_per_node} ranks, NIC "
        f"{params.nic_bytes_per_s / GBIT:.0f} Gbps, storage {params.storage_bytes_per_s / GBIT:.0f} Gbps aggregate, "
        f"RS({params.data_shards},{params.parity_shards}) keep {params.keep_committed}"
        f"{' + local copy' if params.local_copy else ''}, restart {params.detect_restart_s:.1f} s "
        f"+ {params.restart_per_node_s * 1000:.0f} ms/node, in place {params.detect_s:.1f} + {params.replace_s:.1f} s, "
        f"registry call {params.control_call_s * 1000:.2f} ms, relay {params.relay_s_per_rank * 1e6:.1f} us/rank "
        f"(fan-in {params.relay_fanin}), "
        f"restore efficiency {params.restore_efficiency:.2f}, node MTBF {params.node_mtbf_s / HOUR:.0f} h, "
        f"step {params.step_time_s:.1f} s"
    )
    for name, source in used.items():
        print(f"calibrated {name} from {source}")
    print(format_table(rows))
    g = comparison["row"]
    print(
        f"\nGEMINI setup (16 p4d, 400 Gbps, FSx 20 Gbps, GPT-2 100B = "
        f"{_human_bytes(comparison['setup']['total_state_bytes'])} at {BYTES_PER_PARAM} B/param): recovery "
        f"ray_ckpt {g['recovery_ray_ckpt_s']:.1f} s vs remote storage {g['recovery_storage_s']:.0f} s = "
        f"{comparison['model_speedup']:.1f}x faster (GEMINI reports {GEMINI_CLAIM:.0f}x); retrieval alone "
        f"{g['retrieval_speedup']:.0f}x; the model gives {GEMINI_CLAIM:.0f}x with a detect+restart of "
        f"{comparison['restart_s_for_claim']:.0f} s"
    )
    document = {
        "benchmark": "scale_model",
        "params": dataclasses.asdict(params),
        "calibrated_from": used,
        "rows": rows,
        "gemini": comparison,
    }
    write_json(args.json, document)
    if not args.quick:
        draw_plot(args.plots, "scale_model.png", lambda path: plot(rows, comparison, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
