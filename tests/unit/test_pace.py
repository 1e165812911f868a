"""tests/support/pace.py: the unit of the test bounds that depend on the machine's speed."""

from __future__ import annotations

import pytest
from support import pace


@pytest.fixture
def fresh_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pace, "_pace", None)


def test_a_set_pace_stretches_every_bound(fresh_pace: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_CKPT_TEST_PACE", "1.75")
    assert pace.bound(60) == pytest.approx(105.0)
    assert pace.measured() == 1.75


@pytest.mark.parametrize("value", ["0.5", "nan", "-2"])
def test_a_pace_below_one_is_refused(fresh_pace: None, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("RAY_CKPT_TEST_PACE", value)
    with pytest.raises(ValueError, match="at least 1"):
        pace.pace()


def test_a_slower_machine_gets_a_pace_from_its_slowest_probe(fresh_pace: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_CKPT_TEST_PACE", raising=False)
    monkeypatch.setattr(pace, "measure", lambda: (2 * pace.REFERENCE_IMPORT_S, 1.5 * pace.REFERENCE_CPU_S))
    assert pace.pace() == pytest.approx(2.0)


def test_a_faster_machine_keeps_the_written_bounds(fresh_pace: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_CKPT_TEST_PACE", raising=False)
    monkeypatch.setattr(pace, "measure", lambda: (0.5 * pace.REFERENCE_IMPORT_S, 0.5 * pace.REFERENCE_CPU_S))
    assert pace.bound(30) == 30
