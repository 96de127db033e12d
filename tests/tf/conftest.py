"""TensorFlow helpers for the qlinear.tf tests.

qlinear targets TensorFlow's plain CPU kernels. With oneDNN on -- TensorFlow's default on x86 --
even *eager* QuantizeV2/Dequantize calls are rewritten to _MklQuantizeV2/_MklDequantize, which
compute different numbers (and reject some inputs), so oneDNN is switched off here, before the
first ``import tensorflow`` (TensorFlow reads the variable once). C++ logging is quieted too.
If TensorFlow was already imported with oneDNN on, the ``tf_ops`` fixture fails with an explanation
instead of letting every comparison fail.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

_TF_IMPORTED_EARLIER = "tensorflow" in sys.modules
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
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


def _runs_the_plain_kernel(ops: TFOps) -> bool:
    # SCALED quint8 dequantize: the plain kernel gives 255 * (max / 255) = max; _MklDequantize
    # gives about 2.1e8 here.
    out = ops.dequantize(np.array([255], np.uint8), 842297.8, 1451076.9, "quint8", mode="SCALED", narrow_range=True)
    return abs(float(out[0]) - 1451076.9) < 1.0


@pytest.fixture(scope="session")
def tf_ops():
    tf = pytest.importorskip("tensorflow")
    ops = TFOps(tf)
    if not _runs_the_plain_kernel(ops):
        pytest.fail(
            "TensorFlow runs its oneDNN kernels (_MklQuantizeV2/_MklDequantize): it was imported "
            f"{'before tests/tf/conftest.py set' if _TF_IMPORTED_EARLIER else 'without'} "
            "TF_ENABLE_ONEDNN_OPTS=0. Set TF_ENABLE_ONEDNN_OPTS=0 in the environment."
        )
    return ops
