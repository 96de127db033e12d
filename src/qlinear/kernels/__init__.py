"""numba kernels: integer GEMM and im2col (integer_gemm, im2col), element-wise kernels."""

import os

# numba's "omp" threading layer uses GNU OpenMP, whose default wait policy keeps idle workers spinning (300,000
# rounds, milliseconds) and then sleeping: that made every 2-thread parallel region cost 8-16 ms on a busy
# 2-core machine (measured: a trivial prange took 16 ms median vs 6 us with PASSIVE). PASSIVE workers sleep at
# once, but a sleeping vCPU of this project's virtual machine takes 50-150 us to wake, more than a small
# convolution's whole work (a 1x1 64->64 conv at 56x56 ran slower on 2 threads than on 1). A short spin (1,000
# rounds, about 50 us) keeps the worker awake between back-to-back regions (measured on 2 threads when im2col and
# the GEMM were two regions: packing 163 -> 23 us median on the idle machine, 46 -> 23-103 us with both cores
# busy; a convolution is now one region, see _drivers.CONV_TEMPLATE). libgomp reads these when numba first
# loads the layer, so they must be set before any parallel call; an explicit user setting of either wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["GOMP_SPINCOUNT"] = "1000"

_cache_checked = False
_STAMP = "qlinear-kernels.stamp"


def ensure_fresh_numba_cache() -> None:
    """Drop qlinear's numba disk cache when any kernel source changed since it was written.

    numba keys a cached function on its own file's timestamp only, but a cached function also holds the machine
    code of the njit helpers and intrinsics it calls from other files (the GEMM drivers hold the epilogue of
    integer_gemm.py, the depthwise kernels the byte moves of _byte_moves.py): after a change to a helper, its
    callers' caches would run the old code. One stamp over every kernel source (and numba's version) guards the
    whole directory. Called by each kernel module before it defines njit functions; once per process; best
    effort (a cache directory numba cannot use is left alone)."""
    global _cache_checked
    if _cache_checked:
        return
    _cache_checked = True
    try:
        import hashlib
        import inspect

        import numba
        from numba.core import caching

        here = os.path.dirname(os.path.abspath(__file__))
        modules = sorted(n for n in os.listdir(here) if n.endswith(".py"))
        digest = hashlib.sha256(numba.__version__.encode())
        for name in modules:
            with open(os.path.join(here, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
        stamp = digest.hexdigest()
        source = inspect.getfile(ensure_fresh_numba_cache)
        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")  # renamed in numba 0.61
        for cls in impl._locator_classes:
            locator = cls.from_function(ensure_fresh_numba_cache, source)
            if locator is not None:
                break
        else:
            return
        path = locator.get_cache_path()
        stamp_path = os.path.join(path, _STAMP)
        try:
            with open(stamp_path) as f:
                if f.read() == stamp:
                    return
        except OSError:
            pass
        stems = {n[:-3] for n in modules}
        if os.path.isdir(path):
            for name in os.listdir(path):
                if name.endswith((".nbi", ".nbc")) and name.split(".", 1)[0] in stems:
                    os.remove(os.path.join(path, name))
        os.makedirs(path, exist_ok=True)
        with open(stamp_path, "w") as f:
            f.write(stamp)
    except Exception:  # pragma: no cover - never fail a computation over the cache
        pass
