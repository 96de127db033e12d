"""`qlinear.qlinear_matmul` per call against a one-node onnxruntime QLinearMatMul session (B an initializer), on 1
and 2 threads: B as a plain array (the packing cache compares its bytes on every call) and from
`qlinear.prepack_matmul`. A in [0, 127] and B in [-64, 63], so that onnxruntime's kernel is exact on CPUs without
VNNI (its u8s8 kernel saturates pairs of products in int16 otherwise) and the bits are compared too.

    uv run python benchmarks/bench_matmul.py [--shapes 1x384x384 16x96x10] [--calls 400]

Medians in microseconds of ``calls`` calls after 50; no assertions (timings on a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import subprocess
import time

import numpy as np

import qlinear

SHAPES = ("1x384x384", "1x768x3072", "16x96x10", "128x384x384")


def _median(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def _session(m: int, k: int, scalars: tuple, b: np.ndarray, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    names = ("a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")
    values = (scalars[0], scalars[1], b, *scalars[2:])
    inits = [numpy_helper.from_array(np.asarray(v), n) for v, n in zip(values, names)]
    node = helper.make_node("QLinearMatMul", ["a", *names], ["y"])
    graph = helper.make_graph([node], "matmul", [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="M x K x N, e.g. 1x384x384")
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((line for line in cpu.splitlines() if line.startswith("Model name")), "Model name: ?"))
    print("| M x K x N | plain B, 1t | prepacked B, 1t | onnxruntime 1t | plain 2t | prepacked 2t | onnxruntime 2t "
          "| same bits |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        m, k, n = map(int, shape.split("x"))
        a = rng.integers(0, 128, (m, k), dtype=np.uint8)
        b = rng.integers(-64, 64, (k, n), dtype=np.int8)
        scalars = (np.float32(0.02), np.uint8(64), np.float32(0.01), np.int8(0), np.float32(0.3), np.uint8(120))
        packed = qlinear.prepack_matmul(b, scalars[3])
        cells, same = [], True
        for threads in (1, 2):
            qlinear.set_num_threads(threads)
            for operand in (b, packed):
                cells.append(_median(lambda operand=operand: qlinear.qlinear_matmul(
                    a, scalars[0], scalars[1], operand, *scalars[2:]), args.calls))
            # opened after qlinear's runs and closed before the next: an open session's idle workers spin on
            # the other vCPU (qlinear's plain-B 2-thread calls of 512 x 512 x 512 measured 507 us beside one,
            # against 1-thread 552 us)
            session = _session(m, k, scalars, b, threads)
            cells.append(_median(lambda: session.run(None, {"a": a}), args.calls))
            same &= bool(np.array_equal(qlinear.qlinear_matmul(a, scalars[0], scalars[1], packed, *scalars[2:]),
                                        session.run(None, {"a": a})[0]))
            del session
        print(f"| {shape.replace('x', ' x ')} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {same} |")


if __name__ == "__main__":
    main()
