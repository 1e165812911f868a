"""The built-in dashboard: recoveries, save stalls, store memory, shard placement, protection.

``ray-ckpt dashboard`` serves it (``server.py``, standard library only); ``data.build`` makes
the JSON the page draws (``/api/data``) from recorded events and, live, from a cluster.
"""

from ray_ckpt.dashboard.data import build

__all__ = ["build"]
