"""scripts/bench_restore.py: a quick run restores bit-exact after two node kills and writes rows."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pace
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_restore.py"
FIELDS = {"size_bytes", "restore_s", "raw_transfer_s", "ratio", "object_pull_s", "fan_in_s"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # the script starts its own cluster
    return env


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_quick_run_restores_bit_exact_and_writes_rows(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "out" / "bench.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(target)],
        capture_output=True,
        text=True,
        timeout=pace.bound(540),
        env=_env(),
        check=False,
    )
    # the script exits non-zero when the restored state is not bit-exact
    assert result.returncode == 0, result.stderr[-4000:]
    assert "16 MiB:" in result.stdout
    assert "restored bit-exact" in result.stdout
    for phase in ("locate s", "fetch s", "decode s", "load s"):
        assert phase in result.stdout
    rows = json.loads(target.read_text())
    assert isinstance(rows, list)
    assert len(rows) == 1
    row = rows[0]
    assert set(row) == FIELDS
    assert row["size_bytes"] == 16 << 20
    for key in ("restore_s", "raw_transfer_s", "ratio", "object_pull_s", "fan_in_s"):
        assert isinstance(row[key], float)
        assert row[key] > 0
    assert row["ratio"] == pytest.approx(row["raw_transfer_s"] / row["restore_s"])


def test_help() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=pace.bound(60), check=False
    )
    assert result.returncode == 0
    for option in ("--sizes-mib", "--quick", "--json"):
        assert option in result.stdout
