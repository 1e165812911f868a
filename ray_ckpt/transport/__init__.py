"""Reaching the actors: their names, calls with timeouts, the registry client, the store
directory and the stores' direct-read sockets, and Ray metrics.

Import rule (tests/unit/test_layout.py): a module here imports the core, the foundation, Ray's
public API and ``ray_ckpt._ray_compat``; never the Checkpointer stack, ``train`` or ``tools``.
"""

from ray_ckpt import _lazy

__getattr__ = _lazy.submodules(__name__)
