"""Keeping Ray's own messages out of ray_ckpt's tools: Ray's logs stay in Ray's files.

Besides what ``ray.init(log_to_driver=True)`` forwards from workers, every Ray driver prints the
error messages the cluster publishes to drivers, straight to stdout with a ``(raylet)`` prefix
and colour codes even when piped: a node "marked dead because the detector has missed too many
heartbeats", each worker lost with it, and so on, dozens of lines per killed node. Ray keeps
them in its own log files as well (``logs_dir()``).

- ``quiet_driver()``: call right after ``ray.init`` in a tool's driver. Those messages go to
  the ``ray_ckpt.ray`` logger at DEBUG instead of stdout, and Ray's Python loggers in this
  process print errors only. It replaces one internal function of Ray,
  ``ray._private.worker.print_to_stdstream``, which Ray's listener thread looks up for every
  message (reached through ``ray_ckpt._ray_compat``, with Ray's other internals); where a Ray
  version lacks it, nothing is changed and the messages print as before.
- ``logs_dir()``: the folder of Ray's logs on this host for the cluster this process is
  connected to, for tools to say where Ray's messages went.

Workers' own output is left to ``log_to_driver`` (ray_ckpt's tools pass False).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("ray_ckpt.ray")

RAY_LOGGERS = ("ray", "ray.train", "ray.tune", "ray.data", "ray.serve")
_MARK = "_ray_ckpt_quiet"


def _divert(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (Ray's print_to_stdstream), except that messages published by the cluster
    (pid ``raylet``) are logged at DEBUG instead of printed."""

    def print_to_stdstream(data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if data.get("pid") == "raylet":
            for line in data.get("lines") or ():
                logger.debug("%s", line)
            return None
        return original(data, *args, **kwargs)

    setattr(print_to_stdstream, _MARK, True)
    return print_to_stdstream


def quiet_driver(level: int = logging.ERROR) -> bool:
    """Keep Ray's cluster messages and Python log records below ``level`` off this driver's
    stdout and stderr (see the module doc). Idempotent. True if the cluster messages were
    diverted, False if this Ray version has no hook for them."""
    for name in RAY_LOGGERS:
        ray_logger = logging.getLogger(name)
        ray_logger.setLevel(max(level, ray_logger.getEffectiveLevel()))
    from ray_ckpt import _ray_compat

    original = _ray_compat.driver_printer()
    if original is None:
        return False
    if not getattr(original, _MARK, False):
        _ray_compat.set_driver_printer(_divert(original))
    return True


def logs_dir() -> str | None:
    """Ray's log folder on this host for the connected cluster (the session's ``logs``), or None
    when this process is not connected or Ray does not say."""
    from ray_ckpt import _ray_compat

    return _ray_compat.ray_logs_dir()
