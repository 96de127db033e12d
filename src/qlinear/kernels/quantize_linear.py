"""Fast QuantizeLinear and DequantizeLinear: one multithreaded pass, no full-size temporaries.

Internal API, called by `qlinear.ops.quantize_linear` with validated arguments (the same ones the
NumPy reference in `qlinear.reference.quantize_linear` takes):

``quantize_linear(x, y_scale, y_zero_point, granularity, output, saturate, precision, out=None)``
``dequantize_linear(x, x_type, x_scale, x_zero_point, granularity, output, out=None)``
    The result, bit-identical to the reference, or None when no kernel covers the case (numba missing,
    or the kernels switched off with `use_kernels(False)`); the caller then runs the reference.
    ``out``: None (the result is allocated here), or the array the result is written into and returned,
    checked by the caller (`qlinear._out.check`): a plain C-contiguous, aligned, writeable ndarray of the
    result's shape and dtype that shares no memory with the inputs. Nothing is written into it when the
    answer is None.

How the arithmetic stays the reference's
    - x is loaded in its own type (float16/bfloat16 as raw bits, widened exactly) and rounded to the
      division precision; the scale and zero point, which are small, are converted to that precision
      before the loop, exactly as the reference converts them (with NumPy; large 1-byte arrays, such as
      float8 zero points or e8m0 scales per block, through a table of the same conversions, `_converted`).
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
      by bit manipulation (`small_float.decode_small_float`), every byte as ml_dtypes widens it.

Layout: x (C-contiguous) is walked as rows of contiguous elements; each row takes its scale either
per segment (per-tensor, per-axis with the axis not last, blocked along the last axis) or per element
(per-axis along the last axis, blocked along any other axis). Any element range can be processed on
its own, so `threads.run_chunked` splits [0, n) between threads (the serial kernels release the GIL).
Long runs and per-element rows are walked in blocks of 128 elements, requesting the cache lines 8 KB ahead
(`_prefetch`, which gives the measurements): on one core the hardware prefetchers left the memory idle. Runs
of short segments request them once per 128 elements too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import threading

import numpy as np

from .. import dtypes
from ..dtypes import ElementType
from ..granularity import Granularity
from . import output_pool, threads
from ._arguments import read_only

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


class _Local(threading.local):
    # A class attribute, so that a thread that never entered `use_kernels` reads None without the
    # AttributeError that getattr(local, name, None) raises and catches inside (a third of a microsecond).
    enabled: bool | None = None  # per thread: None (the process-wide default), True or False


_local = _Local()


def kernels_enabled() -> bool:
    forced = _local.enabled
    return HAVE_NUMBA and (_enabled if forced is None else forced)


@contextlib.contextmanager
def use_kernels(flag: bool):
    """Inside the block (in this thread), run the kernels (True) or the NumPy reference (False)."""
    old = _local.enabled
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
    row, element j uses offset + j (per_element) or offset + j // seg_len.

    Python ints, which numba types as int64 just as it does np.int64 scalars (the same compiled
    signature), without the cost of building the scalars on every call."""
    shape = gran.x_shape
    if gran.kind == "tensor":
        n = max(size, 1)
        return n, n, False, 1, 0, 1, 0
    axis = gran.axis
    outer = math.prod(shape[:axis])
    length = shape[axis]
    inner = math.prod(shape[axis + 1:])
    if gran.kind == "axis":
        if inner == 1:
            return length, length, True, 1, 0, 1, 0
        return inner, inner, False, length, 0, 1, 1
    blocks = -(-length // gran.block_size)
    if inner == 1:
        return length, gran.block_size, False, 1, blocks, 1, 0
    return inner, inner, True, length, blocks * inner, gran.block_size, inner


def _flat(array: np.ndarray) -> np.ndarray:
    # ravel: C-contiguous and 1-D, a view when x already is contiguous (reshape(-1) would keep the
    # strides of a strided 1-D array)
    return array.ravel()


_empty = output_pool.empty_result


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_F16, _BF16 = np.dtype(np.float16), dtypes.get("bfloat16").dtype

# Per division precision: (tag, carrier). The tag selects the code path at compile time (numba specialises
# on argument types): uint16 stands for float16 bits, int16 for bfloat16 bits. The carrier is the type the
# kernels compute in: float64 for float64, else float32. A precision not listed here has no kernel.
_PRECISIONS = {
    _F32: (np.float32(0), _F32),
    _F64: (np.float64(0), _F64),
    _F16: (np.uint16(0), _F32),
    _BF16: (np.int16(0), _F32),
}
# How float16/bfloat16 arrays are handed to numba: raw bits, told apart by signedness. The keys are also
# the x (quantize) and output (dequantize) types the kernels take.
_STORAGE_VIEW = {_F32: None, _F16: np.uint16, _BF16: np.int16}
_Q_INPUT_VIEW = {**_STORAGE_VIEW, np.dtype(np.int32): None}


def _byte_view(t: ElementType) -> np.dtype | None:
    """For the ml_dtypes integer and small-float types: the byte view the kernels read/write."""
    if t.is_small_float or (t.is_integer and t.bits < 8):
        return np.dtype(np.uint8)
    return None


_BYTE_VIEW: dict[np.dtype, np.dtype | None] = {t.dtype: _byte_view(t) for t in dtypes.TYPES}


def _int_output_constants(output: ElementType, wide: np.dtype) -> tuple:
    """(lo, hi, mask) of an integer output: its bounds in the wide type, and the bits it keeps."""
    key = (output.dtype, wide)
    constants = _INT_OUTPUT_CONSTANTS.get(key)
    if constants is None:
        mask = np.int32((1 << output.bits) - 1 if output.bits < 8 else -1)
        constants = wide.type(output.qmin), wide.type(output.qmax), mask
        _INT_OUTPUT_CONSTANTS[key] = constants
    return constants


_INT_OUTPUT_CONSTANTS: dict[tuple, tuple] = {}
_SMALL_FLOAT_ARGS: dict[tuple, tuple] = {}  # (output dtype, saturate) -> encode_small_float's arguments


def _small_float_args(output: ElementType, saturate: bool) -> tuple:
    key = (output.dtype, saturate)
    args = _SMALL_FLOAT_ARGS.get(key)
    if args is None:
        from .small_float import SmallFloatFormat

        args = _SMALL_FLOAT_ARGS[key] = SmallFloatFormat.of(output).args(saturate)
    return args


_CODE_TABLES: dict[tuple, np.ndarray] = {}  # (1-byte dtype, conversion chain) -> the chain applied to every code
_TABLE_FROM = 1024  # below this many values astype is as fast as any table


def _converted(array: np.ndarray, *chain: np.dtype) -> np.ndarray:
    """``array`` flattened and converted through ``chain`` (astype after astype), as `astype` would.

    ml_dtypes converts its 1-byte types (float8/6/4 zero points, float8e8m0 scales) element by element:
    2.3-3.7 ms for 512K float8 codes, the blocks of 32 of a 16M-element tensor, as long as the kernel itself.
    Those go through a 256-entry table holding the same conversions of every code (so the same values, NaN
    payloads included), looked up by a numba loop (0.14 ms)."""
    flat = _flat(array)
    if flat.size < _TABLE_FROM or flat.dtype.itemsize != 1 or flat.dtype.kind in "iub":  # the common case first
        for dtype in chain:
            flat = flat.astype(dtype, copy=False)
        return flat
    key = (flat.dtype, chain)
    table = _CODE_TABLES.get(key)
    if table is None:
        table = np.arange(256, dtype=np.uint8).view(flat.dtype)
        with np.errstate(all="ignore"):
            for dtype in chain:
                table = table.astype(dtype)
        _CODE_TABLES[key] = table
    out = np.empty(flat.size, table.dtype)
    threads.run_chunked(_numba()._widen_codes_serial, flat.size, flat.view(np.uint8), table, out)
    return out


# ----------------------------------------------------------------------------------------------- public
def quantize_linear(x, y_scale, y_zero_point, granularity: Granularity, output: ElementType, saturate: bool,
                    precision: np.dtype, out: np.ndarray | None = None):
    if not kernels_enabled():
        return None
    if x.dtype not in _Q_INPUT_VIEW:
        return None
    precision = np.dtype(precision)
    tag_carrier = _PRECISIONS.get(precision)
    if tag_carrier is None:
        return None
    tag, carrier = tag_carrier
    n = x.size
    if out is None:
        out = _empty(x.shape, output.dtype, n)
    if n == 0:
        return out
    geometry = _layout(granularity, n)
    scale = _converted(y_scale, precision, carrier)  # no copy for float32
    xin = _flat(x)
    view = _Q_INPUT_VIEW[x.dtype]
    if view is not None:
        xin = xin.view(view)
    view = _BYTE_VIEW[output.dtype]
    out_flat = out.reshape(-1)
    out_k = out_flat.view(view) if view is not None else out_flat
    nb = _numba()

    if output.is_integer:
        wide = _F64 if (carrier is _F64 or output.bits > 16) else _F32
        if y_zero_point is None:
            zp = np.zeros(scale.size, wide)
        else:
            zp = _flat(y_zero_point).astype(wide)  # exact: every integer zero point fits the wide type
        lo, hi, mask = _int_output_constants(output, wide)
        threads.run_chunked(nb._q_int_walk, n, read_only(xin), read_only(scale), read_only(zp), out_k, *geometry,
                            tag, lo, hi, mask)
        return out

    if not output.is_small_float:
        return None
    fmt = _small_float_args(output, bool(saturate))
    # The rules that never read a zero point get the scales in its place: no array to allocate or convert
    # (converting 512K float4 zero points to float32 took 0.35 ms through ml_dtypes).
    if y_zero_point is None:
        zp, add_zp = scale, nb.ZP_NONE
    elif not _flat(y_zero_point).view(np.uint8).any():  # byte 0 is +0 in every float8/6/4 format
        zp, add_zp = scale, nb.ZP_ZERO
    else:
        zp = _converted(y_zero_point, precision, carrier)
        add_zp = nb.ZP_ADD_NAN if np.isnan(zp).any() else nb.ZP_ADD
    threads.run_chunked(nb._q_float_walk, n, read_only(xin), read_only(scale), read_only(zp), out_k, *geometry,
                        tag, add_zp, fmt)
    return out


_DQ_OUTPUTS = ("float", "float16", "bfloat16")
_DQ_INPUT_CONSTANTS: dict[np.dtype, tuple] = {}  # x dtype -> (zero point type, mask, sign, decoder)


def _dq_input_constants(x_type: ElementType) -> tuple | None:
    """How the kernel decodes x: the zero point's type, the code mask and sign bit of sub-byte integers, and
    the float8/6/4 decoder's arguments (an empty tuple for integers). None for a type the kernel does not take."""
    constants = _DQ_INPUT_CONSTANTS.get(x_type.dtype)
    if constants is not None:
        return constants
    if x_type.is_integer:
        zp_type = np.dtype(np.int64 if x_type.bits > 16 else np.int32)
        if x_type.bits < 8:
            mask = np.int32((1 << x_type.bits) - 1)
            sign = np.int32(1 << (x_type.bits - 1)) if x_type.qmin < 0 else np.int32(0)
        else:
            mask, sign = np.int32(-1), np.int32(0)
        constants = zp_type, mask, sign, ()
    elif x_type.is_small_float:
        from .small_float import decode_args

        constants = _F32, np.int32(255), np.int32(0), decode_args(x_type)
    else:
        return None
    _DQ_INPUT_CONSTANTS[x_type.dtype] = constants
    return constants


def dequantize_linear(x, x_type: ElementType, x_scale, x_zero_point, granularity: Granularity,
                      output: ElementType, out: np.ndarray | None = None):
    if not kernels_enabled():
        return None
    if output.onnx_name not in _DQ_OUTPUTS:
        return None
    n = x.size
    if out is None:
        out = _empty(x.shape, output.dtype, n)
    if n == 0:
        return out
    geometry = _layout(granularity, n)
    scale = _converted(x_scale, _F32)
    out_flat = out.reshape(-1)
    view = _STORAGE_VIEW[output.dtype]
    out_k = out_flat.view(view) if view is not None else out_flat
    view = _BYTE_VIEW[x_type.dtype]
    xin = _flat(x).view(view) if view is not None else _flat(x)

    constants = _dq_input_constants(x_type)
    if constants is None:
        return None
    zp_type, mask, sign, decoder = constants
    zp = np.zeros(scale.size, zp_type) if x_zero_point is None else _converted(x_zero_point, zp_type)
    threads.run_chunked(_numba()._dq_walk, n, read_only(xin), read_only(scale), read_only(zp), out_k, *geometry,
                        mask, sign, decoder)
    return out
