"""`qlinear bench --conv`: the thread scaling of QLinearConv on this CPU, qlinear beside onnxruntime.

Every distinct ResNet-50 convolution and MobileNetV2's 3x3 depthwise layers, batch 1, uint8 activations and
int8 weights (7-bit by default, in [-64, 63], as onnxruntime's quantizer writes them with ``reduce_range`` for
CPUs without VNNI; ``weights="8bit"`` for the whole range), timed at each thread count: qlinear's
`qlinear_conv` on `prepack_conv` weights (the form a runtime uses), and onnxruntime's QLinearConv node with
the weights as initializers, which it prepacks. onnxruntime runs in a child process: its idle intra-op threads
spin after a run, which would slow qlinear in the same process. Times are the best of the runs within
``min_total`` seconds (at least 3); ratios are qlinear's time over onnxruntime's (below 1: qlinear is faster)
and each one's time on more threads over its time on the first count.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from .bench import cpu_model


def resnet50_convs() -> list[tuple]:
    """(name, C, H, M, k, stride, pad) of every distinct ResNet-50 convolution (torchvision v1.5)."""
    layers = [("stem7x7/2", 3, 224, 64, 7, 2, 3)]
    stages = [(64, 256, 56, 1), (128, 512, 56, 2), (256, 1024, 28, 2), (512, 2048, 14, 2)]
    c_in = 64
    for width, out, hw, stride in stages:
        ho = hw // stride
        layers.append((f"1x1 {c_in}->{width} @{hw}", c_in, hw, width, 1, 1, 0))
        layers.append((f"3x3 {width}/{stride} @{hw}", width, hw, width, 3, stride, 1))
        layers.append((f"1x1 {width}->{out} @{ho}", width, ho, out, 1, 1, 0))
        layers.append((f"down 1x1 {c_in}->{out}/{stride} @{hw}", c_in, hw, out, 1, stride, 0))
        layers.append((f"1x1 {out}->{width} @{ho}", out, ho, width, 1, 1, 0))
        if stride != 1:
            layers.append((f"3x3 {width} @{ho}", width, ho, width, 3, 1, 1))
        c_in = out
    seen, unique = set(), []
    for layer in layers:
        if layer[1:] not in seen:
            seen.add(layer[1:])
            unique.append(layer)
    return unique


# (C, H, stride) of MobileNetV2's distinct 3x3 depthwise convolutions
MOBILENET_DW = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
                (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]


def layers(batch: int = 1) -> list[dict]:
    """The benchmark's convolutions: name, x and w shapes, group, stride, pad."""
    out = [dict(name=f"resnet50 {name}", x=(batch, c, hw, hw), w=(m, c, k, k), group=1, stride=s, pad=p)
           for name, c, hw, m, k, s, p in resnet50_convs()]
    out += [dict(name=f"mobilenetv2 dw3x3 {c}/{s} @{hw}", x=(batch, c, hw, hw), w=(c, 1, 3, 3), group=c, stride=s,
                 pad=1) for c, hw, s in MOBILENET_DW]
    # the two dense layers of MobileNet's widths that issue 32 measured (a fixed cost per call showed on them)
    out += [dict(name="mobilenet-width 3x3 32->32 @112", x=(batch, 32, 112, 112), w=(32, 32, 3, 3), group=1, stride=1,
                 pad=1),
            dict(name="mobilenet-width 1x1 96->96 @28", x=(batch, 96, 28, 28), w=(96, 96, 1, 1), group=1, stride=1,
                 pad=0)]
    return out


def _strides(layer: dict) -> list[int]:
    """A layer's strides: its "stride", one for both axes, or (height, width)."""
    s = layer["stride"]
    return [s, s] if isinstance(s, int) else list(s)


def data(layer: dict, weights: str = "7bit", seed: int = 0) -> dict:
    """Deterministic operands of one layer."""
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if weights == "8bit" else (-64, 63)
    m = layer["w"][0]
    return dict(x=rng.integers(0, 256, layer["x"], dtype=np.uint8), x_scale=np.float32(0.02), x_zp=np.uint8(123),
                w=rng.integers(lo, hi + 1, layer["w"]).astype(np.int8),
                w_scale=(rng.random(m).astype(np.float32) * 0.004 + 0.001).astype(np.float32), w_zp=np.int8(0),
                y_scale=np.float32(0.5), y_zp=np.uint8(120), bias=rng.integers(-20000, 20000, m).astype(np.int32))


def best_time(fn, min_total: float = 0.2, max_runs: int = 200, min_runs: int = 3) -> float:
    """The best of the runs within ``min_total`` seconds (at least ``min_runs``, at most ``max_runs``), after one
    untimed run."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < min_total and len(times) < max_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def time_qlinear(selected: list[dict], thread_counts, weights: str, min_total: float) -> dict:
    import qlinear

    out = {}
    for layer in selected:
        d = data(layer, weights)
        p, s = layer["pad"], _strides(layer)
        packed = qlinear.prepack_conv(d["w"], d["w_zp"], group=layer["group"])

        def call():
            return qlinear.qlinear_conv(d["x"], d["x_scale"], d["x_zp"], packed, d["w_scale"], d["w_zp"],
                                        d["y_scale"], d["y_zp"], d["bias"], pads=[p] * 4, strides=s,
                                        group=layer["group"])

        for threads in thread_counts:
            qlinear.set_num_threads(threads)
            out[f"{layer['name']}|{threads}"] = best_time(call, min_total)
    return out


def _onnx_model(layer: dict, d: dict):
    from onnx import TensorProto, helper, numpy_helper

    p, s = layer["pad"], _strides(layer)
    inits = [numpy_helper.from_array(np.asarray(d[k]), k) for k in
             ("x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "bias")]
    node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "bias"],
                            ["y"], pads=[p] * 4, strides=s, group=layer["group"])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(layer["x"]))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def time_onnxruntime(selected: list[dict], thread_counts, weights: str, min_total: float) -> dict:
    """In this process: run by the child that `run` starts."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    out = {}
    for layer in selected:
        d = data(layer, weights)
        model = _onnx_model(layer, d).SerializeToString()
        for threads in thread_counts:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            out[f"{layer['name']}|{threads}"] = best_time(lambda: session.run(None, {"x": d["x"]}), min_total)
            del session
    return out


def _keep_best(best: dict, times: dict) -> None:
    for key, value in times.items():
        best[key] = min(value, best.get(key, value))


def _geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def run(filter_text: str = "", thread_counts=(1, 2), weights: str = "7bit", min_total: float = 0.2,
        peer: bool = True, rounds: int = 2) -> dict:
    """Time every selected layer on qlinear (here) and onnxruntime (a child process, when installed), in
    ``rounds`` alternating rounds: the best time of all rounds counts, so that a slow phase of a shared machine
    (a VM's neighbours) does not fall on one library alone."""
    from .kernels import threads

    selected = [layer for layer in layers() if filter_text in layer["name"]]
    if not selected:
        raise ValueError(f"bench --conv: no layer's name contains {filter_text!r}")
    counts = [int(t) for t in thread_counts]
    ort_times: dict = {}
    ql_times: dict = {}
    ort_note = None
    if peer:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            ort_note = "onnxruntime is not installed"
            peer = False
    for _ in range(rounds):
        if peer:
            child = subprocess.run([sys.executable, "-c", "import json, sys; from qlinear import bench_conv; "
                                    "a = json.loads(sys.argv[1]); print(json.dumps(bench_conv.time_onnxruntime(*a)))",
                                    json.dumps([selected, counts, weights, min_total])],
                                   capture_output=True, text=True, env=dict(os.environ))
            if child.returncode == 0:
                _keep_best(ort_times, json.loads(child.stdout.strip().splitlines()[-1]))
            else:
                ort_note = "onnxruntime failed: " + (child.stderr.strip().splitlines() or ["?"])[-1]
                peer, ort_times = False, {}
        before = threads.get_num_threads()
        try:
            _keep_best(ql_times, time_qlinear(selected, counts, weights, min_total))
        finally:
            threads.set_num_threads(before)
    rows = []
    for layer in selected:
        row = {"layer": layer["name"]}
        for t in counts:
            q, o = ql_times[f"{layer['name']}|{t}"], ort_times.get(f"{layer['name']}|{t}")
            row[f"qlinear_{t}t_ms"] = 1e3 * q
            row[f"onnxruntime_{t}t_ms"] = None if o is None else 1e3 * o
            row[f"ratio_{t}t"] = None if o is None else q / o
        first = counts[0]
        for t in counts[1:]:
            row[f"qlinear_{t}t_over_{first}t"] = row[f"qlinear_{t}t_ms"] / row[f"qlinear_{first}t_ms"]
            if ort_times:
                row[f"onnxruntime_{t}t_over_{first}t"] = row[f"onnxruntime_{t}t_ms"] / row[f"onnxruntime_{first}t_ms"]
        rows.append(row)
    summary = {}
    for key in rows[0]:
        if key != "layer" and (key.startswith("ratio") or "_over_" in key):
            values = [r[key] for r in rows if r[key] is not None]
            summary[key] = {"geomean": _geomean(values), "worst": max(values) if values else None}
    import numba

    from .kernels import integer_gemm

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "thread_counts": counts, "weights": weights,
            "rounds": rounds,
            "qlinear_path": integer_gemm.default_path(), "threading_layer": _threading_layer(numba),
            "amx": integer_gemm.amx_available(),
            # what the serial-or-parallel choices compared with (measured once per process, at first use)
            "launch_cost": threads.launch_cost() if max(counts) > 1 else None,
            "onnxruntime": _version("onnxruntime") if ort_times else ort_note, "rows": rows, "summary": summary}


def _threading_layer(numba) -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel region ran
        return "not started"


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


def table(results: dict) -> str:
    counts = results["thread_counts"]
    head = ["layer"]
    for t in counts:
        head += [f"onnxruntime {t}t", f"qlinear {t}t", f"ratio {t}t"]
    for t in counts[1:]:
        head += [f"qlinear {t}t/{counts[0]}t", f"onnxruntime {t}t/{counts[0]}t"]
    amx = {True: " (AMX tiles where timed faster)", False: " (no AMX tiles)"}.get(results.get("amx"), "")
    lines = [f"CPU: {results['cpu']} ({results['cores']} cores); qlinear path {results['qlinear_path']}{amx}, numba "
             f"threading layer {results['threading_layer']}; onnxruntime {results['onnxruntime']}; "
             f"{results['weights']} weights; ms, best of runs in {results['rounds']} alternating rounds"
             + (f"; launch cost {1e6 * results['launch_cost']:.0f} us" if results.get("launch_cost") else ""),
             "| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]

    def cell(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    for r in results["rows"]:
        cells = [r["layer"]]
        for t in counts:
            cells += [cell(r[f"onnxruntime_{t}t_ms"], ".3f"), cell(r[f"qlinear_{t}t_ms"], ".3f"),
                      cell(r[f"ratio_{t}t"], ".2f") + ("x" if r[f"ratio_{t}t"] is not None else "")]
        for t in counts[1:]:
            cells += [cell(r[f"qlinear_{t}t_over_{counts[0]}t"], ".2f"),
                      cell(r.get(f"onnxruntime_{t}t_over_{counts[0]}t"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    s = results["summary"]
    cells = ["**geomean** (worst)"]
    for t in counts:
        g = s.get(f"ratio_{t}t", {})
        cells += ["", "", f"**{cell(g.get('geomean'), '.2f')}x** ({cell(g.get('worst'), '.2f')}x)" if g else "n/a"]
    for t in counts[1:]:
        for who in ("qlinear", "onnxruntime"):
            g = s.get(f"{who}_{t}t_over_{counts[0]}t", {})
            cells.append(f"{cell(g.get('geomean'), '.2f')} ({cell(g.get('worst'), '.2f')})" if g else "n/a")
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args) -> int:
    results = run(args.filter or "", args.threads, args.weights, args.min_time,
                  peer="onnxruntime" not in (args.skip or []), rounds=args.rounds)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0
