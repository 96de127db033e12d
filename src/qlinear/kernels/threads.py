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
- Whether a call of `run_chunked` wakes helpers at all is decided per call by measurement on the machine at hand:
  the kernel's time per element on one thread (learned from its own calls: the first call of a kernel times its
  first chunk before it decides for the rest) times the call's elements, against what waking the helpers costs
  (`pool_wake_cost`, measured at first use). Waking a helper costs 50-150 microseconds on the virtual machines
  measured here, more than many whole calls; no size threshold fixed in advance holds on every CPU. (Not
  `SerialOrParallel`, which times both ways per call shape: element-wise calls come in every size, and one
  rate per kernel predicts them all without trial calls.)

Nothing here imports numba until a kernel runs, so `import qlinear` stays cheap.
"""

from __future__ import annotations

import itertools
import threading
import time

_CHUNK_MIN = 1 << 18  # elements per chunk at least: a kernel call from Python costs ~10 us
SPLIT_ALWAYS = False  # tests: split every call of 2+ items between the threads, to check the seams of the chunks
_rates: dict = {}  # kernel -> the least seconds per element seen on one thread (learned from its own calls)
_RATES_KEPT = 256  # kernels whose rate is remembered (a caller that makes a new kernel per call must not grow it)
_pool_wake: float | None = None

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
    n = 1 if serial else get_num_threads()
    if _layer_is_safe:
        _numba_set_num_threads(n)  # per calling thread in numba, so set on every call
        return fn(*args)
    import numba

    with _lock:
        _numba_set_num_threads(n)
        result = fn(*args)
        if _layer_is_safe is None:
            try:
                _layer_is_safe = numba.threading_layer() != "workqueue"
            except ValueError:  # pragma: no cover - no parallel region ran yet
                pass
        return result


class FasterOf:
    """Which of two kernels that compute the same bits runs faster on this machine for calls of one kind and
    size (a convolution layer's shape read through im2col panels or in place, say): the first calls alternate
    between them, the first `SKIPPED` of each not counted, and the faster best time of the `TRIALS` others
    decides for the calls after. Which one pays depends on the CPU's caches and prefetchers, not only on the
    shape, so it is measured, not predicted; measured again after `RETRY_AFTER` calls, then after four times as
    many each time (as `SerialOrParallel`)."""

    TRIALS = 4
    SKIPPED = 1
    RETRY_AFTER = 256
    __slots__ = ("times", "choice", "calls", "retry_at")

    def __init__(self):
        self.times: tuple[list[float], list[float]] = ([], [])
        self.choice: int | None = None  # decided: 0 or 1
        self.calls = 0
        self.retry_at = self.RETRY_AFTER

    def call(self, first, second):
        """``first()`` or ``second()``, as measured so far."""
        choice = self.choice
        if choice is not None:
            self.calls += 1
            if self.calls < self.retry_at:
                return (first, second)[choice]()
            self.calls, self.retry_at = 0, 4 * self.retry_at
            self.times, self.choice = ([], []), None
        times = self.times
        which = 1 if len(times[1]) < len(times[0]) else 0
        start = time.perf_counter()
        out = (first, second)[which]()
        times[which].append(time.perf_counter() - start)
        counted = self.SKIPPED + self.TRIALS
        if len(times[0]) >= counted and len(times[1]) >= counted:
            self.choice = int(min(times[1][self.SKIPPED:]) < min(times[0][self.SKIPPED:]))
        return out


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

    def decided(self) -> bool | None:
        """The decision for this call (counted as `next_is_serial` counts it), or None while it is undecided or
        due to be measured again: lets a caller run a decided call without the closure `call` takes (a small
        layer's serial call on two threads cost 0.5 us more than on one, 1% of a 50 us depthwise layer)."""
        decided = self.serial
        if decided is not None and self.calls + 1 < self.retry_at:
            self.calls += 1
            return decided
        return None

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
        import numpy as np

        from ._parallel_probe import empty_region

        out = np.zeros(max(2, get_num_threads()), np.int64)
        _launch_cost = _median_after_sleep(lambda: call_parallel(empty_region, out), 15)
    return _launch_cost


def _median_after_sleep(call, runs: int) -> float:
    """The median seconds of ``call()`` over ``runs`` runs, each after the caller slept a millisecond (so that the
    threads it wakes sleep too), after one run that starts them."""
    call()
    times = []
    for _ in range(runs):
        time.sleep(0.001)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _helpers():
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor

                _pool = ThreadPoolExecutor(max_workers=max(_max_threads() - 1, 1), thread_name_prefix="qlinear")
    return _pool


def _nothing():
    return None


def pool_wake_cost() -> float:
    """Seconds from handing a sleeping helper thread an empty task to seeing it done: the median of 9, each after
    the helper slept a millisecond, measured at first use in this process (about 10 ms, once)."""
    global _pool_wake
    if _pool_wake is None:
        pool = _helpers()
        _pool_wake = _median_after_sleep(lambda: pool.submit(_nothing).result(), 9)
    return _pool_wake


def _worth_waking(seconds: float, workers: int) -> bool:
    """Whether work of ``seconds`` on one thread pays for waking the helpers of ``workers`` threads: they cut it to
    ``seconds / workers`` at best, which must save more than the wake costs. (The wake cost measured is a round
    trip, which the caller's wait for the last chunk also pays. Here the element-wise kernels scaled 1.07-1.12x
    short of ideal on 2 threads, so the break-even this gives, about 1M elements at a 76-118 us wake, is where a
    sweep of sizes found it.)"""
    return seconds * (workers - 1) / workers > pool_wake_cost()


def _timed(fn, args, start: int, stop: int, item_size: int) -> None:
    """``fn(*args, start, stop)`` on the calling thread, its time per element kept as the kernel's rate."""
    began = time.perf_counter()
    fn(*args, start, stop)
    rate = (time.perf_counter() - began) / ((stop - start) * item_size)
    known = _rates.get(fn)
    if known is None and len(_rates) >= _RATES_KEPT:
        _rates.clear()
    _rates[fn] = rate if known is None else min(known, rate)


def run_chunked(fn, n: int, *args, item_size: int = 1) -> None:
    """Run ``fn(*args, start, stop)`` over ``[0, n)`` on the calling thread, or split into chunks between it and up
    to ``get_num_threads() - 1`` helpers where the work pays for waking them (see the module's notes).

    ``item_size`` is the number of elements one unit of ``[0, n)`` stands for (a row, say). ``fn`` is the same
    object for every call of one kernel: its rate is remembered under it."""
    if n < 2:
        fn(*args, 0, n)  # Python ints: numba types them as int64, as it does np.int64 scalars
        return
    workers = get_num_threads()
    if workers == 1:
        fn(*args, 0, n)
        return
    elements = n * item_size
    rate = _rates.get(fn)
    if not SPLIT_ALWAYS and rate is not None:
        seconds = rate * elements
        if seconds < 0.25 * pool_wake_cost():  # far from paying: no timing either (a few us on small calls)
            fn(*args, 0, n)
            return
        if not _worth_waking(seconds, workers):  # near the break-even: timed, to keep the rate learned
            _timed(fn, args, 0, n, item_size)
            return
    low = 0
    if rate is None and not SPLIT_ALWAYS:
        # The kernel's first call: a first chunk, timed on this thread, tells whether the rest pays for waking.
        low = n // _chunks(n, elements, workers)
        _timed(fn, args, 0, low, item_size)
        if not _worth_waking(_rates[fn] * (n - low) * item_size, workers):
            fn(*args, low, n)
            return
    _split(fn, args, low, n, item_size, workers)


def _chunks(n: int, elements: int, workers: int) -> int:
    return int(min(n, max(workers, min(4 * workers, elements // _CHUNK_MIN))))


def _split(fn, args, low: int, high: int, item_size: int, workers: int) -> None:
    """``[low, high)`` in chunks claimed by the calling thread and ``workers - 1`` helpers."""
    import numpy as np

    n = high - low
    chunks = _chunks(n, n * item_size, workers)
    claim = itertools.count()  # next() on a count is atomic under the GIL

    def work(timed=False):
        while True:
            c = next(claim)
            if c >= chunks:
                return
            start, stop = np.int64(low + c * n // chunks), np.int64(low + (c + 1) * n // chunks)
            if timed:  # the caller's chunks keep the rate learned (an early small call overstates it)
                _timed(fn, args, start, stop, item_size)
            else:
                fn(*args, start, stop)

    pool = _helpers()
    tasks = [pool.submit(work) for _ in range(workers - 1)]
    try:
        work(timed=not SPLIT_ALWAYS)
    finally:
        for task in tasks:
            if not task.cancel():  # started: it may hold a chunk; wait for it
                task.result()
