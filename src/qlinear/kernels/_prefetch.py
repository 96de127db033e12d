"""Software prefetch for the element-wise numba kernels: ``prefetch_ahead``.

Why: a QuantizeLinear loop computes for ~3-4 ns per 16 elements (the division, and for float8/float4 the
encoder), a DequantizeLinear loop writes four bytes per byte it reads. On one core the hardware prefetchers
did not keep enough lines in flight for either, so time went to waiting on memory that the computation
could have hidden.

How: the walks over runs with one scale (per tensor, per channel along a middle axis, long blocks) and over
rows with a scale per element (per channel along the last axis) go in blocks of `BLOCK` elements, and before
each block ask for the input's cache lines `AHEAD_BYTES` further on (dequantize: the output's too, for
writing). Spreading the requests matters: asking for a whole 1024-element block's lines at once filled the
core's miss buffers and stalled the loads of the block being computed.

Measured on this project's Xeon (2 vCPUs), 16M elements through the public functions, both versions
alternating in one process, best times (ms):

| case | 1 thread before -> after | 2 threads before -> after |
|---|---|---|
| Q float32 -> uint8 per tensor | 6.7 -> 3.8 | 2.26 -> 2.07 |
| Q float32 -> int8 per channel (last axis) | 4.7-5.5 -> 4.2-4.4 | 2.21 -> 2.29 |
| Q float32 -> float8e4m3fn per tensor | 5.9 -> 5.5 | 2.92 -> 2.90 |
| DQ uint8 -> float32 per tensor | 5.4 -> 3.2 | 2.16 -> 1.72 |
| DQ int8 -> float32 per channel (last axis) | 9.8 -> 4.1 | 2.78 -> 2.30 |
| TF QuantizeV2 qint8 SCALED / Dequantize, per axis along the last axis (added later) | 7.26 / 10.37 -> 4.74 / 6.46 | 3.55 / 5.20 -> 2.52 / 3.23 |

Runs of short segments (blocks of up to 128 along the last axis, one scale per block) request the lines once
per `BLOCK` elements, between blocks. Measured the same way (x of shape (16384, 1024), blocks of 32):

| case | 1 thread before -> after | 2 threads before -> after |
|---|---|---|
| Q float32 -> float4e2m1 | 9.6 -> 6.2 | 3.69 -> 2.87 |
| Q float32 -> int8 | 7.9 -> 5.3 | 2.66 -> 2.24 |
| DQ int4 -> float32 (output lines requested too; without them 8.4 and 2.21) | 9.2 -> 6.8 | 4.99 -> 3.73 |

(The previous session measured its forms, requesting the lines per segment, per 128 elements or per row, as
slower on 2 threads, e.g. int8 2.40 -> 2.55 ms. That code was not kept, so why this form differs is not
established; this one was faster on 1 and 2 threads in every A/B run above.)

A prefetch is a hint: it changes no result, and it never faults (the addresses are kept inside the array
anyway).
"""

from __future__ import annotations

from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from llvmlite import ir  # noqa: E402
from numba import njit  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

BLOCK = 128  # elements per block: 8 cache lines of float32
AHEAD_BYTES = 8192  # how far ahead of the block the requested lines lie


def _prefetch_intrinsic(write: int):
    @intrinsic
    def prefetch_byte(typingctx, a, offset):
        if not isinstance(a, types.Array):
            return None

        def codegen(context, builder, signature, args):
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            at = context.cast(builder, args[1], signature.args[1], types.int64)
            byte = builder.gep(builder.bitcast(arr.data, ir.IntType(8).as_pointer()), [at])
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte.type, i32, i32, i32]), "llvm.prefetch.p0")
            # (address, 0 = read / 1 = write, 3 = keep in every level, 1 = data cache)
            builder.call(fn, [byte, ir.Constant(i32, write), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.void(a, offset), codegen

    return prefetch_byte


_prefetch_read = _prefetch_intrinsic(0)
_prefetch_write = _prefetch_intrinsic(1)


@njit(cache=True, nogil=True)
def prefetch_ahead(a, start, count, write=False):
    """Request the cache lines of 1-D contiguous ``a`` that lie `AHEAD_BYTES` past ``a[start:start + count]``;
    ``write``: for an array about to be written (the lines are fetched for ownership). Callers pass ``write`` as
    a constant, so the branch folds away."""
    size = a.itemsize
    stop = min((start + count) * size + AHEAD_BYTES, a.size * size)
    for offset in range(start * size + AHEAD_BYTES, stop, 64):
        if write:
            _prefetch_write(a, offset)
        else:
            _prefetch_read(a, offset)


@njit(cache=True, nogil=True)
def prefetch_line(a, index, ahead_bytes, write=False):
    """Request the one cache line of 1-D contiguous ``a`` that holds the byte ``ahead_bytes`` past ``a[index]``
    (the array's last line when that lies beyond it): for loops that compute long enough per line that one
    request per step, spread through the loop, keeps the lines in flight (`_mx_numba.X_AHEAD` says by how much)."""
    size = a.itemsize
    offset = min(index * size + ahead_bytes, a.size * size - 1)
    if write:
        _prefetch_write(a, offset)
    else:
        _prefetch_read(a, offset)



@njit(cache=True, nogil=True, inline="always")
def prefetch_byte(a, offset, write=False):
    """Request the cache line of 1-D contiguous ``a`` that holds its byte ``offset``, which the caller keeps
    inside ``a``: for loops that check once per run of blocks that every line they will request lies inside,
    so that a request costs no comparison (`prefetch_line` clamps each one: a compare and a conditional move
    per line, which in NVFP4's codes loop cost 0.4 ns a block)."""
    if write:
        _prefetch_write(a, offset)
    else:
        _prefetch_read(a, offset)
