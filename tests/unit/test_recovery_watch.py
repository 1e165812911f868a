"""The controller's watch on its run's recoveries (``inplace_controller._poll_promptly_in_recoveries``):
the prompt polls follow the coordinator's word, and a coordinator that fails or is gone leaves
the polls at their interval instead of ending the watch."""

from __future__ import annotations

from typing import Any

import pytest

from ray_ckpt import _ray_compat
from ray_ckpt.train import inplace_controller


class Stop(BaseException):
    """Ends the watch, which otherwise runs as long as the controller."""


def test_the_prompt_polls_follow_the_coordinator_and_stop_when_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [True, True, False, True, RuntimeError("the coordinator is gone"), Stop()]
    asked: list[bool] = []
    prompt: list[bool] = []

    class Coordinator:
        def await_recovery(self, known: bool) -> bool:
            asked.append(known)
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return bool(answer)

    monkeypatch.setattr(_ray_compat, "poll_promptly", prompt.append)
    monkeypatch.setattr(inplace_controller, "WATCH_RETRY_S", 0.0)
    with pytest.raises(Stop):
        inplace_controller._poll_promptly_in_recoveries(Coordinator())  # type: ignore[arg-type]
    assert asked == [False, True, True, False, True, False], "each call names what the watch knows"
    assert prompt == [True, True, False, True, False]
