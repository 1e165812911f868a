"""``ray-ckpt status`` as text: job names (and store errors) are shown with every character a
terminal would act on escaped, so a job named with an escape sequence cannot clear the
operator's screen, retitle the window or reorder the line (bidi overrides)."""

from __future__ import annotations

from typing import Any

from ray_ckpt.tools.cli import format_status

HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\r\nnext\u202eabc\x9b"


def report(job: str) -> dict[str, Any]:
    return {
        "namespace": "ns",
        "registry": "alive",
        "nodes": {
            "a" * 40: {"budget_bytes": 1 << 30, "used_bytes": 1 << 20, "shards": 3, "jobs": {job: 1 << 20}},
            "b" * 40: {"node_id": "b" * 40, "error": f"RayTaskError({job})"},
        },
        "jobs": {
            job: {
                "world_size": 2,
                "committed_steps": [4],
                "latest_committed": 4,
                "staged": {5: [0]},
                "protection": 2,
                "full_protection": 2,
            }
        },
    }


def test_control_characters_in_job_names_are_escaped() -> None:
    text = format_status(report(HOSTILE))
    assert not any(c in text for c in "\x1b\x07\r\u202e\x9b")
    assert text.count(r"evil\x1b]0;pwned\x07\x1b[2J\r\nnext\u202eabc\x9b") == 3  # node row, error, job row


def test_plain_and_non_ascii_names_are_shown_as_they_are() -> None:
    for name in ("exp-1", "Übung 2", "实验"):
        rows = format_status(report(name)).splitlines()
        assert any(line.startswith(name + " ") for line in rows)


def test_the_auto_interval_is_shown_per_job() -> None:
    """A job whose ranks chose an ``every="auto"`` interval shows it (a range when they differ)
    and why; a job without one shows "-" and no explanation line."""
    plain = format_status(report("exp"))
    assert "AUTO EVERY" in plain and "AUTO EVERY:" not in plain
    auto = report("exp")
    auto["jobs"]["exp"]["interval"] = {"low": 8, "high": 16, "reason": "keep-up"}
    text = format_status(auto)
    (row,) = [line for line in text.splitlines() if line.startswith("exp ")]
    assert "8-16 (keep-up)" in row
    assert "AUTO EVERY:" in text
    auto["jobs"]["exp"]["interval"] = {"low": 32, "high": 32, "reason": "optimum"}
    assert "32 (optimum)" in format_status(auto)
