"""ONNX ConvInteger / QLinearConv accumulator, transcribed in int64 NumPy (im2col + matmul).

For every output position the spec asks for the sum over the receptive field of
``(x - x_zero_point) * (w - w_zero_point)``, plus the int32 bias ``B`` for QLinearConv. Padded positions
hold ``x_zero_point`` (so they contribute 0 after the subtraction). Everything is computed in int64, which
is exact for any tensor that fits in memory: each product is at most 255 * 255 in magnitude.

The caller (``qlinear.ops.qlinear_conv``) has validated shapes and attributes and resolved auto_pad into
explicit begin/end pads.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def conv_accumulate(
    x: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_zero_point: np.ndarray,
    bias: np.ndarray | None,
    *,
    group: int,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads_begin: tuple[int, ...],
    pads_end: tuple[int, ...],
) -> np.ndarray:
    """Exact int64 accumulator of shape (N, M, *output_spatial).

    x: (N, C, D1..Dn) int8/uint8; w: (M, C/group, k1..kn) int8/uint8; x_zero_point: 0-d;
    w_zero_point: 0-d or (M,); bias: (M,) int32 or None.
    """
    n_spatial = x.ndim - 2
    batch, channels = x.shape[:2]
    out_channels, group_channels = w.shape[:2]
    kernel = w.shape[2:]
    spatial_axes = tuple(range(2, 2 + n_spatial))

    # 1. Remove the zero points (int64: exact).
    x_centered = x.astype(np.int64) - np.int64(x_zero_point)
    w_zp = np.asarray(w_zero_point, dtype=np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    w_centered = w.astype(np.int64) - w_zp

    # 2. Pad with 0, which is x_zero_point before the subtraction.
    x_padded = np.pad(x_centered, [(0, 0), (0, 0)] + list(zip(pads_begin, pads_end)))

    # 3. im2col: every dilated window, keeping every stride-th window and every dilation-th tap.
    extent = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    windows = sliding_window_view(x_padded, extent, axis=spatial_axes)
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
                      + tuple(slice(None, None, d) for d in dilations)]
    out_spatial = windows.shape[2:2 + n_spatial]
    n_positions = math.prod(out_spatial)
    n_taps = math.prod(kernel)

    # windows: (N, C, O1..On, k1..kn) -> columns: (N, group, positions, C/group * taps)
    windows = windows.reshape((batch, group, group_channels) + out_spatial + tuple(kernel))
    columns = np.moveaxis(windows, 2, 2 + n_spatial)  # (N, group, O.., C/group, k..)
    columns = columns.reshape(batch, group, n_positions, group_channels * n_taps)

    # 4. One matmul per group: (N, group, positions, K) @ (group, K, M/group).
    weights = w_centered.reshape(group, out_channels // group, group_channels * n_taps).transpose(0, 2, 1)
    acc = np.matmul(columns, weights)  # (N, group, positions, M/group)
    acc = acc.transpose(0, 1, 3, 2).reshape((batch, out_channels) + out_spatial)

    # 5. Bias, one value per output channel.
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape((1, out_channels) + (1,) * n_spatial)
    return acc
