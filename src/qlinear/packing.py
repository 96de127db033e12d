"""2-, 4- and 6-bit types in ONNX's packed byte layout (onnx.proto, docs/technical/int4.md, int2.md).

ONNX stores these types as a little-endian bit stream: element i occupies bits [i*b, (i+1)*b) of the
stream, bytes hold the stream's bits least significant first, and the last byte is padded with zero
bits. For 4 bits that is "first element in the low nibble" (``y << 4 | x & 0x0F``), for 2 bits
``x0 | x1 << 2 | x2 << 4 | x3 << 6``, and for 6 bits four elements in three bytes. A tensor of N
elements takes ceil(N * b / 8) bytes.

In memory, ml_dtypes keeps one element per byte with the code in the low bits; packing moves the
codes into the stream and unpacking moves them back.
"""

from __future__ import annotations

import numpy as np

from .dtypes import ElementType, resolve_dtype


def _packed_type(dtype, function: str, argument: str) -> ElementType:
    kind = resolve_dtype(dtype, argument, function)
    if not kind.packs:
        raise ValueError(
            f"{function}: {argument} must be a 2-, 4- or 6-bit type (int2, uint2, int4, uint4, float4e2m1, "
            f"float6e2m3, float6e3m2), got {kind.onnx_name}, which ONNX stores one element per byte"
        )
    return kind


def packed_size(count: int, bits: int) -> int:
    return -(-count * bits // 8)


def pack(array) -> np.ndarray:
    """Pack a 2/4/6-bit ml_dtypes array into ONNX's byte layout: a flat uint8 array of
    ceil(size * bits / 8) bytes, elements in C order.

    >>> import numpy as np, ml_dtypes, qlinear
    >>> qlinear.pack(np.array([1, -2, 7], dtype=ml_dtypes.int4))
    array([225,   7], dtype=uint8)
    """
    if not isinstance(array, (np.ndarray, np.generic)):
        raise TypeError(f"pack: array must be a NumPy array of a 2/4/6-bit ml_dtypes type, got {type(array).__name__}")
    array = np.asarray(array)
    kind = _packed_type(array.dtype, "pack", "array's dtype")
    b = kind.bits
    codes = np.ascontiguousarray(array).reshape(-1).view(np.uint8) & np.uint8((1 << b) - 1)
    # Each code as its b bits, least significant first, laid end to end: the ONNX bit stream.
    bits = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :b].reshape(-1)
    return np.packbits(bits, bitorder="little")


def unpack(data, dtype, shape) -> np.ndarray:
    """Unpack ONNX's packed bytes into an ml_dtypes array of ``dtype`` and ``shape``.

    >>> import numpy as np, qlinear
    >>> qlinear.unpack(np.array([225, 7], np.uint8), "int4", (3,))
    array([1, -2, 7], dtype=int4)
    """
    kind = _packed_type(dtype, "unpack", "dtype")
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise TypeError(f"unpack: data must be a uint8 array (the packed bytes), got {data.dtype}")
    try:
        shape = tuple(int(d) for d in (shape if np.iterable(shape) else (shape,)))
    except (TypeError, ValueError):
        raise TypeError(f"unpack: shape must be a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"unpack: shape must not have negative dimensions, got {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    b = kind.bits
    needed = packed_size(count, b)
    if data.size != needed:
        raise ValueError(
            f"unpack: {count} elements of {kind.onnx_name} take ceil({count} * {b} / 8) = {needed} bytes, "
            f"got {data.size}"
        )
    bits = np.unpackbits(data.reshape(-1), bitorder="little")[: count * b].reshape(count, b)
    codes = np.packbits(bits, axis=1, bitorder="little").reshape(-1)
    return codes.view(kind.dtype).reshape(shape)
