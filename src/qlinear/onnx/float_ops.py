"""Faster onnx.reference classes for ordinary float operators, with the reference's results bit for bit.

A QDQ model (what ``qlinear quantize --calibrate`` writes) runs its convolutions and pools in float between
DequantizeLinear and QuantizeLinear. In onnx's reference evaluator these dominate a run: PP-OCR's int8
classifier took 326 ms a run in `qlinear.onnx.run` against 4.5 ms in onnxruntime, 160 ms of it in one MaxPool
(a Python loop per output pixel) and 170 ms in the convolutions' im2col (index arrays built on every call).

- `Conv`: the same im2col matrix as the reference's (rows: input channel, then kernel position; columns: image,
  then output position; dilation as the reference does it, by a kernel with zeros between the taps), built from
  a sliding-window view in one copy, then the same batched matmul and bias addition, so the float sums are
  the reference's, in the same order.
- `ConvTranspose` with one group: the reference's matmul per image, then its col2im's sums a kernel position at a
  time over all the outputs (its loop visits the kernel positions in the same order, and within one position
  no output is reached twice), then the bias. PP-OCR's detector: 19 of its 20 s a run were col2im's loop.
- `AveragePool` over windows inside the input: each window's values in the reference's order, summed by the
  reduction its np.average makes and divided by their count. PP-OCR's recogniser: 2.3 of its 3.1 s a run.
- `MaxPool` where the reference takes its per-pixel loop (a stride or dilation other than 1), 1-3 spatial axes,
  one output: the loop's rule applied a tap at a time to every output at once (a tap replaces the running
  value when it is the first in bounds or compares greater, so NaN behaves as in the loop; an output with no tap
  in bounds stays 0). Other MaxPool nodes (stride 1, auto_pad, the indices output) run the reference's code.

tests/onnx/test_float_ops.py checks both against onnx's classes on random cases, NaN included.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_conv import Conv as _ReferenceConv
from onnx.reference.ops.op_conv_transpose import ConvTranspose as _ReferenceConvTranspose
from onnx.reference.ops.op_max_pool import MaxPool as _ReferenceMaxPool

__all__ = ["AveragePool", "Conv", "ConvTranspose", "MaxPool", "FLOAT_OPS"]


def _same_pads(auto_pad, spatial, kernel, strides) -> list[int]:
    """Begin and end pads of auto_pad SAME_UPPER / SAME_LOWER (the output size ceil(input / stride))."""
    begin, end = [], []
    for size, k, s in zip(spatial, kernel, strides):
        total = max(0, (-(-size // s) - 1) * s + k - size)
        head = (total + 1) // 2 if auto_pad == "SAME_LOWER" else total // 2
        begin.append(head)
        end.append(total - head)
    return begin + end


def _windows(x: np.ndarray, kernel, strides) -> tuple[np.ndarray, tuple[int, ...]]:
    """Every output's window of ``x`` (N, C, *spatial), unpadded: a view of shape (N, C, *out, *kernel), and out."""
    nd = len(kernel)
    out = tuple((x.shape[2 + i] - kernel[i]) // strides[i] + 1 for i in range(nd))
    windows = sliding_window_view(x, tuple(kernel), axis=tuple(range(2, 2 + nd)))
    return windows[(slice(None), slice(None)) + tuple(slice(0, o * s, s) for o, s in zip(out, strides))], out


def _columns(x: np.ndarray, kernel, pads, strides) -> tuple[np.ndarray, tuple[int, ...]]:
    """The im2col matrix of ``x`` (N, C, *spatial): row c * prod(kernel) + k (k over the kernel in row-major
    order), column n * prod(out) + p (p over the output in row-major order); zeros in the padding."""
    nd = len(kernel)
    n, c = x.shape[:2]
    if n == 1 and all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads):
        return x.reshape(c, -1), x.shape[2:]  # a 1x1 convolution of one image reads x itself: the same matrix
    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]) if any(pads) else x
    windows, out = _windows(padded, kernel, strides)
    # (N, C, *out, *kernel) -> (C, *kernel, N, *out)
    order = (1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))
    return windows.transpose(order).reshape(c * int(np.prod(kernel)), n * int(np.prod(out))), out


class Conv(_ReferenceConv):
    op_domain = ""

    def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None,
             strides=None):
        nd = X.ndim - 2
        group = 1 if group is None else group
        if (nd < 1 or X.shape[1] != W.shape[1] * group or W.shape[0] % group
                or auto_pad not in (None, "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")):
            return super()._run(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides)
        dilations = [1] * nd if dilations is None else list(dilations)
        strides = [1] * nd if strides is None else list(strides)
        pads = [0] * (2 * nd) if pads is None else list(pads)
        kernel = list(W.shape[2:] if kernel_shape is None else kernel_shape)
        if any(d != 1 for d in dilations):  # a kernel with d - 1 zeros between taps, as the reference computes
            spread = np.zeros(W.shape[:2] + tuple((k - 1) * d + 1 for k, d in zip(W.shape[2:], dilations)), W.dtype)
            spread[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dilations)] = W
            W = spread
            kernel = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if auto_pad == "VALID":
            pads = [0] * (2 * nd)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pads = _same_pads(auto_pad, X.shape[2:], kernel, strides)
        columns, out = _columns(X, kernel, pads, strides)
        taps = W.shape[1] * int(np.prod(kernel))
        product = W.reshape(group, W.shape[0] // group, taps) @ columns.reshape(group, taps, columns.shape[1])
        y = product.reshape(group, W.shape[0] // group, X.shape[0], *out)
        y = y.transpose(2, 0, 1, *range(3, y.ndim)).reshape(X.shape[0], W.shape[0], *out)
        if B is not None:
            if B.size == 1:
                y = y + B
            else:
                y += B.reshape((1, -1) + (1,) * nd)
        return (y.astype(X.dtype),)


class MaxPool(_ReferenceMaxPool):
    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
             storage_order=None, strides=None):
        nd = x.ndim - 2
        unit = all(v == 1 for v in (dilations or [1])) and all(v == 1 for v in (strides or [1]))
        if (unit or not 1 <= nd <= 3 or len(self.output) != 1 or auto_pad not in (None, "NOTSET")
                or kernel_shape is None or len(kernel_shape) != nd):
            return super()._run(x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                                kernel_shape=kernel_shape, pads=pads, storage_order=storage_order, strides=strides)
        dilations = [1] * nd if dilations is None else list(dilations)
        strides = [1] * nd if strides is None else list(strides)
        pads = [0] * (2 * nd) if pads is None else list(pads)
        spatial = x.shape[2:]
        out = []
        for i in range(nd):
            span = spatial[i] + pads[i] + pads[i + nd] - ((kernel_shape[i] - 1) * dilations[i] + 1)
            if ceil_mode:
                size = -(-span // strides[i]) + 1
                if (size - 1) * strides[i] >= spatial[i] + pads[i]:  # the last window would start in the padding
                    size -= 1
            else:
                size = span // strides[i] + 1
            out.append(size)
        y = np.zeros(x.shape[:2] + tuple(out), x.dtype)
        have = np.zeros(tuple(out), bool)
        for tap in np.ndindex(*kernel_shape):
            index, inside = [], []
            for i in range(nd):
                at = np.arange(out[i]) * strides[i] - pads[i] + tap[i] * dilations[i]
                ok = (at >= 0) & (at < spatial[i])
                index.append(np.where(ok, at, 0))
                inside.append(ok)
            valid = inside[0]
            for ok in inside[1:]:
                valid = np.logical_and.outer(valid, ok)
            values = x[(slice(None), slice(None)) + np.ix_(*index)]
            take = valid & ~have | valid & (values > y)
            y = np.where(take, values, y)
            have |= valid
        return (y,)


def _transpose_geometry(X, W, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides):
    """(kernel, dilations, strides, pads, output shape) of a ConvTranspose node `ConvTranspose` takes; None for
    the others: groups, auto_pad, a kernel_shape other than W's, or an output shape the reference's col2im
    refuses (its code runs, and says so)."""
    nd = X.ndim - 2
    if (nd < 1 or group not in (None, 1) or auto_pad not in (None, "NOTSET") or W.shape[0] != X.shape[1]
            or (kernel_shape is not None and tuple(kernel_shape) != W.shape[2:])):
        return None
    kernel = W.shape[2:]
    dilations = [1] * nd if dilations is None else list(dilations)
    strides = [1] * nd if strides is None else list(strides)
    pads = [0] * (2 * nd) if pads is None else list(pads)
    output_padding = [0] * nd if output_padding is None else list(output_padding)
    if output_shape is None:
        output_shape = [strides[i] * (X.shape[2 + i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
                        - pads[i] - pads[i + nd] for i in range(nd)]
    output_shape = [int(v) for v in output_shape]
    blocks = [(output_shape[i] + pads[i] + pads[i + nd] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
              for i in range(nd)]
    if blocks != list(X.shape[2:]):
        return None
    return kernel, dilations, strides, pads, output_shape


class ConvTranspose(_ReferenceConvTranspose):
    """One group, explicit pads (or none): per image the reference's matmul, then its col2im's sums (a kernel
    position at a time, each output adding its contributions in the reference's order), then the bias. Other
    nodes (groups, auto_pad) run the reference's code."""

    op_domain = ""

    def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, output_padding=None,
             output_shape=None, pads=None, strides=None):
        geometry = _transpose_geometry(X, W, auto_pad, dilations, group, kernel_shape, output_padding, output_shape,
                                       pads, strides)
        if geometry is None:
            return super()._run(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, output_padding=output_padding, output_shape=output_shape,
                                pads=pads, strides=strides)
        nd = X.ndim - 2
        kernel, dilations, strides, pads, output_shape = geometry
        channels, taps, n = W.shape[1], int(np.prod(kernel)), int(np.prod(X.shape[2:]))
        w_t = W.reshape((1, X.shape[1], channels * taps))[0].T  # the reference's operands, views and all
        final = np.empty((X.shape[0], channels, *output_shape), X.dtype)
        # Where each kernel position's contributions land: the input positions in row-major order.
        grid = np.indices(X.shape[2:]).reshape(nd, -1)
        for image in range(X.shape[0]):
            gemm = np.matmul(w_t, X[image].reshape((X.shape[1], n))).reshape((channels, taps, n))
            image_sums = np.zeros((channels, *output_shape), gemm.dtype)
            for tap, offset in enumerate(np.ndindex(*kernel)):
                at = [grid[i] * strides[i] - pads[i] + offset[i] * dilations[i] for i in range(nd)]
                inside = np.ones(n, bool)
                for i in range(nd):
                    inside &= (at[i] >= 0) & (at[i] < output_shape[i])
                image_sums[(slice(None),) + tuple(a[inside] for a in at)] += gemm[:, tap, inside]
            if B is not None:
                image_sums += B.reshape((-1,) + (1,) * nd)
            final[image] = image_sums
        return (final,)


class AveragePool(OpRun):
    """Windows inside the input (no pads, no ceil_mode, no dilation, no NaN): each window's values in the
    reference's order (row-major over the kernel) summed by the same NumPy reduction the reference's np.average
    makes, then divided by their count. Other nodes run the reference's class of the model's version."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None, strides=None,
             count_include_pad=None):
        nd = x.ndim - 2
        given = dict(auto_pad=auto_pad, ceil_mode=ceil_mode, kernel_shape=kernel_shape, pads=pads, strides=strides,
                     count_include_pad=count_include_pad)
        if (nd < 1 or kernel_shape is None or len(kernel_shape) != nd or auto_pad not in (None, "NOTSET")
                or ceil_mode or any(pads or ()) or any(d != 1 for d in dilations or ())
                or x.dtype != np.float32 or np.isnan(x).any()):
            return self._reference()._run(x, **given, **({} if dilations is None else dict(dilations=dilations)))
        windows, out = _windows(x, kernel_shape, [1] * nd if strides is None else list(strides))
        values = np.ascontiguousarray(windows).reshape(x.shape[:2] + out + (-1,))
        return (np.add.reduce(values, axis=-1) / values.shape[-1],)

    def _reference(self):
        """onnx's class of the model's AveragePool version, for the nodes this one does not take."""
        from onnx.reference.ops import op_average_pool

        opsets = self.run_params["opsets"]
        version = opsets.get("", opsets.get("ai.onnx", 1))
        since = max(v for v in (1, 7, 11, 19) if v <= version)
        reference = getattr(op_average_pool, f"AveragePool_{since}")
        return reference(self.onnx_node, self.run_params)


FLOAT_OPS = (AveragePool, Conv, ConvTranspose, MaxPool)
