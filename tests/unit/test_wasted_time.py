"""The wasted time of a failure (``scripts/demo.py``'s ``wasted_s``, which bench_goodput reports):
from the kill until the job is back where it was at the kill, counting the step in progress at
the kill and not counting twice the first step after the restore, which redoes a lost one."""

from __future__ import annotations

import pytest
from support.scripts_under_test import load_script

demo = load_script("demo", module_name="demo_under_test")
STEP = 5.0


def wasted(resume: float | None, lost: int, into: float | None) -> float | None:
    failure = {"time_to_resume_s": resume, "steps_lost": lost, "into_step_s": into}
    return demo.wasted_s(failure, STEP)  # type: ignore[attr-defined,no-any-return]


def test_a_kill_just_after_a_committed_step_wastes_only_the_recovery() -> None:
    """Nothing lost, 0.1 s into the next step: the resume (7 s, its first step 5 s of it) puts the
    job back where it was 0.1 s of work later, so 2.1 s were wasted."""
    assert wasted(7.0, 0, 0.1) == pytest.approx(7.0 - 5.0 + 0.1)


def test_steps_lost_are_redone_and_the_first_step_after_the_restore_is_one_of_them() -> None:
    # 2 steps lost, 3 s into a third: after the resume (first step done) 1 lost step and 3 s remain
    assert wasted(7.0, 2, 3.0) == pytest.approx(7.0 + 1 * STEP + 3.0)


def test_the_part_of_a_step_done_at_the_kill_counts_at_most_a_step_and_none_without_a_resume() -> None:
    assert wasted(7.0, 1, 60.0) == pytest.approx(7.0 + STEP)  # a stalled step counts one step
    assert wasted(7.0, 1, None) == pytest.approx(7.0)  # no step done before the kill
    assert wasted(None, 1, 1.0) is None
    assert demo.time_lost(  # type: ignore[attr-defined]
        [{"time_to_resume_s": 7.0, "steps_lost": 0, "into_step_s": 1.0}, {"failed": True}], STEP
    ) == pytest.approx(3.0)


def test_training_runs_again_when_the_restore_is_done_before_the_first_step() -> None:
    from ray_ckpt.core.timeline import Recovery

    def recovery(resume: float | None, first_step: float | None) -> Recovery:
        return Recovery(
            job="j", attempt="a", kill_time=0.0, killed_nodes=(), step=1, phases_s={"first_step": first_step},
            time_to_resume_s=resume, steps_lost=0, bytes_moved=0, sources={}, failed=False, error=None, errors={},
            mode="in_place", survivor_pids={}, replacement_pids={}, warm_replacements={},
        )  # fmt: skip

    assert demo.training_again_s(recovery(7.5, 5.25)) == pytest.approx(2.25)  # type: ignore[attr-defined]
    assert demo.training_again_s(recovery(None, 5.25)) is None  # type: ignore[attr-defined]
    assert demo.training_again_s(recovery(7.5, None)) is None  # type: ignore[attr-defined]


def test_a_drain_wastes_its_longest_stop_less_a_step_and_the_steps_it_redid() -> None:
    """The job trained on after the notice: what a drain cost is the longest time no step was
    done (less the step that stop held anyway) plus the steps redone, not the notice -> resume."""
    drain = {"kind": "drain", "time_to_resume_s": 12.0, "stall_s": 8.0, "steps_lost": 0, "into_step_s": 0.2}
    assert demo.wasted_s(drain, STEP) == pytest.approx(8.0 - STEP)  # type: ignore[attr-defined]
    assert demo.wasted_s({**drain, "stall_s": 1.0, "steps_lost": 3}, STEP) == pytest.approx(3 * STEP)  # type: ignore[attr-defined]


def test_the_longest_gap_counts_from_the_notice_and_only_rank_0s_steps_of_the_job() -> None:
    def save(time: float, rank: int = 0, job: str = "j") -> dict[str, object]:
        return {"kind": "save", "job": job, "rank": rank, "step": 0, "time": time + 9, "returned": time}

    records = [save(1.0), save(2.0), save(3.5, rank=1), save(7.0, job="other"), save(8.0), save(8.5), save(20.0)]
    assert demo.longest_gap("j", records, 1.5, 8.5) == pytest.approx(6.0)  # type: ignore[attr-defined]
    assert demo.longest_gap("j", records, 0.5, 2.0) == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert demo.longest_gap("j", records, 9.0, 10.0) == pytest.approx(1.0)  # type: ignore[attr-defined]  # none inside


def test_the_killer_takes_a_benchmarks_plain_schedule_as_crashes() -> None:
    killer = demo.Killer(None, "j", [(5, [1], 0), demo.Failure(9, [0], kind="drain")])  # type: ignore[attr-defined]
    assert killer.schedule == [demo.Failure(5, [1], 0, "crash"), demo.Failure(9, [0], 0, "drain")]  # type: ignore[attr-defined]
