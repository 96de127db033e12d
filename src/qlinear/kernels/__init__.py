"""numba kernels: integer GEMM and im2col (integer_gemm, im2col), element-wise kernels."""

import os

# numba's "omp" threading layer uses GNU OpenMP, whose default wait policy keeps idle workers spinning and then
# sleeping in a way that made every 2-thread parallel region cost 8-16 ms on a busy 2-core machine (measured:
# a trivial prange took 16 ms median vs 6 us with PASSIVE). PASSIVE workers sleep at once and wake in
# microseconds. libgomp reads this when numba first loads the layer, so it must be set before any parallel
# call; an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
