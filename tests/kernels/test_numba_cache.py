"""qlinear's numba disk cache is dropped when a kernel source changes (kernels.ensure_fresh_numba_cache).

numba checks only a cached function's own file; a cached GEMM driver also holds the epilogue compiled from
integer_gemm.py, so a change there would otherwise leave the driver running the old code."""

from __future__ import annotations

import os
import subprocess
import sys

LOAD = "import qlinear.kernels.im2col"


def _run(cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    subprocess.run([sys.executable, "-c", LOAD], check=True, env=env, timeout=300)


def _stamp_dir(cache_dir):
    found = [root for root, _dirs, files in os.walk(cache_dir) if "qlinear-kernels.stamp" in files]
    assert len(found) == 1, found
    return found[0]


def test_stale_cache_files_are_dropped_and_others_kept(tmp_path):
    _run(tmp_path)
    path = _stamp_dir(tmp_path)
    stamp_file = os.path.join(path, "qlinear-kernels.stamp")
    current = open(stamp_file).read()
    ours = [os.path.join(path, n) for n in ("im2col._depthwise-1.py311.nbi", "integer_gemm._epilogue-1.py311.1.nbc")]
    theirs = os.path.join(path, "not_qlinear.f-1.py311.nbi")
    for name in ours + [theirs]:
        open(name, "w").close()

    _run(tmp_path)  # stamp unchanged: nothing dropped
    assert all(os.path.exists(n) for n in ours + [theirs])

    with open(stamp_file, "w") as f:  # as if a kernel source had changed since the cache was written
        f.write("an older stamp")
    _run(tmp_path)
    assert not any(os.path.exists(n) for n in ours)
    assert os.path.exists(theirs)
    assert open(stamp_file).read() == current
