"""The integer GEMM's numba parts that the generated drivers (`_drivers`) and `integer_gemm` both use: the path
table, the fused epilogue (zero-point corrections, bias, requantization, store) and the broadcast-side packers.
Kept below both, so that the drivers import nothing from the modules that call them."""

from __future__ import annotations

import numpy as np

from qlinear.kernels import ensure_fresh_numba_cache

# path -> (microkernel op, MR, NV, lanes, bytes per group: 4 = u8 quads, 2 = int16 pairs, required CPU features)
PATHS = {
    "avx512vnni": ("dpbusd512", 8, 2, 16, 4, ("avx512f", "avx512bw", "avx512vnni")),
    "avxvnni": ("dpbusd256", 6, 2, 8, 4, ("avx2", "avxvnni")),
    "avx512bw": ("pmaddwd512", 8, 2, 16, 2, ("avx512f", "avx512bw")),
    # AVX2 without VNNI, for weights whose byte pairs keep vpmaddubsw exact; other weights take "avx2"
    "avx2ub": ("maddubs256", 4, 2, 8, 4, ("avx2",)),
    "avx2": ("pmaddwd256", 6, 2, 8, 2, ("avx2",)),
    "blas": None,
}
PATH_ORDER = ("avx512vnni", "avxvnni", "avx512bw", "avx2ub", "avx2", "blas")
BYTE_PAIR_PATHS = {"avx2ub": "avx2"}  # path -> the path its weights take when their byte pairs do not fit

try:  # numba is a dependency, but the path table must load without it
    ensure_fresh_numba_cache()  # before any cached kernel loads
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only on installs without numba
    HAVE_NUMBA = False

if HAVE_NUMBA:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    from qlinear.kernels._byte_moves import copy_items
    from qlinear.kernels._vector_width import use_512_bit_vectors

    @intrinsic
    def _fma64(typingctx, a, b, c):
        """a * b + c in float64 with one rounding (vfmadd; LLVM vectorises it)."""
        sig = types.float64(types.float64, types.float64, types.float64)

        def codegen(context, builder, signature, args):
            d = ir.DoubleType()
            fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
            return builder.call(fn, [context.cast(builder, v, t, types.float64) for v, t in zip(args, signature.args)])

        return sig, codegen

    @njit(cache=True, inline="always")
    def _requant_one(acc, m, mode, yzp, qmin, qmax):
        # mode 1: float64(acc) * m + zp, clip, round half even (onnx reference)
        # mode 3: mode 1 where the caller proved it equal to the fused form (Requant.fuse), computed as mode 1
        # mode 2: float32(acc) * float32(m), clip to [qmin-zp, qmax-zp], round half even, + zp (onnxruntime)
        if mode == 1 or mode == 3:
            y = np.float64(acc) * m + np.float64(yzp)
            y = min(max(y, np.float64(qmin)), np.float64(qmax))
            return np.int32(np.rint(y))
        else:
            zp32 = np.float32(yzp)
            y32 = np.float32(acc) * np.float32(m)
            y32 = min(max(y32, np.float32(qmin) - zp32), np.float32(qmax) - zp32)
            return np.int32(np.rint(y32)) + np.int32(yzp)

    @njit(cache=True, inline="always")
    def _store_row(accrow, nc, dst, m_row, mult, m_off, mult_cs, mode, yzp, qmin, qmax, out32, out8):
        """Store one contiguous run of finished accumulators, requantized when mode != 0."""
        _store_row_plus(accrow, 0, nc, dst, m_row, mult, m_off, mult_cs, mode, yzp, qmin, qmax, out32, out8)

    @njit(cache=True, inline="always")
    def _store_row_plus(row, rt, nc, dst, m_row, mult, m_off, mult_cs, mode, yzp, qmin, qmax, out32, out8):
        """Store the accumulators row[c] + rt (int32, wrapping), requantized when mode != 0: the epilogue adds
        its row term here instead of in a pass of its own.

        Separate loops per case, and slices indexed by range() variables (numba then emits no negative-index
        wrap-around), so that LLVM vectorises each loop."""
        if mode == 0:
            o32 = out32[dst:dst + nc]
            for c in range(nc):
                o32[c] = np.int32(row[c] + rt)
            return
        o8 = out8[dst:dst + nc]
        if mode == 3:  # see Requant.fuse: one fma, rounding to int32, then the clip, in integers
            zpf = np.float64(yzp)
            lo_i = np.int32(qmin)
            hi_i = np.int32(qmax)
            if mult_cs == 0:
                for c in range(nc):
                    q = np.int32(np.rint(_fma64(np.float64(np.int32(row[c] + rt)), m_row, zpf)))
                    o8[c] = np.uint8(min(max(q, lo_i), hi_i) & 0xFF)
                return
            if mult_cs == 1:
                mrow = mult[m_off:m_off + nc]
                for c in range(nc):
                    q = np.int32(np.rint(_fma64(np.float64(np.int32(row[c] + rt)), mrow[c], zpf)))
                    o8[c] = np.uint8(min(max(q, lo_i), hi_i) & 0xFF)
                return
        if mult_cs == 0:
            if mode == 1:
                zpf = np.float64(yzp)
                lo = np.float64(qmin)
                hi = np.float64(qmax)
                for c in range(nc):
                    y = min(max(np.float64(np.int32(row[c] + rt)) * m_row + zpf, lo), hi)
                    o8[c] = np.uint8(np.int32(np.rint(y)) & 0xFF)
            else:
                zp32 = np.float32(yzp)
                m32 = np.float32(m_row)
                lo32 = np.float32(qmin) - zp32
                hi32 = np.float32(qmax) - zp32
                izp = np.int32(yzp)
                for c in range(nc):
                    y32 = min(max(np.float32(np.int32(row[c] + rt)) * m32, lo32), hi32)
                    o8[c] = np.uint8((np.int32(np.rint(y32)) + izp) & 0xFF)
        elif mult_cs == 1:
            mrow = mult[m_off:m_off + nc]
            if mode == 1:
                zpf = np.float64(yzp)
                lo = np.float64(qmin)
                hi = np.float64(qmax)
                for c in range(nc):
                    y = min(max(np.float64(np.int32(row[c] + rt)) * mrow[c] + zpf, lo), hi)
                    o8[c] = np.uint8(np.int32(np.rint(y)) & 0xFF)
            else:
                zp32 = np.float32(yzp)
                lo32 = np.float32(qmin) - zp32
                hi32 = np.float32(qmax) - zp32
                izp = np.int32(yzp)
                for c in range(nc):
                    y32 = min(max(np.float32(np.int32(row[c] + rt)) * np.float32(mrow[c]), lo32), hi32)
                    o8[c] = np.uint8((np.int32(np.rint(y32)) + izp) & 0xFF)
        else:
            for c in range(nc):
                q = _requant_one(np.int32(row[c] + rt), mult[m_off + c * mult_cs], mode, yzp, qmin, qmax)
                o8[c] = np.uint8(q & 0xFF)

    @njit(cache=True, inline="always")
    def _rowterm_block(tile, ldt, i0, mc, nc, rterm, mult, mult_rs, m_col, mult_cs, mode, yzp, qmin, qmax,
                       row_off, ro, d0, rstep, out32, out8):
        """Rows r < mc of C = tile[r, :nc] + rterm[i0 + r] (int32, wrapping), stored or requantized to
        out[ro * row_off[i0 + r] + d0 + r * rstep:...]; multipliers mult[i * mult_rs + m_col + c * mult_cs].

        The epilogue's common case (a convolution: only the row term). Every mode and multiplier layout gets
        its own loop nest with nothing but slicing in the row loop: the general epilogue's per-row branching
        cost ~200 cycles a row (numba's reference counting of its slices), as much as the arithmetic of a
        row of 384 outputs."""
        if mode == 0:
            for r in range(mc):
                i = i0 + r
                rt = rterm[i]
                t = tile[r * ldt:r * ldt + nc]
                dst = ro * row_off[i] + d0 + r * rstep
                o32 = out32[dst:dst + nc]
                for c in range(nc):
                    o32[c] = np.int32(t[c] + rt)
            return
        zpf = np.float64(yzp)
        lo = np.float64(qmin)
        hi = np.float64(qmax)
        lo_i = np.int32(qmin)
        hi_i = np.int32(qmax)
        zp32 = np.float32(yzp)
        lo32 = np.float32(qmin) - zp32
        hi32 = np.float32(qmax) - zp32
        izp = np.int32(yzp)
        if mult_cs == 0:
            for r in range(mc):
                i = i0 + r
                rt = rterm[i]
                m = mult[i * mult_rs + m_col]
                m32 = np.float32(m)
                t = tile[r * ldt:r * ldt + nc]
                dst = ro * row_off[i] + d0 + r * rstep
                o8 = out8[dst:dst + nc]
                if mode == 3:
                    for c in range(nc):
                        q = np.int32(np.rint(_fma64(np.float64(np.int32(t[c] + rt)), m, zpf)))
                        o8[c] = np.uint8(min(max(q, lo_i), hi_i) & 0xFF)
                elif mode == 1:
                    for c in range(nc):
                        y = min(max(np.float64(np.int32(t[c] + rt)) * m + zpf, lo), hi)
                        o8[c] = np.uint8(np.int32(np.rint(y)) & 0xFF)
                else:
                    for c in range(nc):
                        y32 = min(max(np.float32(np.int32(t[c] + rt)) * m32, lo32), hi32)
                        o8[c] = np.uint8((np.int32(np.rint(y32)) + izp) & 0xFF)
            return
        for r in range(mc):
            i = i0 + r
            rt = rterm[i]
            t = tile[r * ldt:r * ldt + nc]
            mo = i * mult_rs + m_col
            mrow = mult[mo:mo + nc]
            dst = ro * row_off[i] + d0 + r * rstep
            o8 = out8[dst:dst + nc]
            if mode == 3:
                for c in range(nc):
                    q = np.int32(np.rint(_fma64(np.float64(np.int32(t[c] + rt)), mrow[c], zpf)))
                    o8[c] = np.uint8(min(max(q, lo_i), hi_i) & 0xFF)
            elif mode == 1:
                for c in range(nc):
                    y = min(max(np.float64(np.int32(t[c] + rt)) * mrow[c] + zpf, lo), hi)
                    o8[c] = np.uint8(np.int32(np.rint(y)) & 0xFF)
            else:
                for c in range(nc):
                    y32 = min(max(np.float32(np.int32(t[c] + rt)) * np.float32(mrow[c]), lo32), hi32)
                    o8[c] = np.uint8((np.int32(np.rint(y32)) + izp) & 0xFF)

    @njit(cache=True)
    def _epilogue(tile, ldt, i0, j0, mc, nc, rterm, cterm, u1, v1, u2, v2,
                  mult, mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8, accrow):
        """C[i, j] = tile + rterm[i] + cterm[j] - u1[i] v1[j] - u2[i] v2[j]  (mod 2**32), then store or requantize."""
        use_512_bit_vectors()  # zmm: the float64 requantization runs 8 lanes wide instead of 4
        # the last panel's lanes past N (col_off -1) are dropped: a block ending there stays contiguous
        while nc > 0 and col_off[j0 + nc - 1] < 0:
            nc -= 1
        if nc == 0:
            return
        cols = col_off[j0:j0 + nc]
        first = cols[0]
        contiguous = first >= 0
        if contiguous:
            for c in range(nc):
                if cols[c] != first + c:
                    contiguous = False
                    break
        n_runs = 0
        rowq8 = np.empty(0 if contiguous else nc, np.uint8)
        run_lo = np.empty(0 if contiguous else nc, np.int64)
        run_hi = np.empty(0 if contiguous else nc, np.int64)
        if not contiguous:
            # runs of consecutive output columns (a block spanning images, or virtual columns with gaps, -1)
            c0 = 0
            while c0 < nc:
                if cols[c0] < 0:
                    c0 += 1
                    continue
                c1 = c0 + 1
                while c1 < nc and cols[c1] == cols[c1 - 1] + 1:
                    c1 += 1
                run_lo[n_runs] = c0
                run_hi[n_runs] = c1
                n_runs += 1
                c0 = c1
        ct = cterm[j0:j0 + nc]
        w1 = v1[j0:j0 + nc]
        w2 = v2[j0:j0 + nc]
        no_ct = True
        for c in range(nc):
            if ct[c] != 0:
                no_ct = False
                break
        only_rt = no_ct and (mult_cs == 0 or mult_cs == 1)
        for r in range(mc):
            if u1[i0 + r] != 0 or u2[i0 + r] != 0:
                only_rt = False
                break
        if only_rt and contiguous:
            _rowterm_block(tile, ldt, i0, mc, nc, rterm, mult, mult_rs, j0 * mult_cs, mult_cs, mode, yzp, qmin, qmax,
                           row_off, 1, col_off[j0], 0, out32, out8)
            return
        if only_rt:
            # the whole block into a scratch block (gap columns too), then each row's runs copied out
            if mode == 0:
                s32 = np.empty(mc * nc, np.int32)
                s8 = rowq8
            else:
                s32 = accrow
                s8 = np.empty(mc * nc, np.uint8)
            _rowterm_block(tile, ldt, i0, mc, nc, rterm, mult, mult_rs, j0 * mult_cs, mult_cs, mode, yzp, qmin, qmax,
                           row_off, 0, 0, nc, s32, s8)
            for r in range(mc):
                base = row_off[i0 + r]
                for rn in range(n_runs):
                    c0 = run_lo[rn]
                    if mode == 0:
                        copy_items(out32, base + cols[c0], s32, r * nc + c0, run_hi[rn] - c0)
                    else:
                        copy_items(out8, base + cols[c0], s8, r * nc + c0, run_hi[rn] - c0)
            return
        for r in range(mc):
            i = i0 + r
            rt = rterm[i]
            a1 = u1[i]
            a2 = u2[i]
            trow = tile[r * ldt:r * ldt + nc]
            m_off = i * mult_rs + j0 * mult_cs
            m_row = mult[i * mult_rs] if mode != 0 else 0.0
            # int32 wrap-around arithmetic (exact: see the module docstring). With only the row term (a
            # convolution whose weights have zero point 0) the store's own loop adds it: one pass over the row
            # instead of two. Otherwise the common cases get their own loops: a convolution has no column term
            # and no second rank-1 term.
            row = trow
            plus = rt
            if not (no_ct and a1 == 0 and a2 == 0):
                row = accrow
                plus = np.int32(0)
                if a2 == 0:
                    if a1 == 0:
                        for c in range(nc):
                            accrow[c] = np.int32(trow[c] + rt + ct[c])
                    else:
                        for c in range(nc):
                            accrow[c] = np.int32(trow[c] + rt + ct[c] - a1 * w1[c])
                else:
                    for c in range(nc):
                        accrow[c] = np.int32(trow[c] + rt + ct[c] - a1 * w1[c] - a2 * w2[c])
            if contiguous:
                _store_row_plus(row, plus, nc, row_off[i] + col_off[j0], m_row, mult, m_off, mult_cs, mode, yzp,
                                qmin, qmax, out32, out8)
                continue
            # requantize the whole row in one vector pass (the gap columns too, unused), then copy the runs out:
            # per-run passes spent more on loop set-up and remainders than on the arithmetic (runs are output
            # rows of a virtual-column convolution, 56 wide for ResNet's 3x3 layers at 56x56)
            if mode == 0:
                if row is trow:
                    for c in range(nc):
                        accrow[c] = np.int32(trow[c] + rt)
            else:
                _store_row_plus(row, plus, nc, 0, m_row, mult, m_off, mult_cs, mode, yzp, qmin, qmax, out32, rowq8)
            for rn in range(n_runs):
                c0 = run_lo[rn]
                c1 = run_hi[rn]
                d = row_off[i] + cols[c0]
                if mode == 0:
                    o32 = out32[d:d + c1 - c0]
                    a32 = accrow[c0:c1]
                    for c in range(c1 - c0):
                        o32[c] = a32[c]
                else:
                    o8 = out8[d:d + c1 - c0]
                    q8 = rowq8[c0:c1]
                    for c in range(c1 - c0):
                        o8[c] = q8[c]

    @njit(cache=True, inline="always")
    def _pack_row_panel(packed, rowsum, pan, a, xor, g, mr, need_sum):
        """Broadcast-side packing of a (M, K) uint8 matrix, panel pan: rows pan * MR... as [ksteps][MR] int32
        groups of g bytes (^ xor each), rows past M zero; their sums to rowsum[pan * MR:]."""
        m_total, k = a.shape
        ks = (k + g - 1) // g
        kfull = k // g
        shift = 8 if g == 4 else 16
        base = pan * ks * mr
        for r in range(mr):
            rowsum[pan * mr + r] = 0
        for r in range(mr):
            m = pan * mr + r
            if m >= m_total:
                for s in range(ks):
                    packed[base + s * mr + r] = 0
                continue
            row = a[m]
            for s in range(kfull):
                v = np.int64(0)
                for j in range(g):
                    v |= np.int64(row[s * g + j] ^ xor) << (shift * j)
                packed[base + s * mr + r] = np.int32(v if v < 2**31 else v - 2**32)
            if kfull < ks:
                v = np.int64(0)
                for j in range(k - kfull * g):
                    v |= np.int64(row[kfull * g + j] ^ xor) << (shift * j)
                packed[base + kfull * mr + r] = np.int32(v if v < 2**31 else v - 2**32)
            if need_sum:
                t = np.int64(0)
                for kk in range(k):
                    t += np.int64(row[kk] ^ xor)
                rowsum[m] = np.int32(t)

    @njit(cache=True, inline="always")
    def _pack_row_panel_words(packed, rowsum, pan, a32, xorword, mr, need_sum, rowsum_bytes):
        """_pack_row_panel for groups of 4 bytes and K a multiple of 4: a group is a 32-bit word of the row
        (little-endian bytes, ^ 0x80 each for int8), so a panel is a transpose of MR rows of words (the byte
        loops took 65 us for a 128 x 768 matrix). Row sums from rowsum_bytes (the rows as unsigned bytes)."""
        m_total, ks = a32.shape
        base = pan * ks * mr
        for r in range(mr):
            rowsum[pan * mr + r] = 0
        rows = min(mr, m_total - pan * mr)
        dst = packed[base:base + ks * mr]
        if rows < mr:
            for i in range(ks * mr):
                dst[i] = 0
        for r in range(rows):
            src = a32[pan * mr + r]
            for s in range(ks):
                dst[s * mr + r] = src[s] ^ xorword
        if need_sum:
            for r in range(rows):
                row = rowsum_bytes[pan * mr + r]
                t = np.int32(0)
                for kk in range(row.size):
                    t += np.int32(row[kk])
                rowsum[pan * mr + r] = t
