"""Bad input at the API boundary: CheckpointConfig and Checkpointer arguments, drawn by hypothesis.

Every drawn input either builds a valid object or raises ConfigError naming the field; no other
exception type, ever.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_ckpt import CheckpointConfig, ConfigError
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.core.identity import JOB_MAX_BYTES
from ray_ckpt.errors import StoreUnavailableError

FIELDS = [f.name for f in dataclasses.fields(CheckpointConfig)]

ANY_VALUE = (
    st.integers(-(2**70), 2**70)
    | st.integers(-3, 300)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["wait", "skip", "zone", "/tmp/backups", "s3://bucket/run", "auto", "Auto"])
    | st.lists(st.integers(), max_size=2)
)


def _valid(config: CheckpointConfig) -> None:
    """The invariants every constructed config holds."""

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    assert is_int(config.data_shards) and config.data_shards >= 1
    assert is_int(config.parity_shards) and config.parity_shards >= 0
    assert config.total_shards <= 256
    assert is_int(config.keep_committed) and config.keep_committed >= 1
    assert is_int(config.backup_every) and config.backup_every >= 0
    assert is_int(config.backup_keep) and config.backup_keep >= 1
    assert isinstance(config.local_copy, bool)
    assert config.on_busy in ("wait", "skip")
    assert config.every == "auto" or (is_int(config.every) and config.every >= 1)
    assert config.failure_domain_label is None or (
        isinstance(config.failure_domain_label, str) and config.failure_domain_label
    )
    assert config.backup_uri is None or (isinstance(config.backup_uri, str) and config.backup_uri)
    timeout = config.commit_timeout_s
    assert not isinstance(timeout, bool) and isinstance(timeout, (int, float))
    assert math.isfinite(timeout) and timeout > 0


@settings(max_examples=400, deadline=None)
@given(values=st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE, max_size=4))
def test_drawn_configs_are_valid_or_rejected_naming_the_field(values: dict[str, Any]) -> None:
    try:
        config = CheckpointConfig(**values)
    except ConfigError as error:
        assert any(name in str(error) for name in values), (values, str(error))
    else:
        _valid(config)
        assert CheckpointConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "values, field",
    [
        ({"data_shards": 0}, "data_shards"),
        ({"parity_shards": -1}, "parity_shards"),
        ({"data_shards": 200, "parity_shards": 57}, "256"),
        ({"keep_committed": True}, "keep_committed"),
        ({"commit_timeout_s": float("nan")}, "commit_timeout_s"),
        ({"on_busy": "drop"}, "on_busy"),
        ({"backup_uri": ""}, "backup_uri"),
        ({"local_copy": 1}, "local_copy"),
    ],
)
def test_each_bad_field_is_named(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        CheckpointConfig(**values)


@pytest.mark.parametrize("every", [True, False, 0, -1, 2.0, 1.5, float("nan"), "Auto", "always", "", "4", None, [2]])
def test_every_is_a_positive_int_or_auto(every: Any) -> None:
    """Anything else is refused with the accepted values named."""
    with pytest.raises(ConfigError, match=r"every must be an int >= 1 .* or 'auto'"):
        CheckpointConfig(every=every)


@pytest.mark.parametrize("every", [1, 2, 7, 1024, "auto"])
def test_every_accepts_ints_from_1_and_auto(every: int | str) -> None:
    config = CheckpointConfig(every=every)
    assert config.every == every and CheckpointConfig.from_dict(config.to_dict()) == config


def test_every_defaults_to_every_call() -> None:
    assert CheckpointConfig().every == 1


def test_from_dict_rejects_unknown_keys_naming_them() -> None:
    with pytest.raises(ConfigError, match="'parity_shard' not a CheckpointConfig field"):
        CheckpointConfig.from_dict({"data_shards": 2, "parity_shard": 1})


def test_config_is_frozen() -> None:
    config = CheckpointConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data_shards = 8  # type: ignore[misc]


@settings(max_examples=300, deadline=None)
@given(
    job=st.text(max_size=6) | st.none() | st.integers(),
    rank=st.integers(-3, 8) | st.booleans() | st.floats(allow_nan=True) | st.none(),
    world_size=st.integers(-2, 8) | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=2),
)
def test_drawn_checkpointer_arguments_are_checked_before_anything_else(job: Any, rank: Any, world_size: Any) -> None:
    """Wrong job, rank or world size raise ConfigError naming the argument before Ray is even
    needed; valid ones get as far as the missing Ray connection (StoreUnavailableError)."""
    assert not ray.is_initialized()
    valid = (
        isinstance(job, str)
        and job
        and "/" not in job
        and isinstance(world_size, int)
        and not isinstance(world_size, bool)
        and world_size >= 1
        and isinstance(rank, int)
        and not isinstance(rank, bool)
        and 0 <= rank < world_size
    )
    if valid:
        with pytest.raises(StoreUnavailableError, match=r"ray\.init"):
            Checkpointer(job=job, rank=rank, world_size=world_size)
    else:
        with pytest.raises(ConfigError, match=r"job|rank|world_size"):
            Checkpointer(job=job, rank=rank, world_size=world_size)


def test_a_job_name_over_the_one_limit_is_refused_when_the_checkpointer_is_made() -> None:
    """JOB_MAX_BYTES bytes of UTF-8 get as far as the missing Ray connection; one more is a
    ConfigError naming the limit at construction, not a refusal by a store's port at a save."""
    assert not ray.is_initialized()
    with pytest.raises(StoreUnavailableError, match=r"ray\.init"):
        Checkpointer(job="j" * JOB_MAX_BYTES, rank=0, world_size=1)
    with pytest.raises(ConfigError, match=f"more than the {JOB_MAX_BYTES} a job name may have.*JOB_MAX_BYTES"):
        Checkpointer(job="j" * (JOB_MAX_BYTES - 1) + "é", rank=0, world_size=1)


def test_a_config_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="CheckpointConfig"):
        Checkpointer(job="j", rank=0, world_size=1, config={"data_shards": 2})  # type: ignore[arg-type]


def test_backups_of_an_int_every_must_fall_on_saved_steps() -> None:
    assert CheckpointConfig(every=4, backup_every=8).backup_every == 8
    assert CheckpointConfig(every="auto", backup_every=100).backup_every == 100
    with pytest.raises(ConfigError, match="multiple of every"):
        CheckpointConfig(every=4, backup_every=6)
