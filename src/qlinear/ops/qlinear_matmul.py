"""ONNX QLinearMatMul-10/21 and MatMulInteger-10: arguments, shape rules, opset rules, dispatch.

Both operators share the accumulator ``(a - a_zero_point) @ (b - b_zero_point)`` with numpy.matmul's
broadcasting, computed by :func:`_matmul_accumulate` on the exact integer GEMM kernels
(:mod:`qlinear.kernels.integer_gemm`, one GEMM per batch matrix, b packed once when it has no batch
dimensions), with QLinearMatMul's requantization fused into the store. The int64 NumPy reference
(:mod:`qlinear.reference.matmul`) is what the kernels equal bit for bit.

QLinearMatMul-21 with a float8 a, b or y (each independently) takes another route: the exact sum of the
products rounded once to float64 (:mod:`qlinear.kernels.float8_gemm`, equal bit for bit to the exact-integer
reference :mod:`qlinear.reference.matmul_float8`), then ``"float64"`` requantization; float8 zero points must
be 0. See that reference's docstring and docs/semantics.md.

Granularity (the spec's text): a's scale and zero point are per tensor or per row, b's per tensor or per
column. Per row of a 2-D a (M, K) is an M-vector or (M, 1); of an N-D a (D1, .., M, K) it is (D1, .., M, 1),
where any leading dimension may also be 1 (shared). Per column of b (.., K, N) is an N-vector or
(D1, .., 1, N). y's scale and zero point are per tensor.
"""

from __future__ import annotations

import numbers
import weakref

import ml_dtypes
import numpy as np

from qlinear.ops import _quant_args as qa
from qlinear.ops._quant_args import AccumulatorOverflowError
from qlinear.reference.matmul_float8 import FLOAT8_TYPES, centered, fraction_bits, matmul_accumulate_exact, requantize_to_output
from qlinear.reference.requantize import FUSED_MODES, REQUANTIZE_MODES, arithmetic, requantize_multiplier
from qlinear.reference.requantize import requantize as _requantize

__all__ = ["qlinear_matmul", "matmul_integer", "prepack_matmul", "PackedMatMul", "AccumulatorOverflowError"]

# What each QLinearMatMul opset allows for the scales (TS; one type for all three). Keys are since_version.
QLINEAR_MATMUL_SCALE_TYPES = {
    10: (np.dtype(np.float32),),
    21: (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)),
}
# What each opset allows for a (T1), b (T2) and y (T3), independently.
QLINEAR_MATMUL_TENSOR_TYPES = {
    10: qa.INT8_TYPES,
    21: qa.INT8_TYPES + FLOAT8_TYPES,
}
LATEST_QLINEAR_MATMUL_OPSET = max(QLINEAR_MATMUL_SCALE_TYPES)


def _matmul_accumulate(a, a_zero_point, b, b_zero_point, requant=None) -> np.ndarray:
    """Exact int32 accumulator ``(a - a_zero_point) @ (b - b_zero_point)``, or with ``requant``
    ``(multiplier, y_zero_point, y_dtype, mode)`` its requantization, fused into the GEMM's store.

    a: (..., M, K), b: (..., K, N), both at least 2-D, int8/uint8; a_zero_point: 0-d or broadcastable
    (..., M, 1) of a's dtype; b_zero_point: 0-d, (N,) or (..., 1, N) of b's dtype; the multiplier
    broadcasts against the (..., M, N) result.
    """
    from qlinear.kernels import integer_gemm  # imports numba: on first use, never at `import qlinear`

    (m, k), n = a.shape[-2:], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_b = np.broadcast_to(a, batch + (m, k))
    b_b = np.broadcast_to(b, batch + (k, n))
    a_zp = np.asarray(a_zero_point)
    a_zp = np.broadcast_to(a_zp.reshape(1, 1) if a_zp.ndim == 0 else a_zp, batch + (m, 1))
    b_zp = np.asarray(b_zero_point)
    b_zp = np.broadcast_to(b_zp.reshape(1, -1) if b_zp.ndim <= 1 else b_zp, batch + (1, n))
    out_dtype = np.int32 if requant is None else requant[2]
    out = np.empty(batch + (m, n), out_dtype)
    multiplier = None if requant is None else np.broadcast_to(np.asarray(requant[0]), batch + (m, n))
    shared_b = b.ndim == 2  # constant weights: packed once
    packed = _packed(b, np.ascontiguousarray(b_zp[(0,) * len(batch)].reshape(-1))) if shared_b else None
    for index in np.ndindex(*batch):
        weights = packed if shared_b else integer_gemm.pack_weights(b_b[index], b_zp[index].reshape(-1))
        rq = None
        if requant is not None:
            rq = (_compact(multiplier[index]), requant[1], requant[2], requant[3])
        # into out's own slice: a result array per product, copied, cost the copy and at times made glibc trim
        # the heap and fault the pages back on every call (3136 x 64 x 64 matmul_integer, 1 thread: 290-940 us
        # before, 262-277 after, the product itself 205-212)
        integer_gemm.gemm(a_b[index], a_zp[index].reshape(-1), weights, requant=rq, out=out[index])
    return out


def _packed(b, zp: np.ndarray):
    """2-D weights ``b`` packed with their zero points ``zp`` (1-D): a `PackedMatMul`'s own packing when ``b`` is
    its frozen weights, else an equal array's packing when one was made (kernels/packing_cache.py compares the
    bytes)."""
    from qlinear.kernels import integer_gemm, packing_cache

    extra = (zp.dtype.str, zp.tobytes())
    owner = _FROZEN.get(id(b))
    if owner is not None and owner.weights is b and owner.extra == extra and not b.flags.writeable:
        return owner.packing
    return packing_cache.packed("gemm", b, extra, lambda copy: integer_gemm.pack_weights(copy, zp))


class PackedMatMul:
    """`prepack_matmul`'s result: 2-D weights packed once. ``weights`` is a read-only copy of them."""

    __slots__ = ("weights", "extra", "packing", "__weakref__")

    def __init__(self, weights: np.ndarray, zero_point: np.ndarray, packing):
        self.weights, self.extra, self.packing = weights, (zero_point.dtype.str, zero_point.tobytes()), packing

    @property
    def shape(self) -> tuple:
        return self.weights.shape

    @property
    def dtype(self) -> np.dtype:
        return self.weights.dtype

    def __repr__(self) -> str:
        return f"PackedMatMul(shape={self.weights.shape}, dtype={self.weights.dtype})"


# id(weights) -> the PackedMatMul that owns them (gone with it)
_FROZEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def prepack_matmul(b, b_zero_point=None) -> PackedMatMul:
    """Pack 2-D matmul weights once, for repeated `qlinear_matmul` / `matmul_integer` calls.

    Pass the result as ``b`` (with the same ``b_zero_point``): the packing is then taken as it is, where a plain
    array is compared with the packing cache's copy byte by byte on every call (about 30 us per MB), as runtimes
    take constant weights. The result holds a read-only copy of ``b`` (``.weights``); changing ``b`` afterwards
    changes nothing. With another ``b_zero_point`` the call packs as for a plain array (same result).

    >>> import numpy as np, qlinear
    >>> packed = qlinear.prepack_matmul(np.full((3, 2), 2, np.int8), np.int8(0))
    >>> qlinear.matmul_integer(np.array([[1, 2, 3]], np.uint8), packed, np.uint8(0), np.int8(0))
    array([[12, 12]], dtype=int32)
    """
    from qlinear.kernels import integer_gemm  # imports numba: on first use, never at `import qlinear`

    func = "prepack_matmul"
    b = qa.quantized_tensor(func, "b", b)
    if b.ndim != 2:
        raise ValueError(f"{func}: b must be 2-D (K, N), got shape {b.shape}")
    zp = _column_param(func, "b_zero_point", qa.zero_point(func, "b_zero_point", b_zero_point, b.dtype, "b"), b, "b")
    zp = np.ascontiguousarray(np.asarray(zp).reshape(-1))  # as a call's preparation holds it (_PreparedMatMul)
    weights = np.array(b, order="C", copy=True)
    weights.flags.writeable = False
    packed = PackedMatMul(weights, zp, integer_gemm.pack_weights(weights, zp))
    _FROZEN[id(weights)] = packed
    return packed


def _unpacked(b):
    """A `PackedMatMul`'s frozen weights (what the checks read, and `_packed` recognizes), or ``b`` itself."""
    return b.weights if type(b) is PackedMatMul else b


class _PreparedMatMul:
    """A 2-D int8/uint8 call's normalised zero points and requantization, kept under the key of its arguments
    (`qa.fingerprint`): a repeated call (inference, the same scales) skips the checks and the set-up, ~70% of a
    small product's time, and, with the same packed weights, the GEMM's own set-up (its `GemmLaunch`). b's
    content is not in the key: the packing cache compares it on every call."""

    def __init__(self, a_zero_point, b_zero_point, requant):
        self.a_zp = np.ascontiguousarray(np.asarray(a_zero_point).reshape(-1))
        self.b_zp = np.ascontiguousarray(np.asarray(b_zero_point).reshape(-1))
        self.requant = requant
        self.launch = None  # (integer_gemm.GemmLaunch, the kernel path it was made for): repeated with a new a

    def __call__(self, a, b):
        from qlinear.kernels import integer_gemm

        packed = _packed(b, self.b_zp)
        path = integer_gemm.current_path()
        kept = self.launch
        if kept is not None and kept[0].packed is packed and kept[1] == path:
            return kept[0].run(a)  # a's shape and type are in this object's key
        launch, result = integer_gemm.gemm_launch(a, self.a_zp, packed, requant=self.requant)
        if launch is None:
            return result
        if launch.reusable:
            self.launch = (launch, path)
        return launch.run(a)


_PREPARED: dict = {}
_PREPARED_MAX = 64
# The last repeated call's arguments (`qa.LastCall`): checking a call against them costs less than its key.
_LAST: list = [None]


def _prepared_key(a, b, *arguments):
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.ndim != 2 or b.ndim != 2 \
            or a.dtype not in qa.INT8_TYPES or b.dtype not in qa.INT8_TYPES:
        return None
    return qa.call_key((a.shape, a.dtype, b.shape, b.dtype), arguments)


def _compact(multiplier: np.ndarray) -> np.ndarray:
    """A broadcast (M, N) multiplier in the smallest form the GEMM's store takes: scalar, (N,), (M, 1)."""
    if multiplier.strides == (0, 0):
        return multiplier[0, 0]
    if multiplier.strides[0] == 0:
        return np.ascontiguousarray(multiplier[0])
    if multiplier.strides[1] == 0:
        return np.ascontiguousarray(multiplier[:, :1])
    return np.ascontiguousarray(multiplier)


def _as_matrices(func: str, a: np.ndarray, b: np.ndarray, a_name: str, b_name: str):
    """numpy.matmul's 1-D promotion, and the shape checks, with messages naming the arguments."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{func}: {a_name} and {b_name} must have at least 1 dimension, got shapes {a.shape} and {b.shape}")
    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(
            f"{func}: the last dimension of {a_name} ({a2.shape[-1]}) must equal the "
            f"{'first' if b.ndim == 1 else 'second-to-last'} dimension of {b_name} ({b2.shape[-2]})"
        )
    try:
        np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(
            f"{func}: the batch dimensions of {a_name} {a.shape[:-2]} and {b_name} {b.shape[:-2]} do not broadcast"
        ) from None
    return a2, b2


def _row_param(func: str, name: str, value: np.ndarray, a2: np.ndarray, a_name: str) -> np.ndarray:
    """Per tensor (0-d) or per row of a: returned with a shape that broadcasts against a and the result."""
    if qa.is_per_tensor(value):
        return value.reshape(())
    rows = a2.shape[-2]
    if a2.ndim == 2 and value.ndim == 1 and value.shape[0] == rows:
        return value.reshape(rows, 1)
    if value.ndim == a2.ndim and value.shape[-1] == 1 and all(v in (1, d) for v, d in zip(value.shape[:-1], a2.shape[:-1])):
        return value
    expected = f"({rows},) or ({rows}, 1)" if a2.ndim == 2 else str(a2.shape[:-1] + (1,))
    raise ValueError(
        f"{func}: {name} must be a scalar (per tensor) or per row of {a_name}, shape {expected}, got shape {value.shape}"
    )


def _column_param(func: str, name: str, value: np.ndarray, b2: np.ndarray, b_name: str) -> np.ndarray:
    """Per tensor (0-d) or per column of b: returned with a shape that broadcasts against b and the result."""
    if qa.is_per_tensor(value):
        return value.reshape(())
    columns = b2.shape[-1]
    if value.ndim == 1 and value.shape[0] == columns:
        return value
    if value.ndim == b2.ndim and value.shape[-2] == 1 and value.shape[-1] == columns and all(
        v in (1, d) for v, d in zip(value.shape[:-2], b2.shape[:-2])
    ):
        return value
    expected = f"({columns},)" if b2.ndim == 2 else f"({columns},) or {b2.shape[:-2] + (1, columns)}"
    raise ValueError(
        f"{func}: {name} must be a scalar (per tensor) or per column of {b_name}, shape {expected}, got shape {value.shape}"
    )


def _restore_vector_axes(result: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Undo the 1-D promotion, as numpy.matmul does."""
    if b.ndim == 1:
        result = result[..., 0]
    if a.ndim == 1:
        result = result[..., 0, :] if b.ndim != 1 else result[..., 0]
    return result


def qlinear_matmul(
    a,
    a_scale,
    a_zero_point,
    b,
    b_scale,
    b_zero_point,
    y_scale,
    y_zero_point,
    *,
    opset=None,
    requantize="float64",
) -> np.ndarray:
    """ONNX QLinearMatMul (opset 10 or 21): quantized numpy.matmul with int8/uint8 a, b and y, and at
    opset 21 also float8 (ml_dtypes float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz) a, b
    and/or y, in any combination.

    ``y = saturate(round(acc * a_scale * b_scale / y_scale) + y_zero_point)`` with ``acc`` the exact int32
    ``(a - a_zero_point) @ (b - b_zero_point)``. Scales are float32 (opset 10) or float32/float16/bfloat16
    (opset 21, the default when ``opset`` is None), all three of one type. ``requantize="float64"``
    (default) reproduces the onnx reference evaluator, ``"float32"`` onnxruntime, ``"tflite"`` /
    ``"tflite-single"`` TFLite's QuantizeMultiplier and fixed-point multiply (its FULLY_CONNECTED kernels
    before 2025; the default and the single-rounding build), ``"xnnpack"`` XNNPACK's (equal to "float32");
    see docs/semantics.md and docs/tflite_conv.md.
    Raises AccumulatorOverflowError (a ValueError and OverflowError) when the exact accumulator leaves int32.

    With any float8 a, b or y (no peer computes these; qlinear's semantics, docs/semantics.md): a float8
    zero point must be 0; ``acc`` is the exact real sum of the products rounded once (to nearest even) to
    float64, ``v = acc * float64(a_scale * b_scale / y_scale) + y_zero_point`` in float64, and a float8 y is
    ``v`` rounded once to nearest even, saturating (QuantizeLinear's saturate=1: NaN stays NaN), an int8/uint8
    y as above (NaN gives the type minimum). Only ``requantize="float64"``; no int32 limit on ``acc``, but
    K is limited (about 2.7 million for e5m2 x e5m2, more for the e4m3 types).
    """
    func = "qlinear_matmul"
    what = "(a - a_zero_point) @ (b - b_zero_point)"
    b = _unpacked(b)
    arguments = (a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point, opset, requantize)
    last = _LAST[0]
    if last is not None and type(a) is np.ndarray and type(b) is np.ndarray:
        prepared = last.matches((a.shape, a.dtype, b.shape, b.dtype), arguments)
        if prepared is not None:
            return qa.int32_kernel(func, what, prepared, a, b)
    key = _prepared_key(a, b, *arguments)
    prepared = _PREPARED.get(key) if key is not None else None
    if prepared is not None:
        if last is None or last.value is not prepared:
            _LAST[0] = qa.LastCall(key[:4], key[-2], arguments, prepared)
        return qa.int32_kernel(func, what, prepared, a, b)
    if opset is None:
        opset = LATEST_QLINEAR_MATMUL_OPSET
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise TypeError(f"{func}: opset must be an integer or None, got {type(opset).__name__}")
    if opset < min(QLINEAR_MATMUL_SCALE_TYPES):
        raise ValueError(f"{func}: opset must be >= {min(QLINEAR_MATMUL_SCALE_TYPES)} (QLinearMatMul's first version), got {opset}")
    since_version = max(v for v in QLINEAR_MATMUL_SCALE_TYPES if v <= opset)
    scale_types = QLINEAR_MATMUL_SCALE_TYPES[since_version]
    if not isinstance(requantize, str) or requantize not in REQUANTIZE_MODES:
        raise ValueError(f"{func}: requantize must be one of {', '.join(map(repr, REQUANTIZE_MODES))}, got {requantize!r}")

    tensor_types = QLINEAR_MATMUL_TENSOR_TYPES[since_version]
    for name, value in (("a", a), ("b", b), ("y_zero_point", y_zero_point)):
        if getattr(value, "dtype", None) in FLOAT8_TYPES and value.dtype not in tensor_types:
            raise TypeError(
                f"{func}: float8 {name} ({value.dtype}) needs QLinearMatMul-21 (opset >= 21); "
                f"QLinearMatMul-{since_version} allows uint8 or int8, got opset {opset}"
            )
    a = qa.quantized_tensor(func, "a", a, tensor_types)
    b = qa.quantized_tensor(func, "b", b, tensor_types)
    y_zero_point = qa.output_zero_point(func, "y_zero_point", y_zero_point, tensor_types)
    float8_operands = [(name, value.dtype) for name, value in (("a", a), ("b", b), ("y_zero_point", y_zero_point))
                       if value.dtype in FLOAT8_TYPES]
    if float8_operands and requantize != "float64":
        name, dtype = float8_operands[0]
        raise ValueError(
            f"{func}: requantize={requantize!r} is not defined with a float8 {name} ({dtype}): no runtime but "
            "the onnx reference implements a float8 QLinearMatMul; use requantize='float64'"
        )
    a2, b2 = _as_matrices(func, a, b, "a", "b")

    a_scale = _row_param(func, "a_scale", qa.scale(func, "a_scale", a_scale, scale_types), a2, "a")
    b_scale = _column_param(func, "b_scale", qa.scale(func, "b_scale", b_scale, scale_types), b2, "b")
    y_scale = qa.require_per_tensor(func, "y_scale", qa.scale(func, "y_scale", y_scale, scale_types))
    if not a_scale.dtype == b_scale.dtype == y_scale.dtype:
        raise TypeError(
            f"{func}: a_scale, b_scale and y_scale must share one dtype (TS), got "
            f"{a_scale.dtype}, {b_scale.dtype}, {y_scale.dtype}"
        )
    a_zero_point = _row_param(func, "a_zero_point", _zero_point(func, "a_zero_point", a_zero_point, a.dtype, "a"), a2, "a")
    b_zero_point = _column_param(func, "b_zero_point", _zero_point(func, "b_zero_point", b_zero_point, b.dtype, "b"), b2, "b")
    y_zero_point = qa.require_per_tensor(func, "y_zero_point", y_zero_point)
    if y_zero_point.dtype in FLOAT8_TYPES:
        _require_zero(func, "y_zero_point", y_zero_point, "y")

    requantize = arithmetic(requantize)
    with np.errstate(over="ignore", under="ignore"):  # an infinite multiplier is reported just below
        multiplier = requantize_multiplier(a_scale, b_scale, y_scale, requantize, a.dtype)
    qa.check_multiplier(func, multiplier, "a_scale * b_scale / y_scale")
    if float8_operands:
        acc = _float8_accumulate(func, a2, a_zero_point, b2, b_zero_point)
        return _restore_vector_axes(requantize_to_output(acc, multiplier, y_zero_point), a, b)
    if requantize not in FUSED_MODES:
        acc = qa.int32_kernel(func, what, _matmul_accumulate, a2, a_zero_point, b2, b_zero_point)
        return _restore_vector_axes(_requantize(acc, multiplier, y_zero_point, requantize), a, b)
    requant = (multiplier, y_zero_point, y_zero_point.dtype, requantize)
    if key is not None:  # 2-D int8/uint8 operands: kept for the next call with these arguments
        m, n = a.shape[0], b.shape[1]
        prepared = _PreparedMatMul(a_zero_point, b_zero_point, (_compact(np.broadcast_to(multiplier, (m, n))),
                                                                 y_zero_point, y_zero_point.dtype, requantize))
        qa.keep(_PREPARED, key, prepared, _PREPARED_MAX)
        return qa.int32_kernel(func, what, prepared, a, b)
    y = qa.int32_kernel(func, what, _matmul_accumulate, a2, a_zero_point, b2, b_zero_point, requant=requant)
    return _restore_vector_axes(y, a, b)


def _require_zero(func: str, name: str, value: np.ndarray, partner: str) -> None:
    # The float8 QuantizeLinear formula is used with a zero point of 0, and neither peer applies one.
    if not np.all(value.astype(np.float64) == 0):
        raise ValueError(f"{func}: {name} of a float8 {partner} must be 0 (+0 or -0), got {value.tolist()}")


def _zero_point(func: str, name: str, value, dtype, partner: str) -> np.ndarray:
    """An input zero point: as `qa.zero_point` for int8/uint8; for a float8 partner it must be 0."""
    if np.dtype(dtype) not in FLOAT8_TYPES:
        return qa.zero_point(func, name, value, dtype, partner)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.generic)):
        if value != 0:
            raise ValueError(f"{func}: {name} of a float8 {partner} must be 0 (+0 or -0), got {value}")
        value = None
    value = qa.zero_point(func, name, value, dtype, partner)
    _require_zero(func, name, value, partner)
    return value


def _float8_accumulate(func: str, a2, a_zero_point, b2, b_zero_point) -> np.ndarray:
    """The exact float8 accumulator rounded once to float64, on the kernel (the reference without numba)."""
    from qlinear.kernels import float8_gemm  # imports numba: on first use, never at `import qlinear`

    depth, limit = a2.shape[-1], float8_gemm.max_depth(a2.dtype, b2.dtype)
    if depth > limit:
        raise ValueError(
            f"{func}: K = {depth} is too long for the exact float8 accumulator of {a2.dtype} x {b2.dtype} "
            f"(at most {limit})"
        )
    if not float8_gemm.HAVE_NUMBA:  # pragma: no cover - numba is a dependency
        return matmul_accumulate_exact(a2, a_zero_point, b2, b_zero_point)
    return float8_gemm.exact_matmul(centered(a2, a_zero_point), centered(b2, b_zero_point),
                                    fraction_bits(a2.dtype) + fraction_bits(b2.dtype),
                                    split=depth > float8_gemm.single_accumulator_depth(a2.dtype, b2.dtype))


def matmul_integer(A, B, a_zero_point=None, b_zero_point=None) -> np.ndarray:
    """ONNX MatMulInteger-10: the exact int32 ``(A - a_zero_point) @ (B - b_zero_point)``.

    Zero points default to 0; a_zero_point may be per row of A, b_zero_point per column of B. Raises
    AccumulatorOverflowError (a ValueError and OverflowError) when the exact sum leaves int32 instead of wrapping.
    """
    func = "matmul_integer"
    B = _unpacked(B)
    A = qa.quantized_tensor(func, "A", A)
    B = qa.quantized_tensor(func, "B", B)
    a2, b2 = _as_matrices(func, A, B, "A", "B")
    a_zero_point = _row_param(func, "a_zero_point", qa.zero_point(func, "a_zero_point", a_zero_point, A.dtype, "A"), a2, "A")
    b_zero_point = _column_param(func, "b_zero_point", qa.zero_point(func, "b_zero_point", b_zero_point, B.dtype, "B"), b2, "B")
    acc = qa.int32_kernel(func, "(A - a_zero_point) @ (B - b_zero_point)", _matmul_accumulate,
                          a2, a_zero_point, b2, b_zero_point)
    return _restore_vector_axes(acc, A, B)
