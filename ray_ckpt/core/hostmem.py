"""Host buffers: mapped up front, not on first touch, without holding the GIL; any one viewed as bytes.

On many virtual machines a first-touch page fault costs microseconds, so filling a fresh
1 GiB numpy array can take seconds; asking the kernel to map every page in one call is several
times faster. ``MAP_POPULATE`` would do that, but CPython's ``mmap.mmap`` holds the GIL while the
kernel maps the pages (0.35 s per GiB here), which stalls every other thread of the process,
including the ones receiving shards. So the pages are mapped with ``madvise(MADV_POPULATE_WRITE)``
called through ctypes (which releases the GIL), or, on kernels older than 5.14, touched one
per page by numpy (which also releases it). Used for the buffers that save, restore and the
stores write into.

``as_bytes`` is the one way the codec, the checksums, the stores and the snapshot reader see a
caller's buffer (bytes, bytearray, memoryview, numpy array, CPU tensor) as flat bytes, without a
copy.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

_MIN_BYTES = 1 << 20  # below this, malloc's pages are as good
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_PAGE = mmap.PAGESIZE


def _load_madvise() -> Callable[[int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise() if hasattr(mmap, "MAP_ANONYMOUS") else None


def allocate(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` whose memory is already mapped (contents zero or
    arbitrary). Safe to call from a background thread: the GIL is released while pages are
    mapped. Falls back to ``np.empty`` where anonymous mappings do not exist."""
    if nbytes < _MIN_BYTES or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(nbytes, dtype=np.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    array = np.frombuffer(region, dtype=np.uint8)
    if _madvise is None or _madvise(array.ctypes.data, nbytes, _MADV_POPULATE_WRITE) != 0:
        array[::_PAGE] = 0  # older kernels: one write per page
    return array


def as_bytes(buffer: Any, what: str = "buffer") -> np.ndarray:
    """A flat uint8 view (no copy) of a C-contiguous buffer: bytes, bytearray, memoryview,
    numpy array of any dtype, or CPU torch tensor of any dtype. ``what`` names the buffer in
    the errors: ValueError for one that is not contiguous or lives on a device, TypeError for
    something that is not a buffer. Imports no torch (a tensor means torch is loaded already)."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError(f"{what} must be C-contiguous; call np.ascontiguousarray first")
        return buffer.reshape(-1).view(np.uint8)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(buffer, torch.Tensor):
        if buffer.device.type != "cpu":
            raise ValueError(
                f"{what} is a tensor on {buffer.device}: copy it to the CPU first "
                "(ray_ckpt.core.codec_torch codes device tensors)"
            )
        if not buffer.is_contiguous():
            raise ValueError(f"{what} must be a contiguous tensor; call .contiguous() first")
        return buffer.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(
            f"{what} must be a bytes-like buffer, numpy array or CPU tensor, got {type(buffer).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    return np.frombuffer(view, dtype=np.uint8) if view.nbytes else np.zeros(0, dtype=np.uint8)


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the same bytes (same start, same size): copying one into the
    other would change nothing."""
    return a.nbytes == b.nbytes and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
