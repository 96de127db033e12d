"""Byte moves as vector code, emitted as LLVM IR through numba intrinsics: 16-row transposes, 4-way
interleaves, and short copies.

``transpose16(src, src_off, src_stride, dst, dst_off, dst_stride, ncols, flip)`` reads 16 rows of 16 bytes,
``src[src_off + j*src_stride + c]`` (j, c < 16), and writes column c as 16 contiguous bytes,
``dst[dst_off + c*dst_stride + j] = src[...] ^ flip`` for every c < ncols. ``transpose32`` does the same
for rows of 32 bytes (columns c < 32). Every row is read in full, whatever ncols is: the caller makes sure
the reads stay inside src.

The depthwise kernel uses them to turn planes (NCHW) into channels-last rows and back. Written as numba loops
these were scalar byte moves; here they are four rounds of lane-wise byte interleaves (punpcklbw/punpckhbw on
xmm or ymm), a perfect-shuffle transpose of every 16x16 tile held in a 128-bit lane.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from qlinear.kernels._microkernel import splat


def _interleave_masks(width: int):
    """Shuffle masks of two width-byte vectors a, b: per 128-bit lane, the low (high) 8 bytes of a and b
    interleaved, as punpcklbw (punpckhbw) does."""
    lo, hi = [], []
    for lane in range(width // 16):
        for i in range(8):
            lo += [16 * lane + i, width + 16 * lane + i]
            hi += [16 * lane + 8 + i, width + 16 * lane + 8 + i]
    return lo, hi


def _make_transpose(width: int):
    i8 = ir.IntType(8)
    i32 = ir.IntType(32)
    i64 = ir.IntType(64)
    row_t = ir.VectorType(i8, width)
    col_t = ir.VectorType(i8, 16)
    lo_mask, hi_mask = _interleave_masks(width)
    lo_mask = ir.Constant(ir.VectorType(i32, width), lo_mask)
    hi_mask = ir.Constant(ir.VectorType(i32, width), hi_mask)
    lanes = [ir.Constant(ir.VectorType(i32, 16), list(range(16 * lane, 16 * lane + 16)))
             for lane in range(width // 16)]

    @intrinsic
    def transpose(typingctx, src, src_off, src_stride, dst, dst_off, dst_stride, ncols, flip):
        sig = types.void(src, src_off, src_stride, dst, dst_off, dst_stride, ncols, flip)

        def codegen(context, builder, signature, args):
            sa = signature.args
            s_ptr = context.make_array(sa[0])(context, builder, args[0]).data
            d_ptr = context.make_array(sa[3])(context, builder, args[3]).data
            s_off, s_stride, d_off, d_stride, n = (context.cast(builder, args[k], sa[k], types.int64)
                                                  for k in (1, 2, 4, 5, 6))
            f = context.cast(builder, args[7], sa[7], types.uint8)
            fv = splat(builder, f, row_t)
            rows = []
            for j in range(16):
                at = builder.add(s_off, builder.mul(s_stride, ir.Constant(i64, j)))
                ptr = builder.bitcast(builder.gep(s_ptr, [at]), row_t.as_pointer())
                rows.append(builder.xor(builder.load(ptr, align=1), fv))
            # four rounds of out[2i], out[2i+1] = interleave(in[i], in[i+8]) leave column c of every 16x16
            # tile (one per 128-bit lane) in vector c
            for _ in range(4):
                nxt = []
                for i in range(8):
                    nxt.append(builder.shuffle_vector(rows[i], rows[i + 8], lo_mask))
                    nxt.append(builder.shuffle_vector(rows[i], rows[i + 8], hi_mask))
                rows = nxt
            for lane, pick in enumerate(lanes):
                for k in range(16):
                    c = 16 * lane + k
                    with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, c), n), likely=True):
                        col = rows[k]
                        if width != 16:
                            col = builder.shuffle_vector(col, ir.Constant(row_t, None), pick)
                        at = builder.add(d_off, builder.mul(d_stride, ir.Constant(i64, c)))
                        builder.store(col, builder.bitcast(builder.gep(d_ptr, [at]), col_t.as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return transpose


# module-level objects, so that numba's disk cache of the kernels calling them hits (see _drivers.py)
transpose16 = _make_transpose(16)
transpose32 = _make_transpose(32)


@intrinsic
def zip4x16(typingctx, src, o0, o1, o2, o3, dst, d):
    """``dst[d + 4c + j] = src[o_j + c]`` for c < 16, j < 4: four 16-byte runs interleaved into 16 groups of 4
    bytes (one 64-byte store), as the depthwise kernel's vpdpbusd operands want them."""
    sig = types.void(src, o0, o1, o2, o3, dst, d)

    def codegen(context, builder, signature, args):
        sa = signature.args
        i8, i32 = ir.IntType(8), ir.IntType(32)
        v16, v64 = ir.VectorType(i8, 16), ir.VectorType(i8, 64)
        s_ptr = context.make_array(sa[0])(context, builder, args[0]).data
        d_ptr = context.make_array(sa[5])(context, builder, args[5]).data
        runs = []
        for j in range(4):
            at = context.cast(builder, args[1 + j], sa[1 + j], types.int64)
            runs.append(builder.load(builder.bitcast(builder.gep(s_ptr, [at]), v16.as_pointer()), align=1))
        both = ir.Constant(ir.VectorType(i32, 32), list(range(32)))
        lo = builder.shuffle_vector(runs[0], runs[1], both)
        hi = builder.shuffle_vector(runs[2], runs[3], both)
        mask = ir.Constant(ir.VectorType(i32, 64), [16 * j + c for c in range(16) for j in range(4)])
        out = builder.shuffle_vector(lo, hi, mask)
        at = context.cast(builder, args[6], sa[6], types.int64)
        builder.store(out, builder.bitcast(builder.gep(d_ptr, [at]), v64.as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_items(typingctx, dst, d, src, s, n):
    """``dst[d:d + n] = src[s:s + n]`` (same dtype, no overlap) as one memcpy: numba's element loop for a short
    run costs its vectoriser set-up and a scalar remainder (the GEMM epilogue copies rows of 56 outputs)."""
    if dst.dtype != src.dtype:
        return None
    sig = types.void(dst, d, src, s, n)

    def codegen(context, builder, signature, args):
        sa = signature.args
        size = context.get_abi_sizeof(context.get_data_type(sa[0].dtype))
        d_ptr = context.make_array(sa[0])(context, builder, args[0]).data
        s_ptr = context.make_array(sa[2])(context, builder, args[2]).data
        d_at, s_at, count = (context.cast(builder, args[k], sa[k], types.int64) for k in (1, 3, 4))
        cgutils.raw_memcpy(builder, builder.gep(d_ptr, [d_at]), builder.gep(s_ptr, [s_at]), count, size)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy32_xor(typingctx, dst, d, src, s, flip):
    """``dst[d + i] = src[s + i] ^ flip`` for i < 32 (uint8 arrays): one 32-byte load and store. The caller
    makes sure both runs lie inside their arrays. numba's element loop for it costs ~8 ns (its alias checks
    and loop set-up), the intrinsic ~1 ns."""
    sig = types.void(dst, d, src, s, flip)

    def codegen(context, builder, signature, args):
        sa = signature.args
        v32 = ir.VectorType(ir.IntType(8), 32)
        d_ptr = context.make_array(sa[0])(context, builder, args[0]).data
        s_ptr = context.make_array(sa[2])(context, builder, args[2]).data
        d_at, s_at = (context.cast(builder, args[k], sa[k], types.int64) for k in (1, 3))
        f = context.cast(builder, args[4], sa[4], types.uint8)
        v = builder.load(builder.bitcast(builder.gep(s_ptr, [s_at]), v32.as_pointer()), align=1)
        v = builder.xor(v, splat(builder, f, v32))
        builder.store(v, builder.bitcast(builder.gep(d_ptr, [d_at]), v32.as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def split2_xor(typingctx, src, s, n, flip, dst, d_even, d_odd):
    """The n <= 64 bytes ``src[s:s + n] ^ flip`` split by parity: ``dst[d_even + j] = src[s + 2j] ^ flip`` for
    2j < n and ``dst[d_odd + j] = src[s + 2j + 1] ^ flip`` for 2j + 1 < n (uint8 arrays). Masked loads and stores
    touch exactly those bytes (AVX-512BW: one vmovdqu8 each; elsewhere LLVM expands them), so rows of any width
    can be split in place, in any order."""
    sig = types.void(src, s, n, flip, dst, d_even, d_odd)

    def codegen(context, builder, signature, args):
        sa = signature.args
        i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v64, v32 = ir.VectorType(i8, 64), ir.VectorType(i8, 32)
        s_ptr = context.make_array(sa[0])(context, builder, args[0]).data
        d_ptr = context.make_array(sa[4])(context, builder, args[4]).data
        s_at, count, de, do = (context.cast(builder, args[k], sa[k], types.int64) for k in (1, 2, 5, 6))
        f = context.cast(builder, args[3], sa[3], types.uint8)

        def mask(lanes, limit):  # lane < limit, as the bits (1 << limit) - 1 (a vector compare costs 8x more)
            bits = ir.IntType(lanes)
            full = builder.icmp_signed(">=", limit, ir.Constant(i64, lanes))
            shift = builder.select(full, ir.Constant(bits, 0), builder.trunc(limit, bits) if lanes < 64 else limit)
            low = builder.sub(builder.shl(ir.Constant(bits, 1), shift), ir.Constant(bits, 1))
            return builder.bitcast(builder.select(full, ir.Constant(bits, -1), low), ir.VectorType(i1, lanes))

        def masked(name, ret, argtys):
            return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, argtys), name)

        one = ir.Constant(i32, 1)
        load = masked("llvm.masked.load.v64i8.p0", v64,
                      [v64.as_pointer(), i32, ir.VectorType(i1, 64), v64])
        v = builder.call(load, [builder.bitcast(builder.gep(s_ptr, [s_at]), v64.as_pointer()), one,
                                mask(64, count), ir.Constant(v64, None)])
        v = builder.xor(v, splat(builder, f, v64))
        store = masked("llvm.masked.store.v32i8.p0", ir.VoidType(),
                       [v32, v32.as_pointer(), i32, ir.VectorType(i1, 32)])
        for parity, at in ((0, de), (1, do)):
            half = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 32), [2 * j + parity for j in range(32)]))
            lanes = builder.ashr(builder.add(count, ir.Constant(i64, 1 - parity)), ir.Constant(i64, 1))
            builder.call(store, [half, builder.bitcast(builder.gep(d_ptr, [at]), v32.as_pointer()), one,
                                 mask(32, lanes)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def split2_xor_whole(typingctx, src, s, flip, dst, d_even, d_odd):
    """``split2_xor`` of 64 whole bytes, with plain loads and stores: ``dst[d_even + j] = src[s + 2j] ^ flip`` and
    ``dst[d_odd + j] = src[s + 2j + 1] ^ flip`` for j < 32. The caller makes sure the 64 bytes read and the two
    32-byte runs written lie inside their arrays, and rewrites what a run writes past the bytes it wanted. Without
    AVX-512BW, LLVM expands split2_xor's byte-masked moves into a branch per byte (3x3/2 128 @56: the split took
    500 us for a 400 KB input)."""
    sig = types.void(src, s, flip, dst, d_even, d_odd)

    def codegen(context, builder, signature, args):
        sa = signature.args
        i8, i32 = ir.IntType(8), ir.IntType(32)
        v64, v32 = ir.VectorType(i8, 64), ir.VectorType(i8, 32)
        s_ptr = context.make_array(sa[0])(context, builder, args[0]).data
        d_ptr = context.make_array(sa[3])(context, builder, args[3]).data
        s_at, de, do = (context.cast(builder, args[k], sa[k], types.int64) for k in (1, 4, 5))
        f = context.cast(builder, args[2], sa[2], types.uint8)
        v = builder.load(builder.bitcast(builder.gep(s_ptr, [s_at]), v64.as_pointer()), align=1)
        v = builder.xor(v, splat(builder, f, v64))
        for parity, at in ((0, de), (1, do)):
            half = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 32), [2 * j + parity for j in range(32)]))
            builder.store(half, builder.bitcast(builder.gep(d_ptr, [at]), v32.as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen
