"""A quantized ResNet bottleneck block as an ONNX QOperator model: qlinear.onnx.run vs onnx's ReferenceEvaluator
vs onnxruntime.

    uv run python benchmarks/bench_onnx_run.py [--size 56] [--repeat 5] [--json benchmarks/results/onnx_run.json]

The model (opset 21): x float32 (1, 256, S, S) -> QuantizeLinear (uint8) -> QLinearConv 1x1 256->64 ->
QLinearConv 3x3 64->64 (pad 1) -> QLinearConv 1x1 64->256 -> DequantizeLinear, full-range int8 weights with
per-channel scales, int32 biases: ResNet-50's first bottleneck at S = 56. Each runner is built once (qlinear's
evaluator, the plain ReferenceEvaluator, an onnxruntime session with 1 thread), warmed up once (numba compiles
or loads its cache), then timed; time = best of the repeats (the machine is shared, so the minimum is the
stable figure; medians are printed too), the plain reference with fewer repeats (it is slow). qlinear's kernels use 1 thread by default (--threads), like the onnxruntime session; the plain
reference uses whatever NumPy's BLAS uses. The outputs are checked: qlinear's default arithmetic equals the reference's, ``requantize="float32"``
equals onnxruntime's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import qlinear.onnx as qonnx  # noqa: E402


def bottleneck(size: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (
        ("x_scale", np.float32(0.02)), ("x_zero", np.uint8(128)))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["q0"])]
    layers = [(256, 64, 1), (64, 64, 3), (64, 256, 1)]
    previous = ("q0", "x_scale", "x_zero")
    for i, (c_in, c_out, k) in enumerate(layers, 1):
        fan_in = c_in * k * k
        inits += [numpy_helper.from_array(np.asarray(v), f"{n}{i}") for n, v in (
            ("w", rng.integers(-128, 128, (c_out, c_in, k, k)).astype(np.int8)),
            ("w_scale", rng.uniform(0.5, 1.5, c_out).astype(np.float32) / np.float32(127 * np.sqrt(fan_in))),
            ("w_zero", np.zeros(c_out, np.int8)),
            ("b", rng.integers(-5000, 5000, c_out).astype(np.int32)),
            ("y_scale", np.float32(0.02)), ("y_zero", np.uint8(128)))]
        nodes.append(helper.make_node(
            "QLinearConv", [*previous, f"w{i}", f"w_scale{i}", f"w_zero{i}", f"y_scale{i}", f"y_zero{i}", f"b{i}"],
            [f"q{i}"], pads=[k // 2] * 4))
        previous = (f"q{i}", f"y_scale{i}", f"y_zero{i}")
    nodes.append(helper.make_node("DequantizeLinear", list(previous), ["y"]))
    graph = helper.make_graph(nodes, "bottleneck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def timed(function, repeat: int) -> tuple[float, object]:
    result = function()  # warm-up: numba compilation or cache load, onnxruntime's first-run allocations
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference-repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="qlinear's kernel threads (default 1, like the onnxruntime session; 0: its default)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.threads:
        from qlinear.kernels import threads

        threads.set_num_threads(args.threads)

    from onnx.reference import ReferenceEvaluator

    model = bottleneck(args.size)
    feeds = {"x": np.random.default_rng(1).normal(size=(1, 256, args.size, args.size)).astype(np.float32)}
    ours = qonnx.evaluator(model)
    ours32 = qonnx.evaluator(model, requantize="float32")
    reference = ReferenceEvaluator(model)

    t_ours, m_ours, y_ours = timed(lambda: qonnx.run(ours, feeds)["y"], args.repeat)
    t_ours32, m_ours32, y_ours32 = timed(lambda: qonnx.run(ours32, feeds)["y"], args.repeat)
    t_ref, m_ref, (y_ref,) = timed(lambda: reference.run(None, feeds), args.reference_repeat)

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    t_ort, m_ort, (y_ort,) = timed(lambda: session.run(None, feeds), args.repeat)

    exact_ref = bool(np.array_equal(y_ours, y_ref))
    exact_ort = bool(np.array_equal(y_ours32, y_ort))
    macs = args.size * args.size * (256 * 64 + 64 * 64 * 9 + 64 * 256)
    result = {
        "model": f"QOperator bottleneck 256->64 (1x1) ->64 (3x3) ->256 (1x1) at {args.size}x{args.size}, batch 1",
        "macs": macs,
        "qlinear_s": t_ours,
        "qlinear_float32_requantize_s": t_ours32,
        "onnx_reference_s": t_ref,
        "onnxruntime_1thread_s": t_ort,
        "median_s": {"qlinear": m_ours, "qlinear_float32_requantize": m_ours32, "onnx_reference": m_ref,
                     "onnxruntime_1thread": m_ort},
        "speedup_vs_onnx_reference": t_ref / t_ours,
        "speedup_vs_onnx_reference_medians": m_ref / m_ours,
        "qlinear_over_onnxruntime": t_ours / t_ort,
        "bit_identical_to_onnx_reference": exact_ref,
        "float32_requantize_bit_identical_to_onnxruntime": exact_ort,
        "qlinear_threads": args.threads or "default",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    }
    print(f"{result['model']} ({macs / 1e6:.0f} M MACs)")
    print(f"  qlinear.onnx.run            {t_ours * 1e3:9.1f} ms   (requantize=float32: {t_ours32 * 1e3:.1f} ms; "
          f"threads: {args.threads or 'default'})")
    print(f"  onnx ReferenceEvaluator     {t_ref * 1e3:9.1f} ms   -> qlinear is {t_ref / t_ours:.1f}x faster")
    print(f"  onnxruntime (1 thread)      {t_ort * 1e3:9.1f} ms   -> qlinear takes {t_ours / t_ort:.1f}x its time")
    print(f"  medians: qlinear {m_ours * 1e3:.1f} ms, reference {m_ref * 1e3:.1f} ms ({m_ref / m_ours:.1f}x), "
          f"onnxruntime {m_ort * 1e3:.1f} ms")
    print(f"  bit-identical: to the reference {exact_ref}, float32 mode to onnxruntime {exact_ort}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
