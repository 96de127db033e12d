"""Exact integer N-D convolution (ConvInteger / QLinearConv core): im2col fused with operand packing, then the
integer GEMM of :mod:`qlinear.kernels.integer_gemm`; depthwise convolutions take a direct kernel.

Internal API:

``prepack_conv(w, w_zero_point, group=1) -> PackedConv``
    w (M, C/group, k1..kn) int8/uint8, w_zero_point scalar or (M,). Packed once, reused by every call.
``conv(x, x_zero_point, packed, bias, geometry, requant=None, path=None) -> ndarray``
    x (N, C, D1..Dn) int8/uint8 with n = 1, 2 or 3; ``geometry`` is any object with ``strides``, ``dilations``,
    ``pads_begin``, ``pads_end`` (one int per spatial dim; e.g. qlinear.ops.qlinear_conv.ConvGeometry) or a
    dict with those keys. Returns the exact int32 accumulator ``sum (x - x_zp)(w - w_zp) + bias`` of shape
    (N, M, O1..On), or with ``requant=(multiplier scalar or (M,), y_zero_point, y_dtype, mode)`` its
    requantization (as :func:`qlinear.kernels.integer_gemm.gemm`). Padded positions hold x_zero_point.

Orientation: the weights are the broadcast side of the GEMM (rows of C = output channels) and the im2col
columns the vector side (columns of C = output pixels of all images), so C is stored straight into NC...
order and im2col walks the input along contiguous rows. The im2col pass writes the packed layout directly:
each int32 group holds 4 consecutive K taps (or 2 as int16) of one pixel, read from an input padded once
with x_zp (so no bounds checks in the inner loop).
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from qlinear.kernels import _fallback
from qlinear.kernels import integer_gemm as ig
from qlinear.kernels import weight_packing
from qlinear.kernels._arguments import aligned_empty, read_only
from qlinear.kernels.threads import call_parallel

if ig.HAVE_NUMBA:
    from numba import njit, prange

    from qlinear.kernels._byte_moves import transpose16, transpose32, zip4x16
    from qlinear.kernels._microkernel import (depthwise_dot3_256, depthwise_dot3_512, depthwise_perm_dot3,
                                              depthwise_perm_dot5,
                                              depthwise_taps9_pairs)
    from qlinear.kernels._vector_width import host_has, use_512_bit_vectors


class PackedConv:
    """Convolution weights packed once: one :class:`PackedWeights` (rows orientation) per group (made on first
    use), and the depthwise kernels' forms of the same weights."""

    def __init__(self, w, w_zero_point, group: int = 1):
        w = np.asarray(w)
        func = "prepack_conv"
        if w.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or w.ndim < 3:
            raise ValueError(f"{func}: w must be an int8/uint8 array (M, C/group, k...), got {w.dtype} {w.shape}")
        if not isinstance(group, (int, np.integer)) or group < 1 or w.shape[0] % group:
            raise ValueError(f"{func}: group must be a positive divisor of M={w.shape[0]}, got {group!r}")
        self.w = np.ascontiguousarray(w)
        self.group = int(group)
        self.out_channels = w.shape[0]
        self.group_channels = w.shape[1]
        self.kernel = tuple(int(k) for k in w.shape[2:])
        self.taps = math.prod(self.kernel)
        zp = np.asarray(w_zero_point)
        if zp.size not in (1, self.out_channels):
            raise ValueError(f"{func}: w_zero_point must be a scalar or have M={self.out_channels} elements, got shape {zp.shape}")
        self.w_zero_point = np.broadcast_to(zp.reshape(-1), (self.out_channels,)).copy()
        # the one zero point of every channel (an int), or None: lets a call check the zero point it was given cheaply
        first = int(self.w_zero_point[0]) if self.out_channels else 0
        self.uniform_zero_point = first if np.all(self.w_zero_point == first) else None
        lo, hi = (-128, 127) if w.dtype == np.int8 else (0, 255)
        zp64 = self.w_zero_point.astype(np.int64)
        if zp64.min(initial=0) < lo or zp64.max(initial=0) > hi:
            raise ValueError(f"{func}: w_zero_point must lie in [{lo}, {hi}] for {w.dtype} weights")
        w2 = self.w.reshape(self.out_channels, self.group_channels * self.taps)
        self._w2 = w2
        self._groups = None
        # sum_k |w - zw| and sum_k ws per output channel, one pass; each group's PackedWeights takes its rows
        self._stats = weight_packing.stats(w2, zp64, "rows")
        self.abs_colsum = self._stats[0]
        self.abs_colsum_max = int(self.abs_colsum.max(initial=0))
        self.depthwise = self.group_channels == 1 and self.group > 1
        self.zero_bias = np.zeros(self.out_channels, np.int32)
        self.plans: dict = {}
        self.calls: dict = {}  # prepared launches of repeated calls, by the caller's key (ops.qlinear_conv)
        self.last_call = None  # the last repeated call's arguments and launch (ops._quant_args.LastCall)
        if self.depthwise:
            zw = self.w_zero_point.astype(np.int64).reshape(-1, 1)
            self.w_centered = (w2.astype(np.int64) - zw).astype(np.int32)  # (M, taps)
        self.w_centered_t = None  # see centered_taps_first
        self._vnni_rows = False  # (3, M rounded up to 16) int32, made on first use; None: not int8
        self._pair_taps = False  # depthwise_pair_taps, made on first use
        self._direct: dict = {}  # direct_groups by group size

    @property
    def groups(self) -> list:
        """One PackedWeights (rows orientation) per group, for the GEMM path; made on first use, since the
        depthwise kernels never need them (a 960-channel depthwise layer's 960 of them took 33 ms)."""
        if self._groups is None:
            m_g = self.out_channels // self.group
            rows = [slice(g * m_g, (g + 1) * m_g) for g in range(self.group)]
            self._groups = [ig.PackedWeights(self._w2[r], self.w_zero_point[r], "rows",
                                             stats=(self._stats[0][r], self._stats[1][r]))
                            for r in rows]
        return self._groups

    def direct_groups(self, g: int):
        """One PackedWeights per group for the direct path (_drivers.DIRECT_TEMPLATE), made on first use: K
        ordered as (channel group of g, tap, channel in the group), the channels padded to a multiple of g with
        weights that are 0 in the signed view. None when a weight zero point is not 0 in the signed view (the
        direct path sums no columns of the input for it)."""
        got = self._direct.get(g)
        if got is None:
            zw = self.w_zero_point[0] if self.out_channels else 0
            signed_zero = 128 if self.w.dtype == np.uint8 else 0
            if self.uniform_zero_point != signed_zero:
                got = self._direct[g] = ()
                return None
            m, cg, taps = self.out_channels, self.group_channels, self.taps
            cgp = -(-cg // g) * g
            w3 = np.full((m, cgp, taps), zw, self.w.dtype)
            w3[:, :cg] = self.w.reshape(m, cg, taps)
            w2 = np.ascontiguousarray(w3.reshape(m, cgp // g, g, taps).transpose(0, 1, 3, 2)).reshape(m, -1)
            m_g = m // self.group
            got = self._direct[g] = [ig.PackedWeights(w2[gi * m_g:(gi + 1) * m_g],
                                                      self.w_zero_point[gi * m_g:(gi + 1) * m_g], "rows")
                                     for gi in range(self.group)]
        return got or None

    def centered_taps_first(self):
        """The depthwise centred weights as (taps, M), made on first use (the kernels that vectorise across
        channels read a tap's weights for consecutive channels)."""
        if self.w_centered_t is None:
            self.w_centered_t = np.ascontiguousarray(self.w_centered.T)
        return self.w_centered_t

    def depthwise_vnni_rows(self):
        """A 2-D depthwise kernel's centred weights as vpdpbusd groups, one int32 per (kernel row, group of 4
        taps of the row, channel): taps 4d..4d+3 of each row as signed bytes, 0 past its kw taps ((3, M') for 3x3,
        (10, M') for 5x5; M' = M rounded up to 16). None when a centred weight does not fit int8, or for other
        than 2-D kernels of at most 8 taps a row."""
        if self._vnni_rows is False:
            wc = self.w_centered
            if (len(self.kernel) != 2 or self.kernel[1] > 8 or wc.min(initial=0) < -128
                    or wc.max(initial=0) > 127):
                self._vnni_rows = None
            else:
                kh, kw = self.kernel
                per_row = -(-kw // 4)
                cp = -(-self.out_channels // 16) * 16
                g = np.zeros((kh, per_row * 4, cp), np.int8)
                g[:, :kw, :self.out_channels] = wc.reshape(-1, kh, kw).transpose(1, 2, 0)
                g = g.reshape(kh, per_row, 4, cp).transpose(0, 1, 3, 2)  # (row, group, channel, byte)
                self._vnni_rows = np.ascontiguousarray(g).view(np.int32).reshape(kh * per_row, cp)
        return self._vnni_rows

    def depthwise_pair_taps(self):
        """A 3x3 depthwise kernel's centred weights in the order of _microkernel.depthwise_taps9_pairs: per 32
        channels, 12 vectors of 8 int32 (taps 0-3 as signed byte quads, taps 4-7 likewise, tap 8 as int16 pairs
        (w, 0)), each vector's lanes channels 4v..4v+3 and 16+4v..16+4v+3 of the block. None unless every pair
        of taps (0, 1), (2, 3), (4, 5), (6, 7) has |w_a| + |w_b| <= 128 (vpmaddubsw's int16 sums stay exact for
        unsigned bytes: 255 * 128 = 32640)."""
        if self._pair_taps is False:
            wt = self.centered_taps_first()  # (taps, M)
            # pairs within 128 leave one centred value outside the signed bytes: 128 itself
            if (wt.shape[0] != 9 or np.abs(wt[:8].astype(np.int64)).reshape(4, 2, -1).sum(axis=1).max(initial=0) > 128
                    or wt[:8].max(initial=0) > 127):
                self._pair_taps = None
            else:
                m = self.out_channels
                cp = -(-m // 32) * 32
                w = np.zeros((9, cp), np.int64)
                w[:, :m] = wt
                lanes = np.array([4 * v + k + 16 * h for v in range(4) for h in (0, 1) for k in range(4)])
                order = (np.arange(cp // 32)[:, None] * 32 + lanes).reshape(-1, 4, 8)  # [block, vector, lane]
                quads = w[:8].astype(np.int8).view(np.uint8).astype(np.uint32)  # bytes of the signed weights
                out = np.empty((cp // 32, 12, 8), np.uint32)
                for q in range(2):
                    t = 4 * q
                    group = quads[t] | quads[t + 1] << 8 | quads[t + 2] << 16 | quads[t + 3] << 24
                    out[:, 4 * q:4 * q + 4] = group[order]
                out[:, 8:] = w[8].astype(np.int16).view(np.uint16).astype(np.uint32)[order]
                self._pair_taps = out.reshape(-1).view(np.int32)
        return self._pair_taps

    def bound(self, x_abs_max: int, bias) -> int:
        return ig.acc_bound(self.abs_colsum, self.abs_colsum_max, x_abs_max, bias)


def prepack_conv(w, w_zero_point, group: int = 1) -> PackedConv:
    return PackedConv(w, w_zero_point, group)


# ----------------------------------------------------------------------------------------------- numba kernels
if ig.HAVE_NUMBA:
    from qlinear.kernels._im2col_packers import (_MASKED_BYTES, _colsum_run, _colsum_strided, _fill,  # noqa: F401
                                                 _pack_panel_strided, _pack_panel_virtual, _pad_input, _pad_part,
                                                 _pad_phases2, _pair_run, _phase_split, _quad_run, _quad_strided)

    @njit(cache=True, parallel=True)
    def _depthwise(xp, za, wc, bias, chan_mult, n_img, c_in, dp, hp, wpd, kd_n, kh_n, kw_n,
                   dd, dh, dw, sd, sh, sw, od_n, oh_n, ow_n,
                   mult, mult_rs, mode, yzp, qmin, qmax, out32, out8, fuse):
        """Direct depthwise convolution: each output channel reads one input channel; int32 accumulation of
        (x - x_zp) * (w - w_zp) over the taps.

        Equal strides 1 or 2 along H and W: the output plane is computed over the padded width (a "virtual"
        row of wpd sums per output row, those past ow_n discarded), so each tap is one long vector loop over
        the whole plane instead of many short rows. Channels are processed in chunks per parallel task so
        that the scratch row is allocated once per chunk."""
        m_total = wc.shape[0]
        plane = dp * hp * wpd
        per_img = od_n * oh_n * ow_n
        virtual = sh == sw and (sw == 1 or sw == 2)
        # 2-D 3x3 kernels: the 9 taps in one vector loop (_taps9), accumulator in registers; 2-D kernels 5 wide:
        # a kernel row's 5 taps in one (_taps5), on the virtual plane or on each output row (strides 1 or 2 along W)
        fuse3x3 = fuse and virtual and kd_n == 1 and kh_n == 3 and kw_n == 3
        fuse5 = fuse and kd_n == 1 and kw_n == 5 and (sw == 1 or sw == 2)
        vlen = (oh_n - 1) * wpd + ow_n
        # trip counts rounded up to 32 lanes so that LLVM's vector loop does all the work (reads past the
        # plane land in the next plane or in xp's slack; the extra sums are never stored)
        vlen_r = (vlen + 31) // 32 * 32
        ow_r = (ow_n + 31) // 32 * 32
        n_tasks = n_img * m_total
        n_chunks = min(n_tasks, 64)
        for chunk in prange(n_chunks):
            use_512_bit_vectors()  # the loop bodies run in numba's parfor function
            acc = np.empty(max(vlen_r, ow_r), np.int32)
            q8 = np.empty(vlen_r, np.uint8)
            offs = np.empty(9, np.int64)
            wv9 = np.empty(9, np.int32)
            offs5 = np.empty(5, np.int64)
            wv5 = np.empty(5, np.int32)
            for task in range(chunk * n_tasks // n_chunks, (chunk + 1) * n_tasks // n_chunks):
                n = task // m_total
                o = task - n * m_total
                c = o // chan_mult
                xbase = (n * c_in + c) * plane
                obase = (n * m_total + o) * per_img
                b = np.int32(bias[o])
                m = mult[o * mult_rs]
                c0 = b
                if fuse3x3 or fuse5:
                    wsum = np.int32(0)
                    for k in range(wc.shape[1]):
                        wsum += wc[o, k]
                    if fuse3x3:
                        for k in range(9):
                            wv9[k] = wc[o, k]
                    c0 = np.int32(b - np.int32(za * wsum))
                if virtual:
                    for od in range(od_n):
                        if fuse3x3:
                            for kh in range(3):
                                for kw in range(3):
                                    offs[kh * 3 + kw] = xbase + od * sd * hp * wpd + kh * dh * wpd + kw * dw
                            if sw == 1:
                                _taps9(acc, c0, xp, offs, wv9, vlen_r)
                            else:
                                _taps9_s2(acc, c0, xp, offs, wv9, vlen_r)
                        elif fuse5:
                            for kh in range(kh_n):
                                for kw in range(5):
                                    offs5[kw] = xbase + od * sd * hp * wpd + kh * dh * wpd + kw * dw
                                    wv5[kw] = wc[o, kh * 5 + kw]
                                _taps5(acc, kh == 0, c0, xp, offs5, wv5, vlen_r, sw)
                        else:
                            for t in range(vlen_r):
                                acc[t] = b
                        # the general tap loop (skipped when fused)
                        tap = 0
                        for kd in range(0 if fuse3x3 or fuse5 else kd_n):
                            for kh in range(kh_n):
                                for kw in range(kw_n):
                                    wv = wc[o, tap]
                                    tap += 1
                                    src = xbase + (od * sd + kd * dd) * hp * wpd + kh * dh * wpd + kw * dw
                                    if sw == 1:
                                        xs = xp[src:src + vlen_r]
                                        for t in range(vlen_r):
                                            acc[t] += np.int32((np.int32(xs[t]) - za) * wv)
                                    else:
                                        xs = xp[src:src + 2 * vlen_r]
                                        for t in range(vlen_r):
                                            acc[t] += np.int32((np.int32(xs[2 * t]) - za) * wv)
                        # requantize the whole virtual plane in one vector pass, then copy the rows out
                        # (rows of 7 or 14 would run the requantization in a scalar remainder loop)
                        if mode == 0:
                            for oh in range(oh_n):
                                dst = obase + (od * oh_n + oh) * ow_n
                                o32 = out32[dst:dst + ow_n]
                                a32 = acc[oh * wpd:oh * wpd + ow_n]
                                for t in range(ow_n):
                                    o32[t] = a32[t]
                        else:
                            ig._store_row(acc, vlen_r, 0, m, mult, 0, 0, mode, yzp, qmin, qmax, acc, q8)
                            for oh in range(oh_n):
                                dst = obase + (od * oh_n + oh) * ow_n
                                o8 = out8[dst:dst + ow_n]
                                r8 = q8[oh * wpd:oh * wpd + ow_n]
                                for t in range(ow_n):
                                    o8[t] = r8[t]
                    continue
                for od in range(od_n):
                    for oh in range(oh_n):
                        if fuse5:
                            for kh in range(kh_n):
                                row = xbase + od * sd * hp * wpd + (oh * sh + kh * dh) * wpd
                                for kw in range(5):
                                    offs5[kw] = row + kw * dw
                                    wv5[kw] = wc[o, kh * 5 + kw]
                                _taps5(acc, kh == 0, c0, xp, offs5, wv5, ow_n, sw)
                        else:
                            for t in range(ow_n):
                                acc[t] = b
                        tap = 0
                        for kd in range(0 if fuse5 else kd_n):
                            for kh in range(kh_n):
                                row = xbase + (od * sd + kd * dd) * hp * wpd + (oh * sh + kh * dh) * wpd
                                for kw in range(kw_n):
                                    wv = wc[o, tap]
                                    tap += 1
                                    src = row + kw * dw
                                    if sw == 1:  # a contiguous run: one vector loop (the strided form is scalar)
                                        xs = xp[src:src + ow_n]
                                        for t in range(ow_n):
                                            acc[t] += np.int32((np.int32(xs[t]) - za) * wv)
                                    else:
                                        for t in range(ow_n):
                                            acc[t] += np.int32((np.int32(xp[src + t * sw]) - za) * wv)
                        dst = obase + (od * oh_n + oh) * ow_n
                        ig._store_row(acc, ow_n, dst, m, mult, 0, 0, mode, yzp, qmin, qmax, out32, out8)


    @njit(cache=True, inline="always")
    def _taps9(acc, c0, src, offs, wv, n):
        """acc[t] = c0 + sum_k src[offs[k] + t] * wv[k] for the 9 taps of a 3x3 kernel, in one vector loop
        (the accumulator stays in registers instead of one load/store pass over acc per tap). Sums wrap mod
        2**32 like the exact int32 result they equal (the caller checked that it fits)."""
        x0 = src[offs[0]:offs[0] + n]
        x1 = src[offs[1]:offs[1] + n]
        x2 = src[offs[2]:offs[2] + n]
        x3 = src[offs[3]:offs[3] + n]
        x4 = src[offs[4]:offs[4] + n]
        x5 = src[offs[5]:offs[5] + n]
        x6 = src[offs[6]:offs[6] + n]
        x7 = src[offs[7]:offs[7] + n]
        x8 = src[offs[8]:offs[8] + n]
        w0, w1, w2, w3, w4 = wv[0], wv[1], wv[2], wv[3], wv[4]
        w5, w6, w7, w8 = wv[5], wv[6], wv[7], wv[8]
        out = acc[:n]
        for t in range(n):
            s = (c0 + np.int32(x0[t]) * w0 + np.int32(x1[t]) * w1 + np.int32(x2[t]) * w2
                 + np.int32(x3[t]) * w3 + np.int32(x4[t]) * w4 + np.int32(x5[t]) * w5
                 + np.int32(x6[t]) * w6 + np.int32(x7[t]) * w7 + np.int32(x8[t]) * w8)
            out[t] = np.int32(s)

    @njit(cache=True, inline="always")
    def _taps9_s2(acc, c0, src, offs, wv, n):
        """_taps9 reading every other byte: acc[t] = c0 + sum_k src[offs[k] + 2 t] * wv[k]."""
        x0 = src[offs[0]:offs[0] + 2 * n]
        x1 = src[offs[1]:offs[1] + 2 * n]
        x2 = src[offs[2]:offs[2] + 2 * n]
        x3 = src[offs[3]:offs[3] + 2 * n]
        x4 = src[offs[4]:offs[4] + 2 * n]
        x5 = src[offs[5]:offs[5] + 2 * n]
        x6 = src[offs[6]:offs[6] + 2 * n]
        x7 = src[offs[7]:offs[7] + 2 * n]
        x8 = src[offs[8]:offs[8] + 2 * n]
        w0, w1, w2, w3, w4 = wv[0], wv[1], wv[2], wv[3], wv[4]
        w5, w6, w7, w8 = wv[5], wv[6], wv[7], wv[8]
        out = acc[:n]
        for t in range(n):
            s = (c0 + np.int32(x0[2 * t]) * w0 + np.int32(x1[2 * t]) * w1 + np.int32(x2[2 * t]) * w2
                 + np.int32(x3[2 * t]) * w3 + np.int32(x4[2 * t]) * w4 + np.int32(x5[2 * t]) * w5
                 + np.int32(x6[2 * t]) * w6 + np.int32(x7[2 * t]) * w7 + np.int32(x8[2 * t]) * w8)
            out[t] = np.int32(s)

    @njit(cache=True, inline="always")
    def _taps5(acc, first, c0, src, offs, wv, n, step):
        """One kernel row of 5 taps in one vector loop: acc[t] = (c0 if first else acc[t]) + sum_k
        src[offs[k] + step t] * wv[k] (step 1 or 2: separate loops, so that each vectorises)."""
        w0, w1, w2, w3, w4 = wv[0], wv[1], wv[2], wv[3], wv[4]
        out = acc[:n]
        span = step * n
        x0 = src[offs[0]:offs[0] + span]
        x1 = src[offs[1]:offs[1] + span]
        x2 = src[offs[2]:offs[2] + span]
        x3 = src[offs[3]:offs[3] + span]
        x4 = src[offs[4]:offs[4] + span]
        if step == 1:
            for t in range(n):
                s = (np.int32(x0[t]) * w0 + np.int32(x1[t]) * w1 + np.int32(x2[t]) * w2 + np.int32(x3[t]) * w3
                     + np.int32(x4[t]) * w4)
                out[t] = np.int32((c0 if first else out[t]) + s)
        else:
            for t in range(n):
                s = (np.int32(x0[2 * t]) * w0 + np.int32(x1[2 * t]) * w1 + np.int32(x2[2 * t]) * w2
                     + np.int32(x3[2 * t]) * w3 + np.int32(x4[2 * t]) * w4)
                out[t] = np.int32((c0 if first else out[t]) + s)

    @njit(cache=True, parallel=True)
    def _depthwise3x3(x, flip, za, wc, bias, chan_mult, n_img, c_in, h, w, pt, pl, hp, wpd, dh, dw, stride,
                      oh_n, ow_n, mult, mult_rs, mode, yzp, qmin, qmax, out32, out8):
        """Depthwise 2-D 3x3 convolution with equal strides 1 or 2, reading the unpadded input x (flat uint8;
        int8 data comes as its uint8 view with flip = 0x80, which maps it to x + 128 and za to za + 128).

        Each task first copies its input channel into a per-chunk scratch plane padded with za (the border
        is filled once per chunk: every channel has the same one), so no padded copy of the whole input is
        made. The output plane is then one "virtual" plane (output rows at the scratch's row pitch, lanes
        past ow_n discarded) summed over the 9 taps in a single vector loop, with (x - za) * w = x * w - za * w
        folded into the start value.

        Stride 2: the scratch holds the padded plane's 4 (row, column) parity phases, so every tap reads a
        contiguous run of one phase instead of every other byte, and the virtual plane is half as wide."""
        m_total = wc.shape[0]
        per_img = oh_n * ow_n
        if stride == 1:
            pitch = wpd
            hq = hp
        else:
            pitch = (wpd + 1) // 2
            hq = (hp + 1) // 2
        phase_sz = hq * pitch
        n_phase = 1 if stride == 1 else 4
        vlen = (oh_n - 1) * pitch + ow_n
        # 32-lane rounding: LLVM's vector loop does all the work; the extra sums are never stored
        vlen_r = (vlen + 31) // 32 * 32
        # input columns landing in the even / odd padded columns (stride 2)
        s0 = pl % 2
        s1 = 1 - s0
        n0 = (w - s0 + 1) // 2
        n1 = (w - s1 + 1) // 2 if w > s1 else 0
        j0 = (s0 + pl) // 2
        j1 = (s1 + pl - 1) // 2
        n_tasks = n_img * m_total
        n_chunks = min(n_tasks, 64)
        for chunk in prange(n_chunks):
            use_512_bit_vectors()  # the loop bodies run in numba's parfor function
            acc = np.empty(vlen_r, np.int32)
            q8 = np.empty(vlen_r, np.uint8)
            offs = np.empty(9, np.int64)
            wv = np.empty(9, np.int32)
            # slack past the phases for the rounded runs (values there are never stored)
            sp = np.empty(n_phase * phase_sz + vlen_r + 4 * pitch + 64, np.uint8)
            sp[:] = np.uint8(za)
            last = -1
            for task in range(chunk * n_tasks // n_chunks, (chunk + 1) * n_tasks // n_chunks):
                n = task // m_total
                o = task - n * m_total
                c = o // chan_mult
                src_id = n * c_in + c
                if src_id != last:
                    last = src_id
                    xbase = src_id * h * w
                    for r in range(h):
                        row = x[xbase + r * w:xbase + r * w + w]
                        rp = r + pt
                        if stride == 1:
                            dst = sp[rp * wpd + pl:rp * wpd + pl + w]
                            for t in range(w):
                                dst[t] = row[t] ^ flip
                        else:
                            base = (rp % 2) * 2 * phase_sz + (rp // 2) * pitch
                            d0 = sp[base + j0:base + j0 + n0]
                            d1 = sp[base + phase_sz + j1:base + phase_sz + j1 + n1]
                            r0 = row[s0:s0 + 2 * n0]
                            for t in range(n0):
                                d0[t] = r0[2 * t] ^ flip
                            r1 = row[s1:s1 + 2 * n1]
                            for t in range(n1):
                                d1[t] = r1[2 * t] ^ flip
                obase = (n * m_total + o) * per_img
                wsum = np.int32(0)
                for k in range(9):
                    wv[k] = wc[o, k]
                    wsum += wc[o, k]
                c0 = np.int32(np.int32(bias[o]) - np.int32(za * wsum))
                m = mult[o * mult_rs]
                for kh in range(3):
                    for kw in range(3):
                        a = kh * dh
                        b2 = kw * dw
                        if stride == 1:
                            offs[kh * 3 + kw] = a * wpd + b2
                        else:
                            offs[kh * 3 + kw] = ((a % 2) * 2 + b2 % 2) * phase_sz + (a // 2) * pitch + b2 // 2
                _taps9(acc, c0, sp, offs, wv, vlen_r)
                if mode == 0:
                    for oh in range(oh_n):
                        dst32 = obase + oh * ow_n
                        o32 = out32[dst32:dst32 + ow_n]
                        a32 = acc[oh * pitch:oh * pitch + ow_n]
                        for t in range(ow_n):
                            o32[t] = a32[t]
                else:
                    ig._store_row(acc, vlen_r, 0, m, mult, 0, 0, mode, yzp, qmin, qmax, acc, q8)
                    for oh in range(oh_n):
                        dst8 = obase + oh * ow_n
                        o8 = out8[dst8:dst8 + ow_n]
                        r8 = q8[oh * pitch:oh * pitch + ow_n]
                        for t in range(ow_n):
                            o8[t] = r8[t]

    @njit(cache=True, inline="always")
    def _dw_cl_row(x, flip, za, n, cc, cp, h, w, pt, pl, r, xr):
        """Row r of image n's input, padded with za (rows pt.., columns pl..) and channels-last, into xr
        (wpd * cp bytes: column col's channels at xr[col * cp:...]); int8 flipped to uint8 by flip."""
        xr[:] = np.uint8(za)
        ri = r - pt
        if ri < 0 or ri >= h:
            return
        plane = h * w
        for cs in range(0, cp, 16):
            nb = min(16, cc - cs)
            base = (n * cc + cs) * plane + ri * w
            for col0 in range(0, w, 32):
                ncols = min(32, w - col0)
                d0 = (col0 + pl) * cp + cs
                if nb == 16 and base + col0 + 15 * plane + 32 <= x.size:
                    transpose32(x, base + col0, plane, xr, d0, cp, ncols, flip)
                elif nb == 16 and ncols <= 16 and base + col0 + 15 * plane + 16 <= x.size:
                    transpose16(x, base + col0, plane, xr, d0, cp, ncols, flip)
                else:  # the tiles at the end of x (a vector read would run past it), and partial channel blocks
                    for i in range(ncols):
                        for j in range(nb):
                            xr[d0 + i * cp + j] = x[base + j * plane + col0 + i] ^ flip

    @njit(cache=True, inline="always")
    def _dw_cl_constants(za, wt, bias, mult, mult_rs, cc, cp):
        """Per channel (zero past C): start values bias - za * sum(w) and float64 multipliers. (Filled in
        loops: in a parallel kernel np.zeros would be a parallel region of its own, a fork and join more.)"""
        c0 = np.empty(cp, np.int32)
        mc = np.empty(cp, np.float64)
        for c in range(cc, cp):
            c0[c] = 0
            mc[c] = 0.0
        for c in range(cc):
            c0[c] = np.int32(bias[c])
            mc[c] = mult[c * mult_rs]
        for k in range(wt.shape[0]):
            wk = wt[k]
            for c in range(cc):
                c0[c] -= np.int32(za * wk[c])
        return c0, mc

    @njit(cache=True, inline="always")
    def _dw_cl_store_tile(acc, q8, cc, cp, npx, obase, per_img, mc, mode, yzp, qmin, qmax, out32, out8):
        """A tile of npx <= 16 output pixels, acc[i * cp + c] channels-last, requantized (mode != 0) and stored
        to the NCHW output at obase + c * per_img + i: full tiles by vector transposes of 16 pixels x 16 or 32
        channels, the last partial tile byte by byte."""
        if mode == 0:
            for c in range(cc):
                o32 = out32[obase + c * per_img:obase + c * per_img + npx]
                for i in range(npx):
                    o32[i] = acc[i * cp + c]
            return
        for i in range(npx):
            ig._store_row(acc[i * cp:(i + 1) * cp], cp, i * cp, 0.0, mc, 0, 1, mode, yzp, qmin, qmax, acc, q8)
        if npx == 16:
            for cs in range(0, cp, 32):
                if cs + 16 < cc:
                    transpose32(q8, cs, cp, out8, obase + cs * per_img, per_img, min(32, cc - cs), 0)
                else:
                    transpose16(q8, cs, cp, out8, obase + cs * per_img, per_img, cc - cs, 0)
        else:
            for c in range(cc):
                o8 = out8[obase + c * per_img:obase + c * per_img + npx]
                for i in range(npx):
                    o8[i] = q8[i * cp + c]

    @njit(cache=True, parallel=True)
    def _depthwise3x3_cl(x, flip, za, wt, bias, n_img, c_in, h, w, pt, pl, hp, wpd, dh, dw, stride, oh_n, ow_n,
                         mult, mult_rs, mode, yzp, qmin, qmax, out32, out8):
        """Depthwise 2-D 3x3 convolution (channel multiplier 1) vectorised across channels, for small planes
        where per-channel rows are too short.

        Per image: the input is transposed into a channels-last plane padded with za (int8 flipped to uint8),
        channel pitch cp = C rounded up to 16 (the lanes past C are computed and never stored); then each
        tile of 16 output pixels sums its 9 taps over all channels in one vector loop per pixel (wt: (9, C)
        centred weights, (x - za) * w = x * w - za * w folded into the start value), is requantized
        channels-last and transposed back to the NCHW output (_dw_cl_store_tile)."""
        cc = c_in
        cp = (cc + 15) // 16 * 16
        per_img = oh_n * ow_n
        xt = np.empty(hp * wpd * cp, np.uint8)
        wtp = np.empty((9, cp), np.int32)  # wt, zero past C (in loops: see _dw_cl_constants)
        for k in range(9):
            for c in range(cp):
                wtp[k, c] = wt[k, c] if c < cc else 0
        c0, mc = _dw_cl_constants(za, wt, bias, mult, mult_rs, cc, cp)
        n_tiles = (per_img + 15) // 16
        for n in range(n_img):
            for r in prange(hp):
                use_512_bit_vectors()  # the loop bodies run in numba's parfor function
                _dw_cl_row(x, flip, za, n, cc, cp, h, w, pt, pl, r, xt[r * wpd * cp:(r + 1) * wpd * cp])
            for tile in prange(n_tiles):
                use_512_bit_vectors()
                acc = np.empty(16 * cp, np.int32)
                q8 = np.empty(16 * cp + 32, np.uint8)  # transpose32 reads up to 16 bytes past row 16
                pix0 = tile * 16
                npx = min(16, per_img - pix0)
                for i in range(npx):
                    oh = (pix0 + i) // ow_n
                    ow = pix0 + i - oh * ow_n
                    a = acc[i * cp:(i + 1) * cp]
                    b0 = ((oh * stride) * wpd + ow * stride) * cp
                    x0 = xt[b0:b0 + cp]
                    x1 = xt[b0 + dw * cp:b0 + dw * cp + cp]
                    x2 = xt[b0 + 2 * dw * cp:b0 + 2 * dw * cp + cp]
                    b1 = b0 + dh * wpd * cp
                    x3 = xt[b1:b1 + cp]
                    x4 = xt[b1 + dw * cp:b1 + dw * cp + cp]
                    x5 = xt[b1 + 2 * dw * cp:b1 + 2 * dw * cp + cp]
                    b2 = b0 + 2 * dh * wpd * cp
                    x6 = xt[b2:b2 + cp]
                    x7 = xt[b2 + dw * cp:b2 + dw * cp + cp]
                    x8 = xt[b2 + 2 * dw * cp:b2 + 2 * dw * cp + cp]
                    w0 = wtp[0]
                    w1 = wtp[1]
                    w2 = wtp[2]
                    w3 = wtp[3]
                    w4 = wtp[4]
                    w5 = wtp[5]
                    w6 = wtp[6]
                    w7 = wtp[7]
                    w8 = wtp[8]
                    for c in range(cp):
                        s = (c0[c] + np.int32(x0[c]) * w0[c] + np.int32(x1[c]) * w1[c] + np.int32(x2[c]) * w2[c]
                             + np.int32(x3[c]) * w3[c] + np.int32(x4[c]) * w4[c] + np.int32(x5[c]) * w5[c]
                             + np.int32(x6[c]) * w6[c] + np.int32(x7[c]) * w7[c] + np.int32(x8[c]) * w8[c])
                        a[c] = np.int32(s)
                _dw_cl_store_tile(acc, q8, cc, cp, npx, n * cc * per_img + pix0, per_img, mc, mode, yzp, qmin,
                                  qmax, out32, out8)

    # The same on AVX2 without VNNI, when the centred weights' pairs of taps fit vpmaddubsw (depthwise_pair_taps):
    # channel pitch cp rounded up to 32, each pixel's 9 taps summed 32 channels at a time by depthwise_taps9_pairs
    # (byte quads made in registers, no scratch copy of the input beyond the channels-last plane).
    @njit(cache=True, parallel=True)
    def _depthwise3x3_cl_pairs(x, flip, za, wq, wt, bias, n_img, c_in, h, w, pt, pl, hp, wpd, dh, dw, stride, oh_n,
                               ow_n, mult, mult_rs, mode, yzp, qmin, qmax, out32, out8):
        cc = c_in
        cp = (cc + 31) // 32 * 32
        per_img = oh_n * ow_n
        xt = np.empty(hp * wpd * cp, np.uint8)  # a tap's 32-byte loads end at its pixel's last channel
        c0, mc = _dw_cl_constants(za, wt, bias, mult, mult_rs, cc, cp)
        n_tiles = (per_img + 15) // 16
        dwc = dw * cp
        for n in range(n_img):
            for r in prange(hp):
                use_512_bit_vectors()
                _dw_cl_row(x, flip, za, n, cc, cp, h, w, pt, pl, r, xt[r * wpd * cp:(r + 1) * wpd * cp])
            for tile in prange(n_tiles):
                use_512_bit_vectors()
                acc = np.empty(16 * cp, np.int32)
                q8 = np.empty(16 * cp + 32, np.uint8)
                pix0 = tile * 16
                npx = min(16, per_img - pix0)
                for i in range(npx):
                    oh = (pix0 + i) // ow_n
                    ow = pix0 + i - oh * ow_n
                    b0 = ((oh * stride) * wpd + ow * stride) * cp
                    depthwise_taps9_pairs(xt, b0, b0 + dh * wpd * cp, b0 + 2 * dh * wpd * cp, dwc, wq, c0, acc,
                                          i * cp, cp)
                _dw_cl_store_tile(acc, q8, cc, cp, npx, n * cc * per_img + pix0, per_img, mc, mode, yzp, qmin,
                                  qmax, out32, out8)

    # The same with vpdpbusd (u8 x s8 in groups of 4, exact int32 sums), when every centred weight fits int8:
    # each input row is made channels-last in a scratch row, then zip4x16 stores, for every output column ow,
    # each channel's 4 input columns ow*stride + j*dw (j < 4) as one 32-bit group (xq: hp x ow_n x cp groups);
    # one vpdpbusd per kernel row then sums 3 taps (wq: (3, cp) groups of the row's 3 weights and a 0).
    # wide: zmm vpdpbusd (path avx512vnni), else ymm (avxvnni); on a CPU without AVX-512 VNNI the zmm form
    # compiles to a trap (see _microkernel._make_dot3) and is never called.
    @njit(cache=True, inline="always")
    def _dw_vnni_row(x, flip, za, n, cc, cp, h, w, pt, pl, wpd, dw, stride, ow_n, r, xq):
        xr = np.empty((wpd + dw + 1) * cp, np.uint8)  # zip4x16's 4th column may lie past the row (weight 0)
        _dw_cl_row(x, flip, za, n, cc, cp, h, w, pt, pl, r, xr[:wpd * cp])
        for ow in range(ow_n):
            col = ow * stride
            dq = (r * ow_n + ow) * cp * 4
            for cs in range(0, cp, 16):
                zip4x16(xr, col * cp + cs, (col + dw) * cp + cs, (col + 2 * dw) * cp + cs,
                        (col + 3 * dw) * cp + cs, xq, dq + 4 * cs)

    @njit(cache=True, parallel=True)
    def _depthwise3x3_cl_vnni(x, flip, za, wq, wide, wt, bias, n_img, c_in, h, w, pt, pl, hp, wpd, dh, dw, stride,
                              oh_n, ow_n, mult, mult_rs, mode, yzp, qmin, qmax, out32, out8):
        cc = c_in
        cp = (cc + 15) // 16 * 16
        per_img = oh_n * ow_n
        xq = np.empty(hp * ow_n * cp * 4, np.uint8)
        c0, mc = _dw_cl_constants(za, wt, bias, mult, mult_rs, cc, cp)
        n_tiles = (per_img + 15) // 16
        for n in range(n_img):
            for r in prange(hp):
                use_512_bit_vectors()
                _dw_vnni_row(x, flip, za, n, cc, cp, h, w, pt, pl, wpd, dw, stride, ow_n, r, xq)
            for tile in prange(n_tiles):
                use_512_bit_vectors()
                acc = np.empty(16 * cp, np.int32)
                q8 = np.empty(16 * cp + 32, np.uint8)
                pix0 = tile * 16
                npx = min(16, per_img - pix0)
                step = dh * ow_n * cp * 4
                # 64 channels at a time over the tile's pixels: their part of xq (a few KB) stays in L1
                # (all channels per pixel streamed it from L2: 960 channels @7, 14 -> 10 us)
                for cs in range(0, cp, 64):
                    nc = min(64, cp - cs)
                    for i in range(npx):
                        oh = (pix0 + i) // ow_n
                        ow = pix0 + i - oh * ow_n
                        q0 = ((oh * stride) * ow_n + ow) * cp * 4
                        if wide:
                            depthwise_dot3_512(xq, q0, q0 + step, q0 + 2 * step, wq, cp, c0, acc, i * cp, cs, nc)
                        else:
                            depthwise_dot3_256(xq, q0, q0 + step, q0 + 2 * step, wq, cp, c0, acc, i * cp, cs, nc)
                _dw_cl_store_tile(acc, q8, cc, cp, npx, n * cc * per_img + pix0, per_img, mc, mode, yzp, qmin,
                                  qmax, out32, out8)


    @njit(cache=True, inline="always")
    def _perm_dot(src, off, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c_first, n_ch, acc, a_off,
                  a_stride):
        """The microkernel of the kernel's height (wins holds one window per kernel row: 3 or 5)."""
        if wins.shape[1] == 3:
            depthwise_perm_dot3(src, off, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c_first, n_ch,
                                acc, a_off, a_stride)
        else:
            depthwise_perm_dot5(src, off, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c_first, n_ch,
                                acc, a_off, a_stride)

    # Channel by channel in the NCHW layout, when the CPU has VBMI: no transposes at all. For each 16 output
    # pixels of a channel, one vpermb per kernel row gathers their taps from a 128-byte window of the channel's
    # plane into vpdpbusd groups (tables from _dw_perm_tables), and the channel's outputs are stored as one run,
    # or a run per output row where the groups are a row's (row_pitch > 0: row_len pixels at every row_pitch).
    @njit(cache=True, parallel=True)
    def _depthwise_perm(x, flip, za, wq, wt, bias, n_img, c_in, plane, tab, pads, wins, win_end, n_groups,
                        row_pitch, row_len, per_img, mult, mult_rs, mode, yzp, qmin, qmax, out32, out8, n_tasks):
        c0s, mc = _dw_cl_constants(za, wt, bias, mult, mult_rs, c_in, c_in)
        cp = wq.shape[1]
        jobs = n_img * c_in  # job n * C + c: channel c of image n, whose input and output planes are its job-th
        n_blocks = (jobs + 15) // 16
        n_tasks = min(n_tasks, n_blocks)
        pitch = per_img if row_pitch == 0 else n_groups * 16  # a channel's accumulators
        for task in prange(n_tasks):  # one run of blocks of 16 channels per thread: one scratch row for the run
            use_512_bit_vectors()
            # channel j of a block at acc[j * pitch:]; a group's 16 lanes may run past per_img into the next
            # channel's first group, which is therefore written after it (see depthwise_perm_dot3)
            acc = np.empty(16 * pitch + 16, np.int32)
            for blk in range(task * n_blocks // n_tasks, (task + 1) * n_blocks // n_tasks):
                job = blk * 16
                stop = min(jobs, job + 16)
                while job < stop:  # split where an image ends
                    c = job % c_in
                    n_ch = min(stop - job, c_in - c)
                    off = job * plane
                    # channels whose windows would read past the end of x take their planes from a padded copy
                    n_x = min(n_ch, max(0, (x.size - win_end - off) // plane + 1))
                    a0 = (job - blk * 16) * pitch
                    if n_x > 0:
                        _perm_dot(x, off, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c, n_x, acc, a0,
                                  pitch)
                    if n_x < n_ch:  # after the others: their last group's lanes may run into these channels' first
                        scratch = np.zeros((n_ch - n_x) * plane + win_end, np.uint8)
                        scratch[:(n_ch - n_x) * plane] = x[off + n_x * plane:off + n_ch * plane]
                        _perm_dot(scratch, 0, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c + n_x,
                                  n_ch - n_x, acc, a0 + n_x * pitch, pitch)
                    if row_pitch > 0:
                        for j in range(n_ch):
                            m_j = mc[0] if mult_rs == 0 else mc[c + j]
                            for r in range(per_img // row_len):
                                at = a0 + j * pitch + r * row_pitch
                                ig._store_row(acc[at:at + row_len], row_len, (job + j) * per_img + r * row_len, m_j,
                                              mc, 0, 0, mode, yzp, qmin, qmax, out32, out8)
                    elif mult_rs == 0:
                        ig._store_row(acc[a0:a0 + n_ch * per_img], n_ch * per_img, job * per_img, mc[0], mc, 0, 0, mode,
                                      yzp, qmin, qmax, out32, out8)
                    else:
                        for j in range(n_ch):
                            ig._store_row(acc[a0 + j * per_img:a0 + (j + 1) * per_img], per_img, (job + j) * per_img,
                                          mc[c + j], mc, 0, 0, mode, yzp, qmin, qmax, out32, out8)
                    job += n_ch




# ----------------------------------------------------------------------------------------------- driver
_GEOMETRY_NAMES = ("strides", "dilations", "pads_begin", "pads_end")


def _geometry(func, geometry, n_spatial):
    if isinstance(geometry, dict):
        raw = tuple(geometry[name] for name in _GEOMETRY_NAMES)
    else:
        raw = tuple(getattr(geometry, name) for name in _GEOMETRY_NAMES)
    try:
        return _parse_geometry(func, raw, n_spatial)
    except TypeError:  # lists or arrays are not hashable: parsed on every call (a parsing error is raised again)
        return _parse_geometry.__wrapped__(func, raw, n_spatial)


@functools.lru_cache(maxsize=256)  # repeated calls with the same geometry skip the parsing
def _parse_geometry(func, raw, n_spatial):
    parsed = []
    for name, v in zip(_GEOMETRY_NAMES, raw):
        v = tuple(map(int, v))
        if len(v) != n_spatial:
            raise ValueError(f"{func}: geometry.{name} must have {n_spatial} entries, got {v}")
        parsed.append(v)
    return tuple(parsed)


@functools.lru_cache(maxsize=64)  # shared by every PackedConv: the op-level API packs weights on every call
def _dw_perm_tables(h, w, oh_n, ow_n, sh, sw, dh, dw, pt, pl, kh=3, kw=3):
    """The gather tables of _depthwise_perm for one plane geometry and a kh x kw kernel (kw <= 8; the microkernels
    take 3x3 and 5x5): groups of 16 consecutive output pixels of
    the plane, or, where some of those need input bytes of one kernel row more than 128 apart (16 pixels that
    cross output rows of a wide plane: MobileNetV2's 96/2 @112), groups of 16 pixels of one output row each;
    None where even those do not fit (a kernel row dilated past 128 bytes: the other kernels serve it).

    For group g of 16 pixels and kernel row r: wins[g, r], the window's start in the channel's plane; for each
    group d of 4 taps of the row (t = r * per_row + d, per_row = ceil(kw / 4)), tab[g, t], 64 bytes: pixel i's
    taps 4d + j < kw at window offsets [4i + j] (the others, weight 0, at offset 0); pads[g, t], a bit per byte set
    for the taps in the padding. row_pitch: 0 for consecutive groups, else the accumulators between two output
    rows' first pixels (their groups' 16 lanes each)."""
    per_img = oh_n * ow_n
    n_groups = -(-per_img // 16)
    pix = np.minimum(np.arange(n_groups * 16), per_img - 1).reshape(n_groups, 16)  # the tail repeats a pixel
    found = _dw_perm_groups(h, w, pix // ow_n, pix % ow_n, sh, sw, dh, dw, pt, pl, kh, kw)
    if found is not None:
        return found + (0,)
    per_row = -(-ow_n // 16)
    col = np.minimum(np.arange(per_row * 16), ow_n - 1)  # a row's tail repeats its last pixel
    oh = np.repeat(np.arange(oh_n), per_row * 16).reshape(oh_n * per_row, 16)
    ow = np.tile(col, oh_n).reshape(oh_n * per_row, 16)
    found = _dw_perm_groups(h, w, oh, ow, sh, sw, dh, dw, pt, pl, kh, kw)
    return None if found is None else found + (per_row * 16,)


def _dw_perm_groups(h, w, oh, ow, sh, sw, dh, dw, pt, pl, kh, kw):
    """_dw_perm_tables for the groups of output pixels (oh[g], ow[g]) (16 each), or None."""
    n_groups, per_row = oh.shape[0], -(-kw // 4)
    tab = np.zeros((n_groups, kh, per_row, 16, 4), np.uint8)
    pads = np.zeros((n_groups, kh, per_row), np.uint64)
    wins = np.zeros((n_groups, kh), np.int64)
    taps = np.arange(per_row * 4)
    for r in range(kh):
        ih = (oh * sh + r * dh - pt)[:, :, None]
        iw = (ow * sw - pl)[:, :, None] + taps * dw
        real = taps < kw
        inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w) & real
        at = ih * w + iw
        for g in range(n_groups):
            used = at[g][inside[g]]
            if used.size:
                wins[g, r] = used.min()
                if used.max() - used.min() >= 128:
                    return None
            offsets = np.where(inside[g], at[g] - wins[g, r], 0).reshape(16, per_row, 4)
            padded = (~inside[g] & real).reshape(16, per_row, 4)
            for d in range(per_row):
                tab[g, r, d] = offsets[:, d]
                pads[g, r, d] = int(np.packbits(padded[:, d].reshape(-1), bitorder="little").view("<u8")[0])
    return tab.reshape(-1), pads.reshape(-1), wins, int(wins.max()) + 128


class _Plan:
    """Everything about one (input shape, geometry, path) that does not depend on the data; shared by every packing
    of weights of the same shape (`_shared_plan`), with what their calls measured (`choices`)."""

    def dw_perm(self):
        """_dw_perm_tables for this 2-D geometry (computed on first use), or None."""
        if self._dw_perm is False:
            self._dw_perm = _dw_perm_tables(self.x3_shape[3], self.x3_shape[4], self.out3[1], self.out3[2],
                                            self.s3[1], self.s3[2], self.d3[1], self.d3[2], self.pb3[1], self.pb3[2],
                                            self.kern3[1], self.kern3[2])
        return self._dw_perm

    def _virtual_columns(self, n_img, nr, span, plane_pitch, row_pitch, out_channels):
        """GEMM columns over "virtual" positions: column l < span of an image (padded to whole panels of NR) is
        the output (od, oh, ow) = (l // plane_pitch, l % plane_pitch // row_pitch, l % row_pitch) when that lies
        in the output; the others are computed and never stored (col_off -1)."""
        oh_n, ow_n = self.out3[1:]
        self.pan_per_img = -(-span // nr)
        per_img = self.pan_per_img * nr
        self.q_total = n_img * per_img
        self.npn = n_img * self.pan_per_img
        q_idx = np.arange(self.npn * nr, dtype=np.int64)
        img, loc = q_idx // per_img, q_idx % per_img
        od, rem = loc // plane_pitch, loc % plane_pitch
        oh, ow = rem // row_pitch, rem % row_pitch
        valid = (loc < span) & (oh < oh_n) & (ow < ow_n)
        self.col_off = np.where(valid, img * (out_channels * self.positions) + (od * oh_n + oh) * ow_n + ow, -1)

    def __init__(self, packed: PackedConv, x_shape, strides, dilations, pads_begin, pads_end, path):
        self.choices = _Choices()
        n_spatial = len(x_shape) - 2
        kernel = packed.kernel
        padded = tuple(x_shape[2 + i] + pads_begin[i] + pads_end[i] for i in range(n_spatial))
        extent = tuple(dilations[i] * (kernel[i] - 1) + 1 for i in range(n_spatial))
        out_sp = tuple((padded[i] - extent[i]) // strides[i] + 1 for i in range(n_spatial))
        if any(o < 1 for o in out_sp):
            raise ValueError(f"conv: the dilated kernel {extent} is larger than the padded input {padded}")
        self.n_spatial = n_spatial
        self.out_sp = out_sp
        self.positions = math.prod(out_sp)
        n_img, c_in = x_shape[:2]
        self.out_shape = (n_img, packed.out_channels) + out_sp
        # to 3 spatial dims: size-1 leading dims with no padding
        pad3 = 3 - n_spatial
        self.kern3 = (1,) * pad3 + kernel
        self.s3 = (1,) * pad3 + strides
        self.d3 = (1,) * pad3 + dilations
        self.pb3 = (0,) * pad3 + pads_begin
        self.pe3 = (0,) * pad3 + pads_end
        self.out3 = (1,) * pad3 + out_sp
        self.x3_shape = (n_img, c_in) + (1,) * pad3 + tuple(x_shape[2:])
        self.padded = any(self.pb3) or any(self.pe3)
        self.xp_shape = (n_img, c_in) + tuple(self.x3_shape[2 + i] + self.pb3[i] + self.pe3[i] for i in range(3))
        dp, hp, wp = self.xp_shape[2:]
        self.plane = dp * hp * wp
        self._dw_perm = False
        # how the GEMM's columns are laid out (set below; the depthwise and BLAS paths use none of them)
        self.virtual = self.poly = self.phase = False
        if packed.depthwise or path == "blas":
            return
        _op, mr, nv, lanes, g, _f = ig.PATHS[path]
        self.nr = nr = nv * lanes
        self.mr = mr
        self.g = g
        cg = packed.group_channels
        # input offset of each K index (c, kd, kh, kw) relative to the first input element of a window
        c_i, kd_i, kh_i, kw_i = np.meshgrid(np.arange(cg), np.arange(self.kern3[0]), np.arange(self.kern3[1]),
                                            np.arange(self.kern3[2]), indexing="ij")
        self.koff = (c_i * self.plane + kd_i * self.d3[0] * hp * wp + kh_i * self.d3[1] * wp
                     + kw_i * self.d3[2]).reshape(-1).astype(np.int64)
        # stride 1 everywhere: virtual columns (see _pack_panel_virtual), unless they waste much GEMM work,
        # counted in whole panels of NR columns per image (a 7x7 output: 61 virtual columns, 49 real, 2 panels
        # either way)
        od_n, oh_n, ow_n = self.out3
        span = (od_n - 1) * hp * wp + (oh_n - 1) * wp + ow_n
        panels_real = -(-(n_img * self.positions) // nr)
        self.virtual = self.s3 == (1, 1, 1) and n_img * -(-span // nr) <= _VIRTUAL_MAX_PANELS * panels_real
        if self.virtual:
            self._virtual_columns(n_img, nr, span, hp * wp, wp, packed.out_channels)
        # strides (2, 2) in 2-D with taps in all four (row, column) parities (3x3/2, the 7x7/2 stem): the input
        # padded straight into its four stride-2 phases (_pad_phases2), then virtual columns of pitch wq over a
        # phase plane, as at stride 1. The strided packer spent ~15 us per panel of 32 columns at K = 2304 on
        # 14-pixel rows (3x3 256/2 @28 batch 1, 1 thread: 517 -> 448 us; the stem: equal)
        if (_USE_POLYPHASE and not self.virtual and dp == 1 and self.kern3[0] == 1 and self.s3 == (1, 2, 2)
                and {(kh * self.d3[1]) % 2 for kh in range(self.kern3[1])} == {0, 1}
                and {(kw * self.d3[2]) % 2 for kw in range(self.kern3[2])} == {0, 1}):
            hq, wq = -(-hp // 2), -(-wp // 2)
            span = (oh_n - 1) * wq + ow_n
            self.poly = n_img * -(-span // nr) <= _VIRTUAL_MAX_PANELS * panels_real
        if self.poly:
            self.hq, self.wq = hq, wq
            self.chan = 4 * hq * wq
            self.poly_img = c_in * self.chan
            dh, dw = self.d3[1], self.d3[2]
            c_i, kh_i, kw_i = np.meshgrid(np.arange(cg), np.arange(self.kern3[1]), np.arange(self.kern3[2]),
                                          indexing="ij")
            self.koff = ((c_i * 4 + 2 * ((kh_i * dh) % 2) + (kw_i * dw) % 2) * hq * wq + ((kh_i * dh) // 2) * wq
                         + (kw_i * dw) // 2).reshape(-1).astype(np.int64)
            self._virtual_columns(n_img, nr, span, hq * wq, wq, packed.out_channels)
        # strided 1-D/2-D convolutions with large kernels (the 7x7/2 stem): phase-split input (see
        # _phase_split), then virtual columns. It pays when the split copy is much smaller than im2col
        # (measured: 10% faster on the stem, 5-10% slower on 3x3/2 and 1x1/2, where the ratio is 0.7 / 1).
        self.phase = _USE_PHASES and not self.virtual and not self.poly and dp == 1 and self.kern3[0] == 1
        if self.phase:
            n_ph = len({(kh * self.d3[1]) % self.s3[1] for kh in range(self.kern3[1])})
            hs = oh_n + ((self.kern3[1] - 1) * self.d3[1]) // self.s3[1]
            self.phase = n_ph * self.kern3[2] * hs * ow_n <= 0.4 * self.kern3[1] * self.kern3[2] * self.positions
        if self.phase:
            kh_n, kw_n = self.kern3[1], self.kern3[2]
            sh, sw = self.s3[1], self.s3[2]
            dh, dw = self.d3[1], self.d3[2]
            phases = sorted({(kh * dh) % sh for kh in range(kh_n)})
            self.ph_list = np.array(phases, dtype=np.int64)
            self.hs = oh_n + ((kh_n - 1) * dh) // sh
            chan = self.hs * ow_n  # one channel of one (phase, kw) array
            self.phase_img = len(phases) * kw_n * c_in * chan
            ph_idx = {ph: i for i, ph in enumerate(phases)}
            c_i, kh_i, kw_i = np.meshgrid(np.arange(cg), np.arange(kh_n), np.arange(kw_n), indexing="ij")
            ph_of = np.vectorize(lambda kh: ph_idx[(kh * dh) % sh])(kh_i) if kh_n else kh_i
            self.koff = ((ph_of * kw_n + kw_i) * (c_in * chan) + c_i * chan
                         + ((kh_i * dh) // sh) * ow_n).reshape(-1).astype(np.int64)
            self.chan = chan
            # the split arrays hold exactly the output positions: a row pitch of OW, nothing to skip
            self._virtual_columns(n_img, nr, self.positions, self.positions, ow_n, packed.out_channels)
        if not (self.virtual or self.phase or self.poly):
            self.q_total = n_img * self.positions
            self.npn = -(-self.q_total // nr)
            q_idx = np.arange(self.npn * nr, dtype=np.int64)
            self.col_off = (q_idx // self.positions) * (packed.out_channels * self.positions) + q_idx % self.positions
        m_g = packed.out_channels // packed.group
        self.mp = -(-m_g // mr)
        self.row_off = [(np.arange(self.mp * mr, dtype=np.int64) + gi * m_g) * self.positions
                        for gi in range(packed.group)]
        self.zeros_c = np.zeros(self.npn * nr, np.int32)
        self.zeros_r = np.zeros(self.mp * mr, np.int32)


class _Choices:
    """What the calls of one layer shape measured, whatever their weights: kept on the shared `_Plan`, so that
    weights of the same shape packed anew (a raw-weights call that misses the packing cache) start from the
    decisions made, instead of timing every kernel again and packing its weights for it (ResNet-50's 3x3 512
    @7 with raw weights: 5.5 ms a call, 2.5 of them the direct path's weight order, for a 0.13 ms kernel)."""

    def __init__(self):
        self.thread_choices: dict = {}  # thread count -> threads.SerialOrParallel of this shape's calls
        self.split_serial: dict = {}  # thread count -> whether the phase split runs on one thread (ConvLaunch)
        self.direct_thread_choices: dict = {}  # the same for the direct path's launches
        # thread count -> threads.FasterOf of packed panels and the direct path (ConvLaunch.run): which is faster
        # may differ with the threads (the direct path's GEMM waits for the whole input to be interleaved)
        self.direct_choices: dict = {}
        self.amx_choices: dict = {}  # the same for the packed panels' GEMM on VNNI vectors or AMX tiles
        self.amx_thread_choices: dict = {}  # thread count -> threads.SerialOrParallel of the AMX launches


class _WeightPlan:
    """What one set of packed weights adds to a shared `_Plan`: each group's weight zero points padded to whole
    panels, and the epilogue's row terms (`_row_terms`)."""

    def __init__(self, plan: _Plan, packed: PackedConv):
        self.plan = plan
        self.row_terms: dict = {}
        self.u1 = []
        if hasattr(plan, "mp"):  # the GEMM path (the depthwise and BLAS paths use none of this)
            m_g = packed.out_channels // packed.group
            for pw in packed.groups:
                u1 = np.zeros(plan.mp * plan.mr, np.int32)
                u1[:m_g] = pw.zws
                self.u1.append(u1)


# Plans depend on the geometry only (weight shape, group, input shape, strides...), so weights of the same shape
# packed anew (a raw-weights call that misses the packing cache) share them: building one took ~130 us.
_PLANS: dict = {}
_PLANS_MAX = 256


def _shared_plan(packed: PackedConv, key) -> _Plan:
    full = (packed.out_channels, packed.group, packed.group_channels, packed.kernel, packed.depthwise) + key
    plan = _PLANS.get(full)
    if plan is None:
        plan = _Plan(packed, *key)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[full] = plan
    return plan


def _row_terms(weight_plan, gi, pw, m_g, mr, k_total, zau, bias_full, rq):
    """Group gi's per-row epilogue terms, padded to whole MR panels: the constant
    C[o, q] = acc - zw[o] * colsum[q] - zau * wsum[o] + K * zau * zw[o] + bias[o]   (mod 2**32) part, and the
    per-row multipliers. Kept on the plan for the last few (zero point, bias, multiplier) values: repeated
    inference calls pass the same ones, and building them cost several microseconds per call."""
    key = (gi, zau, bias_full.tobytes(), rq.mult.tobytes() if rq.rs else None)
    plan = weight_plan.plan
    cached = weight_plan.row_terms.get(key)
    if cached is not None:
        return cached[0], (cached[1] if rq.rs else rq.mult)  # a per-tensor multiplier is passed as is
    rterm = np.zeros(plan.mp * mr, np.int32)
    rterm[:m_g] = ig.wrap_int32(bias_full[gi * m_g:(gi + 1) * m_g].astype(np.int64) + pw.rterm_coef(zau, k_total))
    if rq.rs:
        mult = np.zeros(plan.mp * mr, np.float64)
        mult[:m_g] = rq.mult[gi * m_g:(gi + 1) * m_g]
    else:
        mult = rq.mult
    if len(weight_plan.row_terms) >= 8:
        weight_plan.row_terms.clear()
    weight_plan.row_terms[key] = rterm, mult
    return rterm, mult


def conv(x, x_zero_point, packed: PackedConv, bias, geometry, requant=None, path: str | None = None) -> np.ndarray:
    """Exact N-D convolution accumulator (N, M, O...) int32, or its requantization (see module docstring)."""
    x = np.asarray(x)
    if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or x.ndim != packed.w.ndim:
        raise ValueError(f"conv: x must be an int8/uint8 array with {packed.w.ndim} dimensions, got {x.dtype} {x.shape}")
    return prepare(x.shape, x.dtype, x_zero_point, packed, bias, geometry, requant, path).run(x)


def prepare(x_shape, x_dtype, x_zero_point, packed: PackedConv, bias, geometry, requant=None,
            path: str | None = None) -> ConvLaunch:
    """Everything a `conv` call decides before it reads x's values, for x of this shape and dtype: the plan,
    the kernel, its arguments. A caller that repeats a call (`qlinear_conv` with the same arguments) keeps the
    launch and calls `ConvLaunch.run` with each new x, which then costs the kernel and the output's allocation.
    ``bias`` and ``requant`` must not change while the launch is kept (callers pass copies)."""
    func = "conv"
    x_dtype = np.dtype(x_dtype)
    n_spatial = len(x_shape) - 2
    if n_spatial > 3:
        raise ValueError(f"{func}: at most 3 spatial dimensions are supported, got {n_spatial}")
    strides, dilations, pads_begin, pads_end = _geometry(func, geometry, n_spatial)
    group = packed.group
    gg = geometry.get("group") if isinstance(geometry, dict) else getattr(geometry, "group", None)
    if gg is not None and int(gg) != group:
        raise ValueError(f"{func}: geometry.group={gg} but the weights were packed with group={group}")
    n_img, c_in = x_shape[:2]
    if c_in != packed.group_channels * group:
        raise ValueError(f"{func}: x has C={c_in} channels; the weights expect {packed.group_channels * group}")
    m_total = packed.out_channels
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.int32 or bias.size != m_total:
            raise ValueError(f"{func}: bias must be int32 with M={m_total} elements, got {bias.dtype} {bias.shape}")
        bias = bias.reshape(-1)
    za = ig.scalar_int(x_zero_point)
    path = ig.weights_path(ig.current_path(path), () if packed.depthwise else packed.groups)
    key = (tuple(x_shape), strides, dilations, pads_begin, pads_end, path)
    weight_plan = packed.plans.get(key)
    if weight_plan is None:
        weight_plan = _WeightPlan(_shared_plan(packed, key), packed)
        if len(packed.plans) > 64:  # many input shapes: keep memory bounded
            packed.plans.clear()
        packed.plans[key] = weight_plan
    plan = weight_plan.plan
    rq = ig.Requant(func, requant, m_total, plan.positions, weights_on_rows=True)
    k_total = packed.group_channels * packed.taps
    lo, hi = (-128, 127) if x_dtype == np.int8 else (0, 255)
    bound = packed.bound(max(hi - za, za - lo), bias)
    rq.fuse(bound)
    launch = ConvLaunch(packed, weight_plan, rq, za, bias, (strides, dilations, pads_begin, pads_end),
                        bound > ig.INT32_MAX)
    if path == "blas" or math.prod(x_shape) == 0 or m_total == 0 or k_total == 0:
        launch.kind = "exact"
        return launch

    bias_full = bias if bias is not None else packed.zero_bias
    launch.flip, launch.zau = (0x80, za + 128) if x_dtype == np.int8 else (0, za)
    kern3, s3, d3, out3 = plan.kern3, plan.s3, plan.d3, plan.out3
    tail = (rq.mult, rq.rs, rq.mode, rq.yzp, rq.qmin, rq.qmax)
    if (_DW_PERM and packed.depthwise and m_total == c_in and plan.xp_shape[2] == 1
            and kern3 in ((1, 3, 3), (1, 5, 5)) and path == "avx512vnni" and _has_vbmi()
            and packed.depthwise_vnni_rows() is not None and plan.dw_perm() is not None):
        # on a CPU with VBMI, any plane whose 16-pixel groups fit 128-byte windows: channel by channel, taps
        # gathered by vpermb (_depthwise_perm; see the measurements at _DW_PERM)
        tab, pads, wins, win_end, row_pitch = plan.dw_perm()
        launch.kind, launch.kernel = "perm", _depthwise_perm
        launch.args = (np.int32(launch.flip), np.int32(launch.zau), packed.depthwise_vnni_rows(),
                       packed.centered_taps_first(), bias_full, n_img, c_in, plan.x3_shape[3] * plan.x3_shape[4],
                       tab, pads, wins, win_end, wins.shape[0], row_pitch, out3[2], plan.positions) + tail
        return launch

    if (packed.depthwise and m_total == c_in and plan.xp_shape[2] == 1 and kern3 == (1, 3, 3)
            and s3 in ((1, 1, 1), (1, 2, 2))
            and plan.positions <= (_DW_CL_MAX_OUT if s3[2] == 1 else _DW_CL_MAX_OUT_S2)):
        # small output planes: vectorised across channels (channels-last copy made inside the kernel)
        kernel, wq = _depthwise3x3_cl, ()
        if _DW_VNNI and path in ("avx512vnni", "avxvnni"):
            rows = packed.depthwise_vnni_rows()
            if rows is not None:
                kernel, wq = _depthwise3x3_cl_vnni, (rows, path == "avx512vnni")
        elif _DW_PAIRS and path in ("avx2ub", "avx2"):
            taps = packed.depthwise_pair_taps()
            if taps is not None:
                kernel, wq = _depthwise3x3_cl_pairs, (taps,)
        launch.kind, launch.kernel = "direct", kernel
        launch.args = ((np.uint8(launch.flip), np.int32(launch.zau)) + wq
                       + (packed.centered_taps_first(), bias_full, n_img, c_in, plan.x3_shape[3], plan.x3_shape[4],
                          plan.pb3[1], plan.pb3[2], plan.xp_shape[3], plan.xp_shape[4], d3[1], d3[2], s3[2],
                          out3[1], out3[2]) + tail)
        return launch

    if (packed.depthwise and plan.xp_shape[2] == 1 and kern3 == (1, 3, 3) and s3 in ((1, 1, 1), (1, 2, 2))
            and (s3[2] == 2 or _DW_SPLIT_STRIDE1) and x_shape[-1] * x_shape[-2] >= _DW_SPLIT_MIN_PLANE):
        # pads (and phase-splits) the input itself, channel by channel, flipping int8 to uint8 on the way
        launch.kind, launch.kernel = "direct", _depthwise3x3
        launch.args = (np.uint8(launch.flip), np.int32(launch.zau), packed.w_centered, bias_full,
                       m_total // c_in, n_img, c_in, plan.x3_shape[3], plan.x3_shape[4], plan.pb3[1], plan.pb3[2],
                       plan.xp_shape[3], plan.xp_shape[4], d3[1], d3[2], s3[2], out3[1], out3[2]) + tail
        return launch

    dp, hp, wp = plan.xp_shape[2:]
    if packed.depthwise:
        launch.kind, launch.kernel = "padded", _depthwise
        launch.args = (np.int32(launch.zau), packed.w_centered, bias_full, m_total // c_in, n_img, c_in, dp, hp,
                       wp, kern3[0], kern3[1], kern3[2], d3[0], d3[1], d3[2], s3[0], s3[1], s3[2], out3[0],
                       out3[1], out3[2]) + tail
        return launch

    mr = plan.mr
    cg = packed.group_channels
    m_g = m_total // group
    # stride 1 or (2, 2) with taps to replicate (im2col copies each input byte once per tap), weight zero points
    # 0: the GEMM may read the padded, channel-interleaved input in place of im2col panels (_direct_launch). A
    # 1x1 convolution's panels copy each byte once, in parallel tasks, from the input in place: it keeps them
    direct = (packed.direct_groups(plan.g) if _DIRECT is not False and (plan.virtual or plan.poly)
              and packed.taps > 1 and (_DIRECT is True or not _decided_first(plan.choices.direct_choices))
              else None)
    if direct is not None and (path not in ig.BYTE_PAIR_PATHS or all(pw.fits_byte_pairs() for pw in direct)):
        alt = _direct_launch(launch, weight_plan, direct, path, bias_full, n_img)
        if _DIRECT is True:
            return alt
        # whether reading the input in place beats packing its panels depends on the layer and the CPU (3x3
        # 64 @56, 1 thread: 584 -> 427 us; 3x3 512/2 @14: 487 -> 545 us, its K steps scattered over 128
        # channel groups): the first calls time both (threads.FasterOf, per layer shape)
        launch.alt, launch.alt_choices = alt, plan.choices.direct_choices
    if plan.phase:
        img_stride, chan_stride = plan.phase_img, cg * plan.chan
    elif plan.poly:
        img_stride, chan_stride = plan.poly_img, cg * plan.chan
    else:
        img_stride, chan_stride = c_in * plan.plane, cg * plan.plane
    # im2col and the GEMM in one parallel region (see _drivers.CONV_TEMPLATE), one per group
    launch.kind, launch.kernel = "gemm", ig.conv_driver(path)
    virtual = plan.phase or plan.virtual or plan.poly
    pan_per_img = plan.pan_per_img if virtual else 0
    launch.args = []  # per group: the arguments before and after those run() supplies
    for gi, pw in enumerate(packed.groups):
        p_w, ks = pw.packed(path)
        rterm, mult = _row_terms(weight_plan, gi, pw, m_g, mr, k_total, launch.zau, bias_full, rq)
        launch.args.append(((p_w, ks, m_g, plan.q_total), (virtual, n_img, img_stride, gi * chan_stride,
                            pan_per_img, out3[0], out3[1], out3[2], s3[0], s3[1], s3[2], hp * wp, wp, pw.any_zw,
                            rterm, plan.zeros_c, weight_plan.u1[gi], plan.zeros_r, plan.zeros_c, read_only(mult),
                            rq.rs, 0, rq.mode, rq.yzp, rq.qmin, rq.qmax, plan.row_off[gi], plan.col_off)))
    if (path == "avx512vnni" and _AMX is not False and ig.amx_available()
            and (_AMX is True or not _decided_first(plan.choices.amx_choices))):
        amx = _amx_launch(launch, weight_plan)
        if _AMX is True:
            return amx
        # AMX tiles or VNNI vectors for the packed panels, timed on the first calls as the direct path is
        launch.amx, launch.amx_choices = amx, plan.choices.amx_choices
    return launch


def _amx_launch(launch, weight_plan) -> ConvLaunch:
    """The packed path's launch with its GEMM on AMX tiles (kernels._amx.conv_tiles): the same panels and
    epilogue, the weights as rows of whole 64-byte K tiles (kept on each group's PackedWeights)."""
    from qlinear.kernels import _amx

    amx = launch.sibling(weight_plan, weight_plan.plan.choices.amx_thread_choices)
    amx.kind, amx.kernel = "amx_gemm", _amx.conv_tiles
    amx.args = []
    for pw, (head, rest) in zip(launch.packed.groups, launch.args):
        amx.args.append(((pw.amx()[0],) + head[1:], rest))
    return amx


def _direct_launch(launch, weight_plan, direct, path, bias_full, n_img) -> ConvLaunch:
    """The direct path's launch of the call `launch` prepares (_drivers.DIRECT_TEMPLATE, docs/semantics.md C-K4):
    the weights ``direct`` (PackedConv.direct_groups), the offsets of each K step's run in the interleaved input
    (at strides (2, 2) its four phase planes per channel group, C-K3), and what the interleaving tasks need."""
    packed, plan, rq = launch.packed, launch.plan, launch.rq
    g, nr, mr = plan.g, plan.nr, plan.mr
    cg, group = packed.group_channels, packed.group
    m_g = packed.out_channels // group
    cgp = -(-cg // g) * g
    phases = 4 if plan.poly else 1
    plane = plan.hq * plan.wq if plan.poly else plan.plane
    pitch = -(-plane // 32) * 32 + 32  # room for a row's vector runs past the plane (_interleave_plane)
    q_group = cgp // g * phases * pitch
    q_img = group * q_group
    if plan.poly:  # koff's (c * 4 + phase) * hq * wq + offset, with channel groups and the pitch
        dh, dw = plan.d3[1], plan.d3[2]
        kh_i, kw_i = np.meshgrid(np.arange(plan.kern3[1]), np.arange(plan.kern3[2]), indexing="ij")
        taps_off = ((2 * ((kh_i * dh) % 2) + (kw_i * dw) % 2) * pitch + ((kh_i * dh) // 2) * plan.wq
                    + (kw_i * dw) // 2).reshape(-1)
        geo = (cg, g, cgp, 1) + tuple(plan.x3_shape[3:]) + (1, plan.hq, plan.wq, 0, plan.pb3[1], plan.pb3[2])
    else:
        taps_off = plan.koff[:packed.taps]
        geo = (cg, g, cgp) + tuple(plan.x3_shape[2:]) + tuple(plan.xp_shape[2:]) + tuple(plan.pb3)
    qtab = (np.arange(cgp // g, dtype=np.int64)[:, None] * (phases * pitch) + taps_off[None, :]).reshape(-1)
    # the last panel of the last image reads up to NR columns past its plane, from its last channel group
    last = (n_img - 1) * q_img + (group - 1) * q_group + (plan.pan_per_img - 1) * nr + int(qtab.max()) + nr
    # strides (2, 2): each task splits one channel group's g planes into their phases first (_pad_phases2),
    # in a scratch of the worker's with room for the vector runs past its end
    scratch = g * 4 * plan.hq * plan.wq + 64 if plan.poly else 0
    # the interleaving tasks: channel groups of the whole input, at least _FILL_TASK_GROUPS int32 groups a task
    units = n_img * group * (cgp // g)
    per_task = max(1, _FILL_TASK_GROUPS // (phases * plane))
    geo = np.array(geo + (pitch, launch.flip, launch.zau, n_img * group * cg, int(plan.poly), scratch, per_task,
                          units), np.int64)
    alt = launch.sibling(weight_plan, plan.choices.direct_thread_choices)
    alt.split_serial = {}
    alt.kind, alt.kernel = "direct_gemm", ig.conv_direct_driver(path)
    alt.direct_size = max(n_img * q_img, last) + 32
    alt.args = []
    k_total = cg * packed.taps
    for gi, (pw, pd) in enumerate(zip(packed.groups, direct)):
        p_w, ks = pd.packed(path)
        rterm, mult = _row_terms(weight_plan, gi, pw, m_g, mr, k_total, launch.zau, bias_full, rq)
        n_fill = -(-units // per_task) if gi == 0 else 0  # the first group's call interleaves them all
        alt.args.append(((p_w, ks, m_g, plan.q_total), (n_fill, read_only(geo), read_only(qtab), q_img,
                         plan.pan_per_img, gi * q_group, rterm, plan.zeros_c, weight_plan.u1[gi], plan.zeros_r,
                         read_only(mult), rq.rs, 0, rq.mode, rq.yzp, rq.qmin, rq.qmax, plan.row_off[gi],
                         plan.col_off)))
    return alt


class ConvLaunch:
    """A convolution call prepared for inputs of one shape and dtype (`prepare`): ``run(x)`` pads x as the
    kernel needs, allocates the output and runs the kernel."""

    kind = "exact"
    kernel = None
    args = ()
    flip = zau = 0
    alt = None  # the direct path's launch for the same call, when it may run (see prepare)
    alt_choices = None  # thread count -> threads.FasterOf of this launch and alt, shared by the shape's launches
    amx = None  # the packed path's launch on AMX tiles (see prepare)
    amx_choices = None  # thread count -> threads.FasterOf of this launch and amx

    def __init__(self, packed, weight_plan, rq, za, bias, geometry, may_overflow):
        self.packed, self.plan, self.rq, self.za, self.bias = packed, weight_plan.plan, rq, za, bias
        self.geometry, self.may_overflow = geometry, may_overflow
        # shared by every launch of the shape: what the calls measured
        choices = weight_plan.plan.choices
        self.thread_choices, self.split_serial = choices.thread_choices, choices.split_serial
        self.pad_parts: dict = {}  # thread count -> the padding's arguments (_pad_arguments)

    def sibling(self, weight_plan, thread_choices) -> "ConvLaunch":
        """A launch of the same call for another kernel (the direct path's, the AMX tiles'), with its own thread
        choices; the caller sets its kind, kernel and arguments."""
        other = ConvLaunch(self.packed, weight_plan, self.rq, self.za, self.bias, self.geometry, self.may_overflow)
        other.flip, other.zau, other.thread_choices = self.flip, self.zau, thread_choices
        return other

    def run(self, x) -> np.ndarray:
        if self.kind == "exact" or (self.may_overflow  # the worst case of x's type leaves int32: x's own values?
                                    and self.packed.bound(ig.activation_abs_max(x, self.za), self.bias) > ig.INT32_MAX):
            return self._exact(x)
        if self.alt is not None:
            choice = _per_thread_count(self.alt_choices, ig.threads.get_num_threads(), ig.threads.FasterOf)
            return choice.call(lambda: self._panels(x), lambda: self.alt._threads(x))
        return self._panels(x)

    def _panels(self, x) -> np.ndarray:
        if self.amx is None:
            return self._threads(x)
        choice = _per_thread_count(self.amx_choices, ig.threads.get_num_threads(), ig.threads.FasterOf)
        return choice.call(lambda: self._threads(x), lambda: self.amx._threads(x))

    def _threads(self, x) -> np.ndarray:
        workers = ig.threads.get_num_threads()
        if workers == 1 or _FORCE_SERIAL is not None:
            return self._run(x, workers == 1 or bool(_FORCE_SERIAL), workers)
        choice = _per_thread_count(self.thread_choices, workers, ig.threads.SerialOrParallel)
        serial = choice.decided()
        if serial is not None:
            return self._run(x, serial, workers)
        return choice.call(lambda serial: self._run(x, serial, workers))

    def _run(self, x, serial: bool, workers: int) -> np.ndarray:
        """The call on the calling thread alone (``serial``) or on ``workers`` threads."""
        plan, rq = self.plan, self.rq
        out = np.empty(plan.out_shape, rq.y_dtype)
        flat = out.reshape(-1)
        out32 = flat if rq.mode == 0 else _EMPTY32
        out8 = flat.view(np.uint8) if rq.mode != 0 else _EMPTY8
        kind = self.kind
        if kind == "perm":
            xc = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            call_parallel(self.kernel, xc, *self.args, out32, out8, 1 if serial else workers, serial=serial)
            return out
        if kind == "direct":
            xc = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            call_parallel(self.kernel, xc, *self.args, out32, out8, serial=serial)
            return out
        if kind == "direct_gemm":
            xc = np.ascontiguousarray(x).reshape(-1).view(np.uint8)  # the region's first tasks pad it
            xq = aligned_empty(self.direct_size, np.int32)
            n_workers = 1 if serial else workers
            blocks = ig.block_sizes(self.args[0][0][2], plan.q_total, plan.mr, plan.nr, n_workers)
            for head, rest in self.args:
                call_parallel(self.kernel, *head, *blocks, n_workers, xc, xq, *rest, out32, out8, serial=serial)
            return out
        n_workers = 1 if serial else workers
        pad, xc = _NO_PAD, _EMPTY8
        in_place = self._in_place(x)
        if kind in ("gemm", "amx_gemm") and not plan.phase and (plan.poly or not in_place):
            # the GEMM's own tasks pad (or phase-split) the input first, in parts, in the same parallel region
            # (3x3 256/2 @28: the split took 36 us on one thread before it)
            xc = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            xflat = self._pad_buffer(x.shape[0])
            pad = self._pad_arguments(x, n_workers)
        else:
            xflat = self._padded(x, in_place)
        if kind == "padded":
            call_parallel(self.kernel, xflat, *self.args, out32, out8, _FUSE_DW3X3, serial=serial)
            return out
        n_img, c_in = x.shape[:2]
        src = xflat
        if plan.phase:
            kern3, d3, s3 = plan.kern3, plan.d3, plan.s3
            hp, wp = plan.xp_shape[3:]
            src = np.empty(n_img * plan.phase_img + _SLACK, np.uint8)
            src[n_img * plan.phase_img:] = 0
            # a copy of x in a parallel region of its own, before the GEMM's: on one thread unless it takes
            # twice what starting the region costs (timed on its first call; measured on 2 vCPUs, the strided
            # ResNet layers' 2t/1t went 0.63-0.80 -> 0.56-0.76 on one thread)
            split_serial = serial or self.split_serial.get(workers, True)
            start = time.perf_counter()
            call_parallel(_phase_split, xflat, src, n_img, c_in, hp, wp, plan.ph_list, kern3[2], d3[2],
                          s3[1], s3[2], plan.hs, plan.out3[2], serial=split_serial)
            if not serial and workers not in self.split_serial:
                self.split_serial[workers] = time.perf_counter() - start < 2 * ig.threads.launch_cost()
        k_total = self.packed.group_channels * self.packed.taps
        if kind == "amx_gemm":
            from qlinear.kernels import _amx

            blocks, tail = ig.block_sizes(self.args[0][0][2], plan.q_total, 32, 32, n_workers), (_amx.CONFIG,)
        else:
            blocks, tail = ig.block_sizes(self.args[0][0][2], plan.q_total, plan.mr, plan.nr, n_workers), ()
        for head, rest in self.args:
            call_parallel(self.kernel, *head, *blocks, n_workers, src, xc, pad, plan.koff, k_total, *rest, out32,
                          out8, *tail, serial=serial)
            pad = _NO_PAD  # the first group's call padded every plane
        return out

    def _in_place(self, x) -> bool:
        """Whether the packers read x itself: no padding, no int8 flip, C order (they bound their reads)."""
        plan = self.plan
        return (not plan.padded and not self.packed.depthwise and not plan.phase and not plan.poly and not self.flip
                and x.flags.c_contiguous)

    def _padded(self, x, in_place: bool):
        """x as the kernels read it outside the GEMM's region (the depthwise kernel, the phase split): x itself
        where the packers may read it in place (``in_place``: `_in_place` of x), else padded on the calling
        thread, int8 flipped to uint8 bits."""
        # the packers bound their reads themselves, so an unpadded uint8 input is used in place (ResNet-50's down
        # 1x1 256->512/2 @56: the copy took 23 of 380 us, on one thread whatever the call's count)
        if in_place:
            return x.reshape(-1)
        # in numba: NumPy's strided copy costs ~10 ns a row (3x3 256/2 @28: 72 us of short rows)
        xflat = self._pad_buffer(x.shape[0])
        _pad_part(np.ascontiguousarray(x).reshape(-1).view(np.uint8), xflat, self._pad_arguments(x, 1), 0)
        return xflat

    def _pad_buffer(self, n_img: int) -> np.ndarray:
        """Room for the padded (or stride-2 phase-split) input, plus slack for the vector runs that read past a
        row (values unused)."""
        plan = self.plan
        return np.empty((n_img * plan.poly_img if plan.poly else math.prod(plan.xp_shape)) + _SLACK, np.uint8)

    def _pad_arguments(self, x, n_workers: int) -> np.ndarray:
        """_im2col_packers._pad_part's pad for x's shape: (flip, zau, planes, d, h, w, dp, hp, wp, p0, p1, p2,
        parts, phases), the planes split into 4 parts a worker (1 on one), kept per thread count."""
        pad = self.pad_parts.get(n_workers)
        if pad is None:
            plan = self.plan
            planes = x.shape[0] * x.shape[1]
            if plan.poly:
                shape = (1, *plan.x3_shape[3:], 1, plan.hq, plan.wq, 0, *plan.pb3[1:])
            else:
                shape = (*plan.x3_shape[2:], *plan.xp_shape[2:], *plan.pb3)
            parts = min(planes, 4 * n_workers) if n_workers > 1 else 1
            pad = np.array((self.flip, self.zau, planes, *shape, parts, int(plan.poly)), np.int64)
            pad = self.pad_parts.setdefault(n_workers, read_only(pad))
        return pad

    def _exact(self, x):
        """The float64-accumulating reference path: exact, or AccumulatorOverflowError."""
        packed, rq = self.packed, self.rq
        strides, dilations, pads_begin, pads_end = self.geometry
        n_spatial = x.ndim - 2
        acc = _fallback.conv_exact("conv", x, self.za, packed.w, packed.w_zero_point, self.bias, packed.group,
                                   strides, dilations, pads_begin, pads_end)
        if rq.mode == 0:
            return acc
        mult = rq.raw.reshape((1, -1) + (1,) * n_spatial) if rq.raw.size > 1 else rq.raw
        return _fallback.requantize(acc, mult, rq.yzp, rq.y_dtype, rq.mode_name)


_USE_PHASES = True
_USE_POLYPHASE = True
# the direct path (weights with zero points 0 read the interleaved input in place): None times it against the
# packed one per layer shape (threads.FasterOf); tests force it (True) or switch it off (False)
_DIRECT = None
# int32 groups an interleaving task of the direct path writes at least: a task per channel group made 128 tasks
# of 7x7 planes for 3x3 512 @7, each claimed with two atomic additions for a few hundred bytes of work
_FILL_TASK_GROUPS = 4096
# virtual columns are taken while they fill at most this many times the panels of the real ones. Measured with
# the vector packers (1 thread): batch-8 layers at 28x28 (25 panels per image for 24.5) and 3x3 at 14x14
# (56 panels for 49) are 10-30% faster virtual, 7x7 batch 8 (16 for 13) 12-19% slower
_VIRTUAL_MAX_PANELS = 1.2
# 3x3 depthwise kernels (tests change these to cover every path). Measured on MobileNetV2's layers (1 thread):
# _depthwise3x3_cl (channels-last, vector transposes; its vpdpbusd form where the centred weights fit int8)
# is 1.3-1.9x faster than the per-channel kernels on outputs of up to 28x28 and at stride 2 up to 56x56
# (192/2 @28: 147 -> 80 us; 144/2 @56: 333 -> 185 us), 0.5-0.9x on larger outputs at stride 1. There
# _depthwise3x3's in-kernel phase split is 1.2-1.6x faster than _depthwise at stride 2 on planes of 56x56 and
# up, but its per-channel copies cost more than they save on smaller planes and at stride 1 (0.8-0.95x), where
# _depthwise with its fused 9-tap loop (1.1-1.3x faster than the tap-by-tap loop) is used instead.
# Whether a layer runs on one thread or on all is measured per layer shape (threads.SerialOrParallel, in
# ConvLaunch.run), not by a fixed size (800,000 multiply-adds before, measured on one VM).
# Ahead of all of these, on CPUs with AVX-512 VBMI and weights whose centred values fit int8, _depthwise_perm
# (channel by channel, vpermb gathers, no transposes) takes every plane its 128-byte windows fit (all of
# MobileNetV2's; 96/2 @112 with groups of one output row each): 1.3-2.8x faster than the best of the others there
# (1 thread: 960/1 @7 79 -> 45 us, 144/2 @56 185 -> 68 us, 32/1 @112 319 -> 205 us, 96/2 @112 366 -> 143 us).
# It takes 5x5 kernels too (the OCR models' depthwise layers, which only _depthwise served: 2.2-4.6x faster,
# 208/1 @2x96 batch 8 628 -> 235 us).
_DW_CL_MAX_OUT = 784
_DW_CL_MAX_OUT_S2 = 3136
_FORCE_SERIAL = None  # tests: True or False runs every call on one thread or on all, unmeasured
_DW_VNNI = True
_DW_PAIRS = True
_DW_SPLIT_MIN_PLANE = 2500
_DW_SPLIT_STRIDE1 = False
_DW_PERM = True
_VBMI = None


def _has_vbmi() -> bool:
    global _VBMI
    if _VBMI is None:
        _VBMI = "avx512vbmi" in ig._host_features()
    return _VBMI


def _decided_first(choices: dict) -> bool:
    """Whether the layer shape's calls on the current thread count chose the first of two kernels for good
    (threads.FasterOf): a new launch then leaves the second unbuilt, and its weights unpacked."""
    choice = choices.get(ig.threads.get_num_threads())
    return choice is not None and choice.choice == 0


def _per_thread_count(choices: dict, workers: int, make):
    """``choices[workers]``, made by ``make()`` on first use (threads.FasterOf, threads.SerialOrParallel): what
    the calls of a layer shape measured, kept per thread count."""
    choice = choices.get(workers)
    if choice is None:
        choice = choices.setdefault(workers, make())
    return choice


_FUSE_DW3X3 = True
_AMX = None  # tests: True makes the packed path's launch the AMX one where it may run, False never; None times both
_SLACK = 256  # reads past the data: 32-lane rounding, doubled at stride 2, plus a dilated kw offset
_EMPTY32 = np.empty(1, np.int32)
_EMPTY8 = np.empty(1, np.uint8)
_NO_PAD = read_only(np.zeros(14, np.int64))  # CONV_TEMPLATE's padding in 0 parts: the input comes padded
