"""The numba half of `qlinear.kernels.mx` (see its docstring for the arithmetic and the layout).

Imported on the first kernel call, never by ``import qlinear``. Every function is compiled lazily and cached
on disk. Each kernel takes a range of rows ``[start, stop)`` of x viewed as (rows, row_len), float32, C order,
and processes the blocks of those rows: `threads.run_chunked` splits the rows between threads.
"""

from __future__ import annotations

import numpy as np
from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from llvmlite import ir  # noqa: E402
from numba import njit  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.core import types as nbtypes  # noqa: E402
from numba.extending import intrinsic, overload  # noqa: E402

from ._prefetch import BLOCK, prefetch_ahead, prefetch_byte, prefetch_line  # noqa: E402
from ._vector_width import use_512_bit_vectors  # noqa: E402
from .small_float import decode_small_float, magic_sum  # noqa: E402

_JIT = dict(cache=True, nogil=True, error_model="numpy")
# The per-block helpers take array arguments: inlined by numba itself (a call would pass each array by value and
# count references around it: 170 cycles a block in a first version), so that the loops are the caller's.
_INLINE = dict(_JIT, inline="always")

MX_BLOCK = 32
NV_BLOCK = 16
# Bytes of x ahead of the block being read whose lines the quantize loops request, a block's lines per block:
# requested 8 or 32 lines at a time, between groups of blocks, the lines came late. 16M float32 elements on
# 2 threads (x in L3): MX quantize 4.4-4.6 -> 2.8-3.0 ms, NVFP4 pass 2 3.45 -> 2.3 ms; NVFP4 pass 1 with x
# out of the caches 4.2 -> 2.8 ms (then still keeping block maxima; now a plain read, 2.1 ms: see
# `nv_finite_max_rows`). 4096 to 16384 measured alike.
X_AHEAD = 8192
RULE_FLOOR, RULE_CEIL, RULE_EVEN = 0, 1, 2
_ABS = np.int32(0x7FFFFFFF)
_INF = np.int32(0x7F800000)
_E8M0_NAN = np.uint8(0xFF)
_E4M3_NAN = np.uint8(0x7F)  # float32 NaN (positive) as float8_e4m3fn, as ml_dtypes casts it


# ----------------------------------------------------------------------------------------------- block maxima
def _abs_max_intrinsic(width: int):
    """``abs_max(a, i)``: the maximum over a[i:i + width] (float32, C-contiguous) of the magnitudes' float32 bits,
    as int32 (the bits of a magnitude order as its value; >= 0x7F800000 when one is Inf or NaN).

    Why an intrinsic: LLVM unrolls a 32-iteration loop in full before its vectoriser sees it, and left the
    maximum as 32 scalar compares (about 20 ns a block); loaded as one <width x i32> vector and reduced with
    ``llvm.vector.reduce.umax``, it is a few 512-bit instructions."""

    @intrinsic
    def abs_max(typingctx, a, i):
        if not (isinstance(a, nbtypes.Array) and a.dtype == nbtypes.float32 and a.layout == "C"):
            return None

        def codegen(context, builder, signature, args):
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            at = context.cast(builder, args[1], signature.args[1], nbtypes.int64)
            i32 = ir.IntType(32)
            vector = ir.VectorType(i32, width)
            pointer = builder.bitcast(builder.gep(arr.data, [at]), vector.as_pointer())
            bits = builder.and_(builder.load(pointer, align=4), ir.Constant(vector, [0x7FFFFFFF] * width))
            reduce = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(i32, [vector]), f"llvm.vector.reduce.umax.v{width}i32")
            return builder.call(reduce, [bits])

        return nbtypes.int32(a, i), codegen

    return abs_max


_abs_max_32 = _abs_max_intrinsic(32)
_abs_max_16 = _abs_max_intrinsic(16)


def _abs_max_x16_intrinsic(width: int):
    """``abs_max_x16(a, i, out, o)``: the `_abs_max_intrinsic` maximum of each of the 16 blocks of ``width`` at
    a[i:i + 16 * width] into out[o:o + 16] (int32); returns the largest of the 16.

    The 16 blocks are reduced together: each 32-wide block's two halves to one vector, then the 16 vectors
    pairwise by shuffles, so that each level halves the lanes per block and the last leaves block j's maximum
    in lane j (30 shuffles and 15 maxima for 16 blocks, where one block's own reduction takes 4 shuffles, 4
    maxima and a move to a general register; fewer port-5 shuffles, and the maxima come out as one vector)."""

    @intrinsic
    def abs_max_x16(typingctx, a, i, out, o):
        if not (isinstance(a, nbtypes.Array) and a.dtype == nbtypes.float32 and a.layout == "C"
                and isinstance(out, nbtypes.Array) and out.dtype == nbtypes.int32 and out.layout == "C"):
            return None

        def codegen(context, builder, signature, args):
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            dest = context.make_array(signature.args[2])(context, builder, args[2])
            at = context.cast(builder, args[1], signature.args[1], nbtypes.int64)
            out_at = context.cast(builder, args[3], signature.args[3], nbtypes.int64)
            i32, i64 = ir.IntType(32), ir.IntType(64)
            lanes = ir.VectorType(i32, 16)
            mask = ir.Constant(lanes, [0x7FFFFFFF] * 16)
            base = builder.bitcast(arr.data, i32.as_pointer())

            def umax(u, v):
                return builder.select(builder.icmp_unsigned(">", u, v), u, v)

            def load(offset):
                pointer = builder.gep(base, [builder.add(at, ir.Constant(i64, offset))])
                return builder.and_(builder.load(builder.bitcast(pointer, lanes.as_pointer()), align=4), mask)

            vectors = [load(width * j) if width == 16 else umax(load(width * j), load(width * j + 16))
                       for j in range(16)]
            per_block = 16  # lanes per block in each vector
            while len(vectors) > 1:
                half = per_block // 2
                first = [s * per_block + t for s in range(16 // per_block) for t in range(half)]
                second = [k + half for k in first]
                low = ir.Constant(ir.VectorType(i32, 16), first + [k + 16 for k in first])
                high = ir.Constant(ir.VectorType(i32, 16), second + [k + 16 for k in second])
                vectors = [umax(builder.shuffle_vector(p, q, low), builder.shuffle_vector(p, q, high))
                           for p, q in zip(vectors[0::2], vectors[1::2])]
                per_block = half
            target = builder.gep(builder.bitcast(dest.data, i32.as_pointer()), [out_at])
            builder.store(vectors[0], builder.bitcast(target, lanes.as_pointer()), align=4)
            reduce = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(i32, [lanes]), "llvm.vector.reduce.umax.v16i32")
            return builder.call(reduce, [vectors[0]])

        return nbtypes.int32(a, i, out, o), codegen

    return abs_max_x16


if MX_BLOCK != 32 or NV_BLOCK != 16:
    raise AssertionError("the block maxima intrinsics are written for blocks of 32 (MX) and 16 (NVFP4)")
_abs_max_32_x16 = _abs_max_x16_intrinsic(32)
_abs_max_16_x16 = _abs_max_x16_intrinsic(16)


# ----------------------------------------------------------------------------------------------- scalars
@njit(**_JIT)
def pow2_f32(t):
    """2**t as a float32, exactly, for an integer t in [-149, 127] (below -126 a subnormal)."""
    t = np.int32(t)
    if t >= np.int32(-126):
        bits = np.int32(np.int32(t + np.int32(127)) << np.int32(23))
    else:
        bits = np.int32(np.int32(1) << np.int32(t + np.int32(149)))
    return np.int32(bits).view(np.float32)


@njit(**_JIT)
def _exponent_and_fraction(v):
    """(unbiased exponent, 23-bit fraction field) of float32 ``v`` >= 0 as a normalised number: read off
    float64(v), in which every float32 (subnormals too) is normal. v = 0 gives exponent -1023."""
    b = np.float64(v).view(np.int64)
    return np.int32((b >> np.int64(52)) - np.int64(1023)), np.int32((b >> np.int64(29)) & np.int64(0x7FFFFF))


@njit(**_JIT)
def shared_exponent(amax_bits, rule, emax, mbits, max_value):
    """The block exponent e (X = 2**e) of `qlinear.reference.mx.shared_exponents`, from the block maximum's
    float32 bits (finite, >= 0): exact integer arithmetic on the exponent and fraction fields, never a log2.

    floor: e = floor(log2 amax) - emax. ceil: ceil(log2(float32(amax / max_value))), the quotient rounded to
    float32 by one float32 division. even: amax's significand rounded to mbits + 1 bits (halves up), then
    floor. A zero maximum gives exponent -1023 before the clamp, so -127 (code 0x00)."""
    a = np.int32(amax_bits).view(np.float32)
    if rule == RULE_CEIL:
        q = np.float32(a / max_value)
        ex, frac = _exponent_and_fraction(q)
        e = np.int32(ex + np.int32(frac != np.int32(0)))
    else:
        ex, frac = _exponent_and_fraction(a)
        e = np.int32(ex - emax)
        if rule == RULE_EVEN:
            threshold = np.int32(np.int32(0x800000) - np.int32(np.int32(1) << np.int32(np.int32(22) - mbits)))
            e = np.int32(e + np.int32(frac >= threshold))
    if e < np.int32(-127):
        e = np.int32(-127)
    if e > np.int32(127):
        e = np.int32(127)
    return e


# ----------------------------------------------------------------------------------------------- elements
def mx_element(v, factor, elem):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@njit(**_JIT)
def encode_finite(v, shift, clamp, min_normal, magic_offset, nan_code, sign_value, keep_mask):
    """`small_float.encode_small_float` for a finite ``v`` and a format with a signed zero (every MX element
    format), saturating: the same byte with 3 of its 16 vector instructions per 16 elements left out. Its NaN
    case cannot occur, and its sign rule keeps the sign wherever the sum has exponent bits, which it always
    has (``keep_mask`` 0x7F800000; the driver checks the format). Same arguments, the unused ones ignored."""
    bits = np.float32(v).view(np.int32)
    magnitude = np.int32(bits & np.int32(0x7FFFFFFF))
    total, _ = magic_sum(min(magnitude, clamp), shift, min_normal, magic_offset)
    code = np.float32(total).view(np.int32)
    return np.uint8(code | (np.int32(bits >> np.int32(31)) & sign_value))


@overload(mx_element, jit_options=_JIT)
def _mx_element(v, factor, elem):
    """The code byte of a finite float32 ``v`` in a block whose scale is 2**e, ``factor`` = 2**-e.

    v * 2**-e is exact whenever it is a normal float32 (a power-of-two product); below 2**-126 it may round,
    but such a value lies far below half the smallest step of every element format and gives +-0 either way.
    ``elem`` None: MXINT8, rint(v / X * 64) clamped to [-127, 127] (the clamp first: the bounds are integers,
    so it commutes with rint); otherwise `encode_small_float`'s arguments (saturating), see `encode_finite`."""
    if isinstance(elem, nbtypes.NoneType):
        def impl(v, factor, elem):
            q = np.float32(np.float32(v * factor) * np.float32(64))
            q = q if q > np.float32(-127) else np.float32(-127)
            q = q if q < np.float32(127) else np.float32(127)
            return np.uint8(np.int32(np.rint(q)) & np.int32(0xFF))
        return impl
    return lambda v, factor, elem: encode_finite(np.float32(v * factor), *elem)


def mx_decode(v, elem):  # pragma: no cover
    raise NotImplementedError


@overload(mx_decode, jit_options=_JIT)
def _mx_decode(v, elem):
    """float32 value of an element byte: MXINT8 (``elem`` None) the int8, else `decode_small_float`."""
    if isinstance(elem, nbtypes.NoneType):
        # the byte sign-extended by shifts in int32 (np.int8(v) left LLVM to vectorise 4 lanes wide)
        return lambda v, elem: np.float32(np.int32(np.int32(np.int32(v) << np.int32(24)) >> np.int32(24)))
    return lambda v, elem: decode_small_float(v, *elem)


# ----------------------------------------------------------------------------------------------- MX quantize
@njit(**_INLINE)
def _mx_block(xs, cs, base, length, rule, emax, mbits, max_value, elem):
    """Quantize ``xs[base:base + length]`` (one block, the short last one of a row) into ``cs``; returns the
    E8M0 scale byte.

    The maximum is taken over the magnitudes' bits as integers (their order is the values' order); a block
    holding an Inf or a NaN has a maximum >= 0x7F800000: scale NaN (0xFF) and +0 codes, as the reference."""
    amax = np.int32(0)
    for k in range(length):
        amax = max(amax, np.int32(np.float32(xs[base + np.uint64(k)]).view(np.int32) & _ABS))
    if amax >= _INF:
        for k in range(length):
            cs[base + np.uint64(k)] = np.uint8(0)
        return _E8M0_NAN
    e = shared_exponent(amax, rule, emax, mbits, max_value)
    factor = pow2_f32(-e)
    for k in range(length):
        cs[base + np.uint64(k)] = mx_element(xs[base + np.uint64(k)], factor, elem)
    return np.uint8(e + np.int32(127))


GROUP = 16  # blocks whose scales are computed together, in vector registers


@njit(**_JIT)
def mx_quantize_rows(x, codes, scales, row_len, rule, emax, mbits, max_value, elem, start, stop):
    """Rows [start, stop) of x (rows of ``row_len`` elements, each ceil(row_len / 32) blocks, the last one
    possibly short) into codes (uint8 bytes) and scales (E8M0 bytes).

    Whole blocks go in groups of `GROUP`: their maxima (one vector reduction each), then their exponents and
    scale factors in one vectorised loop (per block, that scalar chain cost about a third of the time), then
    their elements."""
    use_512_bit_vectors()
    full = row_len // MX_BLOCK
    rest = row_len - full * MX_BLOCK
    per_row = full + (1 if rest else 0)
    n = (stop - start) * row_len
    i0 = start * row_len
    xs, cs = x[i0:i0 + n], codes[i0:i0 + n]
    ss = scales[start * per_row:stop * per_row]
    amax = np.empty(GROUP, np.int32)
    factor = np.empty(GROUP, np.float32)
    for r in range(stop - start):
        row = r * row_len
        srow = r * per_row
        for g in range(0, full, GROUP):
            m = min(GROUP, full - g)
            first = row + g * MX_BLOCK
            if m == GROUP:
                _abs_max_32_x16(xs, first, amax, 0)
            else:
                for j in range(m):
                    amax[j] = _abs_max_32(xs, np.uint64(first + j * MX_BLOCK))
            for j in range(m):
                a = amax[j]
                e = shared_exponent(a, rule, emax, mbits, max_value)
                factor[j] = pow2_f32(-e)
                ss[srow + g + j] = _E8M0_NAN if a >= _INF else np.uint8(e + np.int32(127))
            for j in range(m):
                base = np.uint64(first + j * MX_BLOCK)
                # the block's two lines of x, `X_AHEAD` bytes on, requested one block at a time (see X_AHEAD)
                prefetch_line(x, i0 + first + j * MX_BLOCK, X_AHEAD)
                prefetch_line(x, i0 + first + j * MX_BLOCK + 16, X_AHEAD)
                if amax[j] >= _INF:
                    for k in range(MX_BLOCK):
                        cs[base + np.uint64(k)] = np.uint8(0)
                else:
                    f = factor[j]
                    for k in range(MX_BLOCK):
                        cs[base + np.uint64(k)] = mx_element(xs[base + np.uint64(k)], f, elem)
        if rest:
            base = np.uint64(row + full * MX_BLOCK)
            ss[srow + full] = _mx_block(xs, cs, base, rest, rule, emax, mbits, max_value, elem)


# ----------------------------------------------------------------------------------------------- MX dequantize
@njit(**_INLINE)
def _mx_dq_block(cs, ys, base, length, scale, shift, elem):
    """``ys[base:base + length]`` = codes * 2**(scale - 127 - shift) (shift 6 for MXINT8's implicit 2**-6),
    one float32 multiplication of exact operands: the correctly rounded product, as the reference's float64
    product rounded once. A NaN scale (0xFF) makes the block NaN. (One loop and no early return: a second
    exit kept numba's reference counting of the arrays inside the row loop.)"""
    nan_block = scale == _E8M0_NAN
    factor = pow2_f32(np.int32(np.int32(scale) - np.int32(127) - shift))  # Inf for 0xFF: not used
    nan = np.float32(np.nan)
    for k in range(length):
        y = np.float32(mx_decode(cs[base + np.uint64(k)], elem) * factor)
        ys[base + np.uint64(k)] = nan if nan_block else y


@intrinsic
def _int8_block_times(typingctx, cs, ys, base, factor, nan_block):
    """``ys[base:base + 32]`` = float32(int8 code) * factor, or NaN where ``nan_block``: `_mx_dq_block` for
    MXINT8's whole blocks as one <32 x i8> -> <32 x float> computation. (The numba loop's body is so small that
    LLVM unrolled its 32 iterations in full before vectorising, and left 32 scalar conversions.)"""
    if not (isinstance(cs, nbtypes.Array) and cs.dtype == nbtypes.uint8 and cs.layout == "C"
            and isinstance(ys, nbtypes.Array) and ys.dtype == nbtypes.float32 and ys.layout == "C"
            and factor == nbtypes.float32 and nan_block == nbtypes.boolean):
        return None

    def codegen(context, builder, signature, args):
        c_arr = context.make_array(signature.args[0])(context, builder, args[0])
        y_arr = context.make_array(signature.args[1])(context, builder, args[1])
        at = context.cast(builder, args[2], signature.args[2], nbtypes.int64)
        f32, i8 = ir.FloatType(), ir.IntType(8)
        bytes_ = ir.VectorType(i8, MX_BLOCK)
        floats = ir.VectorType(f32, MX_BLOCK)
        codes = builder.load(builder.bitcast(builder.gep(c_arr.data, [at]), bytes_.as_pointer()), align=1)
        values = builder.sitofp(codes, floats)
        one = builder.insert_element(ir.Constant(ir.VectorType(f32, 1), ir.Undefined), args[3], ir.Constant(ir.IntType(32), 0))
        factor = builder.shuffle_vector(one, ir.Constant(ir.VectorType(f32, 1), ir.Undefined),
                                        ir.Constant(ir.VectorType(ir.IntType(32), MX_BLOCK), [0] * MX_BLOCK))
        product = builder.fmul(values, factor)
        nan = ir.Constant(floats, [float("nan")] * MX_BLOCK)
        flag = context.cast(builder, args[4], signature.args[4], nbtypes.boolean)
        result = builder.select(flag, nan, product)
        builder.store(result, builder.bitcast(builder.gep(y_arr.data, [at]), floats.as_pointer()), align=4)
        return context.get_dummy_value()

    return nbtypes.void(cs, ys, base, factor, nan_block), codegen


def mx_dq_whole(cs, ys, base, scale, shift, elem):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(mx_dq_whole, inline="always", jit_options=_JIT)
def _mx_dq_whole(cs, ys, base, scale, shift, elem):
    """One whole block of `mx_dequantize_rows`: MXINT8 by `_int8_block_times`, the float formats by the loop."""
    if isinstance(elem, nbtypes.NoneType):
        def impl(cs, ys, base, scale, shift, elem):
            factor = pow2_f32(np.int32(np.int32(scale) - np.int32(127) - shift))
            _int8_block_times(cs, ys, base, factor, scale == _E8M0_NAN)
        return impl

    def impl(cs, ys, base, scale, shift, elem):
        _mx_dq_block(cs, ys, base, MX_BLOCK, scale, shift, elem)
    return impl


@njit(**_JIT)
def mx_dequantize_rows(codes, scales, out, row_len, shift, elem, start, stop):
    use_512_bit_vectors()
    full = row_len // MX_BLOCK
    rest = row_len - full * MX_BLOCK
    per_row = full + (1 if rest else 0)
    n = (stop - start) * row_len
    i0 = start * row_len
    cs, ys = codes[i0:i0 + n], out[i0:i0 + n]
    ss = scales[start * per_row:stop * per_row]
    ahead = 0
    for r in range(stop - start):
        row = r * row_len
        srow = r * per_row
        for b in range(full):
            off = row + b * MX_BLOCK
            base = np.uint64(off)
            if off >= ahead:
                prefetch_ahead(out, i0 + ahead, BLOCK, True)
                ahead += BLOCK
            mx_dq_whole(cs, ys, base, ss[srow + b], shift, elem)
        if rest:
            _mx_dq_block(cs, ys, np.uint64(row + full * MX_BLOCK), rest, ss[srow + full], shift, elem)


# ----------------------------------------------------------------------------------------------- NVFP4
@njit(**_INLINE)
def _nv_amax(xs, base, length):
    """(max magnitude bits, max finite magnitude bits) of one block: the first >= 0x7F800000 when the
    block holds an Inf or a NaN. A whole block takes one vector reduction (the second maximum is the first
    unless the block holds an Inf or a NaN, which the scalar loop below then handles)."""
    if length == NV_BLOCK:
        every = _abs_max_16(xs, base)
        if every < _INF:
            return every, every
    finite = np.int32(0)
    every = np.int32(0)
    for k in range(length):
        m = np.int32(np.float32(xs[base + np.uint64(k)]).view(np.int32) & _ABS)
        every = max(every, m)
        finite = max(finite, m if m < _INF else np.int32(0))
    return every, finite


def _finite_max_intrinsic(ahead: int):
    """``finite_max(a, i)``: over a[i:i + 256] (float32, C-contiguous), the largest finite magnitude's bits
    (Inf and NaN counting as 0) in the low 32 bits of the int64 result, the largest magnitude's bits (>=
    0x7F800000: an Inf or a NaN among them) in the high 32: sixteen vectors reduced lane by lane, then
    across the lanes once (per block, the reduction across lanes took longer than reading x). ``ahead`` > 0:
    before each line is read, the line ``ahead`` bytes on is requested (which the caller keeps inside
    ``a``): one request per line read, spread as the `prefetch_byte` calls of the codes loop are (sixteen
    requested at once before the sixteen loads came late: 2.4-2.8 ms at 16M elements on 2 threads, where
    reading alone takes 1.7-2.1)."""

    @intrinsic
    def finite_max(typingctx, a, i):
        if not (isinstance(a, nbtypes.Array) and a.dtype == nbtypes.float32 and a.layout == "C"):
            return None

        def codegen(context, builder, signature, args):
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            at = context.cast(builder, args[1], signature.args[1], nbtypes.int64)
            i32, i64, i8 = ir.IntType(32), ir.IntType(64), ir.IntType(8)
            lanes = ir.VectorType(i32, 16)
            base = builder.bitcast(arr.data, i32.as_pointer())
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i32, i32, i32]), "llvm.prefetch.p0")
            infinity, zero = ir.Constant(lanes, [0x7F800000] * 16), ir.Constant(lanes, [0] * 16)
            top = most = None
            for j in range(16):
                element = builder.gep(base, [builder.add(at, ir.Constant(i64, 16 * j))])
                if ahead:
                    line = builder.gep(builder.bitcast(element, i8.as_pointer()), [ir.Constant(i64, ahead)])
                    builder.call(prefetch, [line, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
                every = builder.and_(builder.load(builder.bitcast(element, lanes.as_pointer()), align=4),
                                     ir.Constant(lanes, [0x7FFFFFFF] * 16))
                m = builder.select(builder.icmp_signed("<", every, infinity), every, zero)
                top = m if top is None else builder.select(builder.icmp_signed(">", top, m), top, m)
                most = every if most is None else builder.select(builder.icmp_signed(">", most, every), most, every)
            reduce = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(i32, [lanes]), "llvm.vector.reduce.smax.v16i32")
            low = builder.zext(builder.call(reduce, [top]), i64)
            high = builder.zext(builder.call(reduce, [most]), i64)
            return builder.or_(builder.shl(high, ir.Constant(i64, 32)), low)

        return nbtypes.int64(a, i), codegen

    return finite_max


_finite_max_256 = _finite_max_intrinsic(0)
_finite_max_256_ahead = _finite_max_intrinsic(X_AHEAD)


@njit(**_JIT)
def nv_finite_max_rows(x, top, every, row_len, start, stop):
    """Pass 1 of NVFP4: over rows [start, stop), the largest finite magnitude's bits into ``top[start]`` (the
    tensor scale's maximum) and the largest magnitude's bits into ``every[start]`` (>= 0x7F800000: x holds
    an Inf or a NaN); the caller zeroes both and takes their maxima. A plain read of x, 256 elements at a
    time, each line requested `X_AHEAD` bytes on (`_finite_max_intrinsic`).

    The block maxima are not kept: pass 2 takes each group's maxima just before its scales, as it does
    with the tensor scale given. Storing them here made this pass 2.4-2.7 ms at 16M elements on 2 threads,
    and reading them back made pass 2 no faster."""
    n = (stop - start) * row_len
    i0 = start * row_len
    whole = n - n % 256
    # the 256-element runs whose requested lines lie inside x, then the rest without requests
    ahead = min(whole, max(0, (x.size - X_AHEAD // 4 - i0) // 256 * 256))
    best = np.int32(0)
    most = np.int32(0)
    for i in range(i0, i0 + ahead, 256):
        both = _finite_max_256_ahead(x, np.uint64(i))
        best = max(best, np.int32(both & np.int64(0x7FFFFFFF)))
        most = max(most, np.int32(both >> np.int64(32)))
    for i in range(i0 + ahead, i0 + whole, 256):
        both = _finite_max_256(x, np.uint64(i))
        best = max(best, np.int32(both & np.int64(0x7FFFFFFF)))
        most = max(most, np.int32(both >> np.int64(32)))
    for i in range(i0 + whole, i0 + n):
        m = np.int32(np.float32(x[i]).view(np.int32) & _ABS)
        best = max(best, m if m < _INF else np.int32(0))
        most = max(most, m)
    top[start] = best
    every[start] = most


_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # between the E2M1 magnitudes 0, 0.5, 1, ..., 4, 6
_NEVER = np.int32(0x7FFFFFFF)  # a threshold no magnitude's bits exceed


@njit(**_JIT)
def _nv_threshold(midpoint, d, ties_up):
    """The float32 bits L such that, for a float32 magnitude m, ``m > L`` (as integers) exactly when m >
    midpoint * d (``ties_up`` False) or m >= midpoint * d (True), the product being exact in float64.

    With T the exact product and R = float32(T): when R < T no float32 lies in (R, T], so m > T iff m > R;
    when R > T, m > T iff m >= R iff m > the float32 before R; when R == T, m > T iff m > R and m >= T iff
    m > the float32 before R. d <= 0 or NaN (no usable scale): `_NEVER`, every code 0."""
    t = np.float64(midpoint) * np.float64(d)
    r = np.float32(t)
    bits = np.float32(r).view(np.int32)
    if np.float64(r) > t or (ties_up and np.float64(r) == t):
        bits = np.int32(bits - np.int32(1))  # r > 0 here: t > 0
    return bits if d > np.float32(0) else _NEVER


@intrinsic
def _fma32(typingctx, a, b, c):
    """a * b + c with one rounding (``llvm.fma.f32``: vfmadd where the CPU has FMA, libm's fmaf elsewhere)."""
    if not (a == nbtypes.float32 and b == nbtypes.float32 and c == nbtypes.float32):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return nbtypes.float32(nbtypes.float32, nbtypes.float32, nbtypes.float32), codegen


_FMA_SAFE = np.float32(2.0**-100)  # d at least this: the residual of every midpoint * d is a float32


@njit(**_JIT)
def _nv_threshold_fma(midpoint, d, ties_up):
    """`_nv_threshold` in float32 for d >= `_FMA_SAFE`: p = float32(midpoint * d), and the exact residual
    T - p = fma(midpoint, d, -p) (exact because the exponents of midpoint and d sum to at least -103, so no
    bit of it falls below float32's range; Boldo & Muller) says whether p lies above, on or below T. Half the
    instructions of the float64 form, on twice the lanes."""
    p = np.float32(np.float32(midpoint) * d)
    r = _fma32(np.float32(midpoint), d, -p)
    bits = np.float32(p).view(np.int32)
    down = (r <= np.float32(0)) if ties_up else (r < np.float32(0))
    return np.int32(bits - np.int32(down)) if d > np.float32(0) else _NEVER


@njit(**_JIT)
def _nv_scale(a, g, e4m3):
    """(E4M3 block scale byte, d) for a block maximum's bits ``a`` (-1: the block holds an Inf or a NaN):
    float8_e4m3fn(min((amax / 6) / g, 448)) in float32 arithmetic, NaN (0x7F) for -1; d = float32(float32(scale)
    * g), NaN for a NaN scale.

    The scale is rounded as `encode_small_float` rounds it (s is finite and >= 0 here: one float32 addition
    of a magic number), and its value is that sum minus the magic number, exact (both are multiples of the
    E4M3 step at s, their difference a multiple below 2**9): the rounded value without decoding the byte,
    which took a third of this function's instructions (checked against ml_dtypes for every float32 in
    [0, 448] offline, 2026-12-02; tests/kernels/test_mx_kernels.py puts block maxima around every E4M3
    value and midpoint)."""
    s = np.float32(np.float32(np.int32(a).view(np.float32) / np.float32(6)) / g)
    s = s if s < np.float32(448) else np.float32(448)  # a NaN s (a = -1) becomes 448: replaced below
    shift, clamp, min_normal, magic_offset = e4m3[0], e4m3[1], e4m3[2], e4m3[3]
    total, magic = magic_sum(min(np.float32(s).view(np.int32), clamp), shift, min_normal, magic_offset)
    rounded = np.float32(total - magic)
    code = np.uint8(np.float32(total).view(np.int32) & np.int32(0xFF))
    d = np.float32(rounded * g)
    return (code, d) if a >= np.int32(0) else (_E4M3_NAN, np.float32(np.nan))


@njit(**_JIT)
def _nv_code(bits, l0, l1, l2, l3, l4, l5, l6, sign_mask):
    """The E2M1 code of float32 ``bits`` (as int32) against a block's thresholds (see `_nv_threshold`): the
    number of thresholds the magnitude exceeds, and the sign. (A binary search over the thresholds, three
    comparisons and four selects, came out of LLVM as more instructions than these seven comparisons.)"""
    m = np.int32(bits & _ABS)
    index = (np.int32(m > l0) + np.int32(m > l1) + np.int32(m > l2) + np.int32(m > l3)
             + np.int32(m > l4) + np.int32(m > l5) + np.int32(m > l6))
    sign = np.int32(np.int32(bits >> np.int32(28)) & sign_mask)
    return np.uint8(index | sign)


def _nv_codes_ir(builder, bits, splat, sign=None):
    """LLVM IR: the `_nv_code` of the <16 x i32> float32 ``bits`` against one block's thresholds, ``splat(k)``
    giving threshold k (0-6) or the sign mask (7) in every lane. The count of thresholds below the magnitude
    is found by binary search, as the thresholds ascend: whether the magnitude is above threshold 3 (codes
    4-7), then above 1 or 5, then above 0, 2, 4 or 6 (three comparisons and four blends of broadcast
    thresholds where a count of seven comparisons took seven compares and masked adds, and a first
    comparison with threshold 3 followed by three counted ones took ten instructions). ``sign``: the sign
    bit as 8 or 0 per lane; None: the sign of ``bits`` masked by ``splat(7)``."""
    i32 = ir.IntType(32)
    lanes = ir.VectorType(i32, NV_BLOCK)

    def const(v):
        return ir.Constant(lanes, [v] * NV_BLOCK)

    magnitude = builder.and_(bits, const(0x7FFFFFFF))
    above4 = builder.icmp_signed(">", magnitude, splat(3))
    above2 = builder.icmp_signed(">", magnitude, builder.select(above4, splat(5), splat(1)))
    last = builder.select(above4, builder.select(above2, splat(6), splat(4)),
                          builder.select(above2, splat(2), splat(0)))
    above1 = builder.icmp_signed(">", magnitude, last)
    index = builder.or_(builder.or_(builder.select(above4, const(4), const(0)),
                                    builder.select(above2, const(2), const(0))),
                        builder.select(above1, const(1), const(0)))
    if sign is None:
        sign = builder.and_(builder.ashr(bits, const(28)), splat(7))
    return builder.or_(index, sign)


@intrinsic
def _nv_codes_16(typingctx, xs, cs, base, limits, j):
    """`_nv_code` of the 16 elements ``xs[base:base + 16]`` into ``cs[base:base + 16]``, against the thresholds
    ``limits[0:7, j]`` and the sign mask ``limits[7, j]`` (`_nv_codes_ir`).

    Why an intrinsic: numba's loop over a block's 16 elements vectorised, but behind a runtime check that
    the input and output do not overlap, whose scalar fallback made LLVM load the eight thresholds into
    general registers and broadcast each (eight port-5 instructions a block). Here each is broadcast from
    memory. (Four blocks at a time, their codes packed by byte shuffles into one store, was faster in L2
    but slower at 16M elements: 3.6 -> 4.3-4.7 ms with the tensor scale given, its lines requested four at
    a time.)"""
    if not (isinstance(xs, nbtypes.Array) and xs.dtype == nbtypes.float32 and xs.layout == "C"
            and isinstance(cs, nbtypes.Array) and cs.dtype == nbtypes.uint8 and cs.layout == "C"
            and isinstance(limits, nbtypes.Array) and limits.dtype == nbtypes.int32 and limits.ndim == 2
            and limits.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        x_arr = context.make_array(signature.args[0])(context, builder, args[0])
        c_arr = context.make_array(signature.args[1])(context, builder, args[1])
        l_arr = context.make_array(signature.args[3])(context, builder, args[3])
        at = context.cast(builder, args[2], signature.args[2], nbtypes.int64)
        column = context.cast(builder, args[4], signature.args[4], nbtypes.int64)
        i32, i8, i64 = ir.IntType(32), ir.IntType(8), ir.IntType(64)
        lanes = ir.VectorType(i32, NV_BLOCK)
        width = builder.extract_value(l_arr.shape, 1)
        limits_data = builder.bitcast(l_arr.data, i32.as_pointer())

        def splat(k):
            index = builder.add(builder.mul(ir.Constant(i64, k), width), column)
            value = builder.load(builder.gep(limits_data, [index]), align=4)
            one = builder.insert_element(ir.Constant(ir.VectorType(i32, 1), ir.Undefined), value,
                                         ir.Constant(i32, 0))
            return builder.shuffle_vector(one, ir.Constant(ir.VectorType(i32, 1), ir.Undefined),
                                          ir.Constant(ir.VectorType(i32, NV_BLOCK), [0] * NV_BLOCK))

        bits = builder.load(builder.bitcast(builder.gep(x_arr.data, [at]), lanes.as_pointer()), align=4)
        code = builder.trunc(_nv_codes_ir(builder, bits, splat), ir.VectorType(i8, NV_BLOCK))
        out = builder.bitcast(builder.gep(c_arr.data, [at]), ir.VectorType(i8, NV_BLOCK).as_pointer())
        builder.store(code, out, align=1)
        return context.get_dummy_value()

    return nbtypes.void(xs, cs, base, limits, j), codegen


NV_GROUP = 64  # NVFP4 blocks whose scales and thresholds are computed together, in vector registers


@njit(**_INLINE)
def _nv_group_amax(xs, base, m, whole, rest, local):
    """The block maxima of a group's ``m`` blocks at ``xs[base:]`` (the first ``whole`` of them whole, the
    last possibly short: ``rest`` elements) into ``local[0:m]`` (-1 for a block holding an Inf or a NaN).
    The lines of x were requested by the codes loop of the groups before."""
    j = 0
    while j + 16 <= whole:
        at = base + j * NV_BLOCK
        if _abs_max_16_x16(xs, np.uint64(at), local, np.uint64(j)) >= _INF:
            for q in range(16):
                every, finite = _nv_amax(xs, np.uint64(at + q * NV_BLOCK), NV_BLOCK)
                local[j + q] = finite if every < _INF else np.int32(-1)
        j += 16
    for b in range(j, m):
        at = base + b * NV_BLOCK
        every, finite = _nv_amax(xs, np.uint64(at), NV_BLOCK if b < whole else rest)
        local[b] = finite if every < _INF else np.int32(-1)


_HUGE = np.float32(2.0**100)  # d at most this: 5 * d is finite, so the thresholds scale by powers of two


@njit(**_INLINE)
def _nv_limits(d):
    """The seven `_nv_threshold` bits of d, for d in [`_FMA_SAFE`, `_HUGE`] (and `_NEVER` for d <= 0 or NaN).
    Only 0.75 d, 1.25 d and 1.75 d take arithmetic (`_nv_threshold_fma`): 0.25 d, 2.5 d, 3.5 d and 5 d are d
    or those times a power of two, so their float32 roundings, and the side of the exact product each lies
    on, are the same with the exponent moved (bits: d's - 2^24, 1.25 d's + 2^23, 1.75 d's + 2^23, 1.25 d's
    + 2^24; every float32 d in the range checked against the float64 form offline, 2026-12-02, and a sample
    in tests/kernels/test_mx_kernels.py)."""
    usable = d > np.float32(0)
    l2 = _nv_threshold_fma(1.25, d, False)
    l3 = _nv_threshold_fma(1.75, d, True)  # the odd midpoints' ties go up: the even code wins
    l0 = np.int32(np.float32(d).view(np.int32) - np.int32(1 << 24)) if usable else _NEVER
    l4 = np.int32(l2 + np.int32(1 << 23)) if usable else _NEVER
    l5 = np.int32(l3 + np.int32(1 << 23)) if usable else _NEVER
    l6 = np.int32(l2 + np.int32(1 << 24)) if usable else _NEVER
    return l0, _nv_threshold_fma(0.75, d, True), l2, l3, l4, l5, l6


# Model Optimizer's NVFP4 (scale_rule="modelopt")
_MO_SCALE_MIN = np.float32(2.0**-9)  # Model Optimizer clamps block scales up to E4M3's smallest subnormal
# Model Optimizer's code of a quotient q: #{midpoints below |q|} + [|q| is 0.75, 1.75 or 3.5], i.e. |q| > m for
# the even midpoints and |q| >= m for the odd ones: as thresholds on |q|'s bits, m's bits and m's bits - 1
_MO_LIMITS = tuple(int(np.float32(m).view(np.int32)) - (k % 2) for k, m in enumerate(_MIDPOINTS))


@njit(**_JIT)
def _nv_scale_modelopt(a, g6, g, e4m3):
    """(E4M3 byte, d) of Model Optimizer's block scale for the block maximum's bits ``a`` (an Inf's or a
    NaN's too): s = amax / g6 (g6 = float32(6 * g)), 0 -> 1, clamped into [2^-9, 448] (a NaN stays NaN),
    to E4M3 nearest even (`magic_sum`, as in `_nv_scale`), a NaN with its sign; d = float32(float32(s) * g),
    NaN for a NaN s."""
    s = np.float32(np.int32(a).view(np.float32) / g6)
    s = np.float32(1) if s == np.float32(0) else s
    s = _MO_SCALE_MIN if s < _MO_SCALE_MIN else s
    s = np.float32(448) if s > np.float32(448) else s
    finite = s == s
    shift, clamp, min_normal, magic_offset = e4m3[0], e4m3[1], e4m3[2], e4m3[3]
    bits = np.float32(s if finite else np.float32(1)).view(np.int32)
    total, magic = magic_sum(min(bits, clamp), shift, min_normal, magic_offset)
    code = np.uint8(np.float32(total).view(np.int32) & np.int32(0xFF))
    d = np.float32(np.float32(total - magic) * g)
    # a NaN keeps its sign, as ml_dtypes casts it: inf / inf (an Inf block maximum, g6 overflowed) is x86's
    # default NaN, whose sign bit is set (0xFF); a NaN maximum divided stays positive (0x7F)
    sign = np.int32(np.int32(np.float32(s).view(np.int32) >> 24) & np.int32(0x80))
    nan_code = np.uint8(np.int32(_E4M3_NAN) | sign)
    return (code, d) if finite else (nan_code, np.float32(np.nan))


@njit(**_JIT)
def _nv_code_modelopt(v, d):
    """Model Optimizer's E2M1 code of one element: q = float32(v / d), the sign only where q < 0 (not for
    -0 or a NaN), and a NaN's magnitude above every threshold (code 7)."""
    q = np.float32(np.float32(v) / d)
    m = np.int32(np.float32(q).view(np.int32) & _ABS)
    index = np.int32(0)
    for limit in _MO_LIMITS:
        index += np.int32(m > np.int32(limit))
    return np.uint8(index + (np.int32(8) if q < np.float32(0) else np.int32(0)))


@intrinsic
def _nv_codes_modelopt_16(typingctx, xs, cs, base, d):
    """`_nv_code_modelopt` of the 16 elements ``xs[base:base + 16]`` into ``cs[base:base + 16]``: one vector
    division by d (float32, correctly rounded: Model Optimizer's torch division), then `_nv_codes_ir` on
    the quotient's bits against the constant `_MO_LIMITS`, the sign from q < 0."""
    if not (isinstance(xs, nbtypes.Array) and xs.dtype == nbtypes.float32 and xs.layout == "C"
            and isinstance(cs, nbtypes.Array) and cs.dtype == nbtypes.uint8 and cs.layout == "C"
            and d == nbtypes.float32):
        return None

    def codegen(context, builder, signature, args):
        x_arr = context.make_array(signature.args[0])(context, builder, args[0])
        c_arr = context.make_array(signature.args[1])(context, builder, args[1])
        at = context.cast(builder, args[2], signature.args[2], nbtypes.int64)
        i32, i8, f32 = ir.IntType(32), ir.IntType(8), ir.FloatType()
        lanes, floats = ir.VectorType(i32, NV_BLOCK), ir.VectorType(f32, NV_BLOCK)
        one = builder.insert_element(ir.Constant(ir.VectorType(f32, 1), ir.Undefined), args[3], ir.Constant(i32, 0))
        divisor = builder.shuffle_vector(one, ir.Constant(ir.VectorType(f32, 1), ir.Undefined),
                                         ir.Constant(ir.VectorType(i32, NV_BLOCK), [0] * NV_BLOCK))
        v = builder.load(builder.bitcast(builder.gep(x_arr.data, [at]), floats.as_pointer()), align=4)
        q = builder.fdiv(v, divisor)
        negative = builder.fcmp_ordered("<", q, ir.Constant(floats, [0.0] * NV_BLOCK))
        sign = builder.select(negative, ir.Constant(lanes, [8] * NV_BLOCK), ir.Constant(lanes, [0] * NV_BLOCK))

        def splat(k):
            return ir.Constant(lanes, [_MO_LIMITS[k]] * NV_BLOCK)

        code = _nv_codes_ir(builder, builder.bitcast(q, lanes), splat, sign)
        out = builder.bitcast(builder.gep(c_arr.data, [at]), ir.VectorType(i8, NV_BLOCK).as_pointer())
        builder.store(builder.trunc(code, ir.VectorType(i8, NV_BLOCK)), out, align=1)
        return context.get_dummy_value()

    return nbtypes.void(xs, cs, base, d), codegen


@njit(**_JIT)
def nv_quantize_rows(x, codes, scales, row_len, g, e4m3, modelopt, start, stop):
    """NVFP4 with the tensor scale g (given, or from pass 1's maximum): per block, the maximum, the block
    scale float8_e4m3fn(min((amax / 6) / g, 448)) (NaN for a block holding an Inf or a NaN), d =
    float32(float32(block scale) * g), and each element's E2M1 code by exact comparisons of its magnitude
    with the midpoints of the E2M1 magnitudes times d (ties to the even code: the odd midpoints'
    comparisons are >=). A zero or NaN d gives +0 codes (every threshold `_NEVER`, the sign masked off).

    Blocks go in groups of `NV_GROUP`: first the maxima, the scales and the seven thresholds of every block
    of the group (one vectorised loop, three of the thresholds computed, four from them: `_nv_limits`; a
    group with a d outside [2^-100, 2^100] takes the float64 form for all seven), then the elements.
    Measured on one core, 256K elements (in L2), the tensor scale given: 5.2 ns a block with each threshold
    computed in its own loop, the scales in another and the codes counted linearly, 4.4 ns so. At 16M
    elements on 2 threads: 3.6 -> 3.2-3.3 ms.

    ``modelopt``: NVFP4 as TensorRT Model Optimizer 0.47 quantizes (`reference.mx.quantize_nvfp4_modelopt`)
    instead: per block the maximum (NaN for a block holding a NaN, Inf for one holding an Inf and no NaN),
    `_nv_scale_modelopt`, and each element's code from its float32 quotient by d (`_nv_codes_modelopt_16`):
    the reference's float32 operations in its order, so every special value goes as there."""
    use_512_bit_vectors()
    full = row_len // NV_BLOCK
    rest = row_len - full * NV_BLOCK
    per_row = full + (1 if rest else 0)
    n = (stop - start) * row_len
    i0 = start * row_len
    xs, cs = x[i0:i0 + n], codes[i0:i0 + n]
    ss = scales[start * per_row:stop * per_row]
    limits = np.empty((8, NV_GROUP), np.int32)
    dd = np.empty(NV_GROUP, np.float32)
    local = np.empty(NV_GROUP, np.int32)  # the group's block maxima
    g6 = np.float32(np.float32(6) * g)  # Model Optimizer's divisor of the block maxima
    x_safe = x.size * 4 - X_AHEAD  # the lines requested for elements below this byte lie inside x
    c_safe = codes.size - X_AHEAD // 4
    for r in range(stop - start):
        row = r * row_len
        srow = r * per_row
        for first in range(0, per_row, NV_GROUP):
            m = min(NV_GROUP, per_row - first)
            stop_block = min(m, full - first)  # the whole blocks of the group
            b0 = np.uint64(srow + first)  # unsigned indices: with signed ones LLVM gathered and scattered
            _nv_group_amax(xs, row + first * NV_BLOCK, m, stop_block, rest, local)
            if modelopt:
                for j in range(m):
                    if local[j] < 0:  # an Inf or a NaN: the maximum of every magnitude (a NaN's bits exceed an Inf's)
                        at = row + (first + j) * NV_BLOCK
                        local[j], _ = _nv_amax(xs, np.uint64(at), NV_BLOCK if j < stop_block else rest)
                for j in range(m):
                    code, d = _nv_scale_modelopt(local[np.uint64(j)], g6, g, e4m3)
                    ss[b0 + np.uint64(j)] = code
                    dd[np.uint64(j)] = d
            else:
                odd = False
                for j in range(m):
                    code, d = _nv_scale(local[np.uint64(j)], g, e4m3)
                    ss[b0 + np.uint64(j)] = code
                    dd[np.uint64(j)] = d
                    usable = d > np.float32(0)
                    odd |= ((d < _FMA_SAFE) | (d > _HUGE)) & usable  # a bool: an int64 count made LLVM take 8 lanes
                    l0, l1, l2, l3, l4, l5, l6 = _nv_limits(d)
                    limits[0, np.uint64(j)] = l0
                    limits[1, np.uint64(j)] = l1
                    limits[2, np.uint64(j)] = l2
                    limits[3, np.uint64(j)] = l3
                    limits[4, np.uint64(j)] = l4
                    limits[5, np.uint64(j)] = l5
                    limits[6, np.uint64(j)] = l6
                    limits[7, np.uint64(j)] = np.int32(8) if usable else np.int32(0)  # the sign kept or not
                if odd:
                    for k in range(7):
                        for j in range(m):
                            limits[k, j] = _nv_threshold(_MIDPOINTS[k], dd[j], k % 2 == 1)
            # each block's line of x, X_AHEAD bytes on (for the maxima of a group to come, so that lines arrive
            # while this group computes), and a line of codes per four blocks; checked once per group
            end = i0 + row + (first + stop_block) * NV_BLOCK
            ahead = end * 4 <= x_safe and end <= c_safe
            for j in range(stop_block):
                at = row + (first + j) * NV_BLOCK
                if ahead:
                    prefetch_byte(x, (i0 + at) * 4 + X_AHEAD)
                    if j % 4 == 0:
                        prefetch_byte(codes, i0 + at + X_AHEAD // 4, True)
                if modelopt:
                    _nv_codes_modelopt_16(xs, cs, at, dd[j])
                else:
                    _nv_codes_16(xs, cs, at, limits, j)
            if stop_block < m and modelopt:
                base = np.uint64(row + (first + stop_block) * NV_BLOCK)
                for k in range(rest):
                    cs[base + np.uint64(k)] = _nv_code_modelopt(xs[base + np.uint64(k)], dd[stop_block])
            elif stop_block < m:  # the row's short last block
                j = stop_block
                base = np.uint64(row + (first + j) * NV_BLOCK)
                l0, l1, l2, l3 = limits[0, j], limits[1, j], limits[2, j], limits[3, j]
                l4, l5, l6, sign_mask = limits[4, j], limits[5, j], limits[6, j], limits[7, j]
                for k in range(rest):
                    cs[base + np.uint64(k)] = _nv_code(np.float32(xs[base + np.uint64(k)]).view(np.int32),
                                                       l0, l1, l2, l3, l4, l5, l6, sign_mask)


@njit(**_JIT)
def nv_dequantize_rows(codes, scales, out, row_len, g, e2m1_decode, e4m3_decode, start, stop):
    """codes * float32(float32(block scale) * g), in float32 (the reference's two DequantizeLinear steps).
    The d of a group of blocks first (one vectorised loop), then their elements."""
    use_512_bit_vectors()
    per_row = -(-row_len // NV_BLOCK)
    n = (stop - start) * row_len
    i0 = start * row_len
    cs, ys = codes[i0:i0 + n], out[i0:i0 + n]
    ss = scales[start * per_row:stop * per_row]
    dd = np.empty(NV_GROUP, np.float32)
    ahead = 0
    for r in range(stop - start):
        row = r * row_len
        srow = r * per_row
        for first in range(0, per_row, NV_GROUP):
            m = min(NV_GROUP, per_row - first)
            for j in range(m):
                dd[j] = np.float32(decode_small_float(ss[srow + first + j], *e4m3_decode) * g)
            for j in range(m):
                off = row + (first + j) * NV_BLOCK
                if off >= ahead:
                    prefetch_ahead(out, i0 + ahead, BLOCK, True)
                    ahead += BLOCK
                base = np.uint64(off)
                d = dd[j]
                length = min(NV_BLOCK, row + row_len - off)
                if length == NV_BLOCK:
                    for k in range(NV_BLOCK):
                        e = base + np.uint64(k)
                        ys[e] = np.float32(decode_small_float(cs[e], *e2m1_decode) * d)
                else:
                    for k in range(length):
                        e = base + np.uint64(k)
                        ys[e] = np.float32(decode_small_float(cs[e], *e2m1_decode) * d)
