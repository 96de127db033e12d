"""How the workers of one parallel region share its tasks (qlinear.kernels._drivers, qlinear.kernels._amx): counters
in an int64 array, taken with `_atomics.fetch_add`.

- `zeros` makes the counters (in a loop: np.zeros would be a parallel region of its own);
- `wait_for` waits until the tasks a task reads from (packed panels) have set their flags;
- `next_in_shares` hands out tasks [0, n) split into one contiguous share per worker: a worker takes from its own
  share first, then from what is left of the others', so the data of its share stays in its cache from call to
  call, and a worker that wakes late still finds work.
"""

from __future__ import annotations

import numpy as np

from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit  # noqa: E402

from qlinear.kernels._atomics import fetch_add, load_acquire  # noqa: E402


@njit(cache=True, inline="always")
def zeros(n):
    """n int64 zeros, set in a loop: in a parallel function np.zeros is a parallel region of its own, which costs a
    fork and join (and a sleeping worker's wake-up) before the real one."""
    a = np.empty(n, np.int64)
    for i in range(n):
        a[i] = 0
    return a


@njit(cache=True, inline="always")
def next_in_shares(claim, first, stride, n, n_workers, worker, r):
    """(the next task of [0, n) for ``worker``, the share it came from) or (-1, n_workers) when none is left.
    Share v is tasks [v * n // n_workers, (v + 1) * n // n_workers), counted in claim[first + stride * v];
    ``r`` is the share, counted from the worker's own, to try first (0 at the start, then what the last call
    returned)."""
    while r < n_workers:
        v = (worker + r) % n_workers
        t = v * n // n_workers + fetch_add(claim, first + stride * v, 1)
        if t < (v + 1) * n // n_workers:
            return t, r
        r += 1
    return -1, r


@njit(cache=True, inline="always")
def wait_for(ready, lo, hi):
    """Until ready[lo...hi-1] are all set (store_release by the tasks that filled them)."""
    for i in range(lo, hi):
        while load_acquire(ready, i) == 0:
            pass
