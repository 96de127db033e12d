"""qlinear.tf (NumPy reference) vs tensorflow-cpu eager, QuantizeV2 and Dequantize.

    uv run python benchmarks/bench_tf_quantize.py [n_elements]

Prints the median wall time of each call; no assertions (timings on shared machines are noisy).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from qlinear.tf import dequantize, quantize_v2


def median_time(fn, repeat=7):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(n: int) -> None:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    print(f"n = {n}")
    for T in ("qint8", "quint8", "qint32"):
        for mode in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
            ours = median_time(lambda: quantize_v2(x, -2.0, 3.0, T, mode=mode))
            theirs = median_time(
                lambda: tf.raw_ops.QuantizeV2(input=x, min_range=-2.0, max_range=3.0, T=tf.as_dtype(T), mode=mode).output.numpy()
            )
            q = quantize_v2(x, -2.0, 3.0, T, mode=mode)[0]
            tq = tf.constant(q, dtype=tf.as_dtype(T))
            d_ours = median_time(lambda: dequantize(q, -2.0, 3.0, mode=mode))
            d_theirs = median_time(lambda: tf.raw_ops.Dequantize(input=tq, min_range=-2.0, max_range=3.0, mode=mode).numpy())
            print(
                f"{T:7s} {mode:12s} quantize: qlinear {ours * 1e3:8.2f} ms  tf {theirs * 1e3:7.2f} ms   "
                f"dequantize: qlinear {d_ours * 1e3:8.2f} ms  tf {d_theirs * 1e3:7.2f} ms"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
