"""scripts/bench_save.py: a quick run measures every implementation and writes well-formed rows."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pace
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_save.py"
FIELDS = {"size_bytes", "impl", "blocking_s"}
IMPLS = {"ray_ckpt", "ray_ckpt_back_to_back", "memcpy", "torch_save", "dcp_async_save", "ray_train_report"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # the script starts its own clusters
    return env


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_quick_run_writes_a_row_per_impl(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "out" / "bench_save.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(target)],
        capture_output=True,
        text=True,
        timeout=pace.bound(280),
        env=_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for text in ("blocking time per save", "ckpt/memcpy", "dcp/ckpt", "train/ckpt", "poll interval", "pushed bare"):
        assert text in result.stdout
    rows = json.loads(target.read_text())
    assert isinstance(rows, list)
    for row in rows:
        assert set(row) == FIELDS
        assert row["size_bytes"] == 16 << 20
        assert isinstance(row["blocking_s"], float)
        assert row["blocking_s"] > 0
    impls = [row["impl"] for row in rows]
    assert sorted(impls) == sorted(IMPLS)  # exactly one row per impl for the one size


def test_help() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=pace.bound(60), check=False
    )
    assert result.returncode == 0
    for option in ("--sizes-mib", "--repeats", "--quick", "--json"):
        assert option in result.stdout
