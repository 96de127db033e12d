"""`threads.run_chunked`: whether a call wakes helper threads is decided per call from the kernel's measured time
per element and the measured cost of waking a helper, not from a size fixed in advance; every decision covers
[0, n) exactly once. The kernels here are plain Python functions that record the ranges they are given (and, to
be slow, sleep), with the wake cost set to a known figure."""

from __future__ import annotations

import threading
import time

import pytest

from qlinear.kernels import threads


@pytest.fixture
def two_threads(monkeypatch):
    if threads._max_threads() < 2:
        pytest.skip("needs NUMBA_NUM_THREADS >= 2")
    before = threads.get_num_threads()
    threads.set_num_threads(2)
    monkeypatch.setattr(threads, "_rates", {})
    monkeypatch.setattr(threads, "_pool_wake", 100e-6)  # 100 us, as measured on the project's VMs
    yield
    threads.set_num_threads(before)


class Kernel:
    """Records each (start, stop, thread) it runs; sleeps ``seconds_per_item`` per item. With ``meet``, a chunk on
    the calling thread waits (up to 10 s) until a chunk runs on another thread: a test that expects a helper
    then does not depend on how fast one wakes, and one that never comes shows as a single thread."""

    def __init__(self, seconds_per_item: float = 0.0, meet: bool = False, helper_seconds: float = 0.0):
        self.seconds_per_item = seconds_per_item
        self.helper_seconds = helper_seconds  # a helper's chunk sleeps this long: it cannot take every chunk
        self.ranges: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()
        self.meet = meet
        self.helper_ran = threading.Event()
        self.caller = threading.get_ident()

    def __call__(self, start, stop):
        if self.seconds_per_item:
            time.sleep(self.seconds_per_item * (int(stop) - int(start)))
        with self.lock:
            self.ranges.append((int(start), int(stop), threading.get_ident()))
        if threading.get_ident() != self.caller:
            time.sleep(self.helper_seconds)
            self.helper_ran.set()
        elif self.meet:
            self.helper_ran.wait(10)

    def covered(self, n: int) -> bool:
        spans = sorted((a, b) for a, b, _ in self.ranges)
        return spans[0][0] == 0 and spans[-1][1] == n and all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))

    def threads_used(self) -> int:
        return len({t for _, _, t in self.ranges})

    def reset(self):
        self.ranges = []
        self.helper_ran.clear()


def test_a_cheap_kernel_stays_on_the_calling_thread(two_threads, monkeypatch):
    # Cheap against a wake of 50 ms: a first chunk (12,500 items of about 1 us in all) would have to be preempted
    # for 14 ms to look worth splitting, and for 1.5 ms to keep the second call from running at once. Against the
    # fixture's 100 us, a 28 us hiccup of a loaded CI machine split the first call (3 ranges; seen once).
    monkeypatch.setattr(threads, "_pool_wake", 50e-3)
    kernel = Kernel()
    threads.run_chunked(kernel, 100_000)  # first call: a timed first chunk, then the rest, both here
    assert kernel.covered(100_000) and len(kernel.ranges) == 2 and kernel.threads_used() == 1
    assert kernel.ranges[0][2] == threading.get_ident()
    assert threads._rates[kernel] > 0
    kernel.reset()
    threads.run_chunked(kernel, 100_000)  # rate known: one call
    assert kernel.covered(100_000) and len(kernel.ranges) == 1


def test_a_slow_kernel_wakes_a_helper(two_threads):
    kernel = Kernel(seconds_per_item=2e-4)  # 8 items: 1.6 ms on one thread, far above twice a 100 us wake
    threads.run_chunked(kernel, 8)  # first call: a timed first chunk here, then the rest split
    assert kernel.covered(8) and len(kernel.ranges) >= 3 and kernel.ranges[0][:2] == (0, 4)
    kernel.reset()
    kernel.meet = True
    threads.run_chunked(kernel, 8)
    assert kernel.covered(8) and kernel.threads_used() == 2


def test_the_wake_cost_decides(two_threads, monkeypatch):
    kernel = Kernel(seconds_per_item=1e-4)  # 8 items: 0.8 ms
    threads._rates[kernel] = 1e-4
    monkeypatch.setattr(threads, "_pool_wake", 1.0)  # a machine whose helpers take a second to wake
    threads.run_chunked(kernel, 8)
    assert kernel.covered(8) and len(kernel.ranges) == 1
    kernel.reset()
    kernel.meet = True
    monkeypatch.setattr(threads, "_pool_wake", 10e-6)
    threads.run_chunked(kernel, 8)
    assert kernel.covered(8) and kernel.threads_used() == 2


def test_item_size_counts_elements(two_threads):
    kernel = Kernel()
    threads._rates[kernel] = 1e-6  # a microsecond per element: 10 rows of 100 are 1 ms, one row 0.1 ms
    threads.run_chunked(kernel, 10, item_size=100)
    assert kernel.covered(10) and len(kernel.ranges) > 1
    kernel.reset()
    threads._rates[kernel] = 1e-6
    threads.run_chunked(kernel, 10, item_size=10)  # 0.1 ms: 2 threads would save 50 us, not worth a 100 us wake
    assert kernel.covered(10) and len(kernel.ranges) == 1


def test_split_always_splits_small_calls(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "SPLIT_ALWAYS", True)
    kernel = Kernel()
    threads.run_chunked(kernel, 5)
    assert kernel.covered(5) and len(kernel.ranges) >= 2
    assert kernel not in threads._rates  # forced splits teach nothing


def test_the_rate_kept_is_the_least_seen(two_threads):
    # A helper that woke first could take both chunks (a descheduled vCPU: seen once in CI) and leave the caller
    # nothing to time; its chunk sleeping 0.2 s leaves the caller one.
    kernel = Kernel(helper_seconds=0.2)
    threads._rates[kernel] = 1e-3
    threads.run_chunked(kernel, 2)  # predicted 2 ms: split, the caller's chunk timed
    assert any(t == kernel.caller for _, _, t in kernel.ranges)
    assert threads._rates[kernel] < 1e-3


def test_one_item_and_one_thread_run_at_once(two_threads):
    kernel = Kernel(seconds_per_item=1e-3)
    threads.run_chunked(kernel, 1)
    assert kernel.ranges == [(0, 1, threading.get_ident())] and kernel not in threads._rates
    threads.set_num_threads(1)
    kernel.reset()
    threads.run_chunked(kernel, 4)
    assert [r[:2] for r in kernel.ranges] == [(0, 4)]


def test_rates_stay_bounded(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "_RATES_KEPT", 4)
    for _ in range(10):
        threads.run_chunked(Kernel(), 10)
    assert len(threads._rates) <= 4


def test_the_wake_cost_is_measured_once(monkeypatch):
    monkeypatch.setattr(threads, "_pool_wake", None)
    first = threads.pool_wake_cost()
    assert 0 < first < 0.1 and threads.pool_wake_cost() == first
