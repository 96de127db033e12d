"""Exact u8/s8 x u8/s8 -> int32 GEMM: the integer core of QLinearMatMul, MatMulInteger, QLinearConv, ConvInteger.

Internal API (the ops call these; nothing here validates user input beyond what exactness needs):

``pack_weights(w2d, w_zero_point) -> PackedWeights``
    w2d (K, N) int8/uint8, w_zero_point scalar or (N,) (per column, may differ). Packed once, reused.
``gemm(a, a_zero_point, packed, bias=None, requant=None, path=None) -> ndarray``
    a (M, K) int8/uint8, a_zero_point scalar or (M,) (per row). Returns the exact int32
    ``sum_k (a - a_zp)(w - w_zp) + bias`` (M, N), or, with ``requant=(multiplier, y_zero_point, y_dtype, mode)``,
    the requantized (M, N) array of y_dtype (int8/uint8) with the requantization fused into the store.
    multiplier broadcasts against (M, N) (scalar, (N,), (M, 1) or (M, N)); mode "float64" (onnx reference
    arithmetic) or "float32" (onnxruntime's); see :func:`qlinear.kernels._fallback.requantize`.
``available_paths()``, ``default_path()``, ``force_path(name)`` (context manager), ``set_path(name)``
    Which kernel runs; every path gives identical bits. Names, fastest first:
    ``"avx512vnni"`` (vpdpbusd zmm), ``"avxvnni"`` (vpdpbusd ymm), ``"avx512bw"`` (vpmaddwd zmm),
    ``"avx2ub"`` (vpmaddubsw + vpmaddwd ymm, for weights whose byte pairs keep it exact; others run
    ``"avx2"``), ``"avx2"`` (vpmaddwd ymm), ``"blas"`` (exact float32 BLAS in chunks, NumPy only).
    The environment variable QLINEAR_GEMM_PATH picks one at import (for tests and benchmarks).

How it stays exact
    8-bit operands are mapped to unsigned activations ``xu = x ^ 0x80`` (int8 x) and signed weights
    ``ws = w ^ 0x80`` (uint8 w); zero points shift by 128 with them, so (x - x_zp) and (w - w_zp) are unchanged.
    The kernels multiply the raw bytes (vpdpbusd: u8 x s8 quads, never saturating; vpmaddwd: int16 pairs) and
    the store adds the zero-point corrections
        sum (xu - zx)(ws - zw) = sum xu*ws - zw * sum xu - zx * sum ws + K * zx * zw.
    Every step wraps modulo 2**32, which is a ring homomorphism, so the int32 result is exact whenever the
    true sum fits in int32. That is checked before the kernel runs from a bound on the actual values,
    ``max|x - x_zp| * sum_k |w - w_zp| + |bias|`` per output column; when the bound could leave int32 the
    problem goes to the float64-accumulating BLAS path, which returns the exact sum or raises ValueError.
    vpmaddubsw (saturating) is used only on weights whose byte pairs cannot saturate it (path avx2ub).

Layouts (int32 groups of 4 bytes, or of 2 int16 for vpmaddwd, along K; K padded with zeros):
    broadcast side P: [ceil(M/MR)][ksteps][MR],   vector side Q: [ceil(N/NR)][ksteps][NR].
    For a GEMM the activations are P (rows of C) and the weights Q; for a convolution (im2col.py) the weights
    are P (output channels) and the im2col columns Q (pixels), so the output is stored in NC... order.
    Each parallel task runs the microkernel over its block of tiles into a scratch block, then one epilogue
    (zero-point corrections, bias, requantization, store) walks the block's long rows: per-tile epilogues
    cost more than the arithmetic when K is small. Microkernel tiles (MR x NR): 8 x 32 for the zmm paths,
    6 x 16 for the ymm paths.

Threading: numba prange over (M-block x N-block) tasks with qlinear's thread count
(``qlinear.kernels.threads.set_num_threads``, process-wide; default all cores); concurrent calls from Python
threads are safe (serialised under numba's "workqueue" layer). qlinear.kernels sets OMP_WAIT_POLICY=PASSIVE
unless the user set it (see its __init__). Kernels compiled as serial ``nogil`` functions driven by Python
threads were tried: 20-50% slower on one thread, because numba marks the arrays of a prange body noalias.
Compilation is lazy (nothing compiles at import) and cached on disk (cache=True).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import numpy as np

from qlinear.kernels import _fallback, threads, weight_packing
from qlinear.kernels._arguments import read_only

try:  # numba is a dependency, but the BLAS path must keep working without it.
    from qlinear.kernels import ensure_fresh_numba_cache

    ensure_fresh_numba_cache()  # before any cached kernel loads
    import numba
    from numba import njit, prange

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only on installs without numba
    numba = None
    HAVE_NUMBA = False

INT32_MAX = 2**31 - 1

from qlinear.kernels._gemm_parts import BYTE_PAIR_PATHS, PATH_ORDER, PATHS  # noqa: E402  (the drivers' table too)


def _host_features() -> set[str]:
    if not HAVE_NUMBA:
        return set()
    try:
        import llvmlite.binding as llb

        return {k for k, v in llb.get_host_cpu_features().items() if v}
    except Exception:  # pragma: no cover - unknown CPU: stay on the portable path
        return set()


_AVAILABLE = None


def available_paths() -> tuple[str, ...]:
    """Paths this machine can run, fastest first ("blas" always)."""
    global _AVAILABLE
    if _AVAILABLE is None:  # once: every convolution asks
        features = _host_features()
        _AVAILABLE = tuple(p for p in PATH_ORDER if PATHS[p] is None or all(f in features for f in PATHS[p][5]))
    return _AVAILABLE


_forced = threading.local()
_global_path = os.environ.get("QLINEAR_GEMM_PATH") or None


def default_path() -> str:
    return available_paths()[0]


def set_path(name: str | None) -> None:
    """Use path ``name`` for every later call in the process (None: back to the fastest available)."""
    global _global_path
    if name is not None:
        _check_path(name)
    _global_path = name


@contextlib.contextmanager
def force_path(name: str):
    """Run the calls inside the block (in this thread) on path ``name``."""
    _check_path(name)
    old = getattr(_forced, "path", None)
    _forced.path = name
    try:
        yield
    finally:
        _forced.path = old


def _check_path(name: str) -> None:
    if name not in PATHS:
        raise ValueError(f"integer_gemm: unknown path {name!r}; one of {PATH_ORDER}")
    if name not in available_paths():
        raise ValueError(f"integer_gemm: path {name!r} needs CPU features this machine lacks; available: {available_paths()}")


def weights_path(path: str, packed_weights) -> str:
    """The path ``packed_weights`` (PackedWeights) run on when ``path`` is asked for: a byte-pair path
    (``avx2ub``) where every one's pairs fit it (`PackedWeights.fits_byte_pairs`), else the path it stands in
    for (``avx2``). An empty list takes the fallback (the depthwise kernels pack no GEMM weights)."""
    fallback = BYTE_PAIR_PATHS.get(path)
    if fallback is None:
        return path
    return path if packed_weights and all(pw.fits_byte_pairs() for pw in packed_weights) else fallback


def current_path(path: str | None = None) -> str:
    if path is not None:
        _check_path(path)
        return path
    forced = getattr(_forced, "path", None)
    if forced is not None:
        return forced
    if _global_path is not None:
        _check_path(_global_path)
        return _global_path
    return default_path()


# ----------------------------------------------------------------------------------------------- threading
def call_parallel(fn, *args, serial: bool = False):
    """Run a ``parallel=True`` kernel on qlinear's thread count, or on one thread if ``serial``
    (kernels.threads: process-wide ``set_num_threads``; calls serialised by a lock under numba's
    "workqueue" layer, which aborts on concurrent use)."""
    return threads.call_parallel(fn, *args, serial=serial)


if HAVE_NUMBA:
    # the epilogue and the activation packers live below the generated drivers, which read them too
    from qlinear.kernels._gemm_parts import (_epilogue, _pack_row_panel, _pack_row_panel_words,  # noqa: F401
                                             _requant_one, _store_row, _store_row_plus)


_EMPTY_WORDS = np.empty((0, 0), np.int32)


def gemm_driver(path: str):
    """The GEMM's parallel region (activation packing and tiles) for ``path`` (qlinear.kernels._drivers; compiled
    lazily, cached on disk)."""
    from qlinear.kernels._drivers import GEMM_DRIVERS

    return GEMM_DRIVERS[path]


def conv_driver(path: str):
    """The convolution's fused im2col + GEMM region for ``path`` (qlinear.kernels._drivers)."""
    from qlinear.kernels._drivers import CONV_DRIVERS

    return CONV_DRIVERS[path]


def conv_direct_driver(path: str):
    """The convolution's direct region for ``path``: the GEMM over the channel-interleaved input, no im2col
    (qlinear.kernels._drivers)."""
    from qlinear.kernels._drivers import CONV_DIRECT_DRIVERS

    return CONV_DIRECT_DRIVERS[path]


@functools.lru_cache(maxsize=1024)
def block_sizes(m_total: int, n_total: int, mr: int, nr: int, n_threads: int) -> tuple[int, int]:
    """Panels per task along M and N for a call on ``n_threads`` threads: blocks that keep operands in L2, split
    until every thread has several tasks. Chosen per call, not once per kept launch: blocks made for one thread
    gave 3 tasks to a later 2-thread call of ResNet-50's 3x3 128 @28 (2t/1t 0.77 against 0.66)."""
    mp = -(-m_total // mr)
    npn = -(-n_total // nr)
    mb = max(1, min(mp, 192 // mr))
    nb = max(1, min(npn, 384 // nr))

    def equal(panels, per_block):
        # blocks of equal size: one full block of 12 panels next to a remainder block of 1 left a thread idle
        # (ResNet-50's 1x1 512->2048 @7 batch 8, N = 13 panels: 2 threads 1.44 ms against 1.52 on one)
        return -(-panels // -(-panels // per_block))

    def uneven(mb, nb):
        # fewer than 4 tasks a thread, or a last round of tasks that leaves threads idle for more than a tenth
        # of the work (9 equal tasks on 2 threads: 5 against 4.5; ResNet-50's down 1x1 256->512/2 @56)
        tasks = (-(-mp // mb)) * (-(-npn // nb))
        return tasks < 4 * n_threads or -(-tasks // n_threads) * n_threads > 1.1 * tasks

    mb, nb = equal(mp, mb), equal(npn, nb)
    while n_threads > 1 and uneven(mb, nb) and (mb > 1 or nb > 1):
        if (mb * mr >= nb * nr and mb > 1) or nb == 1:
            mb = equal(mp, -(-mb // 2))
        else:
            nb = equal(npn, -(-nb // 2))
    return mb, nb


if HAVE_NUMBA:

    @njit(cache=True)
    def _int_abs_max(a):
        m = np.int64(0)
        for v in a:
            m = max(m, abs(np.int64(v)))
        return m

    @njit(cache=True)
    def _float_abs_max(a):
        m = 0.0
        for v in a:
            m = max(m, abs(v))
        return m
else:  # pragma: no cover - installs without numba

    def _int_abs_max(a):
        return int(np.abs(np.asarray(a, np.int64)).max(initial=0))

    def _float_abs_max(a):
        return float(np.abs(a).max(initial=0.0))


def acc_bound(abs_colsum, colsum_max: int, x_abs_max: int, bias) -> int:
    """A bound on |sum_k (x - x_zp)(w - w_zp) + bias| over all outputs, given max|x - x_zp|.

    First the cheap one (largest column sum, largest |bias|: one pass over the bias in numba); where that
    reaches 2**29, the smallest threshold a caller tests against (Requant.fuse; int32 overflow is 2**31),
    the row-wise maximum instead. Per call: the full NumPy form cost ~5 us."""
    quick = colsum_max * x_abs_max
    if bias is not None:
        quick += int(_int_abs_max(read_only(bias)))
    if quick < 2**29:
        return quick
    b = abs_colsum * np.int64(x_abs_max)
    if bias is not None:
        b = b + np.abs(np.asarray(bias, dtype=np.int64))
    return int(b.max(initial=0))


def wrap_int32(v) -> np.ndarray:
    """int64 values modulo 2**32 as int32 (the kernels' arithmetic)."""
    v = np.asarray(v, dtype=np.int64)
    return (((v + 2**31) & 0xFFFFFFFF) - 2**31).astype(np.int32)


# ----------------------------------------------------------------------------------------------- requant args
def scalar_int(v) -> int:
    """A zero point given as a Python or NumPy integer, or an array of one element, as an int."""
    if isinstance(v, (int, np.integer)):
        return int(v)
    return int(np.asarray(v).reshape(()))


class Requant:
    """Normalised requantization arguments: a flat float buffer with (row, col) strides, and output range."""

    def __init__(self, func: str, requant, m_total: int, n_total: int, weights_on_rows: bool):
        if requant is None:
            self.mode = 0
            self.y_dtype = np.dtype(np.int32)
            self.mult = np.zeros(1, np.float64)
            self.rs = self.cs = 0
            self.yzp = self.qmin = self.qmax = 0
            self.raw = None
            return
        multiplier, y_zero_point, y_dtype, mode = requant
        y_dtype = np.dtype(y_dtype)
        if y_dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise ValueError(f"{func}: requant y_dtype must be int8 or uint8, got {y_dtype}")
        if mode not in ("float64", "float32"):
            raise ValueError(f"{func}: requant mode must be 'float64' or 'float32', got {mode!r}")
        self.mode = 1 if mode == "float64" else 2
        self.mode_name = mode
        self.y_dtype = y_dtype
        self.yzp = scalar_int(y_zero_point)
        self.qmin, self.qmax = (-128, 127) if y_dtype == np.int8 else (0, 255)
        m = np.asarray(multiplier)
        if mode == "float32":
            m = m.astype(np.float32, copy=False)
        m = m.astype(np.float64, copy=False)  # exact for float32/float16/bfloat16 multipliers
        # shape as (rows, cols) of the kernel's C, where "rows" are output channels for a convolution.
        if weights_on_rows:  # convolution: scalar or per output channel (rows)
            m = m.reshape(-1)
            if m.size == 1:
                self.mult, self.rs, self.cs = m, 0, 0
            elif m.size == m_total:
                self.mult, self.rs, self.cs = np.ascontiguousarray(m), 1, 0
            else:
                raise ValueError(f"{func}: requant multiplier must be a scalar or one per output channel ({m_total}), got {m.size}")
        elif m.size == 1 and m.ndim <= 2:  # a scalar (the common case) broadcasts: no check to pay for
            self.mult, self.rs, self.cs = m.reshape(-1), 0, 0
        else:
            try:
                b = np.broadcast_to(m, (m_total, n_total))
            except ValueError:
                raise ValueError(f"{func}: requant multiplier of shape {m.shape} does not broadcast to {(m_total, n_total)}") from None
            if m.size == 1:
                self.mult, self.rs, self.cs = m.reshape(-1), 0, 0
            elif m.shape in ((n_total,), (1, n_total)):
                self.mult, self.rs, self.cs = np.ascontiguousarray(m).reshape(-1), 0, 1
            elif m.shape == (m_total, 1):
                self.mult, self.rs, self.cs = np.ascontiguousarray(m).reshape(-1), 1, 0
            else:
                self.mult, self.rs, self.cs = np.ascontiguousarray(b).reshape(-1), n_total, 1
        self.raw = m
        # float64 arithmetic on a multiplier with a float32 significand (24 bits): see fuse()
        self._short_mult = mode == "float64" and (np.asarray(multiplier).dtype.itemsize <= 4
                                                  or bool(np.all(m.astype(np.float32) == m)))

    def fuse(self, acc_bound: int) -> None:
        """Take the fused form of the "float64" arithmetic (mode 3) where it provably gives the same bytes.

        Mode 1 computes rint(clip(fl(fl(acc * m) + zp))) in float64. If |acc| < 2**29 and m has a 24-bit
        significand, acc * m has at most 53 significant bits, so fl(acc * m) is exact and one fused
        multiply-add fl(acc * m + zp) rounds the same value once, as mode 1 rounds it in its second step. If
        moreover |acc * m| + |zp| < 2**31 - 1, rounding to int32 cannot overflow, and clipping to the integers
        qmin, qmax after rounding equals rounding after clipping (rint is monotonic and fixes integers).
        The fused form costs half as much (ResNet-50 1x1 convolutions spend most of their time there).
        acc_bound: a bound on |acc| over every possible input (the caller's worst case)."""
        if self.mode != 1 or not self._short_mult or acc_bound >= 2**29:
            return
        m_max = float(_float_abs_max(read_only(self.mult)))
        if acc_bound * m_max + abs(self.yzp) < 2**31 - 2:
            self.mode = 3


# ----------------------------------------------------------------------------------------------- packed weights
class PackedWeights:
    """Weights with per-column zero points, packed lazily per path (`weight_packing`).

    ``orientation`` "cols": ``w`` is (K, N), the vector side Q (GEMM); "rows": ``w`` is (N, K), one row per
    output column, the broadcast side P (convolution, where the N weight columns become the rows of C).
    ``stats``: the columns' (sum |w - zw|, sum ws) when the caller has them already.
    """

    def __init__(self, w2d: np.ndarray, w_zero_point, orientation: str = "cols", stats=None):
        w2d = np.asarray(w2d)
        if w2d.ndim != 2 or w2d.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise ValueError(f"pack_weights: w2d must be a 2-D int8/uint8 array, got {w2d.dtype} {w2d.shape}")
        n, k = w2d.shape if orientation == "rows" else w2d.shape[::-1]
        zp = np.asarray(w_zero_point)
        if zp.size not in (1, n):
            raise ValueError(f"pack_weights: w_zero_point must be a scalar or have {n} elements (one per column), got shape {zp.shape}")
        zp = np.broadcast_to(zp.reshape(-1).astype(np.int64), (n,)).copy()
        lo, hi = (-128, 127) if w2d.dtype == np.int8 else (0, 255)
        if zp.min(initial=0) < lo or zp.max(initial=0) > hi:
            raise ValueError(f"pack_weights: w_zero_point must lie in [{lo}, {hi}] for {w2d.dtype} weights")
        self.k, self.n = k, n
        self.orientation = orientation
        self.w = np.ascontiguousarray(w2d)
        self.w_zero_point = zp
        # the signed view: ws = w ^ 0x80 for uint8 (== w - 128), zero point shifted alike
        self.zws = zp - 128 if w2d.dtype == np.uint8 else zp
        if stats is None:
            stats = weight_packing.stats(self.w, zp, orientation)
        self.abs_colsum, self.colsum = stats  # sum_k |w - zw| and sum_k ws per column, int64
        self.abs_colsum_max = int(self.abs_colsum.max(initial=0))
        self.any_zw = bool(np.any(self.zws != 0))
        self._packed: dict = {}
        self._fits_byte_pairs: bool | None = None
        self.epilogue_terms: dict = {}  # see gemm

    def packed(self, path: str) -> tuple[np.ndarray, int]:
        """(packed int32 groups, ksteps) for ``path`` in this orientation."""
        got = self._packed.get(path)
        if got is None:
            _op, mr, nv, lanes, g, _f = PATHS[path]
            tile = mr if self.orientation == "rows" else nv * lanes
            got = weight_packing.pack(self.w, self.orientation, g, tile)
            self._packed[path] = got
        return got

    def amx(self) -> tuple[np.ndarray, int]:
        """The AMX kernels' weights (kernels._amx), made on first use: for a GEMM ("cols"), the VNNI panels with
        their K steps padded to whole 16-step tiles, as bytes, and the padded K steps; for a convolution
        ("rows"), the signed bytes as rows of whole 64-byte K tiles (`_amx.conv_weights`) and their pitch."""
        got = self._packed.get("amx")
        if got is None:
            from qlinear.kernels import _amx

            if self.orientation == "rows":
                rows, pitch = _amx.conv_weights(self.w)
                got = (read_only(rows), pitch)
            else:
                q, ks = self.packed("avx512vnni")
                ks16 = -(-ks // 16) * 16
                npn = q.size // (ks * 32) if ks else 0
                b = np.zeros((npn, ks16, 32), np.int32)
                b[:, :ks] = q.reshape(npn, ks, 32)
                got = (read_only(b.reshape(-1).view(np.uint8)), ks16)
            got = self._packed.setdefault("amx", got)  # threads may race here: each makes the same arrays
        return got

    def fits_byte_pairs(self) -> bool:
        """Whether every pair of neighbouring signed weight bytes along K, as the byte-pair paths pack them, has
        |a| + |b| <= 128: then vpmaddubsw's int16 pair sums of u8 x s8 products cannot saturate (at most
        255 * 128 = 32640), and ``avx2ub`` gives the exact sums. Weights quantized to 7 bits always fit (what
        onnxruntime's quantizer writes with reduce_range for CPUs without VNNI); symmetric 8-bit ones rarely."""
        if self._fits_byte_pairs is None:  # threads may race here: each computes the same answer
            path = next(iter(BYTE_PAIR_PATHS))
            groups, _ksteps = self.packed(path)
            pairs = np.abs(groups.view(np.int8).reshape(-1, 2).astype(np.int16))
            fits = bool((pairs[:, 0] + pairs[:, 1]).max(initial=0) <= 128)
            if not fits:
                self._packed.pop(path, None)  # never used
            self._fits_byte_pairs = fits
        return self._fits_byte_pairs

    def rterm_coef(self, zx: int, k: int) -> np.ndarray:
        """int64 ``-zx * sum_k ws + K * zx * zw`` per column: the zero-point terms that do not depend on x."""
        return -np.int64(zx) * self.colsum + np.int64(k) * np.int64(zx) * self.zws

    def bound(self, x_abs_max: int, bias) -> int:
        """A bound on |sum_k (x - x_zp)(w - w_zp) + bias| given max|x - x_zp| (see acc_bound)."""
        return acc_bound(self.abs_colsum, self.abs_colsum_max, x_abs_max, bias)


def pack_weights(w2d, w_zero_point) -> PackedWeights:
    """Pack GEMM weights (K, N) once; see :class:`PackedWeights`."""
    return PackedWeights(w2d, w_zero_point, "cols")


def activation_abs_max(x: np.ndarray, x_zero_point) -> int:
    """max |x - x_zp| over the data (per-row zero points allowed for a GEMM)."""
    if x.size == 0:
        return 0
    zp = np.asarray(x_zero_point, dtype=np.int64)
    return int(max(int(x.max()) - int(zp.min()), int(zp.max()) - int(x.min()), 0))


# ----------------------------------------------------------------------------------------------- gemm
_FORCE_SERIAL = None  # tests: True or False runs every call on one thread or on all, unmeasured
_EMPTY_OUT32 = np.empty(1, np.int32)  # the output buffer a call does not write (int32 or requantized bytes)
_EMPTY_OUT8 = np.empty(1, np.uint8)
THREAD_CHOICES: dict = {}  # (path, M, K, N, thread count) -> threads.SerialOrParallel of gemm's calls


def gemm(a, a_zero_point, packed: PackedWeights, bias=None, requant=None, path: str | None = None,
         out: np.ndarray | None = None) -> np.ndarray:
    """Exact ``sum_k (a - a_zp)(w - w_zp) + bias`` (M, N) int32, or its requantization (see module docstring).
    ``out``: a C-contiguous (M, N) array of the result's type that the kernels write into (a batch's slice)."""
    a = np.asarray(a)
    launch, result = gemm_launch(a, a_zero_point, packed, bias, requant, path)
    if launch is not None:
        return launch.run(a, out)
    if out is None:
        return result
    _check_out(out, result.shape, result.dtype)
    out[...] = result
    return out


def _check_out(out: np.ndarray, shape: tuple, dtype) -> None:
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"gemm: out must be a writeable C-contiguous {np.dtype(dtype)} array of shape {shape}, "
                         f"got {out.dtype} {out.shape}")


def gemm_launch(a, a_zero_point, packed: PackedWeights, bias=None, requant=None, path: str | None = None):
    """(GemmLaunch, None) for a call `gemm` runs on its kernels, whose `run` a caller may repeat with other
    arrays of ``a``'s shape and type where ``launch.reusable``; (None, the result) where it computes the product
    another way (the BLAS path, an accumulator past int32 for this ``a``, an empty product)."""
    func = "gemm"
    if a.ndim != 2 or a.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise ValueError(f"{func}: a must be a 2-D int8/uint8 array, got {a.dtype} {a.shape}")
    if packed.orientation != "cols":
        raise ValueError(f"{func}: packed weights come from prepack_conv; use pack_weights for a GEMM")
    m_total, k = a.shape
    if k != packed.k:
        raise ValueError(f"{func}: a has K={k} columns but the packed weights have K={packed.k} rows")
    n_total = packed.n
    za = np.asarray(a_zero_point).astype(np.int64).reshape(-1)
    if za.size not in (1, m_total):
        raise ValueError(f"{func}: a_zero_point must be a scalar or have {m_total} elements (one per row), got {za.size}")
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.int32 or bias.size != n_total:
            raise ValueError(f"{func}: bias must be int32 with {n_total} elements, got {bias.dtype} {bias.shape}")
        bias = bias.reshape(-1)
    rq = Requant(func, requant, m_total, n_total, weights_on_rows=False)
    path = weights_path(current_path(path), (packed,))
    out_shape = (m_total, n_total)

    lo, hi = (-128, 127) if a.dtype == np.int8 else (0, 255)
    worst = max(hi - int(za.min()), int(za.max()) - lo) if za.size else 0
    bound = packed.bound(worst, bias)
    wide = bound > INT32_MAX and packed.bound(activation_abs_max(a, za), bias) > INT32_MAX
    rq.fuse(bound)
    if path == "blas" or wide or m_total == 0 or n_total == 0 or k == 0:
        acc = _fallback.gemm_exact(func, a, za, packed.w, packed.w_zero_point, bias) if k or bias is not None \
            else np.zeros(out_shape, np.int32)
        if k == 0 and bias is not None:
            acc = np.broadcast_to(bias.reshape(1, -1), out_shape).astype(np.int32)
        if rq.mode == 0:
            return None, acc
        return None, _fallback.requantize(acc, rq.raw, rq.yzp, rq.y_dtype, rq.mode_name)

    return GemmLaunch(a.dtype, m_total, k, zau_of(a.dtype, za), packed, bias, rq, path, bound <= INT32_MAX), None


def zau_of(a_dtype, za: np.ndarray) -> np.ndarray:
    """The zero point of the unsigned bytes the kernels read: int8 activations are flipped (xor 0x80)."""
    return za + 128 if a_dtype == np.int8 else za


class GemmLaunch:
    """Everything a GEMM call sets up from its shape, zero point, bias, requantization and weights (the path,
    the packed weights, the epilogue terms, the blocks): made once, `run` with each new ``a`` of that shape and
    type costs the kernel, the output and the activations' views. ``reusable``: whether the int32 accumulator
    provably holds for any ``a`` of the type (else `gemm` checks a's own values and makes a launch per call)."""

    __slots__ = ("m_total", "k", "n_total", "xor", "words", "need_rowsum", "head", "panels", "rest", "path", "rq",
                 "out_shape", "reusable", "packed", "calls")

    def __init__(self, a_dtype, m_total: int, k: int, zau: np.ndarray, packed: "PackedWeights", bias, rq: "Requant",
                 path: str, reusable: bool):
        _op, mr, nv, lanes, g, _f = PATHS[path]
        nr = nv * lanes
        n_total = packed.n
        self.m_total, self.k, self.n_total, self.path, self.rq, self.reusable = m_total, k, n_total, path, rq, reusable
        self.packed = packed
        self.calls: dict = {}  # (amx, workers) -> the kernel and the arguments no `a` changes (_call_parts)
        self.out_shape = (m_total, n_total)
        self.xor = 0x80 if a_dtype == np.int8 else 0  # unsigned activations: int8 flipped, its zero point + 128
        q_w, ks = packed.packed(path)
        self.need_rowsum = packed.any_zw
        # the activations are packed by the GEMM's own tasks (_drivers.GEMM_TEMPLATE): as 32-bit words when groups
        # of 4 bytes fill K (the row sums then from the unsigned bytes, the int8 flip applied first), else byte by byte
        self.words = g == 4 and k % 4 == 0 and k > 0
        mp = -(-m_total // mr)
        npn = -(-n_total // nr)
        # corrections: C = acc - zw[j]*rowsum[i] - zau[i]*colsum[j] + K*zau[i]*zw[j] + bias[j]
        #            = acc + cterm[j] - u1[i] v1[j] - u2[i] v2[j],  u1 = rowsum, v1 = zw, u2 = zau, v2 = colsum - K*zw
        # these depend only on the call's shape, zero point and bias: kept on the weights for the last few, since
        # building them cost ~15 us per call (repeated inference calls pass the same ones)
        key = (m_total, mr, nr, zau.tobytes(), None if bias is None else bias.tobytes())
        terms = packed.epilogue_terms.get(key)
        if terms is None:
            zw = packed.zws
            cterm = np.zeros(npn * nr, np.int32)
            if bias is not None:
                cterm[:n_total] = bias
            v1 = np.zeros(npn * nr, np.int32)
            v1[:n_total] = zw
            v2 = np.zeros(npn * nr, np.int32)
            v2[:n_total] = wrap_int32(packed.colsum - k * zw)
            u2 = np.zeros(mp * mr, np.int32)
            u2[:m_total] = np.broadcast_to(zau, (m_total,))
            rterm = np.zeros(mp * mr, np.int32)
            row_off = np.arange(mp * mr, dtype=np.int64) * n_total
            col_off = np.arange(npn * nr, dtype=np.int64)
            terms = cterm, v1, v2, u2, rterm, row_off, col_off
            if len(packed.epilogue_terms) >= 8:
                packed.epilogue_terms.clear()
            packed.epilogue_terms[key] = terms
        cterm, v1, v2, u2, rterm, row_off, col_off = terms
        self.head = (q_w, ks, m_total, n_total)
        self.panels = (mr, nr)
        self.rest = (rterm, cterm, v1, u2, v2, read_only(rq.mult), rq.rs, rq.cs, rq.mode, rq.yzp, rq.qmin, rq.qmax,
                     row_off, col_off)

    def run(self, a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The product of ``a`` (the launch's shape and type) with the launch's weights, into ``out`` when given
        (C-contiguous, the launch's output shape and type)."""
        if out is not None:
            _check_out(out, self.out_shape, self.rq.y_dtype)
        if self.path != "avx512vnni" or _AMX is False or not amx_available():
            return self._run(a, False, out)
        if _AMX is True:
            return self._run(a, True, out)
        # AMX tiles or VNNI vectors, measured per shape and thread count (threads.FasterOf): the tiles pay on
        # long products, a one-row product or a short K may not (the activations are copied into padded rows)
        key = (self.m_total, self.k, self.n_total, threads.get_num_threads())
        choice = AMX_CHOICES.get(key)
        if choice is None:
            if len(AMX_CHOICES) >= 256:
                AMX_CHOICES.clear()
            choice = AMX_CHOICES.setdefault(key, threads.FasterOf())
        return choice.call(lambda: self._run(a, False, out), lambda: self._run(a, True, out))

    def _run(self, a: np.ndarray, amx: bool, out: np.ndarray | None = None) -> np.ndarray:
        xor = self.xor
        au = np.ascontiguousarray(a.view(np.uint8) if xor else a)
        rq = self.rq
        if out is None:
            out = np.empty(self.out_shape, rq.y_dtype)
        flat = out.reshape(-1)
        out32 = flat if rq.mode == 0 else _EMPTY_OUT32
        out8 = flat.view(np.uint8) if rq.mode != 0 else _EMPTY_OUT8
        workers = threads.get_num_threads()
        ro_au = read_only(au)
        if amx:
            lead = (ro_au.reshape(-1),)
        else:
            a32 = read_only(au.view(np.int32) if self.words else _EMPTY_WORDS)  # read-only either way: one type
            ub = read_only(au ^ np.uint8(xor)) if (self.words and xor and self.need_rowsum) else ro_au
            lead = (ro_au, a32, ub)

        def launch(serial: bool) -> np.ndarray:
            kernel, arrange = self._call_parts(amx, 1 if serial else workers)
            call_parallel(kernel, *arrange(lead, out32, out8), serial=serial)
            return out

        if workers == 1 or _FORCE_SERIAL is not None:
            return launch(workers == 1 or bool(_FORCE_SERIAL))
        # One thread or all, measured per shape as a convolution layer is (threads.SerialOrParallel): a small
        # product (a classifier head, one token's projection) loses more to waking the workers than it gains. Per
        # shape, not per weight: a product of two activations (attention's) packs a new B on every call.
        key = ("amx" if amx else self.path, self.m_total, self.k, self.n_total, workers)
        choice = THREAD_CHOICES.get(key)
        if choice is None:
            if len(THREAD_CHOICES) >= 256:
                THREAD_CHOICES.clear()
            choice = THREAD_CHOICES.setdefault(key, threads.SerialOrParallel())
        serial = choice.decided()
        return launch(serial) if serial is not None else choice.call(launch)

    def _call_parts(self, amx: bool, n_workers: int):
        """The kernel, and a function that places a call's activation arrays and outputs among the arguments that
        do not change between calls (made once per kernel and thread count: building them cost ~2 us a call)."""
        got = self.calls.get((amx, n_workers))
        if got is None:
            if amx:
                from qlinear.kernels import _amx

                b, ks16 = self.packed.amx()
                kernel = _amx.gemm_tiles
                middle = (np.uint8(self.xor), self.k, self.need_rowsum, b, ks16, self.m_total, self.n_total,
                          *block_sizes(self.m_total, self.n_total, 32, 32, n_workers), n_workers, *self.rest)
                tail = (_amx.CONFIG,)

                def arrange(lead, out32, out8):
                    return (lead[0], *middle, out32, out8, *tail)
            else:
                kernel = gemm_driver(self.path)
                xor8, flip = np.uint8(self.xor), np.int32(-0x7F7F7F80 if self.xor else 0)
                words, rowsum = self.words, self.need_rowsum
                after = (*self.head, *block_sizes(self.m_total, self.n_total, *self.panels, n_workers), n_workers,
                         *self.rest)

                def arrange(lead, out32, out8):
                    au, a32, ub = lead
                    return (au, xor8, a32, flip, words, ub, rowsum, *after, out32, out8)
            got = self.calls[(amx, n_workers)] = (kernel, arrange)
        return got


_AMX = None  # tests: True runs every product the AMX path can take on it, False none; None measures per shape
AMX_CHOICES: dict = {}  # (M, K, N, thread count) -> threads.FasterOf of the VNNI and the AMX kernels


@functools.lru_cache(maxsize=1)
def amx_available() -> bool:
    """Whether the AMX kernels (kernels._amx) may run in this process: numba is installed, the CPU has AMX-INT8,
    Linux granted the tile state and QLINEAR_AMX is not 0."""
    if not HAVE_NUMBA:
        return False
    from qlinear.kernels import _amx

    return _amx.available()
