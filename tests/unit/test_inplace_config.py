"""InPlaceRecovery without a cluster: its arguments, which errors count as a lost peer, the
fallback when Ray lacks the replica-group path, and the wrapper used without its config."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ray_ckpt import _ray_compat, inplace
from ray_ckpt.errors import CommitTimeoutError, ConfigError
from ray_ckpt.inplace import InPlaceRecovery, is_peer_failure


@pytest.mark.parametrize("name", ["timeout_s", "hang_timeout_s", "collective_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, "10", True, None])
def test_bad_timeouts_are_refused_naming_the_argument(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        InPlaceRecovery(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_a_bad_warm_spare_count_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="warm_spares"):
        InPlaceRecovery(warm_spares=value)  # type: ignore[arg-type]


def test_warm_up_imports_what_a_worker_needs_at_a_lower_priority_the_worker_takes_back() -> None:
    """The setup hook of warm spares imports the modules named and says when it was done; where
    the process may renice back, it does so at WARM_NICENESS more, and becoming a worker
    restores its niceness."""
    import os
    import sys

    before = os.nice(0)
    renices = inplace._may_renice()
    try:
        inplace.warm_up()
        assert all(module in sys.modules for module in inplace.WARM_MODULES)
        assert inplace._warmed_at is not None
        assert os.nice(0) == before + (inplace.WARM_NICENESS if renices else 0)
    finally:
        inplace._take_priority_back()
    assert os.nice(0) == before


def test_it_is_a_torch_config_whose_process_groups_use_the_collective_timeout() -> None:
    from ray.train.torch import TorchConfig

    recovery = InPlaceRecovery(collective_timeout_s=42, backend="gloo")
    assert isinstance(recovery, TorchConfig) and recovery.timeout_s == 42 and recovery.backend == "gloo"
    assert recovery.backend_cls.has_replica_groups is True


def test_collective_and_commit_errors_count_as_a_lost_peer_and_others_do_not() -> None:
    assert is_peer_failure(dist.DistBackendError("whatever"))
    assert is_peer_failure(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    assert is_peer_failure(CommitTimeoutError("step 3 did not commit"))
    assert not is_peer_failure(RuntimeError("shape mismatch in matmul"))
    assert not is_peer_failure(ValueError("Connection closed"))


def test_without_the_replica_group_path_the_backend_restarts_the_whole_group(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = _ray_compat.ReplicaGroups(None, None, "Ray lacks ReplicaGroup")
    monkeypatch.setattr(_ray_compat, "replica_groups", lambda: missing)
    inplace._backend_class.cache_clear()
    try:
        assert inplace._backend_class().has_replica_groups is False
    finally:
        inplace._backend_class.cache_clear()


def test_the_wrapped_function_without_its_config_says_what_to_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inplace, "_role", None)
    wrapped = InPlaceRecovery().wrap(lambda config: None)
    with pytest.raises(ConfigError, match="torch_config=recovery"):
        wrapped({})
