"""Per-call time of the element-wise quantization operators on small and medium inputs, where the Python
around the kernel (argument checks, dispatch) is most of the cost; with ``--peers``, the same calls in
onnxruntime (InferenceSession.run) and TensorFlow eager (tf.raw_ops).

    uv run python benchmarks/bench_call_overhead.py [--threads 1] [--calls 2000] [--repeat 7] [--peers]

Times are microseconds per call, the best of ``repeat`` loops of ``calls`` calls after a warm-up. The
TensorFlow calls pass the same ranges on every call, as a model does (qlinear keeps their per-slice
constants; see `qlinear.kernels.tf_quantize`); "fresh ranges" rows change them on every call. No
assertions: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import qlinear


def _best(fn, calls: int, repeat: int) -> float:
    for _ in range(max(calls // 10, 20)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def _cases():
    rng = np.random.default_rng(0)
    x64 = rng.standard_normal(64).astype(np.float32)
    x64k = rng.standard_normal(65536).astype(np.float32)
    xb = rng.standard_normal((64, 4096)).astype(np.float32)
    sb = np.full((64, 128), 0.02, np.float32)
    q8 = rng.integers(-128, 128, (64, 64)).astype(np.int8)
    sa, za = np.full(64, 0.02, np.float32), np.zeros(64, np.int8)
    s, zp = np.float32(0.02), np.uint8(3)
    counter = iter(range(10**9))
    return {
        "Q per-tensor uint8, 64": (lambda: qlinear.quantize_linear(x64, s, zp),
                                   ("QuantizeLinear", x64, s, zp, {})),
        "Q per-tensor uint8, 64K": (lambda: qlinear.quantize_linear(x64k, s, zp),
                                    ("QuantizeLinear", x64k, s, zp, {})),
        "Q blocked int4 b32, 64x4096": (
            lambda: qlinear.quantize_linear(xb, sb, None, axis=1, block_size=32, output_dtype="int4"), None),
        "DQ per-axis int8, 64x64": (lambda: qlinear.dequantize_linear(q8, sa, za, axis=1),
                                    ("DequantizeLinear", q8, sa, za, {"axis": 1})),
        "TF QuantizeV2 SCALED qint8, 64": (
            lambda: qlinear.tf.quantize_v2(x64, -1.0, 1.0, "qint8", mode="SCALED"), ("tf", x64)),
        "TF QuantizeV2 SCALED qint8, 64K": (
            lambda: qlinear.tf.quantize_v2(x64k, -1.0, 1.0, "qint8", mode="SCALED"), ("tf", x64k)),
        "TF QuantizeV2 SCALED qint8, 64, fresh ranges": (
            lambda: qlinear.tf.quantize_v2(x64, -1.0 - next(counter) * 1e-6, 1.0, "qint8", mode="SCALED"), None),
    }


def _onnxruntime_call(op, x, scale, zero_point, attributes):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    y_type = TensorProto.UINT8 if op == "QuantizeLinear" else TensorProto.FLOAT
    x_type = TensorProto.FLOAT if op == "QuantizeLinear" else TensorProto.INT8
    inits = [numpy_helper.from_array(np.asarray(scale), "s"), numpy_helper.from_array(np.asarray(zero_point), "z")]
    node = helper.make_node(op, ["x", "s", "z"], ["y"], **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, list(x.shape))],
                              [helper.make_tensor_value_info("y", y_type, list(x.shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = qlinear.get_num_threads()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"x": x}
    return lambda: session.run(None, feed)


def _tensorflow_call(x):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(qlinear.get_num_threads())
    tx, lo, hi = tf.constant(x), tf.constant(-1.0), tf.constant(1.0)
    return lambda: tf.raw_ops.QuantizeV2(input=tx, min_range=lo, max_range=hi, T=tf.qint8, mode="SCALED")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--peers", action="store_true", help="also time onnxruntime and TensorFlow eager")
    args = parser.parse_args()
    if args.threads:
        qlinear.set_num_threads(args.threads)
    print(f"threads: {qlinear.get_num_threads()}; microseconds per call, best of {args.repeat} x {args.calls}")
    print(f"{'case':46s} {'qlinear':>9s}" + (f" {'peer':>9s}" if args.peers else ""))
    for name, (fn, peer) in _cases().items():
        calls = max(args.calls // 10, 50) if ("4096" in name or "64K" in name) else args.calls
        line = f"{name:46s} {_best(fn, calls, args.repeat):9.2f}"
        if args.peers and peer is not None:
            peer_fn = _tensorflow_call(peer[1]) if peer[0] == "tf" else _onnxruntime_call(*peer)
            line += f" {_best(peer_fn, calls, args.repeat):9.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
