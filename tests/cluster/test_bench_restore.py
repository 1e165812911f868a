"""scripts/bench_restore.py: a quick run restores bit-exact after two node kills and writes rows."""

from __future__ import annotations

import pathlib

import pytest
from support import pace
from support.scripts_under_test import run_quick, run_script

FIELDS = {"size_bytes", "restore_s", "raw_transfer_s", "ratio", "object_pull_s", "fan_in_s"}


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_quick_run_restores_bit_exact_and_writes_rows(tmp_path: pathlib.Path) -> None:
    # the script exits non-zero when the restored state is not bit-exact
    result, rows = run_quick("bench_restore.py", tmp_path, timeout=pace.bound(540))
    assert "16 MiB:" in result.stdout
    assert "restored bit-exact" in result.stdout
    for phase in ("locate s", "fetch s", "decode s", "load s"):
        assert phase in result.stdout
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
    result = run_script("bench_restore.py", "--help", timeout=pace.bound(60))
    assert result.returncode == 0
    for option in ("--sizes-mib", "--quick", "--json"):
        assert option in result.stdout
