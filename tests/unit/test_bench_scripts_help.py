"""Every benchmark and lab script's --help: it works without a cluster and names the script's options."""

from __future__ import annotations

import pytest
from support import pace
from support.scripts_under_test import run_script


@pytest.mark.parametrize(
    "script, options",
    [
        ("bench_recovery.py", ("--sizes-mib", "--quick", "--json", "--plots")),
        ("bench_memory.py", ("--state-mib", "--quick", "--json", "--plots")),
        ("bench_goodput.py", ("--steps", "--mtbf-steps", "--seed", "--quick", "--json", "--plots")),
        ("scale_model.py", ("--calibration", "--nodes", "--quick", "--json", "--plots")),
        ("bench_reshard.py", ("--state-mib", "--repeats", "--quick", "--json")),
        (
            "bench_overhead.py",
            ("--steps", "--every", "--state-mib", "--compute-s", "--shapes", "--modes", "--quick", "--json"),
        ),
        ("bench_dcp.py", ("--state-mib", "--repeats", "--quick", "--json")),
        ("bench_fsdp2_recovery.py", ("--steps", "--kill-after", "--step-sleep-s", "--seed", "--json")),
        ("bench_full_cluster.py", ("--kill", "--add-after-s", "--runs", "--json")),
        ("lab.py", ("--nodes", "--cpus", "--rate-gbit", "--no-service", "--clean")),
        ("lab_campaign.py", ("--quick", "--trials", "--seed", "--rate-gbit", "--at-step", "--json")),
    ],
)
def test_help(script: str, options: tuple[str, ...]) -> None:
    result = run_script(script, "--help", timeout=pace.bound(120))
    assert result.returncode == 0, result.stderr
    for option in options:
        assert option in result.stdout
