"""What the rounding tests share: a codec by type name, a granularity on a Conv or Gemm weight, and the output
error of rounded values measured here (einsum over the Hessian, independently of `qlinear.rounding.codec`)."""

from __future__ import annotations

import numpy as np

from qlinear import dtypes
from qlinear.granularity import Granularity
from qlinear.reference import mx as mx_reference
from qlinear.rounding.codec import Codec


def codec(dtype: str, symmetric=False, weight_dtype=np.float32, scale_dtype=np.float32) -> Codec:
    fmt = mx_reference.FORMATS.get(dtype)
    qtype = fmt.element if fmt is not None else dtypes.get(dtype)
    return Codec(qtype, symmetric, weight_dtype, scale_dtype, fmt)


def granularity(kind: str, shape, block: int) -> Granularity:
    """Per tensor, per output channel (axis 0), or blocks of ``block`` along axis 1 (the input features)."""
    if kind == "tensor":
        return Granularity("tensor", shape)
    if kind == "axis":
        return Granularity("axis", shape, 0)
    return Granularity("block", shape, 1, block)


def output_error(values, matrices, h) -> float:
    """Σ_g tr(E H Eᵀ), E = values − matrices."""
    e = values - matrices
    return float(np.einsum("grk,gkl,grl->", e, h, e))
