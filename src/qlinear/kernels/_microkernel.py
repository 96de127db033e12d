"""Register-tile microkernels for the exact integer GEMM, emitted as LLVM IR through numba intrinsics.

A microkernel computes one MR x NR tile ``C = P_panel @ Q_panel`` of int32 sums, where both operands are
packed in 32-bit *groups* along K (see :mod:`qlinear.kernels.integer_gemm` for the layouts):

- ``P`` ("broadcast side"): ``[K steps][MR]`` int32 groups; each group is broadcast to a whole vector.
- ``Q`` ("vector side"): ``[K steps][NR]`` int32 groups, loaded as ``NV`` vectors of ``L`` lanes.

Each 32-bit group holds either four 8-bit values (ops ``dpbusd*``: ``vpdpbusd`` multiplies unsigned bytes
by signed bytes, sums the four 16-bit products and adds them to the int32 lane with wrap-around, never
saturating, so it is exact for any u8 x s8 data) or two int16 values (ops ``pmaddwd*``: ``vpmaddwd`` forms
two exact int32 products and adds them; with 8-bit data widened to int16 the pair sum cannot overflow).
``maddubs256`` takes the four bytes of ``dpbusd`` on AVX2 without VNNI: ``vpmaddubsw`` adds the products of
byte pairs into int16 with saturation, then ``vpmaddwd`` by ones adds the two pairs into int32. It is exact
only where no pair sum leaves int16: the caller uses it for signed bytes whose pairs have |a| + |b| <= 128
(255 * 128 = 32640), which `integer_gemm.PackedWeights.fits_byte_pairs` checks on the packed weights.

The LLVM auto-vectoriser does not find these instructions by itself (see shared/notes/int8-gemm-study.md),
hence the explicit intrinsics. Accumulators live in allocas that LLVM promotes to registers.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from qlinear.kernels._vector_width import host_has as _host_has

# op -> (lanes of int32 per vector, LLVM intrinsic, kind)
OPS = {
    "dpbusd512": (16, "llvm.x86.avx512.vpdpbusd.512", "dpbusd"),
    "dpbusd256": (8, "llvm.x86.avx512.vpdpbusd.256", "dpbusd"),
    "pmaddwd512": (16, "llvm.x86.avx512.pmaddw.d.512", "pmaddwd"),
    "pmaddwd256": (8, "llvm.x86.avx2.pmadd.wd", "pmaddwd"),
    "maddubs256": (8, "llvm.x86.avx2.pmadd.ub.sw", "maddubs"),
}


def make_microkernel(op: str, mr: int, nv: int, bcast_unsigned: bool, q_pitch: int | None = None,
                     p_pitch: int | None = None, q_table: bool = False):
    """Return a numba intrinsic ``mk(P, p_off, Q, q_off, ksteps, C, c_off, ldc)``.

    P, Q, C are 1-D int32 arrays; the tile is written to ``C[c_off + r*ldc + n]`` for r < mr, n < nv*L.
    ``bcast_unsigned`` (dpbusd only) says which operand holds the unsigned bytes. ``q_pitch``: Q's int32 groups
    per K step (default nv*L; wider for a kernel that computes only the first columns of a panel). ``p_pitch``:
    P's int32 groups per K step (default mr; wider for a kernel that computes only the first rows of a panel).
    ``q_table``: ``mk(P, p_off, Q, q_off, qtab, ksteps, C, c_off, ldc)`` reads K step s's vectors at
    ``Q[q_off + qtab[s]:]`` (int64 offsets) instead of ``Q[q_off + s * q_pitch:]``: the convolution's direct
    path, whose Q is the channel-interleaved input itself, so that no im2col panel is packed.
    """
    lanes, llvm_name, kind = OPS[op]
    nr = nv * lanes
    q_step = q_pitch or nr
    p_step = p_pitch or mr
    i32 = ir.IntType(32)
    i64 = ir.IntType(64)
    vec = ir.VectorType(i32, lanes)
    vec16 = ir.VectorType(ir.IntType(16), 2 * lanes)

    def codegen(context, builder, signature, args):
        if q_table:
            p_arr, p_off_v, q_arr, q_off_v, t_arr, ks_v, c_arr, c_off_v, ldc_v = args
            sa = signature.args[:4] + signature.args[5:]
            t_ptr = context.make_array(signature.args[4])(context, builder, t_arr).data
        else:
            p_arr, p_off_v, q_arr, q_off_v, ks_v, c_arr, c_off_v, ldc_v = args
            sa = signature.args
        p_ptr = context.make_array(sa[0])(context, builder, p_arr).data
        q_ptr = context.make_array(sa[2])(context, builder, q_arr).data
        c_ptr = context.make_array(sa[5])(context, builder, c_arr).data
        p_off_v = context.cast(builder, p_off_v, sa[1], types.int64)
        q_off_v = context.cast(builder, q_off_v, sa[3], types.int64)
        ks_v = context.cast(builder, ks_v, sa[4], types.int64)
        c_off_v = context.cast(builder, c_off_v, sa[6], types.int64)
        ldc_v = context.cast(builder, ldc_v, sa[7], types.int64)

        module = builder.module
        vec8 = ir.VectorType(ir.IntType(8), 4 * lanes)
        if kind == "dpbusd":
            fnty = ir.FunctionType(vec, [vec, vec, vec])
        elif kind == "maddubs":
            fnty = ir.FunctionType(vec16, [vec8, vec8])
        else:
            fnty = ir.FunctionType(vec, [vec16, vec16])
        fn = cgutils.get_or_insert_function(module, fnty, llvm_name)
        if kind == "maddubs":
            widen = cgutils.get_or_insert_function(module, ir.FunctionType(vec, [vec16, vec16]),
                                                   "llvm.x86.avx2.pmadd.wd")
            ones = ir.Constant(vec16, [1] * (2 * lanes))

        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for _ in range(nv)]
                for _ in range(mr)]
        for row in accs:
            for a in row:
                builder.store(ir.Constant(vec, [0] * lanes), a)

        with cgutils.for_range(builder, ks_v) as loop:
            s = loop.index
            if q_table:
                q_base = builder.add(q_off_v, builder.load(builder.gep(t_ptr, [s]), align=8))
            else:
                q_base = builder.add(q_off_v, builder.mul(s, ir.Constant(i64, q_step)))
            p_base = builder.add(p_off_v, builder.mul(s, ir.Constant(i64, p_step)))
            qv = []
            for v in range(nv):
                ptr = builder.gep(q_ptr, [builder.add(q_base, ir.Constant(i64, v * lanes))])
                ptr = builder.bitcast(ptr, vec.as_pointer())
                qv.append(builder.load(ptr, align=4))
            for r in range(mr):
                ptr = builder.gep(p_ptr, [builder.add(p_base, ir.Constant(i64, r))])
                scalar = builder.load(ptr, align=4)
                bc = splat(builder, scalar, vec)
                for v in range(nv):
                    acc = builder.load(accs[r][v])
                    if kind == "dpbusd":
                        if bcast_unsigned:
                            new = builder.call(fn, [acc, bc, qv[v]])
                        else:
                            new = builder.call(fn, [acc, qv[v], bc])
                    elif kind == "maddubs":  # unsigned bytes first
                        u, sgn = (bc, qv[v]) if bcast_unsigned else (qv[v], bc)
                        pairs = builder.call(fn, [builder.bitcast(u, vec8), builder.bitcast(sgn, vec8)])
                        new = builder.add(acc, builder.call(widen, [pairs, ones]))
                    else:
                        prod = builder.call(fn, [builder.bitcast(bc, vec16), builder.bitcast(qv[v], vec16)])
                        new = builder.add(acc, prod)
                    builder.store(new, accs[r][v])

        for r in range(mr):
            row_base = builder.add(c_off_v, builder.mul(ldc_v, ir.Constant(i64, r)))
            for v in range(nv):
                ptr = builder.gep(c_ptr, [builder.add(row_base, ir.Constant(i64, v * lanes))])
                ptr = builder.bitcast(ptr, vec.as_pointer())
                builder.store(builder.load(accs[r][v]), ptr, align=4)
        return context.get_dummy_value()

    if q_table:
        @intrinsic
        def microkernel_table(typingctx, P, p_off, Q, q_off, qtab, ksteps, C, c_off, ldc):
            return types.void(P, p_off, Q, q_off, qtab, ksteps, C, c_off, ldc), codegen

        return microkernel_table

    @intrinsic
    def microkernel(typingctx, P, p_off, Q, q_off, ksteps, C, c_off, ldc):
        return types.void(P, p_off, Q, q_off, ksteps, C, c_off, ldc), codegen

    return microkernel


def _pack_codegen(rows: int, step: int, width: int):
    """The codegen of ``packed[d + t] = OR over j < rows of xp[a_j + step * t] << (32 / rows) * j`` for t < width:
    ``rows`` byte runs zero-extended into each int32 lane (4: byte quads, 2: int16 pairs)."""
    shift = 32 // rows

    def codegen(context, builder, signature, args):
        sa = signature.args
        p_ptr = context.make_array(sa[0])(context, builder, args[0]).data
        x_ptr = context.make_array(sa[2])(context, builder, args[2]).data
        loaded = ir.VectorType(ir.IntType(8), width * step)
        ints32 = ir.VectorType(ir.IntType(32), width)
        every = ir.Constant(ir.VectorType(ir.IntType(32), width), [step * t for t in range(width)])
        group = None
        for j in range(rows):
            offset = context.cast(builder, args[3 + j], sa[3 + j], types.int64)
            ptr = builder.bitcast(builder.gep(x_ptr, [offset]), loaded.as_pointer())
            row = builder.load(ptr, align=1)
            if step != 1:  # bytes 0, step, 2*step, ...
                row = builder.shuffle_vector(row, ir.Constant(loaded, None), every)
            lane = builder.zext(row, ints32)
            if j:
                group = builder.or_(group, builder.shl(lane, ir.Constant(ints32, [shift * j] * width)))
            else:
                group = lane
        d = context.cast(builder, args[1], sa[1], types.int64)
        builder.store(group, builder.bitcast(builder.gep(p_ptr, [d]), ints32.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _make_pack_quad(step: int, width: int = 32):
    @intrinsic
    def pack(typingctx, packed, d, xp, a0, a1, a2, a3):
        return types.void(packed, d, xp, a0, a1, a2, a3), _pack_codegen(4, step, width)

    return pack


def _make_pack_pair(step: int, width: int):
    @intrinsic
    def pack(typingctx, packed, d, xp, a0, a1):
        return types.void(packed, d, xp, a0, a1), _pack_codegen(2, step, width)

    return pack


# ``packed[d:d+W] = xp[a0+s*t] | xp[a1+s*t] << 8 | xp[a2+s*t] << 16 | xp[a3+s*t] << 24`` for t < W (s = 1, 2), as
# vector code. The im2col packers write one such W-lane group per K step and panel (W = NR: 32 on the AVX-512
# paths, 16 on the AVX2 ones); as a numba loop each group paid the vectoriser's set-up (trip-count and alias
# checks, a remainder loop) for two vectors of work (measured: packing a 3x3 64-channel 56x56 input 271 -> 118 us
# at W = 32; at W = 16, 1x1 256 channels @56, 390 -> 100 us). Module-level objects, so that numba's disk cache of
# the packers that call them hits (see _drivers.py).
pack_quad32 = _make_pack_quad(1)
pack_quad32_stride2 = _make_pack_quad(2)
pack_quad16 = _make_pack_quad(1, 16)
# the same for the int16-pair paths (``pmaddwd``): ``packed[d+t] = xp[a0+s*t] | xp[a1+s*t] << 16``
pack_pair16 = _make_pack_pair(1, 16)
pack_pair32 = _make_pack_pair(1, 32)
pack_pair32_stride2 = _make_pack_pair(2, 32)


def splat(builder, value, vty):
    """``value`` in every lane of a vector of type ``vty`` (insert into lane 0, shuffle with an all-zero mask:
    LLVM selects a broadcast)."""
    one = builder.insert_element(ir.Constant(vty, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vty, None),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count))


def _trap(builder):
    """The body of an intrinsic whose instructions this CPU lacks, in a branch its caller never takes here:
    LLVM must not be asked to select them."""
    builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.trap"), [])


def _make_dot3(op: str):
    lanes, llvm_name, _kind = OPS[op]
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(i32, lanes)

    @intrinsic
    def dot3(typingctx, xq, q0, q1, q2, wq, cp, c0, acc, a_off, cs, nc):
        sig = types.void(xq, q0, q1, q2, wq, cp, c0, acc, a_off, cs, nc)

        def codegen(context, builder, signature, args):
            sa = signature.args
            x_ptr = context.make_array(sa[0])(context, builder, args[0]).data
            w_ptr = context.make_array(sa[4])(context, builder, args[4]).data
            c_ptr = context.make_array(sa[6])(context, builder, args[6]).data
            a_ptr = context.make_array(sa[7])(context, builder, args[7]).data
            qs = [context.cast(builder, args[k], sa[k], types.int64) for k in (1, 2, 3)]
            cp_v = context.cast(builder, args[5], sa[5], types.int64)
            a_off_v = context.cast(builder, args[8], sa[8], types.int64)
            cs_v = context.cast(builder, args[9], sa[9], types.int64)
            nc_v = context.cast(builder, args[10], sa[10], types.int64)
            if lanes == 16 and not _host_has("avx512vnni"):  # the caller's zmm branch, never taken on this CPU
                _trap(builder)
                return context.get_dummy_value()
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec, vec, vec]), llvm_name)

            def load(ptr, at):
                return builder.load(builder.bitcast(builder.gep(ptr, [at]), vec.as_pointer()), align=1)

            n_vec = builder.udiv(nc_v, ir.Constant(i64, lanes))
            with cgutils.for_range(builder, n_vec) as loop:
                c = builder.add(cs_v, builder.mul(loop.index, ir.Constant(i64, lanes)))
                s = load(c_ptr, c)
                for row in range(3):
                    xv = load(x_ptr, builder.add(qs[row], builder.mul(c, ir.Constant(i64, 4))))
                    wv = load(w_ptr, builder.add(c, builder.mul(cp_v, ir.Constant(i64, row))))
                    s = builder.call(fn, [s, xv, wv])
                builder.store(s, builder.bitcast(builder.gep(a_ptr, [builder.add(a_off_v, c)]), vec.as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dot3


# ``acc[a_off + c] = c0[c] + sum_r dot4(xq[q_r + 4c : q_r + 4c + 4], wq[r * cp + c])`` for cs <= c < cs + nc (nc
# a multiple of the lane count), r < 3: one row of a 3x3 depthwise kernel per vpdpbusd, xq holding each
# channel's 4 consecutive (dilated) input columns as unsigned bytes and wq the row's 3 signed weights and a 0.
depthwise_dot3_512 = _make_dot3("dpbusd512")
depthwise_dot3_256 = _make_dot3("dpbusd256")


def _make_taps9_pairs():
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    b32, w16, d8 = ir.VectorType(i8, 32), ir.VectorType(i16, 16), ir.VectorType(i32, 8)

    def mask(idx):
        return ir.Constant(ir.VectorType(i32, len(idx)), idx)

    # vpunpck{l,h}{bw,wd} within each 128-bit half, and the 128-bit halves of two vectors put back together
    lo8 = mask([h * 16 + k + 32 * s for h in (0, 1) for k in range(8) for s in (0, 1)])
    hi8 = mask([h * 16 + 8 + k + 32 * s for h in (0, 1) for k in range(8) for s in (0, 1)])
    lo16 = mask([h * 8 + k + 16 * s for h in (0, 1) for k in range(4) for s in (0, 1)])
    hi16 = mask([h * 8 + 4 + k + 16 * s for h in (0, 1) for k in range(4) for s in (0, 1)])
    low_halves = mask([0, 1, 2, 3, 8, 9, 10, 11])
    high_halves = mask([4, 5, 6, 7, 12, 13, 14, 15])

    @intrinsic
    def taps9(typingctx, xt, o0, o1, o2, dwc, wq, c0, acc, a_off, cp):
        sig = types.void(xt, o0, o1, o2, dwc, wq, c0, acc, a_off, cp)

        def codegen(context, builder, signature, args):
            sa = signature.args

            def arg(k):
                return context.cast(builder, args[k], sa[k], types.int64)

            def data(k):
                return context.make_array(sa[k])(context, builder, args[k]).data

            if not _host_has("avx2"):  # never called there
                _trap(builder)
                return context.get_dummy_value()
            x_ptr, w_ptr, c_ptr, a_ptr = data(0), data(5), data(6), data(7)
            rows, dwc, a_off, cp = [arg(1), arg(2), arg(3)], arg(4), arg(8), arg(9)
            maddubs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(w16, [b32, b32]),
                                                     "llvm.x86.avx2.pmadd.ub.sw")
            maddwd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(d8, [w16, w16]),
                                                    "llvm.x86.avx2.pmadd.wd")
            ones = ir.Constant(w16, [1] * 16)
            zero8 = ir.Constant(b32, [0] * 32)
            zero16 = ir.Constant(w16, [0] * 16)

            def load(ptr, at, ty):
                return builder.load(builder.bitcast(builder.gep(ptr, [at]), ty.as_pointer()), align=1)

            def spread(a, b, c, d):
                """The 4 vectors of byte quads (a, b, c, d)[ch] of channels 0-3|16-19, 4-7|20-23, 8-11|24-27,
                12-15|28-31 (vpunpck's order)."""
                ab = [builder.shuffle_vector(a, b, m) for m in (lo8, hi8)]
                cd = [builder.shuffle_vector(c, d, m) for m in (lo8, hi8)]
                out = []
                for h in (0, 1):
                    ab16, cd16 = builder.bitcast(ab[h], w16), builder.bitcast(cd[h], w16)
                    out += [builder.shuffle_vector(ab16, cd16, m) for m in (lo16, hi16)]
                return out

            n_blocks = builder.udiv(cp, ir.Constant(i64, 32))
            with cgutils.for_range(builder, n_blocks) as loop:
                c = builder.mul(loop.index, ir.Constant(i64, 32))
                w_base = builder.mul(loop.index, ir.Constant(i64, 96))  # 12 vectors of 8 int32 per block
                taps = [load(x_ptr, builder.add(builder.add(rows[r], builder.mul(dwc, ir.Constant(i64, j))), c), b32)
                        for r in range(3) for j in range(3)]
                sums = [None] * 4
                for q in range(2):  # taps 0-3 and 4-7: vpmaddubsw pairs, vpmaddwd by ones
                    quads = spread(*taps[4 * q:4 * q + 4])
                    for v in range(4):
                        wv = load(w_ptr, builder.add(w_base, ir.Constant(i64, (4 * q + v) * 8)), b32)
                        pair = builder.call(maddubs, [builder.bitcast(quads[v], b32), wv])
                        prod = builder.call(maddwd, [pair, ones])
                        sums[v] = prod if q == 0 else builder.add(sums[v], prod)
                # tap 8 alone: zero-extended to int16 pairs (x, 0), vpmaddwd by (w, 0)
                single = [builder.shuffle_vector(taps[8], zero8, m) for m in (lo8, hi8)]
                for h in (0, 1):
                    s16 = builder.bitcast(single[h], w16)
                    for k, m in enumerate((lo16, hi16)):
                        v = 2 * h + k
                        xv = builder.shuffle_vector(s16, zero16, m)
                        wv = load(w_ptr, builder.add(w_base, ir.Constant(i64, (8 + v) * 8)), w16)
                        sums[v] = builder.add(sums[v], builder.call(maddwd, [xv, wv]))
                # channels back in order: 0-7, 8-15, 16-23, 24-31
                for k, (u, v, m) in enumerate(((0, 1, low_halves), (2, 3, low_halves), (0, 1, high_halves),
                                               (2, 3, high_halves))):
                    at = builder.add(c, ir.Constant(i64, 8 * k))
                    total = builder.add(builder.shuffle_vector(sums[u], sums[v], m), load(c_ptr, at, d8))
                    builder.store(total, builder.bitcast(builder.gep(a_ptr, [builder.add(a_off, at)]),
                                                         d8.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return taps9


# ``acc[a_off + c] = c0[c] + sum over the 9 taps t = 3r + j of xt[o_r + j * dwc + c] * w[t, c]`` for c < cp (a
# multiple of 32): one output pixel of a 3x3 depthwise kernel on a channels-last plane, on AVX2 without VNNI. Each
# 32 channels' taps 0-3 and 4-7 become byte quads (vpunpck) summed by vpmaddubsw and vpmaddwd by ones, exact
# where the pairs of taps (0, 1), (2, 3), (4, 5), (6, 7) have |w_a| + |w_b| <= 128 (255 * 128 fits int16); tap 8
# is widened to int16 and taken by vpmaddwd. wq: per 32 channels, 12 vectors of 8 int32 in the quads' channel
# order (PackedConv.depthwise_pair_taps).
depthwise_taps9_pairs = _make_taps9_pairs()


def _make_perm_dot(kh: int, per_row: int):
    """The vpermb depthwise microkernel of a kernel of ``kh`` rows whose taps take ``per_row`` vpdpbusd groups of 4
    bytes a row (kw <= 4 * per_row): its loops over rows and groups are unrolled, so each shape is its own
    intrinsic (made at import: numba caches the kernels that call module-level intrinsics)."""
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    bytes64 = ir.VectorType(i8, 64)
    vec = ir.VectorType(i32, 16)
    mask64 = ir.VectorType(ir.IntType(1), 64)
    dots = kh * per_row  # vpdpbusd per 16 pixels and channel

    @intrinsic
    def perm_dot(typingctx, src, off, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c_first, n_ch, acc,
                 a_off, a_stride):
        sig = types.void(src, off, plane, wins, n_groups, tab, pads, flip, za, wq, cp, c0s, c_first, n_ch, acc,
                         a_off, a_stride)

        def codegen(context, builder, signature, args):
            sa = signature.args

            def arg(k, ty=types.int64):
                return context.cast(builder, args[k], sa[k], ty)

            def data(k):
                return context.make_array(sa[k])(context, builder, args[k]).data

            def load(ptr, at, ty, align):
                return builder.load(builder.bitcast(builder.gep(ptr, [at]), ty.as_pointer()), align=align)

            if not (_host_has("avx512vbmi") and _host_has("avx512vnni")):  # never called there (im2col._has_vbmi)
                _trap(builder)
                return context.get_dummy_value()
            x_ptr, n_ptr, t_ptr, p_ptr, w_ptr, c_ptr, a_ptr = (data(0), data(3), data(5), data(6), data(9), data(11),
                                                               data(14))
            perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(bytes64, [bytes64] * 3),
                                                  "llvm.x86.avx512.vpermi2var.qi.512")
            dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                                 "llvm.x86.avx512.vpdpbusd.512")
            flip_v = splat(builder, builder.trunc(arg(7, types.int32), i8), bytes64)
            za_v = splat(builder, builder.trunc(arg(8, types.int32), i8), bytes64)
            off_v, plane_v, n_groups_v, cp_v, c_first_v = arg(1), arg(2), arg(4), arg(10), arg(12)
            a_off_v, a_stride_v = arg(15), arg(16)
            with cgutils.for_range(builder, n_groups_v) as group_loop:
                # groups in descending order: a group's lanes past a channel's end land in the next channel's
                # first group, written after them
                g = builder.sub(builder.sub(n_groups_v, ir.Constant(i64, 1)), group_loop.index)
                # the group's tables, loaded once for all the channels
                idx = [load(t_ptr, builder.add(builder.mul(g, ir.Constant(i64, 64 * dots)), ir.Constant(i64, 64 * t)),
                            bytes64, 1) for t in range(dots)]
                pad = [builder.bitcast(load(p_ptr, builder.add(builder.mul(g, ir.Constant(i64, dots)),
                                                              ir.Constant(i64, t)), i64, 8), mask64)
                       for t in range(dots)]
                wins = [builder.add(off_v, load(n_ptr, builder.add(builder.mul(g, ir.Constant(i64, kh)),
                                                                   ir.Constant(i64, r)), i64, 8)) for r in range(kh)]
                dst0 = builder.add(a_off_v, builder.mul(g, ir.Constant(i64, 16)))
                with cgutils.for_range(builder, arg(13)) as loop:
                    j = loop.index
                    c = builder.add(c_first_v, j)
                    base = builder.mul(j, plane_v)
                    s = splat(builder, load(c_ptr, c, i32, 4), vec)
                    for r in range(kh):
                        at = builder.add(base, wins[r])
                        lo = load(x_ptr, at, bytes64, 1)
                        hi = load(x_ptr, builder.add(at, ir.Constant(i64, 64)), bytes64, 1)
                        for d in range(per_row):
                            t = r * per_row + d
                            taps = builder.xor(builder.call(perm, [lo, idx[t], hi]), flip_v)
                            taps = builder.select(pad[t], za_v, taps)
                            w_at = builder.add(c, builder.mul(cp_v, ir.Constant(i64, t)))
                            w = splat(builder, load(w_ptr, w_at, i32, 4), vec)
                            s = builder.call(dot, [s, builder.bitcast(taps, vec), w])
                    dst = builder.add(dst0, builder.mul(j, a_stride_v))
                    builder.store(s, builder.bitcast(builder.gep(a_ptr, [dst]), vec.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return perm_dot


# For channels c = c_first + j, j < n_ch, of a 3x3 depthwise convolution and each group g < n_groups of 16 output
# pixels: ``acc[a_off + j * a_stride + 16 g:][:16] = c0s[c] + sum_r dot4(taps_r, wq[r, c])``, r < 3. taps_r gathers
# (vpermb over two 64-byte vectors: src[off + j * plane + wins[g, r]:][:128], then ^ flip) each pixel's 3 input
# bytes of kernel row r and a 4th (weight 0) as one 32-bit group, by the 64 index bytes tab[192 g + 64 r:]; the bits
# of pads[3 g + r] mark the taps in the padding, which take za. wq[r, c]: the row's 3 signed weights and a 0 (cp =
# wq's row pitch). See im2col._dw_perm_tables.
# Needs AVX-512 VBMI and VNNI (Ice Lake and later, AMD Zen 4; Cascade Lake has VNNI but no VBMI).
depthwise_perm_dot3 = _make_perm_dot(3, 1)
# The same for a 5x5 kernel: each kernel row's taps 0-3 and tap 4 (beside 3 taps of weight 0) as two groups, so t
# = 2r + d indexes tab[dots * 64 g + 64 t:], pads[dots * g + t] and wq[t, c], dots = 10.
depthwise_perm_dot5 = _make_perm_dot(5, 2)
