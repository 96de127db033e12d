"""The packings of the raw weight arrays recent calls passed, reused when a later call passes an array that
holds the same bytes.

`qlinear_conv`, `conv_integer`, `qlinear_matmul` and `matmul_integer` called with a plain weight array pack it
first (`prepack_conv` does that once for a caller that knows the weights are constant). A caller that passes
the same array call after call (an inference loop) would pay the packing, and the per-shape plan, every time.

How reuse stays safe: the cache packs a private copy of the weights and keys it by the array's address,
shape, strides, dtype and the packing's other inputs (zero points, group). A call whose key matches compares
the array it was given with that copy, every byte (word by word, about 30 us per MB), and reuses the
packing only if they are equal: an array modified in place, or a new array at a freed address, is packed
again. Nothing depends on the array being read-only or on a hash. What it costs: the copy (the packing is
about as large again), at most `MAX_ENTRIES` packings and `MAX_BYTES` of copied weights, least recently used
dropped first; `clear()` empties it, `set_enabled(False)` turns it off (every call packs).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

MAX_ENTRIES = 32
MAX_BYTES = 256 << 20

_lock = threading.Lock()
_entries: OrderedDict = OrderedDict()  # key -> (copy of the weights, packing)
_held = 0
_enabled = True


def packed(kind: str, w: np.ndarray, extra: tuple, make):
    """``make(copy)``'s packing of ``w`` (``copy``: a C-contiguous private copy of ``w``), or the one an earlier
    call made from an equal array with the same ``kind`` and ``extra`` (hashable: zero points as bytes, group)."""
    global _held
    if not _enabled or w.nbytes > MAX_BYTES:
        return make(np.array(w, order="C", copy=True))
    key = (kind, w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, extra)
    with _lock:
        entry = _entries.get(key)
        if entry is not None:
            _entries.move_to_end(key)
    if entry is not None and _same(entry[0], w):
        return entry[1]
    copy = np.array(w, order="C", copy=True)
    result = make(copy)
    with _lock:
        old = _entries.pop(key, None)
        if old is not None:
            _held -= old[0].nbytes
        _entries[key] = (copy, result)
        _held += copy.nbytes
        while _entries and (len(_entries) > MAX_ENTRIES or _held > MAX_BYTES):
            _, (dropped, _) = _entries.popitem(last=False)
            _held -= dropped.nbytes
    return result


def _same(copy: np.ndarray, w: np.ndarray) -> bool:
    """Whether ``w`` holds ``copy``'s bytes: word by word where ``w`` is C-contiguous (`_same_bytes`), else
    numpy.array_equal."""
    if not (w.flags.c_contiguous and w.dtype == copy.dtype and w.shape == copy.shape):
        return bool(np.array_equal(copy, w))
    from ._same_bytes import same_values

    a, b = copy.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8)
    if a.size % 8 == 0:
        a, b = a.view(np.uint64), b.view(np.uint64)
    return bool(same_values(a, b))


def clear() -> None:
    """Drop every cached packing."""
    global _held
    with _lock:
        _entries.clear()
        _held = 0


def set_enabled(flag: bool) -> None:
    """Reuse packings (True, the default) or pack on every call (False); turning it off clears it."""
    global _enabled
    _enabled = bool(flag)
    if not _enabled:
        clear()


def size() -> tuple[int, int]:
    """(packings held, bytes of weights copied)."""
    with _lock:
        return len(_entries), _held
