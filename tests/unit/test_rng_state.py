"""rng_state() / set_rng_state(): the global generators, saved through a snapshot and put back,
draw what they would have drawn; a state that cannot be put back is refused before any changes."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

import ray_ckpt
from ray_ckpt.core import rng
from ray_ckpt.core import snapshot as snap
from ray_ckpt.errors import ConfigError


def draws() -> tuple[Any, ...]:
    return (random.random(), np.random.random_sample(3).tobytes(), torch.rand(3).tolist())


def through_snapshot(state: Any) -> Any:
    header, payload = snap.snapshot({"rng": state})
    return snap.restore(header, payload)["rng"]


def test_restored_state_makes_the_same_draws() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draws()
    saved = through_snapshot(ray_ckpt.rng_state())
    expected = draws()
    draws()  # the run goes on, then resumes
    ray_ckpt.set_rng_state(saved)
    assert draws() == expected


def test_the_state_is_a_copy() -> None:
    state = rng.rng_state()
    before = [snap.snapshot(state)[0], snap.snapshot(state)[1].tobytes()]
    draws()
    assert [snap.snapshot(state)[0], snap.snapshot(state)[1].tobytes()] == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a process without CUDA")
def test_without_cuda_no_cuda_state_is_taken_and_a_saved_one_is_refused_before_any_change() -> None:
    state = rng.rng_state()
    assert set(state) == {"python", "numpy", "torch"}
    expected = draws()
    with_cuda = {**state, "cuda": [torch.zeros(16, dtype=torch.uint8)]}
    with pytest.raises(ConfigError, match="CUDA generator states of 1 devices, this process has 0"):
        rng.set_rng_state(with_cuda)
    rng.set_rng_state(state)
    assert draws() == expected


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s: {k: v for k, v in s.items() if k != "numpy"}, "missing \\['numpy'\\]"),
        (lambda s: {**s, "jax": 1}, "unknown \\['jax'\\]"),
        (lambda s: [s], "got list"),
        (lambda s: {**s, "torch": torch.zeros(3)}, "state\\['torch'\\]"),
        (lambda s: {**s, "python": [3, [1, 2], None]}, "state\\['python'\\]"),
    ],
)
def test_a_malformed_state_raises_config_error_naming_what(change: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        rng.set_rng_state(change(rng.rng_state()))


def test_the_package_names_are_the_module_functions() -> None:
    assert ray_ckpt.rng_state is rng.rng_state and ray_ckpt.set_rng_state is rng.set_rng_state
