"""Operating a cluster: the command line, fault injection (``chaos``, ``faults``) and keeping
Ray's driver output quiet. May import every other wing; nothing in the library imports it but
``ray_ckpt.testing``.
"""

from ray_ckpt import _lazy

__getattr__ = _lazy.submodules(__name__)
