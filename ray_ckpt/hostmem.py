"""Host buffers whose pages are mapped up front (MAP_POPULATE), not on first touch.

On many virtual machines a first-touch page fault costs microseconds, so filling a fresh
1 GiB numpy array can take seconds; asking the kernel to map every page in one call is several
times faster. Used for the buffers that save, restore and the stores write into.
"""

from __future__ import annotations

import mmap

import numpy as np

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MIN_BYTES = 1 << 20  # below this, malloc's pages are as good


def allocate(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` whose memory is already mapped (contents zero or
    arbitrary). Falls back to ``np.empty`` where MAP_POPULATE does not exist."""
    if nbytes < _MIN_BYTES or not _POPULATE:
        return np.empty(nbytes, dtype=np.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
    return np.frombuffer(region, dtype=np.uint8)
