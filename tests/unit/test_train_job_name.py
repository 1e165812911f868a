"""The Ray Train experiment name -> ray_ckpt job mapping, and the ``job=`` override's checks.

No cluster: ``job_name`` is pure, and a bad override is refused before Ray Train is consulted.
"""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_ckpt import ConfigError
from ray_ckpt.train import Checkpointer, job_name

NAMES = st.text(alphabet=st.sampled_from("ab/%2F5_-. é"), min_size=1, max_size=12) | st.text(min_size=1)


@pytest.mark.parametrize(
    ("experiment", "job"),
    [
        ("exp1", "exp1"),
        ("team/exp1", "team%2Fexp1"),
        ("a/b/c", "a%2Fb%2Fc"),
        ("/lead", "%2Flead"),
        ("100%", "100%25"),
        ("team%2Fexp1", "team%252Fexp1"),
        ("team_exp1", "team_exp1"),
    ],
)
def test_examples_of_the_documented_rule(experiment: str, job: str) -> None:
    assert job_name(experiment) == job


@given(NAMES)
def test_job_is_a_valid_job_and_decodes_back_to_the_name(experiment: str) -> None:
    """Never a '/', never empty, and invertible (so distinct names never share a job)."""
    job = job_name(experiment)
    assert job and "/" not in job
    assert urllib.parse.unquote(job) == experiment


@given(NAMES, NAMES)
def test_distinct_names_give_distinct_jobs(a: str, b: str) -> None:
    assert (job_name(a) == job_name(b)) == (a == b)


@given(st.text(alphabet=st.characters(blacklist_characters="/%"), min_size=1))
def test_names_without_slash_or_percent_are_kept(experiment: str) -> None:
    assert job_name(experiment) == experiment


@given(NAMES)
def test_deterministic(experiment: str) -> None:
    assert job_name(experiment) == job_name(experiment)


@pytest.mark.parametrize("bad", ["", None, 3, b"exp"])
def test_a_bad_experiment_name_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="experiment name"):
        job_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "team/exp1", 7, b"exp"])
def test_a_bad_job_override_is_refused_with_the_fix(bad: object) -> None:
    """Refused before Ray Train is asked anything, so outside a run too; the message names the
    mapping to use instead."""
    with pytest.raises(ConfigError, match=r"job must be a non-empty str without '/'.*job_name"):
        Checkpointer(job=bad)  # type: ignore[arg-type]


class _Context:
    def get_experiment_name(self) -> str:
        return "team/exp1"

    def get_world_rank(self) -> int:
        return 1

    def get_world_size(self) -> int:
        return 2


@pytest.mark.parametrize(("override", "job"), [(None, "team%2Fexp1"), ("exp1-ckpt", "exp1-ckpt")])
def test_the_job_passed_on_is_the_override_else_the_mapped_experiment_name(
    monkeypatch: pytest.MonkeyPatch, override: str | None, job: str
) -> None:
    """With Ray Train's context and collective faked: the generic Checkpointer receives the
    override as is, else ``job_name(<experiment name>)``, with the run's rank and world size."""
    import ray_ckpt.train.checkpointer as train

    received: dict[str, object] = {}
    monkeypatch.setattr(train.ray.train, "get_context", _Context)
    monkeypatch.setattr(train, "broadcast_from_rank_zero", lambda value: value)
    monkeypatch.setattr(train.checkpointer.Checkpointer, "__init__", lambda self, **kwargs: received.update(kwargs))
    train.Checkpointer(job=override)
    assert received["job"] == job
    assert (received["rank"], received["world_size"]) == (1, 2)
    assert isinstance(received["attempt"], str) and received["attempt"]
