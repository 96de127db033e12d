"""The one-op model helper (tests/tflite/litert_models.py) itself: constant buffers, optional inputs, operator
options and resizing reach the interpreter as intended, in every kernel family. Nothing of qlinear is used."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from .litert_models import KERNELS, Runner, Tensor, build_model, run


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_conv_2d_with_constant_weights_bias_and_options(kernel):
    """A 1x1 CONV_2D whose requantization multiplier is exactly 1 and whose weights pick one input channel
    (plus a bias) returns that channel plus the bias: the constant buffers, the per-channel quantization and
    the options all arrive."""
    w = np.zeros((3, 1, 1, 2), np.int8)
    w[0, 0, 0, 0] = w[1, 0, 0, 1] = w[2, 0, 0, 0] = 1
    bias = np.array([0, 0, 5], np.int32)
    options = schema.Conv2DOptionsT()
    options.padding, options.strideH, options.strideW = schema.Padding.VALID, 1, 1
    options.dilationHFactor = options.dilationWFactor = 1
    model = build_model(
        "CONV_2D",
        [Tensor((1, 2, 3, 2), "int8", 0.5, 0),
         Tensor(w.shape, "int8", [1.0, 1.0, 1.0], [0, 0, 0], 0, data=w),
         Tensor(bias.shape, "int32", [0.5, 0.5, 0.5], [0, 0, 0], 0, data=bias)],
        [Tensor((1, 2, 3, 3), "int8", 0.5, 0)], options=options, version=3)
    x = np.arange(-6, 6, dtype=np.int8).reshape(1, 2, 3, 2)
    runner = Runner(model, kernel)
    y = runner(x)
    assert runner.delegated == (kernel == "xnnpack")
    assert np.array_equal(y[..., 0], x[..., 0]) and np.array_equal(y[..., 1], x[..., 1])
    assert np.array_equal(y[..., 2], x[..., 0] + 5)


def test_fully_connected_without_bias_and_resized_batch():
    w = np.eye(4, dtype=np.int8)
    model = build_model("FULLY_CONNECTED", [Tensor((1, 4), "int8", 0.25, 1), Tensor(w.shape, "int8", 1.0, 0, data=w), None],
                        [Tensor((1, 4), "int8", 0.25, 1)], options=schema.FullyConnectedOptionsT())
    runner = Runner(model, "reference")
    x = np.arange(-10, 10, dtype=np.int8).reshape(5, 4)  # a batch of 5: the input is resized
    assert np.array_equal(runner(x), x)
    assert np.array_equal(run(model, "optimized", x[:2]), x[:2])
