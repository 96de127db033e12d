"""Atomic operations on int64 array elements for numba kernels, emitted as LLVM atomics.

The fused convolution drivers (qlinear.kernels._drivers, ``conv_tiles_*``) hand out their tasks through a shared
counter instead of numba's fixed shares, and mark packed panels ready with a flag that the GEMM tasks wait on:

- ``fetch_add(a, i, v)``: ``old = a[i]; a[i] += v; return old`` as one atomic read-modify-write (seq_cst);
- ``store_release(a, i, v)``: ``a[i] = v``, after every earlier write of this thread is visible to a thread that
  reads it with ``load_acquire``;
- ``load_acquire(a, i)``: ``a[i]``, read again on every call (LLVM may not keep it in a register or hoist it out
  of a wait loop, as it may a plain load of a numba array).

On x86 the store and the load are plain moves; the orderings constrain the compiler.
"""

from __future__ import annotations

from numba.core import types
from numba.extending import intrinsic


def _int64_array(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.int64


def _element_pointer(context, builder, signature, args):
    arr = context.make_array(signature.args[0])(context, builder, args[0])
    at = context.cast(builder, args[1], signature.args[1], types.int64)
    return builder.gep(arr.data, [at])


@intrinsic
def fetch_add(typingctx, a, i, v):
    """Atomically add v to a[i] (int64 array); returns the value before the addition."""
    if not _int64_array(a):
        return None

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", _element_pointer(context, builder, signature, args), value, "seq_cst")

    return types.int64(a, i, v), codegen


@intrinsic
def store_release(typingctx, a, i, v):
    """a[i] = v (int64 array) with release ordering."""
    if not _int64_array(a):
        return None

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(value, _element_pointer(context, builder, signature, args), "release", 8)
        return context.get_dummy_value()

    return types.void(a, i, v), codegen


@intrinsic
def load_acquire(typingctx, a, i):
    """a[i] (int64 array) with acquire ordering."""
    if not _int64_array(a):
        return None

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_element_pointer(context, builder, signature, args), "acquire", 8)

    return types.int64(a, i), codegen
