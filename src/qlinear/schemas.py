"""What each version of QuantizeLinear and DequantizeLinear allows, as data.

Transcribed from the schemas in onnx 1.23.2 (shared/spec/onnx-schemas-1.23.md). A model's opset
selects the newest version whose ``since`` is not above it; `schema_for` does that lookup and the
operators check arguments against the row instead of testing opset numbers in code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LATEST_OPSET = 28

_INT8 = ("int8", "uint8")
_FLOAT8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")
_WIDE = ("int16", "uint16", "uint4", "int4")
_FLOATS = ("float", "float16", "bfloat16")


@dataclass(frozen=True)
class Schema:
    op: str
    since: int
    attributes: frozenset[str]
    full_precision_types: tuple[str, ...]  # QuantizeLinear x / DequantizeLinear y (T3 or the scale type)
    scale_types: tuple[str, ...] | None  # None: the scale must have x's type (QuantizeLinear 19, 21)
    quantized_types: tuple[str, ...]  # QuantizeLinear y / DequantizeLinear x
    granularities: frozenset[str]  # "tensor", "axis", "block"
    # "QuantizeLinear-21", named in errors; built once, not on every operator call
    label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "label", f"{self.op}-{self.since}")

    def allows(self, attribute: str) -> bool:
        return attribute in self.attributes


def _q(since, attrs, x, scale, y, gran):
    return Schema("QuantizeLinear", since, frozenset(attrs), x, scale, y, frozenset(gran))


def _dq(since, attrs, y, scale, x, gran):
    return Schema("DequantizeLinear", since, frozenset(attrs), y, scale, x, frozenset(gran))


_Q_X = ("float", "float16", "bfloat16", "int32")
_Q_Y23 = _INT8 + ("int16", "uint16") + _FLOAT8 + ("uint4", "int4", "float4e2m1")
_DQ_X21 = _INT8 + ("int16", "uint16", "int32") + _FLOAT8 + ("uint4", "int4")

SCHEMAS: dict[str, tuple[Schema, ...]] = {
    "QuantizeLinear": (
        _q(10, (), ("float", "int32"), ("float",), _INT8, ("tensor",)),
        _q(13, ("axis",), ("float", "int32"), ("float",), _INT8, ("tensor", "axis")),
        _q(19, ("axis", "saturate"), _Q_X, None, _INT8 + _FLOAT8, ("tensor", "axis")),
        _q(21, ("axis", "saturate", "block_size", "output_dtype"), _Q_X, None,
           _INT8 + ("int16", "uint16") + _FLOAT8 + ("uint4", "int4"), ("tensor", "axis", "block")),
        _q(23, ("axis", "saturate", "block_size", "output_dtype", "precision"), _Q_X, _Q_X, _Q_Y23,
           ("tensor", "axis", "block")),
        _q(24, ("axis", "saturate", "block_size", "output_dtype", "precision"), _Q_X,
           _Q_X + ("float8e8m0",), _Q_Y23, ("tensor", "axis", "block")),
        _q(25, ("axis", "saturate", "block_size", "output_dtype", "precision"), _Q_X,
           _Q_X + ("float8e8m0",), _Q_Y23 + ("uint2", "int2"), ("tensor", "axis", "block")),
        _q(28, ("axis", "saturate", "block_size", "output_dtype", "precision"), _Q_X,
           _Q_X + ("float8e8m0",), _Q_Y23 + ("uint2", "int2", "float6e2m3", "float6e3m2"),
           ("tensor", "axis", "block")),
    ),
    "DequantizeLinear": (
        _dq(10, (), ("float",), ("float",), _INT8 + ("int32",), ("tensor",)),
        _dq(13, ("axis",), ("float",), ("float",), _INT8 + ("int32",), ("tensor", "axis")),
        _dq(19, ("axis",), _FLOATS, _FLOATS, _INT8 + ("int32",) + _FLOAT8, ("tensor", "axis")),
        _dq(21, ("axis", "block_size"), _FLOATS, _FLOATS, _DQ_X21, ("tensor", "axis", "block")),
        _dq(23, ("axis", "block_size", "output_dtype"), _FLOATS, _FLOATS, _DQ_X21 + ("float4e2m1",),
            ("tensor", "axis", "block")),
        _dq(24, ("axis", "block_size", "output_dtype"), _FLOATS, _FLOATS + ("float8e8m0",),
            _DQ_X21 + ("float4e2m1",), ("tensor", "axis", "block")),
        _dq(25, ("axis", "block_size", "output_dtype"), _FLOATS, _FLOATS + ("float8e8m0",),
            _DQ_X21 + ("float4e2m1", "uint2", "int2"), ("tensor", "axis", "block")),
        _dq(28, ("axis", "block_size", "output_dtype"), _FLOATS, _FLOATS + ("float8e8m0",),
            _DQ_X21 + ("float4e2m1", "uint2", "int2", "float6e2m3", "float6e3m2"),
            ("tensor", "axis", "block")),
    ),
}


# (op, opset) -> Schema, filled by `schema_for` for int opsets that passed its checks.
_BY_OPSET: dict[tuple[str, int], Schema] = {}


def schema_for(op: str, opset: int | None, function: str) -> Schema:
    """The schema version in force for a model of the given opset (None: the newest)."""
    versions = SCHEMAS[op]
    if opset is None:
        return versions[-1]
    if type(opset) is int:  # exactly int: a bool or an int subclass takes the checks below
        found = _BY_OPSET.get((op, opset))
        if found is not None:
            return found
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise TypeError(f"{function}: opset must be an int or None, got {opset!r}")
    if opset < versions[0].since or opset > LATEST_OPSET:
        raise ValueError(
            f"{function}: opset={opset} is out of range: {op} exists from opset {versions[0].since} "
            f"and qlinear knows opsets up to {LATEST_OPSET}"
        )
    found = [s for s in versions if s.since <= opset][-1]
    if type(opset) is int:
        _BY_OPSET[(op, opset)] = found
    return found
