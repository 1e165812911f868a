"""A short lab campaign (``scripts/lab_campaign.py --quick --one-job``): every fault kind (kill,
power, partition, slow, flap) strikes once, in turn, at one in-place job, with the campaign's
oracle: the job ends bit-exact, a survivor keeps its process, no rank that kept beating is
taken for lost, no step is committed by two incarnations. Skipped, with the reason, where
namespaces are not allowed. The long campaign, a job per trial, is the script's ``--trials``."""

from __future__ import annotations

import pathlib

import pytest
from support import pace
from support.scripts_under_test import run_quick

from ray_ckpt.tools import network_lab

pytestmark = pytest.mark.cluster

KINDS = ("kill", "power", "partition", "slow", "flap")


@pytest.mark.timeout(900)
def test_a_short_lab_campaign_strikes_every_fault_kind_once_at_one_job_without_a_violation(
    tmp_path: pathlib.Path,
) -> None:
    reason = network_lab.lab_unsupported()
    if reason is not None:
        pytest.skip(reason)
    _, summary = run_quick("lab_campaign.py", tmp_path, "--restore-mib", "0", "--one-job", timeout=pace.bound(840))
    assert summary["violations"] == 0, summary["violation_details"]
    assert summary["trials"] == len(KINDS)
    kinds = summary["kinds"]
    assert {kind: kinds[kind]["trials"] for kind in KINDS} == dict.fromkeys(KINDS, 1)
    assert all(kinds[kind]["bit_exact"] for kind in KINDS), kinds
    for kind in ("kill", "power", "partition"):  # a node lost: recovered in place, the survivor kept
        assert kinds[kind]["detect_s"][0] is not None and kinds[kind]["resume_s"][0] is not None, kinds[kind]
        assert kinds[kind]["survivors_kept"] is True, kinds[kind]
    assert kinds["slow"]["live_ranks_lost"] == 0, kinds["slow"]
