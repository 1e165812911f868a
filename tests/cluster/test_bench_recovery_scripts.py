"""The benchmark scripts (bench_recovery, bench_memory, bench_goodput, bench_overhead, bench_dcp):
quick runs write JSON of the documented shape (their --help: tests/unit/test_bench_scripts_help.py)."""

from __future__ import annotations

import math
import pathlib
import subprocess
from typing import Any

import pytest
from support import pace
from support.scripts_under_test import run_quick


def _run(
    script: str,
    folder: pathlib.Path,
    timeout: float,
    benchmark: str | None = None,
    plots: bool = True,
    options: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """A quick run (``run_quick``) with ``options``, and --plots where it has them, which it
    must not draw; its JSON says it is ``benchmark``."""
    options = (*options, "--plots", str(folder)) if plots else options
    result, document = run_quick(script, folder, *options, timeout=timeout)
    assert not list(folder.glob("*.png")), "--quick must not write plots"
    if benchmark is not None:
        assert document["benchmark"] == benchmark
    return result, document


def _positive(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_bench_recovery_quick(tmp_path: pathlib.Path) -> None:
    result, document = _run("bench_recovery.py", tmp_path, pace.bound(540), "recovery")
    assert "restored bit-exact" in result.stdout
    assert document["skipped"] == []
    rows = document["rows"]
    for row in rows:
        assert set(row) == {"size_bytes", "killed", "impl", "seconds"}
        assert row["size_bytes"] == 8 << 20
        assert _positive(row["seconds"])
    assert sorted((r["impl"], r["killed"]) for r in rows) == sorted(
        [
            ("ray_ckpt", 1),
            ("ray_ckpt", 2),
            ("raw_ray_transfer", 0),
            ("raw_ray_transfer_single", 0),
            ("ray_train_storage", 0),
            ("dcp_load", 0),
        ]
    )
    seconds = {(r["impl"], r["killed"]): r["seconds"] for r in rows}
    ratios = document["ratios"]
    assert sorted(r["killed"] for r in ratios) == [1, 2]
    for ratio in ratios:
        assert set(ratio) == {"size_bytes", "killed", "vs_raw", "vs_ray_train_storage", "vs_dcp"}
        ours = seconds[("ray_ckpt", ratio["killed"])]
        assert ratio["vs_raw"] == pytest.approx(seconds[("raw_ray_transfer", 0)] / ours)
        assert ratio["vs_ray_train_storage"] == pytest.approx(seconds[("ray_train_storage", 0)] / ours)
        assert ratio["vs_dcp"] == pytest.approx(seconds[("dcp_load", 0)] / ours)


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_bench_memory_quick(tmp_path: pathlib.Path) -> None:
    _, document = _run("bench_memory.py", tmp_path, pace.bound(540), "memory")
    assert document["state_bytes"] == 4 << 20
    rows = document["rows"]
    codes = [(r["scheme"], r["data_shards"], r["parity_shards"]) for r in rows]
    assert codes == [
        ("rs", 2, 1),
        ("rs", 4, 2),
        ("rs", 6, 3),
        ("rs", 8, 2),
        ("replication", 1, 1),
        ("replication", 1, 2),
        ("replication", 1, 3),
    ]
    for row in rows:
        assert row["tolerates"] == row["parity_shards"]
        assert row["peer_bytes"] == sum(row["per_node_bytes"])
        assert len(row["per_node_bytes"]) == row["data_shards"] + row["parity_shards"]
        # measured: the code's (k+m)/k of the payload, plus per-shard metadata, within 1%
        assert row["multiple"] == pytest.approx(row["expected_multiple"], rel=0.01)
        assert row["multiple"] >= row["expected_multiple"]
    replication = {r["parity_shards"]: r["peer_bytes"] for r in rows if r["scheme"] == "replication"}
    for row in rows:
        if row["scheme"] == "rs":
            assert row["peer_bytes"] < replication[row["parity_shards"]]


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_bench_goodput_quick(tmp_path: pathlib.Path) -> None:
    _, document = _run("bench_goodput.py", tmp_path, pace.bound(540), "goodput")
    assert len(document["schedule"]) == 1
    assert isinstance(document["baseline_every"], int)
    assert document["baseline_every"] >= 1
    for side in ("in_place", "ray_ckpt", "ray_train"):
        summary = document[side]
        assert len(summary["failures"]) == 1
        failure = summary["failures"][0]
        # back where it was at the kill: the first step after the restore redoes a lost one
        step, into = summary["step_time_s"], failure["into_step_s"]
        assert into >= 0 and failure["wasted_s"] == pytest.approx(
            failure["time_to_resume_s"] + (failure["steps_lost"] - 1) * step + min(step, into)
        )
        assert _positive(summary["wasted_per_failure_s"])
        assert _positive(summary["step_time_s"])
    assert all(s in ("local", "peers") for s in document["ray_ckpt"]["failures"][0]["sources"].values())
    in_place = document["in_place"]["failures"][0]
    assert in_place["mode"] == "in_place" and in_place["survivor_pids_before"] == in_place["survivor_pids_after"]
    assert set(in_place["sources"].values()) == {"local", "peers"}
    assert document["ratio_in_place"] == pytest.approx(
        document["ray_train"]["wasted_per_failure_s"] / document["in_place"]["wasted_per_failure_s"]
    )
    assert document["ratio"] == pytest.approx(
        document["ray_train"]["wasted_per_failure_s"] / document["ray_ckpt"]["wasted_per_failure_s"]
    )
    # the equal-stall replay: same kill, same resume time, steps lost for checkpoints every E
    every = document["equal_stall_every"]
    assert isinstance(every, int) and every >= 1
    assert _positive(document["baseline_stall_per_checkpoint_s"])
    measured = document["ray_train"]["failures"][0]
    replayed = document["ray_train_equal_stall"]["failures"][0]
    newest = measured["restored_step"] + measured["steps_lost"]
    assert replayed["steps_lost"] == newest - ((newest + 1) // every * every - 1)
    assert replayed["time_to_resume_s"] == measured["time_to_resume_s"]
    assert document["ratio_equal_stall"] == pytest.approx(
        document["ray_train_equal_stall"]["wasted_per_failure_s"] / document["ray_ckpt"]["wasted_per_failure_s"]
    )
    # in place is compared at its own stall: Ray Train every E' = ceil(stall per checkpoint / in place's per step)
    stall = document["in_place"]["mean_stall_s"]
    every_in_place = document["equal_stall_every_in_place"]
    assert every_in_place == max(1, math.ceil(document["baseline_stall_per_checkpoint_s"] / stall))
    assert document["ray_train_equal_stall_in_place"]["every"] == every_in_place
    assert document["ratio_in_place_equal_stall"] == pytest.approx(
        document["ray_train_equal_stall_in_place"]["wasted_per_failure_s"]
        / document["in_place"]["wasted_per_failure_s"]
    )


@pytest.mark.timeout(600)
def test_bench_overhead_quick(tmp_path: pathlib.Path) -> None:
    """The modes run the same job; ray_ckpt saves at the interval every="auto" chose (recorded,
    fewer saves than steps once it adapts past its warm-up); Ray Train every N-th. The smoke run
    leaves out the modes that differ from these by one argument (``ray_ckpt/1`` and
    ``ray_ckpt/N``: every, whose steps tests/unit/test_save_every.py checks; ``ray_ckpt/1
    ray-put``: the shards put through Ray, whose path tests/cluster/test_store_service.py
    covers); each mode is a job of its own, about 15 s here."""
    modes = ["none", "ray_ckpt/auto", "ray_train/N"]
    result, document = _run(
        "bench_overhead.py", tmp_path, pace.bound(540), "overhead", plots=False, options=("--modes", ",".join(modes))
    )
    rows = {row["mode"]: row for row in document["rows"]}
    assert list(rows) == modes
    steps = document["steps"]
    assert all(row["steps"] == steps for row in rows.values()), {mode: row["steps"] for mode, row in rows.items()}
    assert 1 <= rows["ray_ckpt/auto"]["saves"] < steps, rows["ray_ckpt/auto"]
    assert rows["ray_ckpt/auto"]["intervals"], "every='auto' recorded no interval"
    assert all(row["step_ratio"] > 0 and row["cpu_per_step_s"] > 0 for row in rows.values())
    assert "ray_ckpt/auto" in result.stdout


def test_bench_dcp_quick(tmp_path: pathlib.Path) -> None:
    """Five ways of saving, three of loading (each load checked bit-exact by the script, at 4
    ranks and at 2 after a node kill), every figure a positive time."""
    _, document = _run("bench_dcp.py", tmp_path, pace.bound(300), plots=False)
    assert list(document["saves"]) == [
        "ray_ckpt save", "dcp.save -> peers", "dcp.async_save -> peers", "dcp.save -> disk", "dcp.async_save -> disk",
    ]  # fmt: skip
    for times in document["saves"].values():
        assert all(_positive(t) for t in times["blocking_s"] + times["done_s"]), times
        assert all(b <= d for b, d in zip(times["blocking_s"], times["done_s"], strict=True)), times
    for pair in ("4 -> 4", "4 -> 2"):
        loads = document["loads"][pair]
        assert list(loads) == ["ray_ckpt restore", "dcp.load <- peers", "dcp.load <- disk"]
        assert all(_positive(t) for times in loads.values() for t in times), loads
