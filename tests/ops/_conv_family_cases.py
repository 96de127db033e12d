"""Hypothesis strategies for random convolution and matmul cases (shapes, attributes, types, values).

Array contents come from a NumPy generator seeded by hypothesis, so examples stay small and fast to draw;
``values`` picks among full-range random data, worst cases (every operand and zero point at the extremes of
its type) and the narrow int8 weights [-64, 63] on which onnxruntime is exact on every CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

INT8_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))
VALUE_MODES = ("random", "random", "random", "extreme", "narrow")


def quantized_values(rng, dtype, shape, mode, *, high_side=None, weights=False):
    info = np.iinfo(dtype)
    if mode == "extreme":
        value = info.max if high_side else info.min
        return np.full(shape, value, dtype=dtype)
    if mode == "narrow" and weights and np.dtype(dtype) == np.int8:
        return rng.integers(-64, 64, shape, dtype=np.int8)
    return rng.integers(info.min, info.max + 1, shape, dtype=dtype)


def extreme_zero_point(dtype, high_side):
    """The zero point at the opposite extreme of the data, maximising |value - zero_point|."""
    info = np.iinfo(dtype)
    return dtype.type(info.min if high_side else info.max)


def log_uniform_scales(rng, size, low=1e-3, high=1.0):
    return np.exp(rng.uniform(np.log(low), np.log(high), size)).astype(np.float32)


@dataclass
class ConvCase:
    x: np.ndarray
    x_scale: np.ndarray
    x_zero_point: np.ndarray
    w: np.ndarray
    w_scale: np.ndarray
    w_zero_point: np.ndarray
    y_scale: np.ndarray
    y_zero_point: np.ndarray
    B: np.ndarray | None
    attributes: dict = field(default_factory=dict)
    values: str = "random"

    @property
    def per_channel_scale(self) -> bool:
        return self.w_scale.ndim == 1 and self.w_scale.size > 1

    @property
    def n_spatial(self) -> int:
        return self.x.ndim - 2

    def qlinear_args(self):
        return (self.x, self.x_scale, self.x_zero_point, self.w, self.w_scale, self.w_zero_point,
                self.y_scale, self.y_zero_point, self.B)

    def onnx_inputs(self):
        names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
        return list(zip(names, self.qlinear_args()))


@st.composite
def conv_cases(draw, n_spatial=(1, 2, 3), type_combos=None, per_channel=(False, True), bias=(False, True),
               values=VALUE_MODES, distinct_w_zero_points=(False, True)):
    """type_combos: allowed (x, w, y) dtype triples; None means all eight."""
    ns = draw(st.sampled_from(n_spatial))
    group = draw(st.integers(1, 3))
    group_channels = draw(st.integers(1, 3))
    group_outputs = draw(st.integers(1, 3))
    batch = draw(st.integers(1, 2))
    kernel = draw(st.lists(st.integers(1, 3), min_size=ns, max_size=ns))
    dilations = draw(st.lists(st.integers(1, 2), min_size=ns, max_size=ns))
    strides = draw(st.lists(st.integers(1, 3), min_size=ns, max_size=ns))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = None
    if auto_pad == "NOTSET" and draw(st.booleans()):
        pads = draw(st.lists(st.integers(0, 2), min_size=2 * ns, max_size=2 * ns))
    max_extra = {1: 6, 2: 4, 3: 2}[ns]
    spatial = []
    for axis in range(ns):
        extent = dilations[axis] * (kernel[axis] - 1) + 1
        padding = 0 if pads is None else pads[axis] + pads[ns + axis]
        smallest = 1 if auto_pad.startswith("SAME") else max(1, extent - padding)
        spatial.append(draw(st.integers(smallest, smallest + max_extra)))

    if type_combos is None:
        type_combos = [(x, w, y) for x in INT8_TYPES for w in INT8_TYPES for y in INT8_TYPES]
    x_dtype, w_dtype, y_dtype = (np.dtype(t) for t in draw(st.sampled_from(type_combos)))
    is_per_channel = draw(st.sampled_from(per_channel))
    distinct = draw(st.sampled_from(distinct_w_zero_points))
    with_bias = draw(st.sampled_from(bias))
    mode = draw(st.sampled_from(values))
    give_kernel_shape = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    channels, out_channels = group * group_channels, group * group_outputs
    high_x = bool(rng.integers(2))
    high_w = bool(rng.integers(2))
    x = quantized_values(rng, x_dtype, (batch, channels, *spatial), mode, high_side=high_x)
    w = quantized_values(rng, w_dtype, (out_channels, group_channels, *kernel), mode, high_side=high_w, weights=True)
    if mode == "extreme":
        x_zero_point = extreme_zero_point(x_dtype, high_x)
        w_zero_point = np.full(out_channels if is_per_channel else (), extreme_zero_point(w_dtype, high_w), w_dtype)
    else:
        info = np.iinfo(x_dtype)
        x_zero_point = x_dtype.type(rng.integers(info.min, info.max + 1))
        w_info = np.iinfo(w_dtype)
        if is_per_channel and distinct:
            w_zero_point = rng.integers(w_info.min, w_info.max + 1, out_channels).astype(w_dtype)
        elif is_per_channel:
            w_zero_point = np.full(out_channels, rng.integers(w_info.min, w_info.max + 1), w_dtype)
        else:
            w_zero_point = w_dtype.type(0 if w_dtype == np.int8 else 128)
            if mode != "narrow":
                w_zero_point = w_dtype.type(rng.integers(w_info.min, w_info.max + 1))

    x_scale = log_uniform_scales(rng, ())
    w_scale = log_uniform_scales(rng, out_channels if is_per_channel else ())
    # Aim y_scale at the typical accumulator so most outputs land inside the output range.
    taps = group_channels * math.prod(kernel)
    typical = 74.0 * 74.0 * math.sqrt(taps) if mode != "extreme" else 255.0 * 255.0 * taps
    y_scale = np.float32(float(x_scale) * float(np.mean(w_scale)) * typical / 64.0 * rng.uniform(0.25, 4.0))
    y_info = np.iinfo(y_dtype)
    y_zero_point = y_dtype.type(rng.integers(y_info.min, y_info.max + 1))
    B = rng.integers(-(2**20), 2**20, out_channels).astype(np.int32) if with_bias else None

    attributes = {"auto_pad": auto_pad, "group": group, "pads": pads,
                  "strides": strides if draw(st.booleans()) else (None if set(strides) == {1} else strides),
                  "dilations": dilations if draw(st.booleans()) else (None if set(dilations) == {1} else dilations),
                  "kernel_shape": kernel if give_kernel_shape else None}
    return ConvCase(x, np.asarray(x_scale), np.asarray(x_zero_point), w, np.asarray(w_scale), np.asarray(w_zero_point),
                    np.asarray(y_scale), np.asarray(y_zero_point), B, attributes, mode)


@dataclass
class MatMulCase:
    a: np.ndarray
    a_scale: np.ndarray
    a_zero_point: np.ndarray
    b: np.ndarray
    b_scale: np.ndarray
    b_zero_point: np.ndarray
    y_scale: np.ndarray
    y_zero_point: np.ndarray
    a_granularity: str  # "tensor", "row-vector" (an (M,) vector for a 2-D a), "row"
    b_granularity: str  # "tensor", "column-vector" (an (N,) vector), "column", "column-exact" (b's batch dims)
    values: str = "random"

    def args(self):
        return (self.a, self.a_scale, self.a_zero_point, self.b, self.b_scale, self.b_zero_point,
                self.y_scale, self.y_zero_point)

    def onnx_inputs(self):
        names = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")
        return list(zip(names, self.args()))


def _batch_shapes(draw):
    """Two batch shapes that broadcast (numpy.matmul rules), each of rank 0..2."""
    rank = draw(st.integers(0, 2))
    full = [draw(st.integers(1, 3)) for _ in range(rank)]
    a_rank, b_rank = draw(st.integers(0, rank)), draw(st.integers(0, rank))
    a_batch = [d if draw(st.booleans()) else 1 for d in full[rank - a_rank:]]
    b_batch = [d if draw(st.booleans()) else 1 for d in full[rank - b_rank:]]
    return tuple(a_batch), tuple(b_batch)


@st.composite
def matmul_cases(draw, type_combos=None, scale_types=(np.float32,), a_granularities=("tensor", "row-vector", "row"),
                 b_granularities=("tensor", "column-vector", "column"), values=VALUE_MODES, allow_vectors=True):
    """Random QLinearMatMul / MatMulInteger cases: broadcast batches, 1-D operands, every granularity."""
    if type_combos is None:
        type_combos = [(x, w, y) for x in INT8_TYPES for w in INT8_TYPES for y in INT8_TYPES]
    a_dtype, b_dtype, y_dtype = (np.dtype(t) for t in draw(st.sampled_from(type_combos)))
    scale_dtype = np.dtype(draw(st.sampled_from(scale_types)))
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(1, 6))
    a_batch, b_batch = _batch_shapes(draw)
    a_vector = allow_vectors and draw(st.integers(0, 5)) == 0
    b_vector = allow_vectors and draw(st.integers(0, 5)) == 0
    a_shape = (k,) if a_vector else a_batch + (m, k)
    b_shape = (k,) if b_vector else b_batch + (k, n)
    mode = draw(st.sampled_from(values))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    high_a, high_b = bool(rng.integers(2)), bool(rng.integers(2))
    a = quantized_values(rng, a_dtype, a_shape, mode, high_side=high_a)
    b = quantized_values(rng, b_dtype, b_shape, mode, high_side=high_b, weights=True)

    a_gran = "tensor" if a_vector else draw(st.sampled_from(a_granularities))
    if a_gran == "row-vector" and len(a_shape) != 2:
        a_gran = "row"
    b_gran = "tensor" if b_vector else draw(st.sampled_from(b_granularities))
    if a_gran == "tensor":
        a_param_shape = draw(st.sampled_from([(), (1,)]))
    elif a_gran == "row-vector":
        a_param_shape = (m,)
    else:
        a_param_shape = tuple(d if draw(st.booleans()) else 1 for d in a_shape[:-2]) + (m, 1)
    if b_gran == "tensor":
        b_param_shape = draw(st.sampled_from([(), (1,)]))
    elif b_gran == "column-vector":
        b_param_shape = (n,)
    elif b_gran == "column-exact":
        b_param_shape = b_shape[:-2] + (1, n)
    else:
        b_param_shape = tuple(d if draw(st.booleans()) else 1 for d in b_shape[:-2]) + (1, n)

    def zero_points(dtype, shape, high):
        if mode == "extreme":
            return np.full(shape, extreme_zero_point(dtype, high), dtype)
        info = np.iinfo(dtype)
        if mode == "narrow" and dtype == np.int8:
            return np.zeros(shape, dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)

    a_zero_point = zero_points(a_dtype, a_param_shape, high_a)
    b_zero_point = zero_points(b_dtype, b_param_shape, high_b)
    a_scale = log_uniform_scales(rng, a_param_shape)
    b_scale = log_uniform_scales(rng, b_param_shape)
    typical = 74.0 * 74.0 * math.sqrt(k) if mode != "extreme" else 255.0 * 255.0 * k
    y_scale = np.float32(float(np.mean(a_scale)) * float(np.mean(b_scale)) * typical / 64.0 * rng.uniform(0.25, 4.0))
    if scale_dtype == np.float16:
        y_scale = max(y_scale, np.float32(1e-4))  # stay clear of float16's subnormals
    y_info = np.iinfo(y_dtype)
    y_zero_point = np.asarray(y_dtype.type(rng.integers(y_info.min, y_info.max + 1)))
    y_param_shape = draw(st.sampled_from([(), (1,)]))
    return MatMulCase(
        a, a_scale.astype(scale_dtype), a_zero_point, b, b_scale.astype(scale_dtype), b_zero_point,
        np.full(y_param_shape, y_scale).astype(scale_dtype), y_zero_point.reshape(y_param_shape), a_gran, b_gran, mode,
    )
