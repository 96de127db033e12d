"""Per-tensor, per-axis and blocked quantization: how a scale (and zero point) maps onto x.

The three granularities differ only in that mapping, so it lives here once: `resolve` checks the
spec's shape rules and returns a `Granularity`; `Granularity.expand` broadcasts a parameter to x's
shape for the NumPy reference; kernels, the dask adapter and calibration read the same object.

The rules (QuantizeLinear-28, "There are three supported quantization granularities"):
- per-tensor: the scale is a scalar (a one-element 1-D scale is accepted too, as both onnx peers do);
- per-axis: the scale is 1-D of length ``x.shape[axis]``;
- blocked: the scale has x's rank and shape except ``ceil(x.shape[axis] / block_size)`` on ``axis``;
  the last block may be short.
The zero point, when given, has the scale's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Granularity:
    kind: str  # "tensor", "axis" or "block"
    x_shape: tuple[int, ...]
    axis: int | None = None  # non-negative; None for per-tensor
    block_size: int = 0  # > 0 only for blocked

    @property
    def param_shape(self) -> tuple[int, ...]:
        """The shape of the scale/zero point (per-tensor: a scalar)."""
        if self.kind == "tensor":
            return ()
        if self.kind == "axis":
            return (self.x_shape[self.axis],)
        shape = list(self.x_shape)
        shape[self.axis] = -(-shape[self.axis] // self.block_size)
        return tuple(shape)

    def attributes(self) -> dict:
        """The QuantizeLinear/DequantizeLinear keywords that select this granularity (none for per-tensor)."""
        attrs = {}
        if self.kind != "tensor":
            attrs["axis"] = self.axis
        if self.kind == "block":
            attrs["block_size"] = self.block_size
        return attrs

    def expand(self, param: np.ndarray) -> np.ndarray:
        """Broadcast a scale or zero point so that it lines up with x element by element
        (a view or a repeat; the result broadcasts against x's shape)."""
        param = np.asarray(param)
        if self.kind == "tensor":
            return param.reshape(())
        if self.kind == "axis":
            shape = [1] * len(self.x_shape)
            shape[self.axis] = self.x_shape[self.axis]
            return param.reshape(shape)
        # Blocked: every scale covers block_size consecutive elements along axis; the last block
        # is cut short where x ends.
        repeated = np.repeat(param, self.block_size, axis=self.axis)
        return np.take(repeated, np.arange(self.x_shape[self.axis]), axis=self.axis)


def normalize_axis(axis, rank: int, function: str, what: str = "x") -> int:
    if type(axis) is not int:  # the common plain int skips the type tests
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{function}: axis must be an int, got {axis!r}")
        axis = int(axis)
    if not -rank <= axis < rank:
        raise ValueError(
            f"{function}: axis={axis} is out of range for {what} of rank {rank} "
            f"(the accepted range is [-r, r-1] = [{-rank}, {rank - 1}])"
        )
    return axis % rank


_GRANULARITY_NAMES = {"tensor": "per-tensor", "axis": "per-axis", "block": "blocked"}


def _require(kind: str, allowed, function: str, opset_label: str, scale_name: str, scale_shape) -> None:
    if kind not in allowed:
        names = _GRANULARITY_NAMES
        raise ValueError(
            f"{function}: {opset_label} supports only {' and '.join(names[k] for k in sorted(allowed, key=['tensor', 'axis', 'block'].index))} "
            f"quantization; {scale_name} of shape {scale_shape} asks for {names[kind]}"
        )


def resolve(
    function: str,
    x_shape: tuple[int, ...],
    scale_shape: tuple[int, ...],
    zero_point_shape: tuple[int, ...] | None,
    axis,
    block_size,
    allowed: frozenset[str] = frozenset({"tensor", "axis", "block"}),
    scale_name: str = "scale",
    zero_point_name: str = "zero_point",
    opset_label: str = "",
) -> Granularity:
    """Check the spec's shape rules and say which granularity the scale selects.

    ``allowed`` is the set of granularities the operator version supports; ``opset_label`` (e.g.
    "QuantizeLinear-10") is named in errors that come from it.
    """
    x_shape = tuple(map(int, x_shape))
    scale_shape = tuple(scale_shape)
    rank = len(x_shape)
    if type(block_size) is not int:  # the common plain int skips the type tests
        if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (int, np.integer)):
            raise TypeError(f"{function}: block_size must be an int, got {block_size!r}")
        block_size = int(block_size)
    if block_size < 0:
        raise ValueError(f"{function}: block_size must be 0 (no blocking) or a positive integer, got {block_size}")

    if zero_point_shape is not None:
        zero_point_shape = tuple(zero_point_shape)
        # math.prod, not np.prod (whose Python wrapper costs microseconds): both shapes have at most one
        # dimension here, so the product is that dimension (or 1) and cannot overflow either way
        both_scalar_like = (
            len(scale_shape) <= 1 and len(zero_point_shape) <= 1
            and int(math.prod(scale_shape)) == 1 and int(math.prod(zero_point_shape)) == 1
        )
        if zero_point_shape != scale_shape and not both_scalar_like:
            raise ValueError(
                f"{function}: {zero_point_name} must have the same shape as {scale_name}, "
                f"got {zero_point_shape} and {scale_shape}"
            )

    if block_size > 0:
        _require("block", allowed, function, opset_label, scale_name, scale_shape)
        if len(scale_shape) != rank or rank == 0:
            raise ValueError(
                f"{function}: blocked quantization (block_size={block_size}) needs {scale_name} of the same rank "
                f"as x ({rank}), got shape {scale_shape}"
            )
        axis = normalize_axis(axis, rank, function)
        for i, (d, s) in enumerate(zip(x_shape, scale_shape)):
            if i != axis and d != s:
                raise ValueError(
                    f"{function}: blocked quantization needs {scale_name}.shape to equal x.shape {x_shape} except on "
                    f"axis {axis}, got {scale_shape} (dimension {i} differs)"
                )
        expected = -(-x_shape[axis] // block_size)
        if scale_shape[axis] != expected:
            raise ValueError(
                f"{function}: blocked quantization needs {scale_name}.shape[{axis}] == ceil(x.shape[{axis}] / block_size) "
                f"= ceil({x_shape[axis]} / {block_size}) = {expected}, got {scale_shape[axis]}"
            )
        return Granularity("block", x_shape, axis, block_size)

    if len(scale_shape) == 0 or (len(scale_shape) == 1 and scale_shape[0] == 1):
        # A one-element 1-D scale is per-tensor at every opset, version 10 included (whose text says "a
        # scalar"): both peers take it so, and onnxruntime's quantizer writes it so at opsets 10-13, which
        # makes it the most common quantized ONNX model there is (docs/semantics.md, row 18). The axis
        # attribute plays no part in per-tensor quantization (and a rank-1 x has no axis 1).
        return Granularity("tensor", x_shape)
    if len(scale_shape) == 1:
        _require("axis", allowed, function, opset_label, scale_name, scale_shape)
        if rank == 0:
            raise ValueError(f"{function}: x is a scalar, so {scale_name} must be a scalar too, got shape {scale_shape}")
        axis = normalize_axis(axis, rank, function)
        if scale_shape[0] != x_shape[axis]:
            raise ValueError(
                f"{function}: per-axis quantization needs a 1-D {scale_name} of length x.shape[{axis}] = {x_shape[axis]}, "
                f"got length {scale_shape[0]}"
            )
        return Granularity("axis", x_shape, axis)
    if "block" in allowed:
        raise ValueError(
            f"{function}: a {scale_name} of rank {len(scale_shape)} means blocked quantization, which needs block_size > 0"
        )
    raise ValueError(f"{function}: {opset_label} needs a scalar or 1-D {scale_name}, got shape {scale_shape}")
