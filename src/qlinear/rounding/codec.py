"""What every rounding algorithm shares: a weight seen as matrices of output channels by input features
(`Layout`), its quantization groups on those matrices (`Groups`), and how a group's parameters follow from
its values and a column of weights becomes codes (`Codec`).

The algorithms (`gptq`, `hqq`, ...) choose *which* code each weight gets; the codes are always those of
QuantizeLinear on the (updated) weight with the group's stored parameters, and the values they stand for
are DequantizeLinear's, computed by qlinear's own operators: what the written model computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import calibrate
from ..dtypes import ElementType
from ..granularity import Granularity
from ..ops.quantize_linear import dequantize_linear, quantize_linear

_OWN_TYPES = (np.dtype(np.float32), np.dtype(np.float16))


# ----------------------------------------------------------------------------------------------------
# The layer's view of a weight


@dataclass(frozen=True)
class Layout:
    """A weight tensor seen by its layer as ``G`` matrices of ``R`` output channels by ``K`` input features.

    ``index`` ([G, R, K] int64) holds, for each matrix element, the flat position of the tensor element it
    is: ``view(t) = t.ravel()[index]``. Columns are ordered as the layer's input features are in the
    Hessian (`qlinear.io.hessians`): for convolutions, kernel positions outer and input channels inner.
    """

    shape: tuple[int, ...]
    index: np.ndarray

    @property
    def groups(self) -> int:
        return self.index.shape[0]

    def view(self, tensor) -> np.ndarray:
        return np.asarray(tensor).reshape(-1)[self.index]

    def unview(self, matrices: np.ndarray) -> np.ndarray:
        out = np.empty(math.prod(self.shape), matrices.dtype)
        out[self.index.reshape(-1)] = matrices.reshape(-1)
        return out.reshape(self.shape)

    @classmethod
    def of(cls, op: str, shape: tuple[int, ...], group: int = 1) -> "Layout":
        """The layout of a weight of ``shape`` as operator ``op`` reads it:

        - Conv ``W [O, C/group, k...]``: ``group`` matrices ``[O/group, prod(k) * C/group]``;
        - ConvTranspose ``W [C, O/group, k...]``: the kernel flipped (the convolution over the zero-upsampled
          input that it is), ``group`` matrices ``[O/group, prod(k) * C/group]``;
        - MatMul or Gemm ``B [K, N]`` (``op="MatMul"``), or Gemm's transposed ``B [N, K]`` (``op="Gemm.T"``):
          one matrix ``[N, K]``;
        - LSTM, GRU, RNN ``W``/``R [D, gates * H, I]``: one matrix per direction ``[gates * H, I]``.
        """
        positions = np.arange(math.prod(shape), dtype=index_dtype(math.prod(shape))).reshape(shape)
        if op == "Conv":
            o, c = shape[0], shape[1]
            if o % group:
                raise ValueError(f"Layout.of: Conv weight {shape} has {o} output channels, not divisible by group {group}")
            moved = np.moveaxis(positions, 1, -1)  # [O, k..., C/group]
            index = moved.reshape(group, o // group, -1)
        elif op == "ConvTranspose":
            c, o = shape[0], shape[1]
            if c % group:
                raise ValueError(f"Layout.of: ConvTranspose weight {shape} has {c} input channels, not divisible by "
                                 f"group {group}")
            spatial = tuple(range(2, len(shape)))
            flipped = np.flip(positions, axis=spatial) if spatial else positions
            moved = np.moveaxis(flipped, 0, -1)  # [O/group, k..., C]
            moved = moved.reshape(moved.shape[:-1] + (group, c // group))
            moved = np.moveaxis(moved, -2, 0)  # [group, O/group, k..., C/group]
            index = moved.reshape(group, o, -1)
        elif op == "MatMul":
            index = positions.reshape(shape[0], -1).T[None]
        elif op == "Gemm.T":
            index = positions[None]
        elif op in ("LSTM", "GRU", "RNN"):
            index = positions
        else:
            raise ValueError(f"Layout.of: no layout for operator {op!r}")
        return cls(tuple(shape), np.ascontiguousarray(index))


def index_dtype(count: int):
    """int32 positions where they fit: a layer's index arrays are as large as its weight (an 8192 x 8192 weight's
    int64 index alone took 512 MB)."""
    return np.int32 if count < 2**31 else np.int64


def row_errors(error: np.ndarray, hessians: np.ndarray) -> np.ndarray:
    """[G, R]: each row's ``e H eᵀ`` of ``error`` [G, R, K] under ``hessians`` [G, K, K]: the squared output
    error a weight error causes, summed over the calibration rows."""
    return np.sum(np.matmul(error, hessians) * error, axis=2)


def output_error(error: np.ndarray, hessians: np.ndarray) -> float:
    """Σ_g tr(E_g H_g E_gᵀ): `row_errors` summed."""
    return float(np.sum(np.matmul(error, hessians) * error))


# ----------------------------------------------------------------------------------------------------
# Quantization groups on the matrices


@dataclass(frozen=True)
class Groups:
    """Which parameter group (flat position in the granularity's parameter shape) each matrix element
    belongs to, and whether the groups can be chosen as the rounding reaches them: every group within one
    row and a run of consecutive columns that starts at the same column in every row (blocks along the
    input features). Otherwise (per tensor, per channel, blocks along the outputs) the parameters are
    chosen once, from the weight as it is, as round-to-nearest chooses them."""

    of: np.ndarray  # [G, R, K] int64: the group of each element
    count: int
    starts: tuple[tuple[int, ...], ...] | None  # per matrix, the first column of each run; None: chosen once

    @classmethod
    def of_granularity(cls, layout: Layout, gran: Granularity, runs: bool = True) -> "Groups":
        """``runs``: find the runs of blocks along the columns (what GPTQ chooses blocks by); without it the
        parameters are chosen once."""
        count = math.prod(gran.param_shape)
        positions = np.arange(count, dtype=index_dtype(count)).reshape(gran.param_shape)
        of = layout.view(np.broadcast_to(gran.expand(positions), layout.shape))
        return cls(of, count, block_runs(of) if gran.kind == "block" and runs else None)


def block_runs(of: np.ndarray):
    """The column starts of the groups of each matrix when they form runs of consecutive columns that
    start together in every row and belong to one row each; None otherwise."""
    starts = []
    seen = 0
    columns = np.arange(of.shape[2])
    for matrix in of:
        change = np.flatnonzero(np.any(matrix[:, 1:] != matrix[:, :-1], axis=0)) + 1
        bounds = np.concatenate([[0], change]).astype(np.int64)
        first_of = bounds[np.searchsorted(bounds, columns, side="right") - 1]
        if not np.array_equal(matrix, matrix[:, first_of]):
            return None
        seen += matrix.shape[0] * len(bounds)
        starts.append(tuple(int(b) for b in bounds))
    if len(np.unique(np.concatenate([m[:, list(s)].reshape(-1) for m, s in zip(of, starts)]))) != seen:
        return None  # a group split across rows or runs
    return tuple(starts)


# ----------------------------------------------------------------------------------------------------
# Codes and their values


class Codec:
    """How a group's parameters follow from its values, and a column of weights becomes codes.

    Integer and plain float types: a scale (and zero point) per group by `qlinear.calibrate` from the
    group's min and max, as round-to-nearest has it. MX formats: the group's e8m0 scale by the format's
    rule (`qlinear.mx`); NVFP4: the e4m3 block scale under the tensor scale of the weight as it is.
    ``effective`` scales are what DequantizeLinear multiplies the codes by, in float32 (or the scale type).
    """

    def __init__(self, qtype: ElementType, symmetric: bool, weight_dtype, scale_dtype=np.float32, fmt=None,
                 scale_rule: str | None = None):
        self.qtype, self.symmetric, self.fmt, self.scale_rule = qtype, symmetric, fmt, scale_rule
        self.weight_dtype = np.dtype(weight_dtype)
        self.scale_dtype = np.dtype(scale_dtype)
        self.global_scale = None  # NVFP4: set by `prepare`

    @property
    def integer(self) -> bool:
        return self.fmt is None and self.qtype.is_integer

    def prepare(self, tensor: np.ndarray) -> None:
        """What the whole weight fixes before any group is chosen: NVFP4's tensor scale."""
        if self.fmt is not None and self.fmt.name == "nvfp4":
            from .. import mx

            _, _, g = mx.quantize(np.asarray(tensor, np.float32).reshape(1, -1), "nvfp4", axis=-1,
                                  scale_rule=self.scale_rule)
            self.global_scale = np.asarray(g, np.float32).reshape(())

    def choose(self, values: np.ndarray):
        """Parameters of groups, one per row of ``values`` [n, m] (the group's elements along the row), by
        each group's min and max as round-to-nearest has it: (stored scales, stored zero points or None,
        effective scales), each of length n."""
        values = np.asarray(values, np.float64)
        if self.fmt is None:
            scale, zero = calibrate.parameters(values.min(axis=1), values.max(axis=1), self.qtype, self.symmetric,
                                               self.scale_dtype)
            return scale, (zero if self.qtype.is_integer else None), scale
        from .. import mx

        x = values.astype(np.float32)
        if self.fmt.name == "nvfp4":
            _, scales, _ = mx.quantize(x, "nvfp4", axis=-1, scale_rule=self.scale_rule, global_scale=self.global_scale)
            scales = scales[:, 0]
            return scales, None, dequantize_linear(scales, self.global_scale, opset=23)
        codes, scales = mx.quantize(x, self.fmt.name, axis=-1, scale_rule=self.scale_rule)
        codes, scales = mx.onnx_scales(codes, scales, self.fmt)
        scales = np.asarray(scales)[:, :1].reshape(-1)
        return scales, None, np.asarray(scales).astype(np.float32)  # e8m0's value, 2^e

    def round(self, w: np.ndarray, effective: np.ndarray, zero: np.ndarray | None):
        """(codes, the values they stand for as float64) of weights ``w`` (any shape) under per-element
        ``effective`` scales and ``zero`` points of w's shape: QuantizeLinear's rule, ``saturate(round(x /
        scale) + zero)`` with x in its own type (float64 as float32) and the division in the scale's type.
        The algorithms call this once per column; `values` gives what DequantizeLinear makes of the codes."""
        x = np.asarray(w)
        x = x.astype(self.weight_dtype if self.weight_dtype in _OWN_TYPES else np.float32)
        shape = x.shape
        if self.integer:
            s = np.asarray(effective)
            quotient = x.astype(s.dtype) / s if x.dtype != s.dtype else x / s
            q = np.clip(np.rint(quotient) + np.asarray(zero).astype(np.float64), self.qtype.qmin, self.qtype.qmax)
            codes = q.astype(np.int64).astype(self.qtype.dtype)
            # DequantizeLinear's arithmetic, (q - zero) * scale in the scale's type; `values` is the operator itself
            value = ((q - np.asarray(zero).astype(np.float64)).astype(s.dtype) * s).astype(np.float64)
            return codes, value
        x1 = x.reshape(-1, 1)
        s1 = np.asarray(effective, np.float32).reshape(-1, 1)
        if self.qtype.is_integer:  # MXINT8's codes under its folded scale, in the format's symmetric range
            q = quantize_linear(x1, s1, np.zeros_like(x1, self.qtype.dtype), axis=0, block_size=1)
            q = np.maximum(q.astype(np.int16), -127).astype(self.qtype.dtype)
        else:
            q = quantize_linear(x1, s1, output_dtype=self.qtype.onnx_name, axis=0, block_size=1)
        q = q.reshape(shape)
        return q, self.values(q, effective, None)

    def values(self, codes: np.ndarray, effective, zero) -> np.ndarray:
        """DequantizeLinear of ``codes`` under per-element parameters (float64 of its output)."""
        q1 = np.asarray(codes).reshape(-1, 1)
        s1 = np.asarray(effective).reshape(-1, 1)
        if self.fmt is not None:
            s1 = s1.astype(np.float32)
        z1 = np.asarray(zero).reshape(-1, 1) if zero is not None and self.integer else None
        value = dequantize_linear(q1, s1, z1, axis=0, block_size=1)
        return np.asarray(value, np.float64).reshape(np.shape(codes))


class Parameters:
    """Every group's parameters, chosen once (`choose_all`) or as the rounding reaches them (`choose_run`)."""

    def __init__(self, groups: Groups, codec: Codec):
        self.groups, self.codec = groups, codec
        self.scales = None
        self.zeros = None
        self.effective = None
        self.known = np.zeros(groups.count, bool)

    def _store(self, at: np.ndarray, scales, zeros, effective) -> None:
        if self.scales is None:
            self.scales = np.zeros(self.groups.count, np.asarray(scales).dtype)
            self.effective = np.zeros(self.groups.count, np.asarray(effective).dtype)
            if zeros is not None:
                self.zeros = np.zeros(self.groups.count, np.asarray(zeros).dtype)
        self.scales[at] = scales
        if zeros is not None:
            self.zeros[at] = zeros
        self.effective[at] = effective
        self.known[at] = True

    def choose_all(self, matrices: np.ndarray, choose=None) -> None:
        """Each group's parameters from all its elements in ``matrices`` [G, R, K], by ``choose`` (the
        codec's rule unless given: HQQ's solver)."""
        choose = choose or self.codec.choose
        of = self.groups.of.reshape(-1)
        values = np.asarray(matrices, np.float64).reshape(-1)
        order = np.argsort(of, kind="stable")
        sorted_of = of[order]
        bounds = np.flatnonzero(np.diff(sorted_of)) + 1
        sizes = np.diff(np.concatenate([[0], bounds, [len(of)]]))
        ids = sorted_of[np.concatenate([[0], bounds])]
        # groups of equal size in one call: a [groups, size] array each
        for size in np.unique(sizes):
            which = np.flatnonzero(sizes == size)
            starts = np.concatenate([[0], bounds])[which]
            rows = values[order[starts[:, None] + np.arange(size)[None, :]]]  # one gather, not a sorted copy first
            self._store(ids[which], *choose(rows))

    def choose_run(self, g: int, start: int, stop: int, matrix: np.ndarray) -> None:
        """The groups of columns ``start:stop`` of matrix ``g`` (one per row) from their current values."""
        at = self.groups.of[g, :, start]
        if self.known[at].all():
            return
        self._store(at, *self.codec.choose(matrix[:, start:stop]))

    def per_element(self):
        """(effective scales, zero points or None) of every matrix element, [G, R, K] each."""
        of = self.groups.of
        return self.effective[of], (self.zeros[of] if self.zeros is not None else None)

    def column(self, g: int, j: int):
        """(effective scales, zero points or None) of column ``j`` of matrix ``g``, per row."""
        at = self.groups.of[g, :, j]
        return self.effective[at], (self.zeros[at] if self.zeros is not None else None)

    def stored(self, gran: Granularity):
        """(scales, zero points or None) in the granularity's parameter shape."""
        shape = gran.param_shape
        return self.scales.reshape(shape), (self.zeros.reshape(shape) if self.zeros is not None else None)
