"""Large kernel outputs: reuse the memory of results the caller has dropped, as onnxruntime does.

Why: glibc serves allocations of 32 MB and more (its largest mmap threshold) with a fresh mmap, and the
kernel zeroes every page on first touch. For a memory-bound operator that costs more than the operator:
a 16M-element float32 DequantizeLinear output (64 MB) took 7.5 ms on this project's machine, 2.3 ms of
it the kernel and the rest page faults. onnxruntime returns arrays backed by its own arena (their base is
a PyCapsule) and hands the same memory out again once the caller drops the array, so its steady-state
calls never fault; this pool does the same for qlinear's element-wise kernels. Smaller outputs come
from ``np.empty``: malloc already reuses freed memory below the threshold.

How: a pooled buffer is a 1-D uint8 NumPy array that the pool owns; a result is a view of it (``result.base
is buffer``). When only the pool still refers to a buffer, every view of it is gone, and the next request
that fits (between half and all of the buffer) takes it. The pool never holds more than
`get_output_pool_limit()` bytes, in use or free: beyond that, free buffers are released (least recently
used first) and, if that is not enough, the result is an ordinary ``np.empty`` array. So memory kept after
the caller has dropped every result is bounded by the limit; ``set_output_pool_limit(0)`` turns the pool
off (and releases what it holds).

A pooled result behaves like any array, except that it does not own its data (``flags.owndata`` is
False), so in-place ``ndarray.resize`` refuses it; ``np.copy`` gives an owning array.
"""

from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np

MIN_POOLED_BYTES = 32 << 20  # glibc's largest mmap threshold: below it, malloc reuses memory itself
_DEFAULT_LIMIT = 1 << 30

_lock = threading.Lock()
_buffers: list[np.ndarray] = []  # least recently handed out first
_limit: int | None = None


def _env_limit() -> int:
    value = os.environ.get("QLINEAR_OUTPUT_POOL_BYTES")
    if value is None:
        return _DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError:
        raise ValueError(f"QLINEAR_OUTPUT_POOL_BYTES must be a non-negative integer, got {value!r}") from None
    if limit < 0:
        raise ValueError(f"QLINEAR_OUTPUT_POOL_BYTES must be a non-negative integer, got {value!r}")
    return limit


def get_output_pool_limit() -> int:
    """The most memory (bytes) qlinear keeps for reusing large outputs (default 1 GiB, or the
    QLINEAR_OUTPUT_POOL_BYTES environment variable)."""
    global _limit
    if _limit is None:
        _limit = _env_limit()
    return _limit


def set_output_pool_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` of memory for reusing outputs of 32 MB and more; 0 turns reuse off.

    Free buffers beyond the new limit are released at once; buffers still behind a live result are
    released once they are free and the pool needs room."""
    global _limit
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"set_output_pool_limit: nbytes must be an int, got {nbytes!r}")
    if nbytes < 0:
        raise ValueError(f"set_output_pool_limit: nbytes must be >= 0, got {nbytes}")
    with _lock:
        _limit = nbytes
        _trim(0)


def _is_free(buffer_index: int) -> bool:
    # references while free: the list slot, and getrefcount's own argument
    return sys.getrefcount(_buffers[buffer_index]) == 2


def _trim(room: int) -> None:
    """Release free buffers, least recently used first, until ``room`` more bytes fit under the limit."""
    limit = get_output_pool_limit()
    total = sum(b.nbytes for b in _buffers)
    i = 0
    while total + room > limit and i < len(_buffers):
        if _is_free(i):
            total -= _buffers.pop(i).nbytes
        else:
            i += 1


def empty_result(shape: tuple, dtype, n: int | None = None) -> np.ndarray:
    """`empty` for a kernel's result: below the pooling threshold plain np.empty, without `empty`'s Python
    overhead (``n``: the element count, when the caller has it)."""
    dtype = np.dtype(dtype)
    if (math.prod(shape) if n is None else n) * dtype.itemsize < MIN_POOLED_BYTES:
        return np.empty(shape, dtype)
    return empty(shape, dtype)


def empty(shape, dtype) -> np.ndarray:
    """Like ``np.empty(shape, dtype)`` (C order); large results may reuse a dropped result's memory."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, tuple) else (shape,)))
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_POOLED_BYTES or get_output_pool_limit() < nbytes:
        return np.empty(shape, dtype)
    with _lock:
        best = -1
        sizes = [b.nbytes for b in _buffers]  # no loop variable may hold a buffer: it would count as a user
        for i, size in enumerate(sizes):
            if nbytes <= size <= 2 * nbytes and (best < 0 or size < sizes[best]) and _is_free(i):
                best = i
        if best >= 0:
            buffer = _buffers.pop(best)
        else:
            _trim(nbytes)
            if sum(b.nbytes for b in _buffers) + nbytes > get_output_pool_limit():
                return np.empty(shape, dtype)  # the pool is full of live results
            buffer = np.empty(nbytes, np.uint8)
        _buffers.append(buffer)  # most recently used last
        return buffer[:nbytes].view(dtype).reshape(shape)


def pooled_bytes() -> int:
    """Bytes the pool holds now, in use or free (for tests and benchmarks)."""
    with _lock:
        return sum(b.nbytes for b in _buffers)
