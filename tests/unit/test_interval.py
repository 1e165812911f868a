"""IntervalPolicy (``every="auto"``): Young's optimum from fed measurements, its floor and cap,
power-of-two rounding, the rule of due steps (every step in warm-up, the grid after, never timing), and the nested
grids of ranks that measured different times. Measurements are fed as numbers: nothing here depends on a clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_ckpt.core import events
from ray_ckpt.core.generations import Generations, generation_of
from ray_ckpt.core.interval import (
    IntervalPolicy,
    nearest_power_of_two,
    power_of_two_at_least,
    power_of_two_at_most,
    summarize,
    young_interval_s,
)
from ray_ckpt.errors import ConfigError


def is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def fed(
    *,
    step_s: float = 0.1,
    blocking_s: float = 0.05,
    background_s: float = 0.05,
    busy_step_s: float | None = None,
    mtbf_prior_s: float = 3600.0,
    max_interval_s: float = 600.0,
    saves: int = 3,
) -> IntervalPolicy:
    """A policy past its warm-up: ``saves`` saves and a few steps of each kind measured."""
    policy = IntervalPolicy(max_interval_s=max_interval_s, mtbf_prior_s=mtbf_prior_s)
    for _ in range(4):
        policy.observe_step(step_s, during_save=False)
        if busy_step_s is not None:
            policy.observe_step(busy_step_s, during_save=True)
    for _ in range(saves):
        policy.observe_save(blocking_s, background_s)
    return policy


# ---- the pieces -------------------------------------------------------------------------


def test_young_interval_is_sqrt_of_twice_cost_times_mtbf() -> None:
    assert young_interval_s(2.0, 100.0) == pytest.approx(20.0)
    assert young_interval_s(0.0, 100.0) == 0.0
    with pytest.raises(ValueError):
        young_interval_s(1.0, 0.0)


@pytest.mark.parametrize(
    "value, nearest",
    [(0.2, 1), (1.0, 1), (1.4, 1), (1.5, 2), (3.0, 4), (5.5, 4), (6.0, 8), (189.7, 256), (1000.0, 1024)],
)
def test_rounding_to_the_nearest_power_of_two_in_log_scale(value: float, nearest: int) -> None:
    assert nearest_power_of_two(value) == nearest


def test_hysteresis_keeps_the_current_interval_near_a_boundary() -> None:
    assert nearest_power_of_two(6.2, current=4) == 4  # 0.63 powers of two away: kept
    assert nearest_power_of_two(6.2) == 8
    assert nearest_power_of_two(6.5, current=4) == 8  # 0.70 away: changed
    assert nearest_power_of_two(2.9, current=4) == 4
    assert nearest_power_of_two(2.7, current=4) == 4  # 0.57 below: kept
    assert nearest_power_of_two(2.5, current=4) == 2  # 0.68 below: changed


@pytest.mark.parametrize("value, up, down", [(0.3, 1, 1), (1.0, 1, 1), (8.0, 8, 8), (10.0, 16, 8), (1.5, 2, 1)])
def test_powers_of_two_above_and_below(value: float, up: int, down: int) -> None:
    assert power_of_two_at_least(value) == up
    assert power_of_two_at_most(value) == down


@settings(max_examples=300, deadline=None)
@given(value=st.floats(1e-6, 1e9), current=st.none() | st.sampled_from([1, 2, 4, 64, 1 << 20]))
def test_every_rounding_gives_a_power_of_two(value: float, current: int | None) -> None:
    for rounded in (nearest_power_of_two(value, current), power_of_two_at_least(value), power_of_two_at_most(value)):
        assert is_power_of_two(rounded), (value, current, rounded)
    assert power_of_two_at_least(value) >= value or power_of_two_at_least(value) == 1
    assert power_of_two_at_most(value) <= max(value, 1)


# ---- the policy -------------------------------------------------------------------------


def test_warm_up_saves_every_idle_step_then_adapts() -> None:
    policy = IntervalPolicy(max_interval_s=600, mtbf_prior_s=3600)
    assert policy.warming_up and policy.interval == 1
    assert all(policy.due(step) for step in range(1, 6))
    policy.observe_step(0.1, during_save=False)
    assert policy.observe_save(0.05, 0.05) is None
    assert policy.observe_save(0.05, 0.05) is None
    decision = policy.observe_save(0.05, 0.05)  # the third save ends the warm-up
    assert decision is not None and not policy.warming_up
    # C = 0.05 s, MTBF = the prior 3600 s: sqrt(2 * 0.05 * 3600) = 18.97 s = 189.7 steps of 0.1 s
    assert decision.optimum_steps == pytest.approx(189.74, rel=1e-3)
    assert (decision.interval, decision.reason) == (256, "optimum")
    assert decision.mtbf_s == 3600 and decision.cost_s == pytest.approx(0.05)


def test_no_decision_without_a_step_time() -> None:
    policy = IntervalPolicy(max_interval_s=600, mtbf_prior_s=3600)
    for _ in range(5):
        assert policy.observe_save(0.05, 0.05) is None
    assert policy.warming_up


def test_the_grid_after_warm_up() -> None:
    policy = fed()
    assert policy.interval == 256
    assert [s for s in range(1, 1025) if policy.due(s)] == [256, 512, 768, 1024]


def test_every_warm_up_step_is_due_then_only_the_grid() -> None:
    """Due steps depend on the step and the interval only: every step in warm-up, the multiples
    of the interval after it (a rank still saving waits: a step all ranks save commits)."""
    policy = IntervalPolicy(max_interval_s=600, mtbf_prior_s=3600)
    assert all(policy.due(step) for step in range(0, 7))
    policy = fed()
    assert all(policy.due(step) for step in (256, 512, 1024))
    assert not any(policy.due(step) for step in (255, 257, 513))


def test_the_keep_up_floor_wins_over_the_optimum_and_the_cap() -> None:
    # optimum sqrt(2 * 0.001 * 10) / 0.1 = 1.4 steps, but one background spans 10 steps
    policy = fed(blocking_s=0.001, background_s=1.0, mtbf_prior_s=10.0)
    assert (policy.interval, policy.decision.reason, policy.decision.floor_steps) == (16, "keep-up", 16)
    # a cap of 0.8 s is 8 steps: still 16, a save must end before the next is due
    policy = fed(blocking_s=1.0, background_s=1.0, max_interval_s=0.8)
    assert (policy.interval, policy.decision.reason, policy.decision.cap_steps) == (16, "keep-up", 8)


def test_the_cap_bounds_the_time_between_saves() -> None:
    policy = fed(blocking_s=5.0, max_interval_s=1.0)  # optimum 1897 steps; 1 s is 10 steps
    assert (policy.interval, policy.decision.reason) == (8, "cap")


def test_the_slowdown_of_steps_during_a_save_counts_in_the_cost() -> None:
    # steps take 0.15 s instead of 0.1 s while a save runs; one background of 0.3 s spans 2 steps
    policy = fed(blocking_s=0.02, background_s=0.3, busy_step_s=0.15)
    assert policy.decision.slowdown_s == pytest.approx(0.1)
    assert policy.decision.cost_s == pytest.approx(0.12)
    assert policy.decision.step_s == pytest.approx(0.1)
    # without steps measured during a save the slowdown is unknown and counted as 0
    assert fed(blocking_s=0.02, background_s=0.3).decision.slowdown_s == 0.0


def test_failures_seen_replace_the_prior() -> None:
    policy = fed()
    decision = policy.observe_failures(4, job_s=400.0)  # MTBF 100 s: sqrt(2 * 0.05 * 100) = 3.16 s
    assert decision is not None and decision.mtbf_s == pytest.approx(100.0)
    assert decision.optimum_steps == pytest.approx(31.62, rel=1e-3) and decision.interval == 32
    assert decision.failures == 4


def test_without_a_job_time_it_is_the_step_number_times_the_step_time() -> None:
    policy = fed()
    policy.due(1000)  # 1000 steps of 0.1 s: 100 s
    decision = policy.observe_failures(1)
    assert decision is not None and decision.mtbf_s == pytest.approx(100.0)


def test_a_job_that_ran_longer_than_the_prior_without_failing_uses_its_time() -> None:
    policy = fed(mtbf_prior_s=10.0)
    policy.observe_failures(0, job_s=3600.0)
    policy.observe_save(0.05, 0.05)
    assert policy.decision.mtbf_s == pytest.approx(3600.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.observe_step(-1.0, during_save=False),
        lambda p: p.observe_step(float("nan"), during_save=True),
        lambda p: p.observe_save(True, 0.1),
        lambda p: p.observe_save(0.1, float("inf")),
        lambda p: p.observe_failures(-1),
        lambda p: p.observe_failures(1.5),
        lambda p: p.observe_failures(1, job_s=-3.0),
    ],
)
def test_bad_measurements_are_config_errors(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        call(IntervalPolicy(max_interval_s=600, mtbf_prior_s=3600))


@pytest.mark.parametrize("name", ["max_interval_s", "mtbf_prior_s"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_bad_bounds_are_config_errors_naming_them(name: str, value: object) -> None:
    arguments = {"max_interval_s": 600.0, "mtbf_prior_s": 3600.0, name: value}
    with pytest.raises(ConfigError, match=name):
        IntervalPolicy(**arguments)  # type: ignore[arg-type]


def test_a_decision_makes_a_well_formed_event() -> None:
    decision = fed(busy_step_s=0.15).decision
    measured = decision.measured()
    record = events.event("interval", job="j", rank=0, step=7, interval=decision.interval, reason=decision.reason)
    events.check({**record, "measured": measured})
    assert set(measured) >= {"step_s", "cost_s", "mtbf_s", "optimum_steps", "floor_steps", "cap_steps"}
    assert f"= {decision.optimum_steps:.3g} steps" in decision.describe()
    with pytest.raises(ConfigError, match="interval"):
        events.check({**record, "interval": 0})


# ---- ranks that measured different times ------------------------------------------------

MEASURED = st.tuples(
    st.floats(1e-3, 10.0),  # step_s
    st.floats(0.0, 5.0),  # blocking_s
    st.floats(0.0, 60.0),  # background_s
    st.floats(1.0, 3.0),  # busy steps' slowdown factor
    st.floats(1.0, 1e6),  # MTBF prior
    st.integers(0, 20),  # failures
)


def feed(policy: IntervalPolicy, measured: tuple[float, float, float, float, float, int], rounds: int) -> None:
    step_s, blocking_s, background_s, slower, _prior, failures = measured
    for _ in range(rounds):
        policy.observe_step(step_s, during_save=False)
        policy.observe_step(step_s * slower, during_save=True)
        policy.observe_save(blocking_s, background_s)
    policy.due(10_000)
    policy.observe_failures(failures)


@settings(max_examples=400, deadline=None)
@given(
    measured=MEASURED,
    ratios=st.lists(st.floats(1 / 1.5, 1.5), min_size=6, max_size=6),
    rounds=st.integers(3, 8),
)
def test_two_ranks_that_measured_within_a_ratio_share_the_coarser_grid(
    measured: tuple[float, float, float, float, float, int], ratios: list[float], rounds: int
) -> None:
    """Every multiple of the larger interval is due for both ranks: a step all
    ranks save, so the job keeps committing whatever each rank measured."""
    other = (*(value * ratio for value, ratio in zip(measured[:5], ratios[:5], strict=True)), measured[5])
    a = IntervalPolicy(max_interval_s=600.0, mtbf_prior_s=measured[4])
    b = IntervalPolicy(max_interval_s=600.0 * ratios[5], mtbf_prior_s=other[4])
    feed(a, measured, rounds)
    feed(b, other, rounds)  # type: ignore[arg-type]
    assert is_power_of_two(a.interval) and is_power_of_two(b.interval)
    coarse = max(a.interval, b.interval)
    for k in range(1, 5):
        assert a.due(k * coarse) and b.due(k * coarse), (a.decision, b.decision)


@settings(max_examples=200, deadline=None)
@given(step_s=st.floats(1e-3, 10.0), blocking_s=st.floats(1e-4, 5.0), ratio=st.floats(1 / 1.2, 1.2))
def test_without_slowdown_close_measurements_give_intervals_at_most_a_factor_4_apart(
    step_s: float, blocking_s: float, ratio: float
) -> None:
    """Blocking time and step time within 1.2x of each other move the optimum by at most 1.44x:
    rounding (with its hysteresis band) and the cap add at most one power of two each."""
    a = fed(step_s=step_s, blocking_s=blocking_s, background_s=0.0)
    b = fed(step_s=step_s * ratio, blocking_s=blocking_s * ratio, background_s=0.0)
    assert max(a.interval, b.interval) <= 4 * min(a.interval, b.interval), (a.decision, b.decision)


# ---- around the policy ------------------------------------------------------------------


def test_status_summary_of_the_ranks_intervals() -> None:
    assert summarize({}) is None
    assert summarize({1: (16, "keep-up"), 0: (8, "optimum"), 2: (8, "optimum")}) == {
        "low": 8,
        "high": 16,
        "reason": "optimum",
    }


def test_generation_numbers_count_the_failures_of_an_in_place_run() -> None:
    generations = Generations()
    assert generation_of(generations.attempt(1)) == 1
    assert generation_of(generations.attempt(17)) == 17
    for other in (None, "", "abc", "run.g", "run.gx", ".g3", "0123456789abcdef"):
        assert generation_of(other) is None, other
