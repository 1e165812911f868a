"""scripts/bench_codec.py runs, checks its own decodes and writes rows of the documented schema."""

from __future__ import annotations

import json
import pathlib

from support.scripts_under_test import run_script

CODES = {(4, 1), (4, 2), (8, 2), (6, 3)}
FIELDS = {"impl", "k", "m", "size_bytes", "encode_gbps", "decode_gbps", "threads"}


def test_quick_run_writes_rows(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "out" / "bench.json"
    result = run_script("bench_codec.py", "--quick", "--threads", "2", "--json", str(target), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "encode GB/s" in result.stdout
    rows = json.loads(target.read_text())
    assert isinstance(rows, list)
    assert rows
    for row in rows:
        assert set(row) == FIELDS
        assert row["impl"] in {"ray_ckpt", "memcpy", "zfec", "pyeclib"}
        for key in ("k", "m", "size_bytes", "threads"):
            assert isinstance(row[key], int)
        assert row["size_bytes"] == 4 << 20
        assert row["threads"] >= 1
        for key in ("encode_gbps", "decode_gbps"):
            assert isinstance(row[key], float)
            assert row[key] > 0
    ray_ckpt = [r for r in rows if r["impl"] == "ray_ckpt"]
    assert {(r["k"], r["m"]) for r in ray_ckpt if r["threads"] == 1} == CODES
    assert {(r["k"], r["m"]) for r in ray_ckpt if r["threads"] == 2} == CODES
    assert sum(r["impl"] == "memcpy" for r in rows) == 1


def test_help() -> None:
    result = run_script("bench_codec.py", "--help", timeout=60)
    assert result.returncode == 0
    assert "--size-mib" in result.stdout
    assert "--quick" in result.stdout
