"""The convolution's im2col packers (a panel of GEMM columns from the padded input, at stride 1 over "virtual"
columns or strided) and the phase split of strided inputs: numba parts that the generated drivers (`_drivers`)
and `im2col` both use, kept below both so that the drivers import nothing from the modules that call them."""

from __future__ import annotations

import numpy as np

from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit, prange  # noqa: E402

from qlinear.kernels._microkernel import (pack_pair16, pack_pair32, pack_pair32_stride2,  # noqa: E402
                                         pack_quad16, pack_quad32, pack_quad32_stride2)
from qlinear.kernels._atomics import fetch_add, load_acquire  # noqa: E402
from qlinear.kernels._byte_moves import copy32_xor, split2_xor, split2_xor_whole  # noqa: E402
from qlinear.kernels._vector_width import host_has, use_512_bit_vectors  # noqa: E402


# The run loops below use slices indexed by a range() variable (numba then drops its negative-index
# wrap-around, so LLVM sees contiguous or stride-2 accesses and vectorises with runtime alias checks),
# and round the trip count up to a multiple of 32 lanes where that stays inside the panel's row: the
# extra lanes are rewritten by a later run or by the zero fill of unused lanes, and the reads stay
# inside xp thanks to its slack. Short trip counts would otherwise run in LLVM's scalar remainder loop.
@njit(cache=True)
def _quad_run(packed, d, xp, a0, a1, a2, a3, step, trip):
    out = packed[d:d + trip]
    if step == 1:
        x0 = xp[a0:a0 + trip]
        x1 = xp[a1:a1 + trip]
        x2 = xp[a2:a2 + trip]
        x3 = xp[a3:a3 + trip]
        for t in range(trip):
            out[t] = np.int32(np.uint32(x0[t]) | (np.uint32(x1[t]) << np.uint32(8))
                              | (np.uint32(x2[t]) << np.uint32(16)) | (np.uint32(x3[t]) << np.uint32(24)))
    else:
        x0 = xp[a0:a0 + 2 * trip]
        x1 = xp[a1:a1 + 2 * trip]
        x2 = xp[a2:a2 + 2 * trip]
        x3 = xp[a3:a3 + 2 * trip]
        for t in range(trip):
            out[t] = np.int32(np.uint32(x0[2 * t]) | (np.uint32(x1[2 * t]) << np.uint32(8))
                              | (np.uint32(x2[2 * t]) << np.uint32(16)) | (np.uint32(x3[2 * t]) << np.uint32(24)))

@njit(cache=True)
def _colsum_run(colsum, c, xp, a0, a1, a2, a3, trip):
    """colsum[c + t] += xp[a0 + t] + xp[a1 + t] (+ xp[a2 + t] + xp[a3 + t] unless a2 < 0) for t < trip.

    A function of its own, not inlined: its slices in the packers' K-step loop cost ~40 cycles per step
    even when the branch holding them never ran (numba's reference counting of the variables; 3x3 64 @56:
    packing 211 -> 111 us)."""
    cs = colsum[c:c + trip]
    x0 = xp[a0:a0 + trip]
    x1 = xp[a1:a1 + trip]
    if a2 < 0:
        for t in range(trip):
            cs[t] += np.int32(x0[t]) + np.int32(x1[t])
        return
    x2 = xp[a2:a2 + trip]
    x3 = xp[a3:a3 + trip]
    for t in range(trip):
        cs[t] += np.int32(x0[t]) + np.int32(x1[t]) + np.int32(x2[t]) + np.int32(x3[t])

@njit(cache=True)
def _quad_strided(packed, d, xp, src, sw, k0, k1, k2, k3, t0, ln):
    """packed[d + t] = the 4 bytes xp[src + t*sw + k_j] (2 int16 halves if k2 < 0) for t0 <= t < ln: the
    scalar form of the packers' runs (strides past 2). Not inlined, like _colsum_run."""
    for t in range(t0, ln):
        o = src + t * sw
        if k2 < 0:
            packed[d + t] = np.int32(np.uint32(xp[o + k0]) | (np.uint32(xp[o + k1]) << np.uint32(16)))
        else:
            packed[d + t] = np.int32(np.uint32(xp[o + k0]) | (np.uint32(xp[o + k1]) << np.uint32(8))
                                     | (np.uint32(xp[o + k2]) << np.uint32(16))
                                     | (np.uint32(xp[o + k3]) << np.uint32(24)))

@njit(cache=True)
def _colsum_strided(colsum, c, xp, src, sw, k0, k1, k2, k3, ln):
    """colsum[c + t] += the bytes xp[src + t*sw + k_j] (k0, k1 only if k2 < 0) for t < ln."""
    for t in range(ln):
        o = src + t * sw
        v = np.int32(xp[o + k0]) + np.int32(xp[o + k1])
        if k2 >= 0:
            v += np.int32(xp[o + k2]) + np.int32(xp[o + k3])
        colsum[c + t] += v

@njit(cache=True)
def _pair_run(packed, d, xp, a0, a1, step, trip):
    out = packed[d:d + trip]
    if step == 1:
        x0 = xp[a0:a0 + trip]
        x1 = xp[a1:a1 + trip]
        for t in range(trip):
            out[t] = np.int32(np.uint32(x0[t]) | (np.uint32(x1[t]) << np.uint32(16)))
    else:
        x0 = xp[a0:a0 + 2 * trip]
        x1 = xp[a1:a1 + 2 * trip]
        for t in range(trip):
            out[t] = np.int32(np.uint32(x0[2 * t]) | (np.uint32(x1[2 * t]) << np.uint32(16)))

@njit(cache=True, parallel=True)
def _phase_split(xp, out, n_img, c_in, hp, wp, ph_list, kw_n, dw, sh, sw, hs, ow_n):
    """Strided convolutions (2-D): out[n][phase][kw][c][i][ow] = xp[n][c][sh*i + ph][sw*ow + kw*dw].

    In this layout the im2col row of tap (c, kh, kw) is one contiguous run over the output positions
    (oh, ow): phase ph = kh*dh % sh, starting at row i = kh*dh // sh. So the virtual-column packer
    packs it with one vector run per K step, and the strided gather happens once per input element
    and kw instead of once per (c, kh, kw) row of im2col."""
    n_ph = ph_list.size
    for task in prange(n_img * n_ph * kw_n * c_in):
        use_512_bit_vectors()  # the loop bodies run in numba's parfor function
        c = task % c_in
        t2 = task // c_in
        kw = t2 % kw_n
        t3 = t2 // kw_n
        phi = t3 % n_ph
        n = t3 // n_ph
        ph = ph_list[phi]
        src_plane = (n * c_in + c) * hp * wp + kw * dw
        dst = task * hs * ow_n
        ow_r = (ow_n + 31) // 32 * 32
        for i in range(hs):
            r = sh * i + ph
            # rows of 7..56 would run in LLVM's scalar remainder loop: write 32-lane multiples, spilling
            # into the next row of this task (written after it), never past the task's block
            trip = min(ow_r, (hs - i) * ow_n)
            o = out[dst + i * ow_n:dst + i * ow_n + trip]
            if r >= hp:
                for t in range(trip):
                    o[t] = 0
                continue
            base = src_plane + r * wp
            if sw == 1:
                row = xp[base:base + trip]
                for t in range(trip):
                    o[t] = row[t]
            elif sw == 2:
                row = xp[base:base + 2 * trip]
                for t in range(trip):
                    o[t] = row[2 * t]
            else:
                for t in range(ow_n):
                    o[t] = xp[base + sw * t]

@njit(cache=True, inline="always")
def _pack_panel_virtual(packed, colsum, pan, xp, koff, k, g, nr, img_stride, chan_off, pan_per_img, need_sum):
    """Panel pan of the im2col for stride-1 convolutions, over "virtual" columns: column l of an image is the
    output position whose window starts at input offset l of the padded plane (l = od*Hp*Wp + oh*Wp + ow,
    ow < Wp), so every K row of a panel is one contiguous run of the input and a panel is packed with one
    vector run per K step. Columns with ow >= OW (or oh >= OH) are computed and never stored. The panel's NR
    columns (of image pan // pan_per_img) go to packed as [ksteps][NR] int32 groups of g bytes, their sums
    to colsum[pan * NR:]."""
    for t in range(nr):
        colsum[pan * nr + t] = 0
    ks = (k + g - 1) // g
    kfull = k // g
    xsize = xp.size
    n = pan // pan_per_img
    src = n * img_stride + chan_off + (pan - n * pan_per_img) * nr
    base = pan * ks * nr
    for s in range(ks):
        dst0 = base + s * nr
        if s < kfull:
            # the reads of the last panel of the last image may run past xp: shorten that run (the
            # columns it drops are past the last output position, never stored)
            trip = min(nr, xsize - src - koff[s * g + g - 1])
            if g == 4:
                if trip == 32:
                    pack_quad32(packed, dst0, xp, src + koff[4 * s], src + koff[4 * s + 1],
                                src + koff[4 * s + 2], src + koff[4 * s + 3])
                elif trip == 16:
                    pack_quad16(packed, dst0, xp, src + koff[4 * s], src + koff[4 * s + 1],
                                src + koff[4 * s + 2], src + koff[4 * s + 3])
                else:
                    _quad_run(packed, dst0, xp, src + koff[4 * s], src + koff[4 * s + 1],
                              src + koff[4 * s + 2], src + koff[4 * s + 3], 1, trip)
                if need_sum:
                    _colsum_run(colsum, pan * nr, xp, src + koff[4 * s], src + koff[4 * s + 1],
                                src + koff[4 * s + 2], src + koff[4 * s + 3], trip)
            else:
                if trip == 32:
                    pack_pair32(packed, dst0, xp, src + koff[2 * s], src + koff[2 * s + 1])
                elif trip == 16:
                    pack_pair16(packed, dst0, xp, src + koff[2 * s], src + koff[2 * s + 1])
                else:
                    _pair_run(packed, dst0, xp, src + koff[2 * s], src + koff[2 * s + 1], 1, trip)
                if need_sum:
                    _colsum_run(colsum, pan * nr, xp, src + koff[2 * s], src + koff[2 * s + 1], -1, -1, trip)
        else:  # the last, partial group: missing taps are 0 (the weights there are 0 too)
            shift = 32 // g
            for t in range(nr):
                v = np.uint32(0)
                tot = np.int32(0)
                for j in range(k - s * g):
                    o = src + koff[s * g + j] + t
                    if o < xsize:
                        b = xp[o]
                        v |= np.uint32(b) << np.uint32(shift * j)
                        tot += np.int32(b)
                packed[dst0 + t] = np.int32(v)
                if need_sum:
                    colsum[pan * nr + t] += tot

@njit(cache=True, inline="always")
def _pack_panel_strided(packed, colsum, pan, segs, xp, koff, k, g, nr, n_img, img_stride, chan_off,
                        od_n, oh_n, ow_n, sd, sh, sw, hpwp, wp, need_sum):
    """Panel pan of the im2col of the padded uint8 input: [ksteps][NR] int32 groups of g bytes of columns
    pan * NR... (column q = (n, od, oh, ow) of all images; K index k = (c, kd, kh, kw) with koff[k] its input
    offset), its column sums in colsum[pan * NR:]. segs: (3, NR) int64 scratch. The vector runs read up to
    NR * sw bytes from a segment's start; a segment whose runs would pass xp's end is packed by the scalar loop,
    so xp may be the caller's unpadded input itself (ConvLaunch._padded)."""
    for t in range(nr):
        colsum[pan * nr + t] = 0
    xsize = xp.size
    per_img = od_n * oh_n * ow_n
    q_total = n_img * per_img
    ks = (k + g - 1) // g
    kfull = k // g
    seg_lane = segs[0]
    seg_len = segs[1]
    seg_src = segs[2]
    nseg = 0
    lane = 0
    q = pan * nr
    while lane < nr and q < q_total:
        n = q // per_img
        p = q - n * per_img
        ow = p % ow_n
        t = p // ow_n
        oh = t % oh_n
        od = t // oh_n
        length = min(ow_n - ow, nr - lane, q_total - q)
        seg_lane[nseg] = lane
        seg_len[nseg] = length
        seg_src[nseg] = n * img_stride + chan_off + od * sd * hpwp + oh * sh * wp + ow * sw
        nseg += 1
        lane += length
        q += length
    valid = lane
    base = pan * ks * nr
    for s in range(ks):
        dst0 = base + s * nr
        if s < kfull and g == 4:
            k0 = koff[4 * s]
            k1 = koff[4 * s + 1]
            k2 = koff[4 * s + 2]
            k3 = koff[4 * s + 3]
            top = max(k0, k1, k2, k3) + nr * sw
            for sg in range(nseg):
                src = seg_src[sg]
                d = dst0 + seg_lane[sg]
                ln = seg_len[sg]
                t0 = 0
                if sw <= 2 and src + top <= xsize:
                    # a 32-lane group may run past the segment, even past this K step's lanes: the
                    # lanes it overwrites are written again by later segments and K steps (or are
                    # past the last column, never stored), so only the panel's end limits it. Short
                    # segments (7-pixel rows of a 7x7 output) then take the vector intrinsic too
                    # (3x3 512 @7 batch 8: packing 1.21 -> 0.57 ms)
                    if ln <= 32 and d + 32 <= base + ks * nr and sw == 1:
                        pack_quad32(packed, d, xp, src + k0, src + k1, src + k2, src + k3)
                    elif ln <= 32 and d + 32 <= base + ks * nr:
                        pack_quad32_stride2(packed, d, xp, src + k0, src + k1, src + k2, src + k3)
                    else:
                        trip = min((ln + 31) // 32 * 32, nr - seg_lane[sg])
                        _quad_run(packed, d, xp, src + k0, src + k1, src + k2, src + k3, sw, trip)
                    t0 = ln
                if t0 < ln:
                    _quad_strided(packed, d, xp, src, sw, k0, k1, k2, k3, t0, ln)
                if need_sum:
                    _colsum_strided(colsum, pan * nr + seg_lane[sg], xp, src, sw, k0, k1, k2, k3, ln)
        elif s < kfull and g == 2:
            k0 = koff[2 * s]
            k1 = koff[2 * s + 1]
            top = max(k0, k1) + nr * sw
            for sg in range(nseg):
                src = seg_src[sg]
                d = dst0 + seg_lane[sg]
                ln = seg_len[sg]
                t0 = 0
                if sw <= 2 and src + top <= xsize:
                    # as for the quads above: a 32-lane group may run past the segment, the panel's end limits it
                    if ln <= 32 and d + 32 <= base + ks * nr and sw == 1:
                        pack_pair32(packed, d, xp, src + k0, src + k1)
                    elif ln <= 32 and d + 32 <= base + ks * nr:
                        pack_pair32_stride2(packed, d, xp, src + k0, src + k1)
                    else:
                        trip = min((ln + 31) // 32 * 32, nr - seg_lane[sg])
                        _pair_run(packed, d, xp, src + k0, src + k1, sw, trip)
                    t0 = ln
                if t0 < ln:
                    _quad_strided(packed, d, xp, src, sw, k0, k1, -1, -1, t0, ln)
                if need_sum:
                    _colsum_strided(colsum, pan * nr + seg_lane[sg], xp, src, sw, k0, k1, -1, -1, ln)
        else:  # the last, partial group: missing taps are 0 (the weights there are 0 too)
            shift = 32 // g
            for sg in range(nseg):
                src = seg_src[sg]
                d = dst0 + seg_lane[sg]
                cs = pan * nr + seg_lane[sg]
                for t in range(seg_len[sg]):
                    o = src + t * sw
                    v = np.uint32(0)
                    tot = np.int32(0)
                    for j in range(k - s * g):
                        b = xp[o + koff[s * g + j]]
                        v |= np.uint32(b) << np.uint32(shift * j)
                        tot += np.int32(b)
                    packed[d + t] = np.int32(v)
                    if need_sum:
                        colsum[cs + t] += tot
        for ln in range(valid, nr):
            packed[dst0 + ln] = 0


# AVX-512BW moves exactly the bytes of a mask; elsewhere LLVM expands a byte-masked move into a branch per byte, and
# _pad_phases2 takes whole vectors where they fit (split2_xor_whole)
_MASKED_BYTES = host_has("avx512bw")


@njit(cache=True, inline="always")
def _fill(a, lo, hi, value):
    """a[lo:hi] = value, as a loop LLVM turns into a memset (numba's slice assignment costs ~50 ns)."""
    run = a[lo:hi]
    for i in range(hi - lo):
        run[i] = value


@njit(cache=True, nogil=True)
def _pad_rows(x, s0, flip, xp, o0, h, w, wp, right, zau):
    """_pad_input's element-by-element path for a plane whose vector runs would leave x or xp: h rows of w
    bytes from x[s0:] to xp[o0:] at pitch wp, each followed by zau up to the next row (the last by its right
    pad only). A function apart: inlined, its loop made the vector path's rows 2x slower."""
    for y in range(h):
        o = o0 + y * wp
        for i in range(w):
            xp[o + i] = x[s0 + y * w + i] ^ flip
        for i in range(w, wp if y + 1 < h else w + right):
            xp[o + i] = zau

@njit(cache=True, nogil=True)
def _pad_input(x, flip, zau, xp, planes, d, h, w, dp, hp, wp, p0, p1, p2):
    """x (planes x d x h x w, uint8 bits, ^ flip) into xp (planes x dp x hp x wp) at offset (p0, p1, p2),
    everything else, the slack past the planes included, set to zau (_pad_planes of them all)."""
    _pad_planes(x, flip, zau, xp, 0, planes, planes, d, h, w, dp, hp, wp, p0, p1, p2)


@njit(cache=True, nogil=True)
def _pad_planes(x, flip, zau, xp, lo, hi, planes, d, h, w, dp, hp, wp, p0, p1, p2):
    """Planes lo...hi-1 of _pad_input (the convolution's tasks pad the input in parts: _drivers.CONV_TEMPLATE);
    the part that ends at the last plane also sets the slack past it.

    xp is written in address order, each input row as whole 32-byte vectors that may run past the row:
    the bytes they spill into (the row's right pad, the next rows) are written again after them. An
    element loop cost ~6 ns per short row (3x3 256/2 @28: 7,168 rows of 28 bytes, 46 us; now 25 us)."""
    n_x = x.size
    n_xp = xp.size
    n_rows = planes * dp * hp * wp
    if dp == d and hp == h and wp == w:  # no padding: one run
        plane = dp * hp * wp
        dst = xp[lo * plane:hi * plane]
        src = x[lo * plane:hi * plane]
        for i in range(dst.size):
            dst[i] = src[i] ^ flip
        if hi == planes:
            _fill(xp, n_rows, n_xp, zau)
        return
    w_r = (w + 31) // 32 * 32
    right = wp - p2 - w
    for pl in range(lo, hi):
        for z in range(dp):
            zi = z - p0
            row0 = (pl * dp + z) * hp * wp
            if zi < 0 or zi >= d:
                _fill(xp, row0, row0 + hp * wp, zau)
                continue
            _fill(xp, row0, row0 + p1 * wp + p2, zau)
            s0 = (pl * d + zi) * h * w
            o0 = row0 + p1 * wp + p2
            # whole vectors when the last row's do not run past x or xp (else element by element)
            vec = s0 + (h - 1) * w + w_r <= n_x and o0 + (h - 1) * wp + w_r <= n_xp
            if not vec:
                _pad_rows(x, s0, flip, xp, o0, h, w, wp, right, zau)
            else:
                for y in range(h):
                    o = o0 + y * wp
                    s = s0 + y * w
                    for c in range(0, w_r, 32):
                        copy32_xor(xp, o + c, x, s + c, flip)
                    # the right pad, then the next row's left pad (or the bottom pad's start): two byte stores
                    # for the usual pads of 1 (a loop of a varying count costs ~1 ns more a row)
                    gap = right + (p2 if y + 1 < h else 0)
                    if gap == 2:
                        xp[o + w] = zau
                        xp[o + w + 1] = zau
                    else:
                        for i in range(gap):
                            xp[o + w + i] = zau
            _fill(xp, row0 + (p1 + h) * wp, row0 + hp * wp, zau)
    if hi == planes:
        _fill(xp, n_rows, n_xp, zau)


@njit(cache=True, inline="always")
def _pad_part(x, xp, pad, t):
    """Part t of the convolution regions' padding (_drivers.CONV_TEMPLATE, _amx.conv_tiles): pad holds (flip,
    zau, planes, d, h, w, dp, hp, wp, p0, p1, p2, parts, phases); its planes split into pad[12] parts, padded
    (_pad_planes) or, pad[13] 1, split into their stride-2 phases (_pad_phases2_planes, h w hq wq pt pl in pad[4],
    pad[5], pad[7], pad[8], pad[10], pad[11])."""
    lo = t * pad[2] // pad[12]
    hi = (t + 1) * pad[2] // pad[12]
    if pad[13]:
        _pad_phases2_planes(x, np.uint8(pad[0]), np.uint8(pad[1]), xp, lo, hi, pad[2], pad[4], pad[5], pad[7],
                            pad[8], pad[10], pad[11])
    else:
        _pad_planes(x, np.uint8(pad[0]), np.uint8(pad[1]), xp, lo, hi, pad[2], pad[3], pad[4], pad[5], pad[6],
                    pad[7], pad[8], pad[9], pad[10], pad[11])


@njit(cache=True, inline="always")
def _pad_in_parts(x, xp, pad, claim):
    """The convolution regions' padding, shared by their workers: each takes the next part (claim[1]) until
    none is left, counts it done (claim[2]), then waits until every part is (pad[12] parts, none where the
    caller passes xp ready; see _pad_part)."""
    n_pad = pad[12]
    while True:
        t = fetch_add(claim, 1, 1)
        if t >= n_pad:
            break
        _pad_part(x, xp, pad, t)
        fetch_add(claim, 2, 1)
    while load_acquire(claim, 2) < n_pad:
        pass


@njit(cache=True, nogil=True)
def _pad_phases2(x, flip, zau, xp, planes, h, w, hq, wq, pt, pl):
    """The four stride-2 phases of the zero-point-padded input, for convolutions with strides (2, 2): for each
    plane of x (planes x h x w, uint8 bits, ^ flip) and each phase p = 2 * rh + rw, the hq x wq plane
    xp[((plane * 4 + p) * hq + i) * wq + j] = padded[2i + rh, 2j + rw], where padded is x with pt rows and
    pl columns of zau before it and zau past its end; the slack past the planes is set to zau. A tap of the
    strided convolution then reads one phase at stride 1, so it packs like a stride-1 convolution (virtual
    columns of pitch wq). Each input row is split by column parity with masked vector moves (split2_xor)."""
    _pad_phases2_planes(x, flip, zau, xp, 0, planes, planes, h, w, hq, wq, pt, pl)


@njit(cache=True, nogil=True)
def _pad_phases2_planes(x, flip, zau, xp, lo, hi, planes, h, w, hq, wq, pt, pl):
    """Planes lo...hi-1 of _pad_phases2 (the convolution's tasks split the input in parts:
    _drivers.CONV_TEMPLATE); the part that ends at the last plane also sets the slack past it. No write
    leaves a part's phase planes."""
    # every byte zau first (one memset: the pads cut each phase row into short runs, ~5 ns a run to fill),
    # then x's rows split into place
    _fill(xp, lo * 4 * hq * wq, hi * 4 * hq * wq, zau)
    if hi == planes:
        _fill(xp, planes * 4 * hq * wq, xp.size, zau)
    n_x = x.size
    for pln in range(lo, hi):
        for rh in range(2):
            # x's even columns land in column phase pl % 2 from column pl // 2 on, its odd ones in the other
            pe = (pln * 4 + 2 * rh + pl % 2) * hq * wq + pl // 2
            po = (pln * 4 + 2 * rh + (pl + 1) % 2) * hq * wq + (pl + 1) // 2
            # the phase planes' ends: a whole-vector run may spill past its row, never past its plane
            end_e = (pln * 4 + 2 * rh + pl % 2 + 1) * hq * wq
            end_o = (pln * 4 + 2 * rh + (pl + 1) % 2 + 1) * hq * wq
            # phase rows i whose padded row 2i + rh lies in x, in increasing order: what a row's runs spill
            # into the rows after it is set back to zau at once, and the data of those rows comes later
            for i in range((pt - rh + 1) // 2, min(hq, (pt + h - rh + 1) // 2)):
                src = (pln * h + 2 * i + rh - pt) * w
                de, do = pe + i * wq, po + i * wq
                spill_e = de
                spill_o = do
                for c in range(0, w, 64):
                    if (not _MASKED_BYTES and src + c + 64 <= n_x and de + c // 2 + 32 <= end_e
                            and do + c // 2 + 32 <= end_o):
                        split2_xor_whole(x, src + c, flip, xp, de + c // 2, do + c // 2)
                        spill_e = de + c // 2 + 32
                        spill_o = do + c // 2 + 32
                    else:
                        split2_xor(x, src + c, min(64, w - c), flip, xp, de + c // 2, do + c // 2)
                _fill(xp, de + (w + 1) // 2, spill_e, zau)
                _fill(xp, do + w // 2, spill_o, zau)


@njit(cache=True)
def _interleave_plane(xq, x, t, geo, scratch):
    """Task t of the direct path's input: its units t * geo[18] ... (channel groups; geo[19] in all, several to a
    task where their planes are small: im2col._FILL_TASK_GROUPS), each by _interleave_phase_group at strides
    (2, 2) (geo[16] set), else _interleave_plane_s1."""
    for u in range(t * geo[18], min((t + 1) * geo[18], geo[19])):
        if geo[16]:
            _interleave_phase_group(xq, x, u, geo, scratch)
        else:
            _interleave_plane_s1(xq, x, u, geo)
    if (t + 1) * geo[18] >= geo[19]:  # the last task zeroes xq's slack: the last panels' K steps read into it
        for i in range(geo[19] * (4 if geo[16] else 1) * geo[12], xq.size):
            xq[i] = 0


@njit(cache=True)
def _interleave_phase_group(xq, x, t, geo, scratch):
    """Channel group t of the direct path's input at strides (2, 2): for convolution group q and channel group j
    (t = q * cgp // g + j), x's channels q*cg + j*g ... + g-1 padded and split into their four stride-2 phases
    (_pad_phases2, into the worker's ``scratch``), then each phase plane p interleaved as in
    _interleave_plane_s1 at xq[(t * 4 + p) * pitch:], one contiguous run of hq * wq positions per channel in
    whole 32-lane vectors (the last one's reads land in the scratch's slack, its writes in the pitch's room).

    geo: (cg, g, cgp, 1, h, w, 1, hq, wq, 0, pt, pl, pitch, flip, zau, planes, 1, scratch bytes)."""
    use_512_bit_vectors()
    cg, g, cgp, h, w = geo[0], geo[1], geo[2], geo[4], geo[5]
    hq, wq, pt, pl, pitch = geo[7], geo[8], geo[10], geo[11], geo[12]
    per_q = cgp // g
    n = hq * wq
    q = t // per_q
    j = t - q * per_q
    c0 = q * cg + j * g
    valid = min(g, cg - j * g)  # the group's channels in x; the others repeat its last (their weights are 0)
    hw = h * w
    _pad_phases2(x[c0 * hw:(c0 + valid) * hw], np.uint8(geo[13]), np.uint8(geo[14]), scratch, valid, h, w, hq,
                 wq, pt, pl)
    for ph in range(4):
        a0 = ph * n
        a1 = (min(1, valid - 1) * 4 + ph) * n
        a2 = (min(2, valid - 1) * 4 + ph) * n
        a3 = (min(3, valid - 1) * 4 + ph) * n
        o = (t * 4 + ph) * pitch
        for c in range(0, n, 32):
            if g == 4:
                pack_quad32(xq, o + c, scratch, a0 + c, a1 + c, a2 + c, a3 + c)
            else:
                pack_pair32(xq, o + c, scratch, a0 + c, a1 + c)


@njit(cache=True)
def _interleave_plane_s1(xq, x, t, geo):
    """Plane t of the direct path's input (see _drivers.DIRECT_TEMPLATE): for convolution group q and channel
    group j (t = q * cgp // g + j), x's channels q*cg + j*g ... + g-1 padded and interleaved, one int32 group
    of g bytes (4) or int16 halves (2) per padded position, at xq[t * pitch:]. Channels past the group's cg
    repeat its last one (their weights are 0); padding holds the zero point; int8 bits are flipped to uint8.

    geo: (cg, g, cgp, d, h, w, dp, hp, wp, p0, p1, p2, pitch, flip, zau, planes, 0) of x (planes = N * C). An
    input row is read as whole 32-lane runs that may spill up to 31 groups past the row: the pads are
    written after them, the next row after that, and pitch leaves 32 groups past the plane (another
    thread's plane is never touched)."""
    use_512_bit_vectors()
    cg, g, cgp, d, h, w = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    dp, hp, wp, p0, p1, p2, pitch = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12]
    flip, zau = geo[13], geo[14]
    xsize = x.size
    per_q = cgp // g
    q = t // per_q
    j = t - q * per_q
    last = q * cg + cg - 1
    dhw = d * h * w
    a0 = min(q * cg + j * g, last) * dhw
    a1 = min(q * cg + j * g + 1, last) * dhw
    a2 = min(q * cg + j * g + 2, last) * dhw
    a3 = min(q * cg + j * g + 3, last) * dhw
    top = max(a0, a1, a2, a3) if g == 4 else max(a0, a1)
    if g == 4:
        zword = np.int32(np.uint32(zau) * np.uint32(0x01010101))
        fword = np.int32(np.uint32(flip) * np.uint32(0x01010101))
    else:
        zword = np.int32(np.uint32(zau) | (np.uint32(zau) << np.uint32(16)))
        fword = np.int32(np.uint32(flip) | (np.uint32(flip) << np.uint32(16)))
    base = t * pitch
    for zz in range(dp):
        zi = zz - p0
        for yy in range(hp):
            yi = yy - p1
            row = base + (zz * hp + yy) * wp
            if zi < 0 or zi >= d or yi < 0 or yi >= h:
                for i in range(row, row + wp):
                    xq[i] = zword
                continue
            src = zi * h * w + yi * w
            o = row + p2
            for c in range(0, w, 32):
                if top + src + c + 32 <= xsize:
                    if g == 4:
                        pack_quad32(xq, o + c, x, a0 + src + c, a1 + src + c, a2 + src + c, a3 + src + c)
                    else:
                        pack_pair32(xq, o + c, x, a0 + src + c, a1 + src + c)
                elif g == 4:
                    _quad_run(xq, o + c, x, a0 + src + c, a1 + src + c, a2 + src + c, a3 + src + c, 1,
                              min(32, w - c))
                else:
                    _pair_run(xq, o + c, x, a0 + src + c, a1 + src + c, 1, min(32, w - c))
            if flip:
                for i in range(o, o + w):
                    xq[i] ^= fword
            for i in range(row, o):
                xq[i] = zword
            for i in range(o + w, row + wp):
                xq[i] = zword
