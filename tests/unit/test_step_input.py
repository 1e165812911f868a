"""Step numbers at the public API: ``save`` and ``restore`` take ints in [0, 2**63) only (not a
bool, not a float), refused with a ConfigError naming the limit before anything is touched."""

from __future__ import annotations

from typing import Any

import pytest

from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.core.shard import STEP_MAX, check_step
from ray_ckpt.errors import ConfigError

BAD_STEPS = [2**64, 2**63, -1, True, False, 1.9, 3.0, "3", None]


@pytest.mark.parametrize("step", [0, 1, 10**12, STEP_MAX])
def test_ints_from_0_to_step_max_are_steps(step: int) -> None:
    assert check_step(step) == step and STEP_MAX == 2**63 - 1


@pytest.mark.parametrize("step", BAD_STEPS)
def test_anything_else_is_a_config_error_naming_the_limit(step: Any) -> None:
    with pytest.raises(ConfigError, match=r"step must be an int in \[0, 2\*\*63\), got "):
        check_step(step)


def unconnected() -> Checkpointer:
    """A Checkpointer past its constructor without Ray: its collaborators are absent, so any
    call that got past the input check would fail with another error."""
    ckpt = object.__new__(Checkpointer)
    ckpt._closed, ckpt._last_step = False, None
    return ckpt


@pytest.mark.parametrize("step", BAD_STEPS)
def test_save_refuses_a_bad_step_first(step: Any) -> None:
    """``save(2**64)`` got as far as the stores, which could not encode it, and was reported as
    StoreUnavailableError."""
    with pytest.raises(ConfigError, match=r"\[0, 2\*\*63\)"):
        unconnected().save(step, {"w": 1})


@pytest.mark.parametrize("step", [s for s in BAD_STEPS if s is not None])
def test_restore_refuses_a_bad_step_first(step: Any) -> None:
    """``restore(step=True)`` restored step 1 and ``restore(step=1.9)`` asked the registry."""
    with pytest.raises(ConfigError, match=r"\[0, 2\*\*63\)"):
        unconnected().restore(step)
