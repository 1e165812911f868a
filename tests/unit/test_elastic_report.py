"""The elastic run's report (scripts/train_example.py): a resize compares what the new group
restored with what the saving group recorded, and a missing record is the records' fault."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from support.scripts_under_test import load_script


def example() -> ModuleType:
    return load_script("train_example", module_name="train_example_report")


def restores(
    attempt: str, ranks: int, step: int | None, saved_by: int | None, digest: str | None
) -> list[dict[str, Any]]:
    return [
        {"attempt": attempt, "rank": r, "restored_step": step, "from_world_size": saved_by, "restored_digest": digest}
        for r in range(ranks)
    ]


def test_a_grow_compares_the_restored_parameters_with_the_saving_groups_record() -> None:
    report = example().reshard_report
    records = restores("a", 4, None, None, None) + restores("b", 3, 4, 4, "d4") + restores("c", 4, 29, 3, "d29")
    saved = [{"step": 4, "world_size": 4, "digest": "d4"}, {"step": 29, "world_size": 3, "digest": "d29"}]
    attempts, reshards = report(records, saved)
    assert [len(a) for a in attempts] == [4, 3, 4]
    assert [(r["from"], r["to"], r["step"], r["bit_exact"]) for r in reshards] == [(4, 3, 4, True), (3, 4, 29, True)]
    _, mismatched = report(records, [saved[0], {"step": 29, "world_size": 3, "digest": "other"}])
    assert mismatched[1]["bit_exact"] is False and mismatched[1]["saved_digests"] == ["other"]


def test_a_committed_step_without_the_savers_record_is_an_error_of_the_records_not_a_mismatch() -> None:
    """What the slower machine's run reported as ``bit_exact: False`` for the grow to 4 workers
    at step 29: the 3 workers committed step 29 and were stopped by the resize before rank 0
    wrote its record of step 29 (it wrote it after ``save`` returned, and the step can commit
    from there on); the run now writes the record before it saves, and a missing record is
    named as such."""
    records = restores("b", 3, 4, 4, "d4") + restores("c", 4, 29, 3, "d29")
    with pytest.raises(RuntimeError, match="no record of what 3 workers saved at step 29"):
        example().reshard_report(records, [{"step": 4, "world_size": 4, "digest": "d4"}])
