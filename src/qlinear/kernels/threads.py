"""How many threads qlinear's numba kernels use, and calling parallel kernels safely.

- `set_num_threads(n)` / `get_num_threads()`: a process-wide setting (numba's own `set_num_threads` is
  per calling thread, which surprises users who call from worker threads). The default is numba's thread
  count, i.e. every core, or NUMBA_NUM_THREADS when that environment variable is set.
- `call_parallel(fn, *args)`: runs a ``parallel=True`` numba function with that many threads. numba's
  "workqueue" threading layer aborts the process when two Python threads enter parallel code at once
  (dask does this), so under that layer calls are serialised by a lock; omp and tbb run concurrently.
- `SERIAL_BELOW`: element-wise calls smaller than this run the serial kernel (a parallel launch costs
  tens of microseconds, more than the whole call).

Nothing here imports numba until a kernel runs, so `import qlinear` stays cheap.
"""

from __future__ import annotations

import threading

SERIAL_BELOW = 32768

_num_threads: int | None = None  # None: numba's default (all cores or NUMBA_NUM_THREADS)
_lock = threading.Lock()
_layer_is_safe: bool | None = None  # unknown until the first parallel call returns


def _max_threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in qlinear's kernels (1 <= n <= NUMBA_NUM_THREADS), in every calling thread."""
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {n!r}")
    top = _max_threads()
    if not 1 <= n <= top:
        raise ValueError(
            f"set_num_threads: n must lie in [1, {top}] (NUMBA_NUM_THREADS caps it), got {n}"
        )
    _num_threads = n


def get_num_threads() -> int:
    """The number of threads qlinear's kernels use."""
    return _max_threads() if _num_threads is None else _num_threads


def call_parallel(fn, *args):
    """Call a ``parallel=True`` numba function with `get_num_threads()` threads."""
    global _layer_is_safe
    import numba

    n = get_num_threads()
    if _layer_is_safe:
        numba.set_num_threads(n)  # per calling thread in numba, so set on every call
        return fn(*args)
    with _lock:
        numba.set_num_threads(n)
        result = fn(*args)
        if _layer_is_safe is None:
            try:
                _layer_is_safe = numba.threading_layer() != "workqueue"
            except ValueError:  # pragma: no cover - no parallel region ran yet
                pass
        return result
