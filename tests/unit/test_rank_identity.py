"""RankIdentity: a rank's job, rank, world size, attempt and node, checked once at construction
(ConfigError naming the field), frozen, and the one record a Checkpointer's save pipeline and
restorer share, also after the registry gave the rank its attempt."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest

from ray_ckpt import checkpointer as checkpointer_module
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.core.identity import JOB_MAX_BYTES, RankIdentity
from ray_ckpt.core.shard import SAVE_ID_MAX
from ray_ckpt.errors import ConfigError

VALID: dict[str, Any] = {"job": "train", "rank": 2, "world_size": 4, "attempt": "a1", "node_id": "node-0"}


def test_a_valid_identity_is_frozen_and_a_new_attempt_is_a_new_record() -> None:
    identity = RankIdentity(**VALID)
    assert (identity.job, identity.rank, identity.world_size, identity.attempt, identity.node_id) == tuple(
        VALID.values()
    )
    assert RankIdentity(**{**VALID, "attempt": None}).attempt is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        identity.rank = 3  # type: ignore[misc]
    later = RankIdentity(**{**VALID, "attempt": None}).with_attempt("auto-1")
    assert later == RankIdentity(**{**VALID, "attempt": "auto-1"})
    with pytest.raises(ConfigError, match="attempt"):
        identity.with_attempt("")


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("job", "", "job must be a non-empty str without '/'"),
        ("job", "a/b", "job must be"),
        ("job", 7, "job must be"),
        ("job", "x" * (JOB_MAX_BYTES + 1), f"{JOB_MAX_BYTES + 1} bytes of UTF-8, more than the {JOB_MAX_BYTES}"),
        ("job", "é" * (JOB_MAX_BYTES // 2 + 1), f"more than the {JOB_MAX_BYTES} a job name may have"),
        ("world_size", 0, r"world_size must be an int >= 1"),
        ("world_size", True, "world_size"),
        ("rank", 4, r"rank must be an int in \[0, world_size=4\)"),
        ("rank", -1, "rank must be"),
        ("rank", 1.0, "rank must be"),
        ("attempt", "", "attempt must be None or a non-empty str"),
        ("attempt", "x" * (SAVE_ID_MAX + 1), f"at most {SAVE_ID_MAX} characters"),
        ("attempt", 5, "attempt must be"),
        ("node_id", "", "node_id must be the non-empty id"),
        ("node_id", None, "node_id"),
    ],
)
def test_a_bad_field_is_a_config_error_naming_it(field: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RankIdentity(**{**VALID, field: value})
    if field != "node_id":  # the checks a caller makes before it knows its node
        arguments = {name: v for name, v in VALID.items() if name != "node_id"}
        with pytest.raises(ConfigError, match=named):
            RankIdentity.check(**{**arguments, field: value})


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Ray looks connected on node "node-0"; the registry client keeps the events it is sent."""
    sent: list[dict[str, Any]] = []
    context = types.SimpleNamespace(get_node_id=lambda: "node-0")
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context)
    monkeypatch.setattr(checkpointer_module, "ray", fake_ray)
    registry = types.SimpleNamespace(record=sent.append)
    monkeypatch.setattr(checkpointer_module, "RegistryClient", lambda namespace: registry)
    monkeypatch.setattr(checkpointer_module, "StoreDirectory", lambda namespace: types.SimpleNamespace())
    return sent


def test_the_checkpointer_its_pipeline_and_its_restorer_share_one_identity(recorded: list[dict[str, Any]]) -> None:
    """Built from the public keywords and Ray's node; after a restore in which the registry gave
    the rank its attempt, all three hold the new record."""
    ckpt = Checkpointer(job="train", rank=2, world_size=4)
    try:
        assert ckpt.identity == RankIdentity(job="train", rank=2, world_size=4, attempt=None, node_id="node-0")
        assert ckpt._saves.identity is ckpt.identity and ckpt._restorer.identity is ckpt.identity
        assert (ckpt.job, ckpt.rank, ckpt.world_size, ckpt.attempt, ckpt.node_id) == ("train", 2, 4, None, "node-0")

        def restore(step: Any, into: Any) -> tuple[None, None]:
            ckpt._restorer.identity = ckpt._restorer.identity.with_attempt("auto-1")  # as a plan would
            return None, None

        ckpt._restorer.restore = restore  # type: ignore[method-assign,assignment]
        assert ckpt.restore() is None
        assert ckpt.attempt == "auto-1" and ckpt._saves.attempt == "auto-1"
        assert ckpt._saves.identity is ckpt.identity is ckpt._restorer.identity
        assert recorded[-1]["attempt"] == "auto-1" and recorded[-1]["node_id"] == "node-0"
    finally:
        ckpt._background.shutdown()
