"""TensorFlow helpers for the qlinear.tf tests.

TensorFlow is imported lazily (only the differential tests need it) with oneDNN graph rewrites
off -- qlinear targets the plain CPU kernel, which is what eager mode runs -- and its C++ logging
quieted. Both variables must be set before the first ``import tensorflow``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class TFOps:
    """tf.raw_ops.QuantizeV2 / Dequantize, eager, with NumPy in and out."""

    def __init__(self, tf):
        self.tf = tf

    def quantize_v2(self, x, min_range, max_range, T, **attrs):
        tf = self.tf
        r = tf.raw_ops.QuantizeV2(
            input=np.asarray(x, np.float32),
            min_range=np.asarray(min_range, np.float32),
            max_range=np.asarray(max_range, np.float32),
            T=tf.as_dtype(T),
            **attrs,
        )
        return r.output.numpy(), r.output_min.numpy(), r.output_max.numpy()

    def dequantize(self, q, min_range, max_range, T, **attrs):
        tf = self.tf
        if "dtype" in attrs:
            attrs["dtype"] = tf.as_dtype(attrs["dtype"])
        out = tf.raw_ops.Dequantize(
            input=tf.constant(q, dtype=tf.as_dtype(T)),
            min_range=np.asarray(min_range, np.float32),
            max_range=np.asarray(max_range, np.float32),
            **attrs,
        )
        return out.numpy()


@pytest.fixture(scope="session")
def tf_ops():
    tf = pytest.importorskip("tensorflow")
    return TFOps(tf)
