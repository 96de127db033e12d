"""numba kernels: integer GEMM and im2col (integer_gemm, im2col), element-wise kernels."""

import os

# numba's "omp" threading layer uses GNU OpenMP, whose default wait policy keeps idle workers spinning (300,000
# rounds, milliseconds) and then sleeping: that made every 2-thread parallel region cost 8-16 ms on a busy
# 2-core machine (measured: a trivial prange took 16 ms median vs 6 us with PASSIVE). PASSIVE workers sleep at
# once, but a sleeping vCPU of this project's virtual machine takes 50-150 us to wake, more than a small
# convolution's whole work (a 1x1 64->64 conv at 56x56 ran slower on 2 threads than on 1). A short spin (1,000
# rounds, about 50 us) keeps the worker awake between the back-to-back regions of one call (im2col, then the
# GEMM): measured on 2 threads, packing 163 -> 23 us median on the idle machine, 46 -> 23-103 us with both cores
# busy. libgomp reads these when numba first loads the layer, so they must be set before any parallel call; an
# explicit user setting of either wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["GOMP_SPINCOUNT"] = "1000"
