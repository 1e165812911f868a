"""A short randomized fault campaign: no restore ever returns a wrong, partial or mixed state."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from support import pace

pytestmark = pytest.mark.cluster

SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "fault_campaign.py"


@pytest.mark.timeout(600)
def test_short_fault_campaign_has_no_violations(ray_tmpdir: str, tmp_path: pathlib.Path) -> None:
    """Two random trials on 4 worker nodes of saves, torn saves, node/store/registry kills, bit
    flips, the cluster shrinking below k+m stores and regrowing, torn steps re-saved by the next
    group, saves abandoned by a replaced group while the next one restores or saves, and
    restores: every restore is bit-exact the committed (or backup) step, or a ray_ckpt error;
    every commit holds one group's records; saves on the shrunken cluster never fail."""
    out = tmp_path / "campaign.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--trials",
            "2",
            "--ops",
            "3",
            "--seed",
            "7",
            "--nodes",
            "4",
            "--always",
            "shrink",
            "--always",
            "zombie",
            "--always",
            "resave_torn",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=pace.bound(560),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["violations"] == 0, report["violation_details"]
    assert report["restores"] >= 2
    assert report["faults"]["shrink"] >= 2
    assert report["faults"]["zombie"] >= 2 and report["faults"]["resave_torn"] >= 2
    assert set(report) >= {"trials", "restores", "violations", "fallbacks", "errors_by_kind"}
