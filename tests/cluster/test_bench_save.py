"""scripts/bench_save.py: a quick run measures every implementation and writes well-formed rows."""

from __future__ import annotations

import pathlib

import pytest
from support import pace
from support.scripts_under_test import run_quick, run_script

FIELDS = {"size_bytes", "impl", "blocking_s"}
IMPLS = {"ray_ckpt", "ray_ckpt_back_to_back", "memcpy", "torch_save", "dcp_async_save", "ray_train_report"}


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_quick_run_writes_a_row_per_impl(tmp_path: pathlib.Path) -> None:
    result, rows = run_quick("bench_save.py", tmp_path, timeout=pace.bound(280))
    for text in ("blocking time per save", "ckpt/memcpy", "dcp/ckpt", "train/ckpt", "poll interval", "pushed bare"):
        assert text in result.stdout
    assert isinstance(rows, list)
    for row in rows:
        assert set(row) == FIELDS
        assert row["size_bytes"] == 16 << 20
        assert isinstance(row["blocking_s"], float)
        assert row["blocking_s"] > 0
    impls = [row["impl"] for row in rows]
    assert sorted(impls) == sorted(IMPLS)  # exactly one row per impl for the one size


def test_help() -> None:
    result = run_script("bench_save.py", "--help", timeout=pace.bound(60))
    assert result.returncode == 0
    for option in ("--sizes-mib", "--repeats", "--quick", "--json"):
        assert option in result.stdout
