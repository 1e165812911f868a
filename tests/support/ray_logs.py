"""What a failed cluster test's report shows of its cluster's logs: the lines about failures and
recoveries (tests/cluster/conftest.py adds them to the report)."""

from __future__ import annotations

import json
import pathlib
import re

_RECOVERY_LINE = re.compile(
    r"^rank \d+: |InPlaceRecoveryError|Replacing failing|replica groups|restarting the worker group|Error:"
    r"|^ray_ckpt: rank \d+ .*is lost: "  # the run's coordinator: each loss and why
)


def ray_log_excerpt(ray_tmpdir: pathlib.Path, limit: int = 60) -> str:
    """The last session's lines about failures and recoveries from the workers and the
    controller (every actor's stderr, then Ray Train's controller log), at most the last
    ``limit``: what a failed recovery test needs to tell why it fell back or failed, in the
    report CI keeps."""
    logs = ray_tmpdir / "ray" / "session_latest" / "logs"
    lines = [
        f"{path.name[-9:-4]}: {line[:300]}"
        for path in sorted(logs.glob("worker-*.err"))
        for line in path.read_text(errors="replace").splitlines()
        if _RECOVERY_LINE.search(line)
    ]
    for path in sorted(logs.glob("train/ray-train-app-controller-*.log")):  # JSON lines
        for raw in path.read_text(errors="replace").splitlines():
            try:
                message = str(json.loads(raw).get("message", ""))
            except (ValueError, AttributeError):
                continue
            if _RECOVERY_LINE.search(message) or message.startswith("[FailurePolicy]"):
                lines.append(f"controller: {' | '.join(message.splitlines()[:6])[:400]}")
    return "\n".join(lines[-limit:])
