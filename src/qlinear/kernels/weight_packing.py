"""Weights into the GEMM's packed layouts, and the per-column sums the exactness checks and the zero-point
terms need, in one pass each at memory speed (the NumPy forms, kept below as the references, made int64
copies and a 4-D transpose: 1M weights of a 512->2048 1x1 convolution took 19 ms to pack, 30x its GEMM).

Both layouts hold int32 groups along K of the signed weights ``ws`` (``w ^ 0x80`` for uint8 weights, so that
``ws - zws == w - zw``), 4 bytes per group (vpdpbusd paths, ``g == 4``) or 2 sign-extended int16 (vpmaddwd
paths, ``g == 2``), K padded with zeros:

- rows (the broadcast side P; a convolution's weights, one row per output channel): from ``w`` (N, K),
  ``[ceil(N / tile)][ksteps][tile]`` groups, rows past N zero;
- cols (the vector side Q; a GEMM's weights): from ``w`` (K, N), ``[ceil(N / tile)][ksteps][tile]`` groups,
  columns past N zero.

``stats(w, zero_point, along)`` gives, per output column, ``sum_k |w - zw|`` and ``sum_k ws`` (int64).
"""

from __future__ import annotations

import numpy as np

from qlinear.kernels._arguments import read_only

try:  # numba is a dependency, but the BLAS path (and these references) must work without it
    from qlinear.kernels import ensure_fresh_numba_cache

    ensure_fresh_numba_cache()  # before any cached kernel loads
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only on installs without numba
    HAVE_NUMBA = False


_ROW_RUN = 8_000_000  # columns summed in int32 at a time (8M * 255 < 2**31)


def _groups(k: int, g: int) -> int:
    return -(-k // g) if k else 0


# ----------------------------------------------------------------------------------------------- references
def stats_reference(w: np.ndarray, zero_point: np.ndarray, along: str) -> tuple[np.ndarray, np.ndarray]:
    """(sum |w - zw|, sum ws) per output column, int64; ``along`` "rows": w is (N, K), "cols": (K, N)."""
    wide = w.astype(np.int64)
    if along == "rows":
        wide = wide.T
    shift = 128 if w.dtype == np.uint8 else 0
    abs_sum = np.abs(wide - zero_point.astype(np.int64)[None, :]).sum(axis=0)
    return abs_sum, wide.sum(axis=0) - shift * wide.shape[0]


def pack_reference(w: np.ndarray, along: str, g: int, tile: int) -> tuple[np.ndarray, int]:
    """(packed int32 groups, ksteps): the layout above, by NumPy reshapes."""
    w2d = w.T if along == "rows" else w
    ws = (w2d ^ np.uint8(0x80)).view(np.int8) if w2d.dtype == np.uint8 else w2d
    k, n = ws.shape
    ks = _groups(k, g)
    npan = -(-n // tile)
    wpad = np.zeros((ks * g, npan * tile), np.int8 if g == 4 else np.int16)
    wpad[:k, :n] = ws
    arr = wpad.reshape(ks, g, npan, tile).transpose(2, 0, 3, 1)  # [panel][kstep][tile][g]
    return np.ascontiguousarray(arr).view(np.int32).reshape(-1), ks


# ----------------------------------------------------------------------------------------------- kernels
if HAVE_NUMBA:

    @njit(cache=True)
    def _stats_rows(w, zp, abs_sum, total):
        # int32 sums vectorise; `stats` passes at most _ROW_RUN columns at a time (|w - zw| <= 255 keeps them
        # exact) and adds the runs in int64. The absolute value written out: numba's abs() kept LLVM from
        # vectorising (4x slower).
        n, k = w.shape
        for r in range(n):
            row = w[r]
            z = np.int32(zp[r])
            a32 = np.int32(0)
            t32 = np.int32(0)
            for i in range(k):
                v = np.int32(row[i])
                d = v - z
                a32 += d if d >= 0 else -d
                t32 += v
            abs_sum[r] += a32
            total[r] += t32

    @njit(cache=True)
    def _stats_cols(w, zp, abs_sum, total):
        # column sums in int32 vectors, added into the int64 results every 2**16 rows (exact in between)
        k, n = w.shape
        z = zp.astype(np.int32)
        a32 = np.zeros(n, np.int32)
        t32 = np.zeros(n, np.int32)
        for i in range(k):
            row = w[i]
            for j in range(n):
                v = np.int32(row[j])
                d = v - z[j]
                a32[j] += d if d >= 0 else -d
                t32[j] += v
            if (i + 1) % 65536 == 0 or i == k - 1:
                for j in range(n):
                    abs_sum[j] += a32[j]
                    total[j] += t32[j]
                    a32[j] = 0
                    t32[j] = 0

    @njit(cache=True)
    def _pack_rows_quads(w32, xorword, tile, packed):
        """Rows of 32-bit words (4 weight bytes each, K a multiple of 4): a transpose of ``tile`` rows per
        panel, ^ 0x80 per byte for uint8 weights."""
        n, ks = w32.shape
        npan = (n + tile - 1) // tile
        for pan in range(npan):
            base = pan * ks * tile
            rows = min(tile, n - pan * tile)
            if rows < tile:
                for i in range(ks * tile):
                    packed[base + i] = 0
            for r in range(rows):
                src = w32[pan * tile + r]
                for s in range(ks):
                    packed[base + s * tile + r] = src[s] ^ xorword

    @njit(cache=True, inline="always")
    def _lane(byte, xor, j, g):
        """Weight byte ``byte`` (^ ``xor``) as the signed value of lane ``j`` of an int32 group: a byte for
        g == 4, a sign-extended int16 for g == 2; the group's other bits zero."""
        b = np.int64(byte ^ xor)
        if b >= 128:
            b -= 256
        if g == 4:
            return (b & np.int64(0xFF)) << (8 * j)
        return (b & np.int64(0xFFFF)) << (16 * j)

    @njit(cache=True, inline="always")
    def _int32(v):
        return np.int32(v if v < 2**31 else v - 2**32)

    @njit(cache=True)
    def _pack_rows_bytes(w, xor, g, tile, ks, packed):
        """Any K, either group size: byte by byte, signed, sign-extended to int16 for g == 2."""
        n, k = w.shape
        npan = (n + tile - 1) // tile
        for pan in range(npan):
            base = pan * ks * tile
            for r in range(tile):
                m = pan * tile + r
                for s in range(ks):
                    v = np.int64(0)
                    if m < n:
                        for j in range(g):
                            if s * g + j < k:
                                v |= _lane(w[m, s * g + j], xor, j, g)
                    packed[base + s * tile + r] = _int32(v)

    @njit(cache=True)
    def _pack_cols(w, xor, g, tile, ks, packed):
        """Columns: group j of a column takes the bytes of rows s*g+j, signed, sign-extended for g == 2."""
        k, n = w.shape
        npan = (n + tile - 1) // tile
        for pan in range(npan):
            c0 = pan * tile
            cols = min(tile, n - c0)
            for s in range(ks):
                base = (pan * ks + s) * tile
                for t in range(tile):
                    packed[base + t] = 0
                for j in range(g):
                    kk = s * g + j
                    if kk >= k:
                        break
                    row = w[kk]
                    for t in range(cols):
                        v = np.int64(packed[base + t]) & np.int64(0xFFFFFFFF)
                        packed[base + t] = _int32(v | _lane(row[c0 + t], xor, j, g))


def stats(w: np.ndarray, zero_point: np.ndarray, along: str) -> tuple[np.ndarray, np.ndarray]:
    """`stats_reference`, in one pass (numba) when it is there."""
    if not HAVE_NUMBA:
        return stats_reference(w, zero_point, along)
    n = w.shape[0] if along == "rows" else w.shape[1]
    abs_sum = np.zeros(n, np.int64)
    total = np.zeros(n, np.int64)
    zp = read_only(np.ascontiguousarray(zero_point, np.int64))
    w = read_only(np.ascontiguousarray(w))
    if along == "rows":
        for start in range(0, max(w.shape[1], 1), _ROW_RUN):
            _stats_rows(w[:, start:start + _ROW_RUN], zp, abs_sum, total)
    else:
        _stats_cols(w, zp, abs_sum, total)
    if w.dtype == np.uint8:
        total -= 128 * (w.shape[1] if along == "rows" else w.shape[0])
    return abs_sum, total


def pack(w: np.ndarray, along: str, g: int, tile: int) -> tuple[np.ndarray, int]:
    """`pack_reference`, in one pass (numba) when it is there."""
    if not HAVE_NUMBA:
        return pack_reference(w, along, g, tile)
    w = read_only(np.ascontiguousarray(w))  # one compiled form for the read-only and the writable arrays
    k = w.shape[1] if along == "rows" else w.shape[0]
    n = w.shape[0] if along == "rows" else w.shape[1]
    ks = _groups(k, g)
    packed = np.empty(-(-n // tile) * ks * tile, np.int32)
    xor = np.uint8(0x80) if w.dtype == np.uint8 else np.uint8(0)
    bytes_ = w.view(np.uint8)
    if along == "rows":
        if g == 4 and k % 4 == 0 and k:
            xorword = np.int32(-2139062144) if xor else np.int32(0)  # 0x80808080
            _pack_rows_quads(bytes_.view(np.int32).reshape(n, ks), xorword, tile, packed)
        else:
            _pack_rows_bytes(bytes_, xor, g, tile, ks, packed)
    else:
        _pack_cols(bytes_, xor, g, tile, ks, packed)
    return packed, ks
