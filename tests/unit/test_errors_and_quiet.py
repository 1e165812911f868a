"""One error hierarchy (also for the tools' errors), remote errors unwrapped, Ray's messages diverted."""

from __future__ import annotations

import logging
import pathlib
import pickle
from typing import Any

import pytest
import ray.exceptions

from ray_ckpt import errors
from ray_ckpt.errors import (
    CliError,
    DashboardError,
    KillError,
    KillTimeoutError,
    NoCheckpointError,
    RayCkptError,
    unwrap_remote,
)
from ray_ckpt.tools import quiet


@pytest.mark.parametrize("kind", [CliError, DashboardError, KillError, KillTimeoutError])
def test_tool_errors_join_the_hierarchy_and_pickle(kind: type[RayCkptError]) -> None:
    error = kind("what went wrong", node_id="abc")
    assert isinstance(error, RayCkptError)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is kind and back.message == "what went wrong" and back.node_id == "abc"  # type: ignore[attr-defined]


def test_kill_timeout_is_still_a_timeout_error() -> None:
    assert issubclass(KillTimeoutError, TimeoutError) and issubclass(KillTimeoutError, KillError)


def remote_error(cause: Exception) -> ray.exceptions.RayTaskError:
    """What ray.get raises when an actor method raised ``cause``."""
    wrapped = ray.exceptions.RayTaskError("Registry.locate", "Traceback (most recent call last): ...", cause)
    return wrapped.as_instanceof_cause()


def test_unwrap_remote_returns_the_ray_ckpt_error_the_actor_raised() -> None:
    cause = NoCheckpointError("job 'a' has no step 3", job="a", step=3)
    wrapped = remote_error(cause)
    assert isinstance(wrapped, ray.exceptions.RayTaskError)
    own = unwrap_remote(wrapped)
    assert type(own) is NoCheckpointError
    assert own is cause and own.details == {"job": "a", "step": 3}
    assert "Traceback" not in str(own)


def test_unwrap_remote_leaves_other_errors_alone() -> None:
    foreign = remote_error(ValueError("not ours"))
    assert unwrap_remote(foreign) is foreign
    plain = NoCheckpointError("local")
    assert unwrap_remote(plain) is plain
    timeout = ray.exceptions.GetTimeoutError("slow")
    assert unwrap_remote(timeout) is timeout


def test_errors_module_imports_nothing_but_the_standard_library() -> None:
    source = pathlib.Path(errors.__file__).read_text(encoding="utf-8")
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["from __future__ import annotations", "import sys", "from typing import Any"]


def test_cluster_messages_go_to_the_log_not_stdout(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    printed: list[dict[str, Any]] = []
    divert = quiet._divert(lambda data, *args: printed.append(data))
    caplog.set_level(logging.DEBUG, logger="ray_ckpt.ray")
    dead = "The node with node id: ab12 ... has been marked dead because the detector has missed too many heartbeats"
    divert({"lines": [dead], "pid": "raylet", "is_err": False}, False)
    worker_line = {"lines": ["hello"], "pid": 1234, "is_err": False}
    divert(worker_line, False)
    assert capsys.readouterr().out == ""
    assert [r.getMessage() for r in caplog.records] == [dead]
    assert printed == [worker_line]  # workers' own output is left to log_to_driver


def test_quiet_driver_replaces_the_hook_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import worker

    def original(data: Any, *args: Any, **kwargs: Any) -> None:
        """Stands for Ray's own hook: an earlier test in this process may have diverted Ray's."""

    monkeypatch.setattr(worker, "print_to_stdstream", original)
    monkeypatch.setattr(logging.getLogger("ray"), "level", logging.INFO)
    assert quiet.quiet_driver()
    diverted = worker.print_to_stdstream
    assert diverted is not original
    assert quiet.quiet_driver()
    assert worker.print_to_stdstream is diverted
    assert logging.getLogger("ray").level == logging.ERROR


def _every_error_kind() -> list[type[RayCkptError]]:
    kinds = [RayCkptError]
    while True:
        subclasses = (k for base in kinds for k in base.__subclasses__())
        more = [k for k in subclasses if k not in kinds and k.__module__ == errors.__name__]
        if not more:
            return kinds
        kinds.extend(more)


@pytest.mark.parametrize("kind", _every_error_kind(), ids=lambda kind: kind.__name__)
def test_every_error_survives_rays_wrapping_with_its_details(kind: type[RayCkptError]) -> None:
    """What a worker's error goes through on its way to ``trainer.fit()``: Ray's RayTaskError
    and its dual class (``as_instanceof_cause``), Ray Train's WorkerGroupError and
    ControllerError, each pickled with Ray's cloudpickle; the error comes out as its own kind,
    with its message and details."""
    from ray.train import ControllerError, WorkerGroupError

    cause = kind("what went wrong", job="j", step=3, ranks=[0, 2])
    traceback = f"Traceback (most recent call last): ...\n{kind.__name__}: what went wrong"
    dual = ray.exceptions.RayTaskError("fn", traceback, cause).as_instanceof_cause()
    for wrapped in (cause, dual, WorkerGroupError("worker 0 failed", {0: dual}), ControllerError(dual)):
        back = ray.cloudpickle.loads(ray.cloudpickle.dumps(wrapped))
        inner = (
            back.worker_failures[0]
            if isinstance(back, WorkerGroupError)
            else back.controller_failure
            if isinstance(back, ControllerError)
            else back
        )
        own = unwrap_remote(inner)
        assert type(own) is kind, (wrapped, own)
        assert own.message == "what went wrong" and own.details == {"job": "j", "step": 3, "ranks": [0, 2]}
        assert "what went wrong" in str(own) and "what went wrong" in str(inner)


def test_an_error_that_cannot_travel_reaches_the_driver_as_a_readable_in_place_error() -> None:
    from ray_ckpt.train import inplace_worker

    class Local(Exception):  # an error holding something that cannot be pickled
        def __init__(self) -> None:
            super().__init__("the dataset shard is gone")
            self.handle = lambda: None

        def __reduce__(self) -> Any:
            raise TypeError("cannot pickle a lambda")

    sent = inplace_worker._transportable(Local())
    assert type(sent) is errors.InPlaceRecoveryError
    assert "Local: the dataset shard is gone" in str(sent) and sent.error_type == "Local"  # type: ignore[attr-defined]
    plain = ValueError("fine")
    assert inplace_worker._transportable(plain) is plain
