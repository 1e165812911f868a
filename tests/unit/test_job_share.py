"""JobShare: a store's budget shared fairly among its jobs; only superseded steps give way, a
job's newest committed step never does for another job; a lone job fits as it always did."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ray_ckpt.core.job_share import JobHoldings, job_share, make_room

U = 100  # bytes of one step of a job in these tables


def held(*steps: int, committed: int | None = None, in_flight: int = 0, unit: int = U) -> JobHoldings:
    """A job holding ``unit`` bytes of each of ``steps``."""
    return JobHoldings(step_bytes={step: unit for step in steps}, in_flight_bytes=in_flight, committed=committed)


@pytest.mark.parametrize(
    ("budget", "jobs", "fraction", "share"),
    [
        (1000, 1, None, 1000),  # a job alone may use the whole budget
        (1000, 2, None, 500),
        (1000, 3, None, 333),  # rounded down: the shares never add up past the budget
        (1000, 0, None, 1000),  # no job yet: as for one
        (1000, 3, 1.0, 1000),  # a fixed fraction of 1: no per-job limit
        (1000, 1, 0.25, 250),  # a fixed fraction holds whatever the number of jobs
        (1000, 4, 0.25, 250),
    ],
)
def test_job_share_is_the_budget_over_the_jobs_present_or_a_fixed_fraction(
    budget: int, jobs: int, fraction: float | None, share: int
) -> None:
    """The fair share is budget // jobs (all of it alone); a fixed fraction ignores the count."""
    assert job_share(budget, jobs, fraction) == share


# (what the store holds, the put: job, step, bytes, bytes it replaces; budget, fraction)
#   -> (steps evicted, refusal)
CASES = {
    "alone, keep_committed=2 plus one in flight fits exactly as before": (
        {"a": held(1, 2, committed=2)},
        ("a", 3, U, 0),
        3 * U,
        None,
        ((), None),
    ),
    "alone, halfway through a save: its puts in flight count, the rest still fits": (
        {"a": held(1, 2, committed=2, in_flight=U // 2)},
        ("a", 3, U // 2, 0),
        3 * U,
        None,
        ((), None),
    ),
    "alone, past the budget: its superseded step gives way, oldest first": (
        {"a": held(1, 2, 3, committed=3)},
        ("a", 4, U, 0),
        3 * U,
        None,
        ((("a", 1),), None),
    ),
    "alone, only the newest committed step and the save in flight: refused, nothing evicted": (
        {"a": held(2, 3, committed=2)},
        ("a", 3, U, 0),
        2 * U,
        None,
        ((), "budget"),
    ),
    "not enough even after every superseded step: refused, and nothing is evicted": (
        {"a": held(1, 2, committed=2)},
        ("a", 3, 2 * U, 0),
        2 * U,
        None,
        ((), "budget"),
    ),
    "a retried put replaces its shard: it fits at the exact share": (
        {"a": held(1, 2, committed=None), "b": held(1)},
        ("a", 2, U, U),
        4 * U,
        None,
        ((), None),
    ),
    "a late put of an old step never evicts a newer superseded one": (
        {"a": held(2, 3, committed=3)},
        ("a", 1, U, 0),
        2 * U,
        None,
        ((), "budget"),
    ),
    "steps of a job the store never heard commit are never evicted": (
        {"a": held(1, 2, 3)},
        ("b", 1, U, 0),
        3 * U,
        None,
        ((), "budget"),
    ),
    "job A filled the store: B's first put evicts A's superseded step, A's newest stays": (
        {"a": held(1, 2, 3, committed=2)},
        ("b", 1, U, 0),
        3 * U,
        None,
        ((("a", 1),), None),
    ),
    "A over its share holds only its newest committed step and a save in flight: B is refused": (
        {"a": held(2, 3, committed=2)},
        ("b", 1, U, 0),
        2 * U,
        None,
        ((), "budget"),
    ),
    "a put past its own share gives up its own superseded step, never another job's": (
        {"a": held(1, 2, committed=2), "b": held(1, committed=1)},
        ("a", 3, U, 0),
        4 * U,
        None,
        ((("a", 1),), None),
    ),
    "past its share with nothing superseded: refused by its share, though the store has room": (
        {"a": held(2, committed=2), "b": held(1, committed=1)},
        ("a", 3, 2 * U, 0),
        5 * U,
        None,
        ((), "share"),
    ),
    "within its share: jobs over theirs give way before its own superseded steps": (
        {"a": held(1, 2, 3, 4, committed=4), "b": held(1, 2, committed=2)},
        ("b", 3, U, 0),
        6 * U,
        None,
        ((("a", 1),), None),
    ),
    "the job furthest over its share gives way first": (
        {"a": held(1, 2, 3, 4, committed=4), "c": held(1, 2, 3, committed=3), "b": held()},
        ("b", 1, U, 0),
        7 * U,
        None,
        ((("a", 1),), None),
    ),
    "a job within its share never gives way: its own superseded steps do": (
        {"a": held(1, 2, committed=2), "b": held(1, 2, committed=2)},
        ("b", 3, U, 0),
        4 * U,
        None,
        ((("b", 1),), None),
    ),
    "a fixed fraction of 1 (no per-job limit): one job may fill the store, the next is refused": (
        {"a": held(1, 2, committed=2)},
        ("b", 1, U, 0),
        2 * U,
        1.0,
        ((), "budget"),
    ),
    "a fixed fraction of 0.5: a job's put past it is refused, whatever room is left": (
        {"a": held(1, 2)},
        ("a", 3, U, 0),
        4 * U,
        0.5,
        ((), "share"),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_make_room_table(case: str) -> None:
    """Each row: the steps evicted to make room for the put, or why it is refused."""
    holdings, (job, step, need, replaced), budget, fraction, (evict, refused) = CASES[case]
    room = make_room(
        holdings,
        job=job,
        step=step,
        need_bytes=need,
        replaced_bytes=replaced,
        budget_bytes=budget,
        fraction=fraction,
    )
    assert (room.evict, room.refused) == (evict, refused)


def test_a_refusal_reports_the_share_the_jobs_present_and_what_was_held_before_the_put() -> None:
    """The numbers a StoreFullError names: the job's share, the jobs counted, bytes held."""
    room = make_room(
        {"a": held(2, committed=2, in_flight=30), "b": held(1)},
        job="a",
        step=3,
        need_bytes=2 * U,
        budget_bytes=6 * U,
        fraction=None,
    )
    assert (room.refused, room.share_bytes, room.jobs_present) == ("share", 3 * U, 2)
    assert (room.job_bytes, room.used_bytes) == (U + 30, 2 * U + 30)


job_names = st.sampled_from(["a", "b", "c", "d"])
holding = st.builds(
    JobHoldings,
    step_bytes=st.dictionaries(st.integers(0, 6), st.integers(1, 60), max_size=5),
    in_flight_bytes=st.integers(0, 40),
    committed=st.none() | st.integers(0, 6),
)


@hypothesis_settings(max_examples=400, deadline=None)
@given(
    holdings=st.dictionaries(job_names, holding, max_size=4),
    job=job_names,
    step=st.integers(0, 8),
    need=st.integers(1, 120),
    budget=st.integers(0, 600),
    fraction=st.none() | st.sampled_from([0.25, 0.5, 1.0]),
)
def test_an_accepted_put_fits_and_evicts_only_superseded_steps_of_itself_or_of_jobs_over_their_share(
    holdings: dict[str, JobHoldings], job: str, step: int, need: int, budget: int, fraction: float | None
) -> None:
    """Whatever the holdings: a put accepted after its evictions fits the budget and its share;
    only steps older than their job's newest committed step go, another job's only while that
    job is over its share, its own only older than the put's step; a refusal evicts nothing."""
    room = make_room(holdings, job=job, step=step, need_bytes=need, budget_bytes=budget, fraction=fraction)
    if room.refused is not None:
        assert room.evict == ()
        return
    left = {name: h.total_bytes for name, h in holdings.items()}
    left.setdefault(job, 0)
    for name, victim in room.evict:
        holding = holdings[name]
        assert holding.committed is not None and victim < holding.committed
        if name == job:
            assert victim < step
        else:
            assert left[name] > room.share_bytes  # over its share when it gave this step up
        left[name] -= holding.step_bytes[victim]
    assert len(set(room.evict)) == len(room.evict)
    assert sum(left.values()) + need <= budget
    assert left[job] + need <= room.share_bytes
