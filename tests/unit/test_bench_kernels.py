"""scripts/bench_kernels.py times every kernel this CPU runs against ISA-L's function of the same
instruction set, checks each parity against ISA-L's and writes rows of the documented schema."""

from __future__ import annotations

import json
import pathlib

from support.scripts_under_test import run_script

from ray_ckpt.core import _gf256


def test_a_short_run_writes_a_row_per_kernel_and_code(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "out" / "kernels.json"
    options = ["--codes", "4,2", "3,3", "--sizes-mib", "1", "--repeats", "2", "--json", str(target)]
    result = run_script("bench_kernels.py", *options, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ours / ISA-L" in result.stdout
    rows = json.loads(target.read_text())["rows"]
    expected = [k for k in ("avx2", "gfni-avx2", "gfni-avx512") if k in _gf256.kernels()]
    assert [(r["kernel"], r["k"], r["m"]) for r in rows] == [(k, 4, 2) for k in expected] + [
        (k, 3, 3) for k in expected
    ]
    for row in rows:
        assert row["size_bytes"] == (1 << 20) // row["k"] * row["k"]
        assert row["ours_gbps"] > 0 and row["isal_gbps"] > 0
        assert abs(row["ratio"] - row["ours_gbps"] / row["isal_gbps"]) < 1e-9


def test_a_malformed_code_is_refused_with_its_text() -> None:
    result = run_script("bench_kernels.py", "--codes", "4x2", timeout=60)
    assert result.returncode == 2 and "'4x2'" in result.stderr
