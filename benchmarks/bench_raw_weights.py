"""The functions users call first, with plain NumPy weights: `qlinear.qlinear_conv` against onnxruntime given the
weights as a graph input (it packs them on every run too), beside the prepacked forms of both.

    uv run python benchmarks/bench_raw_weights.py [--filter TEXT] [--rounds 3] [--threads 2] [--json FILE]

Layers: bench_conv.py's ResNet-50 and MobileNetV2 convolutions at batch 1, weights in [-64, 63]. Columns (ms,
best of repeats, best over rounds that alternate the two processes):
  ort init   onnxruntime, weights as initializers (prepacked at session creation)
  ort input  onnxruntime, weights as a graph input (packed per run)
  ql pre     qlinear.qlinear_conv(x, ..., prepack_conv(w), ...)
  ql raw     qlinear.qlinear_conv(x, ..., w, ...) with the packing cache off: packs on every call
  ql cached  the same with the cache on (the default) and the same array every call: one comparison of the
             weights with the copy packed first (kernels/packing_cache.py)
  pack       prepack_conv(w) plus the first call's lazy GEMM packing (ql raw - ql pre)
Ratios: ql pre / ort init (the prepacked goal), ql raw / ort input and ql cached / ort input (the raw-weights
goal), and the geometric means. onnxruntime runs in a child process (its idle threads spin after a run, which
slows other code in the same process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_conv  # noqa: E402  (the layers, their data and the one-node models)


def cases(filter_text: str):
    return [c for c in bench_conv.make_cases(quick=True)
            if c["kind"] == "conv" and c["x"][0] == 1 and filter_text in c["name"]]


def input_model(case, d):
    """bench_conv's one-node model with w moved from the initializers to the graph inputs."""
    from onnx import TensorProto, helper

    model = bench_conv.onnx_model(case, d)
    graph = model.graph
    weights = [t for t in graph.initializer if t.name == "w"]
    graph.initializer.remove(weights[0])
    graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT8, list(case["w"])))
    return model


def run_ort(selected, threads):
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    out = {}
    for case in selected:
        d = bench_conv.make_data(case, "7bit")
        for kind, model, feed in (("init", bench_conv.onnx_model(case, d), {"x": d["x"]}),
                                  ("input", input_model(case, d), {"x": d["x"], "w": d["w"]})):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            out[f"{case['name']}|ort {kind}"] = bench_conv.best_time(lambda: session.run(None, feed))
            del session
    return out


def run_qlinear(selected, threads):
    import qlinear
    from qlinear.kernels import packing_cache

    qlinear.set_num_threads(threads)
    out = {}
    for case in selected:
        d = bench_conv.make_data(case, "7bit")
        p, s = case["pad"], case["stride"]
        geometry = dict(pads=[p] * 4, strides=[s, s], group=case["group"])
        packed = qlinear.prepack_conv(d["w"], np.int8(0), group=case["group"])

        def call(w):
            return qlinear.qlinear_conv(d["x"], d["x_scale"], d["x_zp"], w, d["w_scale"], np.int8(0), d["y_scale"],
                                        d["y_zp"], d["bias"], **geometry)

        out[f"{case['name']}|ql pre"] = bench_conv.best_time(lambda: call(packed))
        packing_cache.set_enabled(False)
        out[f"{case['name']}|ql raw"] = bench_conv.best_time(lambda: call(d["w"]))
        packing_cache.set_enabled(True)
        out[f"{case['name']}|ql cached"] = bench_conv.best_time(lambda: call(d["w"]))
        packing_cache.clear()
    return out


def geomean(values):
    return float(np.exp(np.mean(np.log(values))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--_ort-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    selected = cases(args.filter)
    if args._ort_child:
        with open(args._ort_child, "w") as f:
            json.dump(run_ort(selected, args.threads), f)
        return
    times: dict[str, float] = {}
    child_out = os.path.join(bench_conv._tmpdir(), "ort_raw.json")
    for _ in range(args.rounds):
        subprocess.run([sys.executable, os.path.abspath(__file__), "--_ort-child", child_out, "--filter", args.filter,
                        "--threads", str(args.threads)], check=True)
        with open(child_out) as f:
            found = json.load(f)
        found.update(run_qlinear(selected, args.threads))
        for key, t in found.items():
            times[key] = min(t, times.get(key, t))
    columns = ["ort init", "ort input", "ql pre", "ql raw", "ql cached"]
    print(f"{args.threads} threads; machine: {json.dumps(bench_conv.machine())}")
    print(f"| layer | {' | '.join(columns)} | pack | pre/init | raw/input | cached/input |")
    print("|---|" + "---:|" * (len(columns) + 4))
    rows, ratios = [], {"pre/init": [], "raw/input": [], "cached/input": []}
    for case in selected:
        t = {c: times[f"{case['name']}|{c}"] * 1e3 for c in columns}
        r = {"pre/init": t["ql pre"] / t["ort init"], "raw/input": t["ql raw"] / t["ort input"],
             "cached/input": t["ql cached"] / t["ort input"]}
        for key, value in r.items():
            ratios[key].append(value)
        rows.append({"layer": case["name"], **{f"{c} ms": v for c, v in t.items()}, **r})
        print(f"| {case['name']} | " + " | ".join(f"{t[c]:.3f}" for c in columns)
              + f" | {t['ql raw'] - t['ql pre']:.3f} | " + " | ".join(f"{r[k]:.2f}x" for k in r) + " |")
    summary = {key: {"geomean": geomean(v), "worst": max(v)} for key, v in ratios.items()}
    print("| **geomean** (worst) | | | | | | | " + " | ".join(
        f"**{s['geomean']:.2f}x** ({s['worst']:.2f}x)" for s in summary.values()) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": bench_conv.machine(), "threads": args.threads, "rows": rows, "summary": summary}, f,
                      indent=1)


if __name__ == "__main__":
    main()
