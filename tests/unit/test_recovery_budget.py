"""RecoveryBudget without Ray: when a worker stops recovering in place and hands its error to
Ray Train (the same step failing again after a recovery that lost no peer; the bound)."""

from __future__ import annotations

import pytest

from ray_ckpt import settings
from ray_ckpt.core.recovery_budget import RecoveryBudget
from ray_ckpt.errors import ConfigError


def test_an_error_that_recurs_at_the_same_step_with_no_peer_lost_is_given_up_at_its_second_occurrence() -> None:
    """Saved up to step 2, failed; the recovery kept every process; failed again before saving
    anything newer: the job's own error."""
    budget = RecoveryBudget(100)
    assert budget.give_up(2) is None
    budget.recovered(2, replaced=[])
    refused = budget.give_up(None)  # the re-run restored step 2 and failed in step 3 again
    assert refused is not None and "after step 2" in refused and "lost no peer" in refused
    assert budget.give_up(2) is not None, "failing after saving step 2 again is the same step too"


def test_before_any_save_the_same_rule_holds() -> None:
    budget = RecoveryBudget(100)
    assert budget.give_up(None) is None
    budget.recovered(None, replaced=[])
    refused = budget.give_up(None)
    assert refused is not None and "before any step was saved" in refused


def test_progress_since_the_last_recovery_means_another_failure_is_recovered_from() -> None:
    budget = RecoveryBudget(100)
    budget.recovered(2, replaced=[])
    assert budget.give_up(3) is None
    budget.recovered(3, replaced=[])
    assert budget.give_up(None) is not None, "step 3 is now the point to pass"


def test_a_recovery_that_replaced_a_peer_does_not_make_the_next_failure_the_jobs_own() -> None:
    """Rank 1's process was replaced: the failure was a lost peer; failing at the same step
    again is recovered from, until a recovery finds every process still there."""
    budget = RecoveryBudget(100)
    budget.recovered(2, replaced=[1])
    assert budget.give_up(None) is None
    budget.recovered(None, replaced=[])
    assert budget.give_up(None) is not None


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_a_bound_of_n_recoveries_is_enforced(bound: int) -> None:
    """Even with progress and a lost peer every time, the (n+1)th failure goes to Ray Train."""
    budget = RecoveryBudget(bound)
    for step in range(bound):
        assert budget.give_up(step) is None
        budget.recovered(step, replaced=[0])
    refused = budget.give_up(bound)
    assert refused is not None and f"RAY_CKPT_INPLACE_MAX_RECOVERIES={bound}" in refused
    assert budget.recoveries == bound


@pytest.mark.parametrize("bound", [-1, 1.5, True, "3"])
def test_a_bad_bound_is_refused_naming_the_setting(bound: object) -> None:
    with pytest.raises(ConfigError, match="RAY_CKPT_INPLACE_MAX_RECOVERIES"):
        RecoveryBudget(bound)  # type: ignore[arg-type]


def test_the_bound_is_a_setting_with_a_default() -> None:
    assert settings.inplace_max_recoveries() == 100
    with settings.override(RAY_CKPT_INPLACE_MAX_RECOVERIES=5):
        assert settings.inplace_max_recoveries() == 5
    with settings.override(RAY_CKPT_INPLACE_MAX_RECOVERIES=-2):
        assert settings.inplace_max_recoveries() == 0
