"""The type table: every element type qlinear handles, described once.

Each row gives the ONNX name, the NumPy/ml_dtypes dtype, the ONNX TensorProto number, the bit
width and, for integer types, the saturation range. Operators, kernels, the packer and the command
all read this table; nothing else spells out a type's properties.

`resolve_dtype` turns anything a user may pass for a type (a dtype, a dtype name in the ONNX or the
ml_dtypes spelling, a TensorProto number, an object with a ``.name``) into a table row.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class ElementType:
    """One element type.

    ``kind`` is "int" for the integer types, "float" for the IEEE-like floats (float32/16, bfloat16),
    "float8"/"float6"/"float4" for the small float formats, and "e8m0" for the exponent-only scale type.
    """

    onnx_name: str  # the TensorProto name, lower case: "int4", "float8e4m3fn"
    dtype: np.dtype
    tensorproto: int
    bits: int
    kind: str
    qmin: int | None = None  # integer saturation range
    qmax: int | None = None
    tf_name: str | None = None  # TensorFlow's quantized type of the same width ("qint8"), if any

    @property
    def name(self) -> str:
        """The NumPy/ml_dtypes name ("int4", "float8_e4m3fn")."""
        return self.dtype.name

    @property
    def is_integer(self) -> bool:
        return self.kind == "int"

    @property
    def is_small_float(self) -> bool:
        """float8, float6 and float4: the quantized float formats."""
        return self.kind in ("float8", "float6", "float4")

    @property
    def packs(self) -> bool:
        """True for the types ONNX stores several to a byte (2, 4 and 6 bits)."""
        return self.bits < 8

    @property
    def max_finite(self) -> float:
        """Largest finite value of a float type."""
        return float(ml_dtypes.finfo(self.dtype).max)

    def __repr__(self) -> str:
        return f"ElementType({self.onnx_name})"


def _int(onnx_name, dtype, tp, bits, tf_name=None):
    info = ml_dtypes.iinfo(dtype)
    return ElementType(onnx_name, np.dtype(dtype), tp, bits, "int", int(info.min), int(info.max), tf_name)


# TensorProto numbers are those of onnx.TensorProto.DataType (onnx 1.23).
TYPES: tuple[ElementType, ...] = (
    _int("uint8", np.uint8, 2, 8, "quint8"),
    _int("int8", np.int8, 3, 8, "qint8"),
    _int("uint16", np.uint16, 4, 16, "quint16"),
    _int("int16", np.int16, 5, 16, "qint16"),
    _int("int32", np.int32, 6, 32, "qint32"),
    _int("uint4", ml_dtypes.uint4, 21, 4),
    _int("int4", ml_dtypes.int4, 22, 4),
    _int("uint2", ml_dtypes.uint2, 25, 2),
    _int("int2", ml_dtypes.int2, 26, 2),
    ElementType("float", np.dtype(np.float32), 1, 32, "float"),
    ElementType("float16", np.dtype(np.float16), 10, 16, "float"),
    ElementType("double", np.dtype(np.float64), 11, 64, "float"),
    ElementType("bfloat16", np.dtype(ml_dtypes.bfloat16), 16, 16, "float"),
    ElementType("float8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), 17, 8, "float8"),
    ElementType("float8e4m3fnuz", np.dtype(ml_dtypes.float8_e4m3fnuz), 18, 8, "float8"),
    ElementType("float8e5m2", np.dtype(ml_dtypes.float8_e5m2), 19, 8, "float8"),
    ElementType("float8e5m2fnuz", np.dtype(ml_dtypes.float8_e5m2fnuz), 20, 8, "float8"),
    ElementType("float4e2m1", np.dtype(ml_dtypes.float4_e2m1fn), 23, 4, "float4"),
    ElementType("float8e8m0", np.dtype(ml_dtypes.float8_e8m0fnu), 24, 8, "e8m0"),
    ElementType("float6e2m3", np.dtype(ml_dtypes.float6_e2m3fn), 27, 6, "float6"),
    ElementType("float6e3m2", np.dtype(ml_dtypes.float6_e3m2fn), 28, 6, "float6"),
)

BY_DTYPE: dict[np.dtype, ElementType] = {t.dtype: t for t in TYPES}
BY_TENSORPROTO: dict[int, ElementType] = {t.tensorproto: t for t in TYPES}


def _spellings(t: ElementType) -> set[str]:
    names = {t.onnx_name, t.dtype.name, t.dtype.name.replace("_", "")}
    if t.onnx_name == "float":
        names |= {"float32"}
    if t.onnx_name == "double":
        names |= {"float64"}
    return {n.lower() for n in names}


BY_NAME: dict[str, ElementType] = {n: t for t in TYPES for n in _spellings(t)}


def _known_names() -> str:
    return ", ".join(sorted({t.onnx_name for t in TYPES}))


def resolve_dtype(value, argument: str, function: str) -> ElementType:
    """Return the table row for a dtype given as a dtype, a name, a TensorProto number or an object
    with a ``.name`` (such as a tf.DType). Raises TypeError/ValueError naming ``argument``."""
    if isinstance(value, ElementType):
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{function}: {argument} must be a dtype, a type name or a TensorProto number, got {value!r}")
    if isinstance(value, (int, np.integer)):
        try:
            return BY_TENSORPROTO[int(value)]
        except KeyError:
            raise ValueError(
                f"{function}: {argument}={int(value)} is not a TensorProto type number qlinear knows "
                f"(known: {sorted(BY_TENSORPROTO)})"
            ) from None
    if isinstance(value, str):
        try:
            return BY_NAME[value.lower()]
        except KeyError:
            raise ValueError(f"{function}: {argument}={value!r} is not a type name qlinear knows (known: {_known_names()})") from None
    try:
        dtype = np.dtype(value)
    except TypeError:
        name = getattr(value, "name", None)
        if isinstance(name, str):
            return resolve_dtype(name, argument, function)
        raise TypeError(f"{function}: {argument} must be a dtype, a type name or a TensorProto number, got {value!r}") from None
    try:
        return BY_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"{function}: {argument} has dtype {dtype}, which is not a type qlinear knows (known: {_known_names()})") from None


def element_type_of(array: np.ndarray) -> ElementType | None:
    """The table row of an array's dtype, or None for a dtype outside the table."""
    return BY_DTYPE.get(array.dtype)


def get(onnx_name: str) -> ElementType:
    return BY_NAME[onnx_name]
