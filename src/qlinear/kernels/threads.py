"""How many threads qlinear's numba kernels use, and calling parallel kernels safely.

- `set_num_threads(n)` / `get_num_threads()`: a process-wide setting (numba's own `set_num_threads` is
  per calling thread, which surprises users who call from worker threads). The default is numba's thread
  count, i.e. every core, or NUMBA_NUM_THREADS when that environment variable is set.
- `call_parallel(fn, *args)`: runs a ``parallel=True`` numba function with that many threads. numba's
  "workqueue" threading layer aborts the process when two Python threads enter parallel code at once
  (dask does this), so under that layer calls are serialised by a lock; omp and tbb run concurrently.
- `run_chunked(fn, n, *args)`: the element-wise kernels' threading. ``fn(*args, start, stop)`` is a serial
  ``nogil`` numba kernel; the calling thread and up to ``get_num_threads() - 1`` helper threads claim
  chunks of ``[0, n)`` from a shared counter. The caller never waits for a helper that has not started
  (its task is cancelled), so on a machine whose cores are busy a call degrades to the single-thread
  time instead of waiting a scheduler tick for a barrier, as a numba ``prange`` does; and no numba
  threading layer is involved, so concurrent calls are safe under any layer.
- `SERIAL_BELOW`: calls smaller than this run on the calling thread only (waking a helper costs 50-150
  microseconds on a virtual machine, more than the whole call).

Nothing here imports numba until a kernel runs, so `import qlinear` stays cheap.
"""

from __future__ import annotations

import itertools
import threading
import time

# Measured on this project's VM (a sleeping vCPU takes 50-150 us to wake): float32 -> uint8/int4 QuantizeLinear on
# 2 threads lost to 1 thread below 1M elements (262K: 109 vs 70 us; 524K: 152 vs 129 us), broke even at 1M
# and won from 2M (382 vs 512 us).
SERIAL_BELOW = 1 << 20
_CHUNK_MIN = 1 << 18  # elements per chunk at least: a kernel call from Python costs ~10 us

_num_threads: int | None = None  # None: numba's default (all cores or NUMBA_NUM_THREADS)
_lock = threading.Lock()
_layer_is_safe: bool | None = None  # unknown until the first parallel call returns
_pool = None
_pool_lock = threading.Lock()


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


_set_threads_unchecked = None


def _numba_set_num_threads(n: int) -> None:
    """numba.set_num_threads(n) for an n already checked (1 <= n <= NUMBA_NUM_THREADS): after the first call,
    numba's own setter without the locks and checks around it (1.1 -> 0.3 us a call, which small convolutions
    pay on every call)."""
    global _set_threads_unchecked
    if _set_threads_unchecked is None:
        import numba
        from numba.np.ufunc import parallel

        numba.set_num_threads(n)  # starts the threading layer, which defines the setter
        _set_threads_unchecked = getattr(parallel, "_set_num_threads", None) or numba.set_num_threads
        return
    _set_threads_unchecked(n)


def call_parallel(fn, *args, serial: bool = False):
    """Call a ``parallel=True`` numba function with `get_num_threads()` threads, or one if ``serial`` (work
    too small to pay for waking a helper thread)."""
    global _layer_is_safe
    import numba

    n = 1 if serial else get_num_threads()
    if _layer_is_safe:
        _numba_set_num_threads(n)  # per calling thread in numba, so set on every call
        return fn(*args)
    with _lock:
        _numba_set_num_threads(n)
        result = fn(*args)
        if _layer_is_safe is None:
            try:
                _layer_is_safe = numba.threading_layer() != "workqueue"
            except ValueError:  # pragma: no cover - no parallel region ran yet
                pass
        return result


class SerialOrParallel:
    """Whether calls of one kind and size (one convolution layer's shape, say) run faster on the calling
    thread alone or on every thread, decided by timing them both ways on this machine: the first calls run
    on one thread, the next as many on all, the first `SKIPPED` of each way not counted (a worker, or the
    virtual CPU under it, that slept long; caches another core has cold), and the faster best time of the
    `TRIALS` others decides for the calls after. (Calls that alternated between the two ways woke a sleeping
    worker for every parallel one and made it look slower than it runs in a sequence of calls.)
    Where a second thread pays depends on the CPU, its load and how fast a sleeping core wakes (50-150 us on
    the virtual machines measured here), so no size threshold fixed in advance holds everywhere. A decision is
    measured again after `RETRY_AFTER` calls, then after four times as many each time: a trial that ran while
    another process held the second core (seen here: 0.6 ms layers kept on one thread, at twice the time)
    does not decide for good. Both ways give identical bits."""

    TRIALS = 6
    SKIPPED = 2  # the first calls of each way, not counted
    CLEAR_GAIN = 4  # one thread's time over `launch_cost` past which all threads run it without a trial
    RETRY_AFTER = 64  # calls after the first decision before it is measured again (then x4 each time)
    __slots__ = ("serial_times", "parallel_times", "serial", "calls", "retry_at")

    def __init__(self):
        self.serial_times: list[float] = []
        self.parallel_times: list[float] = []
        self.serial: bool | None = None  # decided
        self.calls = 0  # since the decision
        self.retry_at = self.RETRY_AFTER

    def next_is_serial(self) -> bool:
        decided = self.serial
        if decided is not None:
            self.calls += 1
            if self.calls < self.retry_at:
                return decided
            # measure again (new lists: a concurrent `record` keeps the ones it holds)
            self.calls, self.retry_at = 0, 4 * self.retry_at
            self.serial_times, self.parallel_times = [], []
            self.serial = None
        return len(self.serial_times) < self.SKIPPED + self.TRIALS

    def call(self, run):
        """``run(serial)`` on one thread or on all, as `next_is_serial` picks; timed and recorded while the
        choice is undecided."""
        serial = self.next_is_serial()
        if self.serial is not None:
            return run(serial)
        start = time.perf_counter()
        out = run(serial)
        self.record(serial, time.perf_counter() - start)
        return out

    def record(self, serial: bool, seconds: float) -> None:
        serial_times, parallel_times = self.serial_times, self.parallel_times
        (serial_times if serial else parallel_times).append(seconds)
        counted = self.SKIPPED + self.TRIALS
        if serial and len(serial_times) == counted and min(serial_times[self.SKIPPED:]) >= \
                self.CLEAR_GAIN * launch_cost():
            self.serial = False  # the work dwarfs waking the workers: no need to time it on all of them
            return
        if len(serial_times) >= counted and len(parallel_times) >= counted:
            self.serial = min(serial_times[self.SKIPPED:]) < min(parallel_times[self.SKIPPED:])


_launch_cost: float | None = None


def launch_cost() -> float:
    """Seconds from a call to a parallel region on every thread, whose workers have slept for a millisecond,
    to its return, with no work: the median of 15, measured at first use in this process. (Measured here:
    62 us with qlinear's short spin, 90-120 us under numba's workqueue layer, 2-7 us with workers that spin
    for milliseconds, which oversubscribed cores make cost milliseconds instead.)"""
    global _launch_cost
    if _launch_cost is None:
        import time

        import numpy as np

        from ._parallel_probe import empty_region

        out = np.zeros(max(2, get_num_threads()), np.int64)
        call_parallel(empty_region, out)
        times = []
        for _ in range(15):
            time.sleep(0.001)
            start = time.perf_counter()
            call_parallel(empty_region, out)
            times.append(time.perf_counter() - start)
        _launch_cost = sorted(times)[len(times) // 2]
    return _launch_cost


def _helpers():
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor

                _pool = ThreadPoolExecutor(max_workers=max(_max_threads() - 1, 1), thread_name_prefix="qlinear")
    return _pool


def run_chunked(fn, n: int, *args, item_size: int = 1) -> None:
    """Run ``fn(*args, start, stop)`` over ``[0, n)`` on `get_num_threads()` threads, the caller included.

    ``item_size`` is the number of elements one unit of ``[0, n)`` stands for (a row, say)."""
    elements = n * item_size
    # the size tests first: small calls (the common case) need not look up the thread count
    if elements < SERIAL_BELOW or n < 2:
        fn(*args, 0, n)  # Python ints: numba types them as int64, as it does np.int64 scalars
        return
    import numpy as np

    workers = get_num_threads()
    if workers == 1:
        fn(*args, np.int64(0), np.int64(n))
        return
    chunks = int(min(n, max(workers, min(4 * workers, elements // _CHUNK_MIN))))
    claim = itertools.count()  # next() on a count is atomic under the GIL

    def work():
        while True:
            c = next(claim)
            if c >= chunks:
                return
            fn(*args, np.int64(c * n // chunks), np.int64((c + 1) * n // chunks))

    pool = _helpers()
    tasks = [pool.submit(work) for _ in range(workers - 1)]
    try:
        work()
    finally:
        for task in tasks:
            if not task.cancel():  # started: it may hold a chunk; wait for it
                task.result()
