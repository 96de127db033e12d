"""Each parallel kernel forks its threads once per call (twice per image for the channels-last depthwise kernels,
whose two phases need a barrier between them).

In a ``parallel=True`` numba function, an array expression outside the ``prange`` loop (``np.zeros``, a slice
assignment) is a parallel loop of its own: one more fork and join per call, and a sleeping worker's wake-up
(50-150 us on this project's VM). That is invisible in the source, so it is counted here in the compiled code:
one call to numba's scheduler (``do_scheduling``) per parallel region. Inspection needs freshly compiled code,
so the kernels are compiled in a subprocess with an empty cache directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qlinear.kernels import integer_gemm as ig

# Compiles every kernel from scratch in a fresh process (1-2 minutes on 2 cores): the full suite only.
pytestmark = pytest.mark.full

SCRIPT = r"""
import json, re
import numpy as np
from qlinear.kernels import _drivers, im2col, integer_gemm as ig, threads

threads.set_num_threads(2)
rng = np.random.default_rng(0)
for ci, co, hw, s, k, grp in [(16, 16, 9, 1, 3, 1), (16, 16, 9, 2, 3, 1), (16, 16, 30, 3, 9, 1), (16, 16, 9, 1, 1, 1),
                              (32, 32, 9, 1, 3, 32), (32, 32, 40, 1, 3, 32), (32, 32, 40, 2, 3, 32)]:
    for xdt in (np.uint8, np.int8):
        x = rng.integers(0, 100, (2, ci, hw, hw)).astype(xdt)
        w = rng.integers(-60, 60, (co, ci // grp, k, k)).astype(np.int8)
        packed = im2col.prepack_conv(w, np.int8(0), grp)
        geo = dict(strides=(s, s), dilations=(1, 1), pads_begin=(k // 2,) * 2, pads_end=(k // 2,) * 2)
        requant = (np.full(co, np.float32(0.001)), np.uint8(128), np.uint8, "float64")
        im2col.conv(x, xdt(3), packed, None, geo, requant)
a = rng.integers(0, 255, (40, 64)).astype(np.uint8)
ig.gemm(a, np.uint8(3), ig.pack_weights(rng.integers(-60, 60, (64, 48)).astype(np.int8), np.int8(0)), None, None)
ig.gemm(a[:, :63], np.uint8(3), ig.pack_weights(rng.integers(-60, 60, (63, 48)).astype(np.int8), np.int8(0)), None, None)
counts = {}
for module in (im2col, ig, _drivers):
    for name in dir(module):
        fn = getattr(module, name)
        if getattr(fn, "targetoptions", {}).get("parallel"):
            for sig in fn.signatures:
                counts[name] = len(re.findall(r"call [^\n]*do_scheduling", fn.inspect_llvm(sig)))
print(json.dumps(counts))
"""

TWO_PHASES = {"_depthwise3x3_cl", "_depthwise3x3_cl_vnni"}  # per image: the channels-last copy, then the tiles


@pytest.mark.skipif(not ig.HAVE_NUMBA, reason="numba kernels only")
def test_each_parallel_kernel_forks_once(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    # the kernels a convolution and a GEMM use on this CPU's path were all compiled
    path = ig.default_path()
    assert {"_phase_split", f"conv_tiles_{path}_s", f"gemm_tiles_{path}_u"} <= set(counts), counts
    for name, n in counts.items():
        assert n == (2 if name in TWO_PHASES else 1), f"{name}: {n} parallel regions per call"
