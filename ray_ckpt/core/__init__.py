"""The pure core: the codec, the snapshot and shard formats, placement and protection, and the
registry's, stores' and generations' state machines as plain classes.

Import rule (tests/unit/test_layout.py): a module here imports only ``ray_ckpt.core`` and the
foundation (``ray_ckpt.errors``, ``ray_ckpt.settings``, ``ray_ckpt.config``); importing any of
it loads no Ray, so it is unit-tested without a cluster and loaded cheaply by the store actors.
"""

from ray_ckpt import _lazy

__getattr__ = _lazy.submodules(__name__)
