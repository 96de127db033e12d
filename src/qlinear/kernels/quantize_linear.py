"""Fast QuantizeLinear and DequantizeLinear: one multithreaded pass, no full-size temporaries.

Internal API, called by `qlinear.ops.quantize_linear` with validated arguments (the same ones the
NumPy reference in `qlinear.reference.quantize_linear` takes):

``quantize_linear(x, y_scale, y_zero_point, granularity, output, saturate, precision)``
``dequantize_linear(x, x_type, x_scale, x_zero_point, granularity, output)``
    The result, bit-identical to the reference, or None when no kernel covers the case (numba missing,
    or the kernels switched off with `use_kernels(False)`); the caller then runs the reference.

How the arithmetic stays the reference's
    - x is loaded in its own type (float16/bfloat16 as raw bits, widened exactly) and rounded to the
      division precision; the scale and zero point, which are small, are converted to that precision
      with NumPy before the loop, exactly as the reference converts them.
    - float32 precision divides in float32 (``vdivps``; never a reciprocal multiply); float16 and
      bfloat16 divide in float32 and round the quotient once to the narrow type, which is their correctly
      rounded division (24 >= 2p + 2); float64 divides in float64.
    - Integer outputs: rint (half to even), + zero point, clamp, NaN -> the type's minimum. In float32
      when the output has at most 16 bits: the bounds are exact there and float32 rounding is monotonic,
      so a sum too large to be exact is far outside the range either way; int32 outputs use float64.
    - float8/6/4 outputs: the zero point is added in the division precision, then the value is encoded
      by bit manipulation (`qlinear.kernels.small_float.encode_small_float`).
    - Dequantize: (x - zero point) exactly in int32 (int64 for int32 x), converted to float32, times the
      float32 scale, then rounded to float16/bfloat16 by bit manipulation. float8/6/4 inputs are widened
      through a 256-entry float32 table built from ml_dtypes.

Layout: x (C-contiguous) is walked as rows of contiguous elements; each row takes its scale either
per segment (per-tensor, per-axis with the axis not last, blocked along the last axis) or per element
(per-axis along the last axis, blocked along any other axis). Any element range can be processed on
its own, so `threads.run_chunked` splits [0, n) between threads (the serial kernels release the GIL).
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading

import numpy as np

from ..dtypes import ElementType
from ..granularity import Granularity
from . import output_pool, threads

# numba is a dependency, but importing it costs more than `import qlinear` may: it is imported by the
# first kernel call (`_numba`), and its absence only means the reference runs.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
_compiled = None


def _numba():
    global _compiled
    if _compiled is None:
        from . import _quantize_linear_numba

        _compiled = _quantize_linear_numba
    return _compiled


# ----------------------------------------------------------------------------------------------- switch
_enabled = True
_local = threading.local()


def kernels_enabled() -> bool:
    forced = getattr(_local, "enabled", None)
    return HAVE_NUMBA and (_enabled if forced is None else forced)


@contextlib.contextmanager
def use_kernels(flag: bool):
    """Inside the block (in this thread), run the kernels (True) or the NumPy reference (False)."""
    old = getattr(_local, "enabled", None)
    _local.enabled = bool(flag)
    try:
        yield
    finally:
        _local.enabled = old


def set_kernels_enabled(flag: bool) -> None:
    """Process-wide default for `use_kernels` (benchmarks compare both paths with it)."""
    global _enabled
    _enabled = bool(flag)


# ----------------------------------------------------------------------------------------------- layout
def _layout(gran: Granularity, size: int) -> tuple:
    """(row_len, seg_len, per_element, rL, rA, rB, rC): row r of x (row_len contiguous elements) takes its
    parameters from offset ``(r // rL) * rA + ((r % rL) // rB) * rC`` of the flattened scale; within the
    row, element j uses offset + j (per_element) or offset + j // seg_len."""
    shape = gran.x_shape
    if gran.kind == "tensor":
        n = max(size, 1)
        return n, n, False, 1, 0, 1, 0
    axis = gran.axis
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    length = shape[axis]
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    if gran.kind == "axis":
        if inner == 1:
            return length, length, True, 1, 0, 1, 0
        return inner, inner, False, length, 0, 1, 1
    blocks = -(-length // gran.block_size)
    if inner == 1:
        return length, gran.block_size, False, 1, blocks, 1, 0
    return inner, inner, True, length, blocks * inner, gran.block_size, inner


def _flat(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1)


# Tags that select code paths at compile time (numba specialises on argument types).
_PRECISION_TAG = {
    np.dtype(np.float32): np.float32(0),
    np.dtype(np.float64): np.float64(0),
    np.dtype(np.float16): np.uint16(0),  # uint16 stands for float16 bits
}
_STORAGE_VIEW = {  # how a float16/bfloat16 array is handed to numba: raw bits, told apart by signedness
    "float16": np.uint16,
    "bfloat16": np.int16,
}


def _precision_tag(precision: np.dtype):
    if precision.name == "bfloat16":
        return np.int16(0)  # int16 stands for bfloat16 bits
    return _PRECISION_TAG[np.dtype(precision)]


def _carrier(precision: np.dtype) -> np.dtype:
    """The type the kernels compute in for a precision: float64 for float64, else float32."""
    return np.dtype(np.float64) if np.dtype(precision) == np.float64 else np.dtype(np.float32)


def _as_kernel_input(x: np.ndarray) -> np.ndarray:
    view = _STORAGE_VIEW.get(x.dtype.name)
    flat = _flat(x)
    return flat.view(view) if view is not None else flat


def _byte_view(t: ElementType) -> np.dtype | None:
    """For the ml_dtypes integer and small-float types: the byte view the kernels read/write."""
    if t.is_small_float or (t.is_integer and t.bits < 8):
        return np.dtype(np.uint8)
    return None


def _run(kernel: str, n: int, *args):
    """Run the serial nogil kernel ``<kernel>_serial`` over [0, n), in chunks on several threads."""
    threads.run_chunked(getattr(_numba(), kernel + "_serial"), n, *args)


# ----------------------------------------------------------------------------------------------- public
def quantize_linear(x, y_scale, y_zero_point, granularity: Granularity, output: ElementType, saturate: bool,
                    precision: np.dtype):
    if not kernels_enabled():
        return None
    if x.dtype.name not in ("float32", "float16", "bfloat16", "int32"):
        return None
    if np.dtype(precision).name not in ("float32", "float16", "bfloat16", "float64"):
        return None
    out = output_pool.empty(x.shape, output.dtype)
    n = x.size
    if n == 0:
        return out
    carrier = _carrier(precision)
    tag = _precision_tag(np.dtype(precision))
    geometry = tuple(np.int64(v) if not isinstance(v, bool) else v for v in _layout(granularity, n))
    scale = _flat(y_scale).astype(precision, copy=False).astype(carrier, copy=False)  # no copy for float32
    xin = _as_kernel_input(x)
    view = _byte_view(output)
    out_flat = out.reshape(-1)
    out_k = out_flat.view(view) if view is not None else out_flat

    if output.is_integer:
        wide = np.dtype(np.float64) if (carrier == np.float64 or output.bits > 16) else np.dtype(np.float32)
        if y_zero_point is None:
            zp = np.zeros(scale.size, wide)
        else:
            zp = _flat(y_zero_point).astype(wide)  # exact: every integer zero point fits the wide type
        mask = np.int32((1 << output.bits) - 1 if output.bits < 8 else -1)
        lo, hi = wide.type(output.qmin), wide.type(output.qmax)
        _run("_q_int", n, xin, scale, zp, out_k, *geometry, tag, lo, hi, mask)
        return out

    if not output.is_small_float:
        return None
    from .small_float import SmallFloatFormat

    fmt = SmallFloatFormat.of(output).args(bool(saturate))
    add_zp = y_zero_point is not None
    zp = _flat(y_zero_point).astype(precision).astype(carrier, copy=False) if add_zp else np.zeros(scale.size, carrier)
    _run("_q_float", n, xin, scale, zp, out_k, *geometry, tag, add_zp, fmt)
    return out


_DECODE_TABLES: dict[np.dtype, np.ndarray] = {}


def _decode_table(t: ElementType) -> np.ndarray:
    table = _DECODE_TABLES.get(t.dtype)
    if table is None:
        with np.errstate(invalid="ignore"):
            table = np.arange(256, dtype=np.uint8).view(t.dtype).astype(np.float32)
        _DECODE_TABLES[t.dtype] = table
    return table


def dequantize_linear(x, x_type: ElementType, x_scale, x_zero_point, granularity: Granularity,
                      output: ElementType):
    if not kernels_enabled():
        return None
    if output.onnx_name not in ("float", "float16", "bfloat16"):
        return None
    out = output_pool.empty(x.shape, output.dtype)
    n = x.size
    if n == 0:
        return out
    geometry = tuple(np.int64(v) if not isinstance(v, bool) else v for v in _layout(granularity, n))
    scale = _flat(x_scale).astype(np.float32, copy=False)
    out_flat = out.reshape(-1)
    view = _STORAGE_VIEW.get(output.dtype.name)
    out_k = out_flat.view(view) if view is not None else out_flat
    view = _byte_view(x_type)
    xin = _flat(x).view(view) if view is not None else _flat(x)

    if x_type.is_integer:
        zp_type = np.int64 if x_type.bits > 16 else np.int32
        zp = np.zeros(scale.size, zp_type) if x_zero_point is None else _flat(x_zero_point).astype(zp_type)
        if x_type.bits < 8:
            mask = np.int32((1 << x_type.bits) - 1)
            sign = np.int32(1 << (x_type.bits - 1)) if x_type.qmin < 0 else np.int32(0)
        else:
            mask, sign = np.int32(-1), np.int32(0)
        table = np.zeros(1, np.float32)
    elif x_type.is_small_float:
        zp = np.zeros(scale.size, np.float32) if x_zero_point is None else _flat(x_zero_point).astype(np.float32)
        mask, sign = np.int32(255), np.int32(0)
        table = _decode_table(x_type)
    else:
        return None
    _run("_dq", n, xin, scale, zp, out_k, *geometry, mask, sign, table)
    return out
