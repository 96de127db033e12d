"""An empty parallel region, timed by `threads.launch_cost`."""

from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit, prange  # noqa: E402


@njit(cache=True, parallel=True)
def empty_region(out):
    """One trivial iteration per worker: the region's fork and join, nothing else."""
    for i in prange(out.shape[0]):
        out[i] += 1
