"""The atomic operations the parallel regions hand out tasks and panels with (qlinear.kernels._atomics)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from qlinear.kernels import integer_gemm as ig

pytestmark = pytest.mark.skipif(not ig.HAVE_NUMBA, reason="numba kernels only")

HANDOFF = r"""
import numpy as np
from numba import njit, prange
from qlinear.kernels import threads
from qlinear.kernels._atomics import fetch_add, load_acquire, store_release

@njit(parallel=True)
def handoff(n, rounds):
    # worker 0 fills a block, then raises its flag; worker 1 waits for the flag, then sums the block. If the
    # flag's load were kept in a register (hoisted out of the wait), worker 1 would spin forever.
    data = np.empty(n, np.int64)
    flags = np.empty(rounds, np.int64)
    for r in range(rounds):
        flags[r] = 0
    sums = np.empty(rounds, np.int64)
    for worker in prange(2):
        for r in range(rounds):
            if worker == 0:
                for i in range(n):
                    data[i] = r * n + i
                store_release(flags, r, 1)
                while load_acquire(flags, r) != 2:  # wait until the sum is taken before the next round
                    pass
            else:
                while load_acquire(flags, r) == 0:
                    pass
                t = 0
                for i in range(n):
                    t += data[i]
                sums[r] = t
                store_release(flags, r, 2)
    return sums

threads.set_num_threads(2)
n, rounds = 4096, 200
got = handoff(n, rounds)
want = np.array([r * n * n + n * (n - 1) // 2 for r in range(rounds)])
assert (got == want).all(), (got[:4], want[:4])
print("ok")
"""


def test_fetch_add_hands_out_every_task_once():
    from numba import njit, prange

    from qlinear.kernels import threads
    from qlinear.kernels._atomics import fetch_add

    @njit(parallel=True)
    def claim_all(n_tasks, n_workers):
        claim = np.zeros(8, np.int64)
        times = np.zeros(n_tasks, np.int64)
        for _worker in prange(n_workers):
            while True:
                t = fetch_add(claim, 0, 1)
                if t >= n_tasks:
                    break
                fetch_add(times, t, 1)
        return times, claim  # the array: its element read here could be folded to the 0 stored above

    old = threads.get_num_threads()
    try:
        threads.set_num_threads(threads._max_threads())
        for workers in (1, 2, 3):
            times, claim = claim_all(200_000, workers)
            assert (times == 1).all()
            assert claim[0] == 200_000 + workers  # each worker's last claim overshoots once
    finally:
        threads.set_num_threads(old)


def test_release_acquire_hand_over_a_block_between_threads():
    # in a subprocess with a timeout: the failure this guards against is a wait that never ends
    done = subprocess.run([sys.executable, "-c", HANDOFF], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_atomics_refuse_other_arrays():
    from numba import njit
    from numba.core.errors import TypingError

    from qlinear.kernels._atomics import fetch_add

    @njit
    def add32(a):
        return fetch_add(a, 0, 1)

    with pytest.raises(TypingError):
        add32(np.zeros(2, np.int32))
