"""QLinearConv / QLinearMatMul speed: qlinear's integer core vs onnxruntime (1 and 2 threads) and the onnx reference.

    uv run python benchmarks/bench_conv.py [--quick] [--json benchmarks/results/conv.json] [--no-reference]

Layers: the convolutions of ResNet-50 (stem 7x7/2 and every 1x1 / 3x3 shape; batch 1 and 8), MobileNetV2's
depthwise 3x3 layers (batch 1), and a transformer's QLinearMatMul shapes (128 x 768 @ 768 x 768 / 768 x 3072 /
3072 x 768). Two weight regimes: full-range int8 and int8 in [-64, 63] (where onnxruntime's AVX2 u8s8 kernel
is exact). x is uint8 with zero point 128 - 5, weights have per-channel scales and zero point 0.

qlinear is timed through its kernel API with prepacked weights (kernels.im2col.conv / kernels.integer_gemm.gemm,
requantization fused, default "float64" arithmetic); onnxruntime runs a one-node model with the weights as
initializers (so it prepacks them too) in a separate process, because a live session's spinning threads slow
other code in the same process. Time = best of several repeats. ratio = qlinear time / onnxruntime time at the
same thread count (below 1: qlinear faster). The onnx ReferenceEvaluator is timed once on a few small layers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

from qlinear import bench_conv
from qlinear.bench_conv import MOBILENET_DW, resnet50_convs  # the layers `qlinear bench --conv` times

HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------- layers
MATMULS = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768)]


def make_cases(quick: bool):
    cases = []
    for batch in (1, 8):
        for name, c, hw, m, k, s, p in resnet50_convs():
            if quick and batch == 8 and name != "stem7x7/2":
                continue
            cases.append(dict(kind="conv", name=f"resnet50 {name} b{batch}", x=(batch, c, hw, hw), w=(m, c, k, k),
                              group=1, stride=s, pad=p))
    for c, hw, s in MOBILENET_DW:
        cases.append(dict(kind="conv", name=f"mobilenetv2 dw3x3 {c}/{s} @{hw}", x=(1, c, hw, hw), w=(c, 1, 3, 3),
                          group=c, stride=s, pad=1))
    for m, k, n in MATMULS:
        cases.append(dict(kind="matmul", name=f"matmul {m}x{k} @ {k}x{n}", a=(m, k), b=(k, n)))
    return cases


def macs(case):
    if case["kind"] == "matmul":
        m, k = case["a"]
        return m * k * case["b"][1]
    n, c, h, w = case["x"]
    m, cg, kh, kw = case["w"]
    ho = (h + 2 * case["pad"] - kh) // case["stride"] + 1
    wo = (w + 2 * case["pad"] - kw) // case["stride"] + 1
    return n * m * ho * wo * cg * kh * kw


def make_data(case, regime: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if regime == "full" else (-64, 63)
    if case["kind"] == "matmul":
        x = rng.integers(0, 256, case["a"], dtype=np.uint8)
        w = rng.integers(lo, hi + 1, case["b"]).astype(np.int8)
        n_out = case["b"][1]
    else:
        x = rng.integers(0, 256, case["x"], dtype=np.uint8)
        w = rng.integers(lo, hi + 1, case["w"]).astype(np.int8)
        n_out = case["w"][0]
    x_scale = np.float32(0.02)
    w_scale = (rng.random(n_out).astype(np.float32) * 0.004 + 0.001).astype(np.float32)
    y_scale = np.float32(0.5 if case["kind"] == "conv" else 2.0)
    bias = rng.integers(-20000, 20000, n_out).astype(np.int32)
    return dict(x=x, x_scale=x_scale, x_zp=np.uint8(123), w=w, w_scale=w_scale, w_zp=np.int8(0),
                y_scale=y_scale, y_zp=np.uint8(120), bias=bias)


def best_time(fn, min_total=0.3, max_reps=200, min_reps=3):
    return bench_conv.best_time(fn, min_total, max_reps, min_reps)


# ----------------------------------------------------------------------------------------------- onnx models
def onnx_model(case, d):
    from onnx import TensorProto, helper, numpy_helper

    if case["kind"] == "matmul":
        inits = [numpy_helper.from_array(np.asarray(d["x_scale"]), "a_scale"),
                 numpy_helper.from_array(np.asarray(d["x_zp"]), "a_zp"),
                 numpy_helper.from_array(d["w"], "b"),
                 numpy_helper.from_array(np.asarray(np.float32(d["w_scale"][0])), "b_scale"),
                 numpy_helper.from_array(np.asarray(d["w_zp"]), "b_zp"),
                 numpy_helper.from_array(np.asarray(d["y_scale"]), "y_scale"),
                 numpy_helper.from_array(np.asarray(d["y_zp"]), "y_zp")]
        node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], ["y"])
        m, n = case["a"][0], case["b"][1]
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, case["a"])],
                                  [helper.make_tensor_value_info("y", TensorProto.UINT8, (m, n))], inits)
    else:
        m = case["w"][0]
        inits = [numpy_helper.from_array(np.asarray(d["x_scale"]), "x_scale"),
                 numpy_helper.from_array(np.asarray(d["x_zp"]), "x_zp"),
                 numpy_helper.from_array(d["w"], "w"),
                 numpy_helper.from_array(d["w_scale"], "w_scale"),
                 numpy_helper.from_array(np.zeros(m, np.int8), "w_zp"),
                 numpy_helper.from_array(np.asarray(d["y_scale"]), "y_scale"),
                 numpy_helper.from_array(np.asarray(d["y_zp"]), "y_zp"),
                 numpy_helper.from_array(d["bias"], "B")]
        k = case["w"][2]
        node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "B"],
                                ["y"], kernel_shape=[k, k], strides=[case["stride"]] * 2, pads=[case["pad"]] * 4,
                                group=case["group"])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, case["x"])],
                                  [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def run_ort(cases, regimes):
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    out = {}
    for case in cases:
        for regime in regimes:
            d = make_data(case, regime)
            model = onnx_model(case, d).SerializeToString()
            feed = {"a" if case["kind"] == "matmul" else "x": d["x"]}
            for threads in (1, 2):
                so = ort.SessionOptions()
                so.intra_op_num_threads = threads
                so.inter_op_num_threads = 1
                so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
                t = best_time(lambda: sess.run(None, feed))
                y = sess.run(None, feed)[0]
                out[f"{case['name']}|{regime}|{threads}"] = t
                if threads == 1:
                    np.save(os.path.join(_tmpdir(), _key(case, regime) + ".npy"), y)
                del sess
    return out


def _tmpdir():
    d = os.path.join(HERE, "results", "tmp")
    os.makedirs(d, exist_ok=True)
    return d


def _key(case, regime):
    return "".join(ch if ch.isalnum() else "_" for ch in case["name"]) + "_" + regime


# ----------------------------------------------------------------------------------------------- qlinear
def qlinear_runner(case, d, mode="float64"):
    from qlinear.kernels import im2col, integer_gemm

    if case["kind"] == "matmul":
        packed = integer_gemm.pack_weights(d["w"], d["w_zp"])
        mult = np.float32(d["x_scale"] * d["w_scale"][0] / d["y_scale"])
        req = (mult, d["y_zp"], np.uint8, mode)
        return lambda: integer_gemm.gemm(d["x"], d["x_zp"], packed, None, req)
    packed = im2col.prepack_conv(d["w"], d["w_zp"], case["group"])
    mult = (d["x_scale"] * d["w_scale"] / d["y_scale"]).astype(np.float32)
    req = (mult, d["y_zp"], np.uint8, mode)
    p = case["pad"]
    geo = dict(strides=(case["stride"],) * 2, dilations=(1, 1), pads_begin=(p, p), pads_end=(p, p))
    return lambda: im2col.conv(d["x"], d["x_zp"], packed, d["bias"], geo, req)


def run_qlinear(cases, regimes):
    from qlinear.kernels import threads as qthreads

    out = {}
    for case in cases:
        for regime in regimes:
            d = make_data(case, regime)
            fn = qlinear_runner(case, d)
            for threads in (1, 2):
                qthreads.set_num_threads(threads)
                out[f"{case['name']}|{regime}|{threads}"] = best_time(fn)
            qthreads.set_num_threads(2)
            ref_path = os.path.join(_tmpdir(), _key(case, regime) + ".npy")
            if os.path.exists(ref_path):
                y_ort = np.load(ref_path)
                y32 = qlinear_runner(case, d, "float32")()
                out[f"{case['name']}|{regime}|match"] = float(np.mean(y_ort == y32))
    return out


def run_reference(cases):
    from onnx.reference import ReferenceEvaluator

    picked = [c for c in cases if c["name"] in (
        "resnet50 3x3 512 @7 b1", "resnet50 1x1 2048->512 @7 b1", "mobilenetv2 dw3x3 960/1 @7",
        "matmul 128x768 @ 768x768")]
    out = {}
    for case in picked:
        d = make_data(case, "full")
        ev = ReferenceEvaluator(onnx_model(case, d))
        feed = {"a" if case["kind"] == "matmul" else "x": d["x"]}
        t0 = time.perf_counter()
        ev.run(None, feed)
        out[case["name"]] = time.perf_counter() - t0
    return out


def machine():
    info = {"python": platform.python_version()}
    try:
        txt = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in txt.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("CPU(s):"):
                info["cpus"] = line.split(":", 1)[1].strip()
            if line.startswith("Flags:"):
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = sorted(f for f in flags if f in (
                    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"))
    except OSError:
        pass
    from qlinear.kernels import integer_gemm

    info["qlinear_path"] = integer_gemm.default_path()
    import numba
    import onnxruntime

    info["numba"] = numba.__version__
    info["onnxruntime"] = onnxruntime.__version__
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batch 8 only for the stem")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "conv.json"))
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--regimes", default="full,7bit")
    ap.add_argument("--filter", default="")
    ap.add_argument("--rounds", type=int, default=2, help="alternating measurement rounds (best time kept)")
    ap.add_argument("--_ort-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    regimes = args.regimes.split(",")
    cases = [c for c in make_cases(args.quick) if args.filter in c["name"]]

    if args._ort_child:
        with open(args._ort_child, "w") as f:
            json.dump(run_ort(cases, regimes), f)
        return

    # Rounds alternate onnxruntime (child process) and qlinear; each time is the best over all rounds, so a
    # burst of load from other processes during one phase does not skew the ratios.
    ort_t, ql_t = {}, {}
    for _round in range(args.rounds):
        child_out = os.path.join(_tmpdir(), "ort.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--_ort-child", child_out, "--regimes", args.regimes,
               "--filter", args.filter] + (["--quick"] if args.quick else [])
        subprocess.run(cmd, check=True)
        with open(child_out) as f:
            for key, t in json.load(f).items():
                ort_t[key] = min(t, ort_t.get(key, t))
        for key, t in run_qlinear(cases, regimes).items():
            ql_t[key] = t if key.endswith("|match") else min(t, ql_t.get(key, t))
    ref_t = {} if args.no_reference else run_reference(cases)

    rows = []
    header = f"{'layer':44s} {'w':5s} {'GMAC':>6s} {'ql 1t ms':>9s} {'ort 1t':>8s} {'r1':>5s} {'ql 2t':>8s} {'ort 2t':>8s} {'r2':>5s} {'=ort':>6s}"
    print(header)
    ratios = {1: [], 2: []}
    for case in cases:
        for regime in regimes:
            k = f"{case['name']}|{regime}"
            row = dict(layer=case["name"], weights=regime, gmac=macs(case) / 1e9)
            for t in (1, 2):
                row[f"qlinear_{t}t_s"] = ql_t[f"{k}|{t}"]
                row[f"ort_{t}t_s"] = ort_t[f"{k}|{t}"]
                row[f"ratio_{t}t"] = ql_t[f"{k}|{t}"] / ort_t[f"{k}|{t}"]
                ratios[t].append(row[f"ratio_{t}t"])
            row["equal_to_ort_float32_mode"] = ql_t.get(f"{k}|match")
            rows.append(row)
            print(f"{case['name']:44s} {regime:5s} {row['gmac']:6.3f} {row['qlinear_1t_s']*1e3:9.3f} "
                  f"{row['ort_1t_s']*1e3:8.3f} {row['ratio_1t']:5.2f} {row['qlinear_2t_s']*1e3:8.3f} "
                  f"{row['ort_2t_s']*1e3:8.3f} {row['ratio_2t']:5.2f} {row['equal_to_ort_float32_mode'] or 0:6.3f}")
    summary = {}
    for t in (1, 2):
        r = np.array(ratios[t])
        summary[f"{t}t"] = dict(geomean=float(np.exp(np.mean(np.log(r)))), worst=float(r.max()), best=float(r.min()),
                                within_2x=int(np.sum(r <= 2.0)), n=int(r.size))
        print(f"threads={t}: geomean ratio {summary[f'{t}t']['geomean']:.3f}, worst {r.max():.2f}, best {r.min():.2f}, "
              f"{summary[f'{t}t']['within_2x']}/{r.size} within 2x")
    ref_rows = []
    for name, t in ref_t.items():
        ql = ql_t[f"{name}|full|1"]
        ref_rows.append(dict(layer=name, reference_s=t, qlinear_1t_s=ql, speedup=t / ql))
        print(f"onnx reference {name}: {t*1e3:.1f} ms, qlinear 1t {ql*1e3:.3f} ms, {t/ql:.0f}x faster")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(machine=machine(), rows=rows, summary=summary, reference=ref_rows), f, indent=1)
    print("wrote", args.json)


if __name__ == "__main__":
    main()
