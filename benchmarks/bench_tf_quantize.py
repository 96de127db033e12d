"""qlinear.tf (numba kernels) vs tensorflow-cpu eager: QuantizeV2 and Dequantize, every mode and type.

    uv run python benchmarks/bench_tf_quantize.py [--size 16M] [--threads 2] [--repeat 7] [--reference]
                                                   [--no-onednn-run] [--json benchmarks/results/tf_quantize.json]

Both sides run in one process with the same thread count (qlinear.kernels.threads.set_num_threads, TensorFlow's
intra-op pool), TensorFlow with TF_ENABLE_ONEDNN_OPTS=0 so that it runs the plain CPU kernels qlinear reproduces;
calls alternate (TF, qlinear, TF, ...) so machine noise hits both alike. Each row also checks that qlinear's
output equals TensorFlow's bit for bit. A second process then times TensorFlow's default build path (oneDNN on,
which rewrites QuantizeV2/Dequantize to _MklQuantizeV2/_MklDequantize; those compute other numbers and reject
some cases, shown "n/a"). ``--reference`` adds qlinear's NumPy reference (use_kernels(False)).

Times are milliseconds, best and median of ``repeat`` calls after a warm-up; "x" is TF's best time over
qlinear's (> 1: qlinear is faster). No assertions: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_ONEDNN_CHILD = "--tf-only" in sys.argv
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if _ONEDNN_CHILD else "0"  # read once, at TensorFlow's import
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

SIZES = {"1M": 1 << 20, "4M": 1 << 22, "16M": 1 << 24, "64M": 1 << 26}
TYPES = ("qint8", "quint8", "qint16", "quint16", "qint32")
RANGE = (-3.0, 3.0)
ROW = 1024  # per-axis rows view the data as (n / ROW, ROW)


def cases():
    """(label, op, T, mode, round_mode, axis, out dtype) for every row of the table."""
    out = []
    for T in TYPES:
        for mode, rm in (("MIN_COMBINED", "HALF_AWAY_FROM_ZERO"), ("MIN_FIRST", "HALF_AWAY_FROM_ZERO"),
                         ("SCALED", "HALF_AWAY_FROM_ZERO"), ("SCALED", "HALF_TO_EVEN")):
            out.append(("QuantizeV2", T, mode, rm, -1, "float32"))
    for T in ("qint8", "quint8"):
        for mode in ("MIN_COMBINED", "SCALED"):
            out.append(("QuantizeV2", T, mode, "HALF_AWAY_FROM_ZERO", 0, "float32"))  # a range per row
            out.append(("QuantizeV2", T, mode, "HALF_AWAY_FROM_ZERO", 1, "float32"))  # a range per column
    for T in TYPES:
        for mode in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
            out.append(("Dequantize", T, mode, "", -1, "float32"))
    for T in ("qint8", "quint8"):
        out.append(("Dequantize", T, "MIN_COMBINED", "", -1, "bfloat16"))
        for mode in ("MIN_COMBINED", "SCALED"):
            out.append(("Dequantize", T, mode, "", 1, "float32"))
    return out


def label(case) -> str:
    op, T, mode, rm, axis, dtype = case
    extra = {"HALF_TO_EVEN": " half-even", "HALF_AWAY_FROM_ZERO": ""}.get(rm, "")
    where = "" if axis < 0 else f" axis={axis}"
    to = " ->bf16" if dtype == "bfloat16" else ""
    return f"{op} {T} {mode}{extra}{where}{to}"


def inputs(case, n):
    op, T, mode, rm, axis, dtype = case
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 1.5).astype(np.float32)
    if axis < 0:
        return x, np.float32(RANGE[0]), np.float32(RANGE[1])
    x = x.reshape(n // ROW, ROW)
    slices = x.shape[axis]
    mins = np.full(slices, RANGE[0], np.float32) * rng.uniform(0.5, 1.5, slices).astype(np.float32)
    maxs = np.full(slices, RANGE[1], np.float32) * rng.uniform(0.5, 1.5, slices).astype(np.float32)
    return x, mins, maxs


def tf_call(tf, case, x, mn, mx, q=None):
    op, T, mode, rm, axis, dtype = case
    if op == "QuantizeV2":
        tx = tf.constant(x)
        return lambda: tf.raw_ops.QuantizeV2(input=tx, min_range=mn, max_range=mx, T=tf.as_dtype(T), mode=mode,
                                             round_mode=rm, axis=axis).output.numpy()
    tq = tf.constant(q, dtype=tf.as_dtype(T))
    return lambda: tf.raw_ops.Dequantize(input=tq, min_range=mn, max_range=mx, mode=mode, axis=axis,
                                         dtype=tf.as_dtype(dtype)).numpy()


def qlinear_call(case, x, mn, mx, q=None):
    import qlinear.tf

    op, T, mode, rm, axis, dtype = case
    if op == "QuantizeV2":
        return lambda: qlinear.tf.quantize_v2(x, mn, mx, T, mode=mode, round_mode=rm, axis=axis)[0]
    return lambda: qlinear.tf.dequantize(q, mn, mx, mode=mode, axis=axis, dtype=dtype)


def alternate(fns, repeat):
    """Times of each function, called in turn ``repeat`` times after one warm-up call each."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for f, t in zip(fns, times):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [(min(t), float(np.median(t))) for t in times]


def setup(threads_n):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads_n)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def tf_only(args):
    """Child process: TensorFlow with oneDNN on (its default), every row, best/median in ms as JSON."""
    tf = setup(args.threads)
    n = SIZES[args.size]
    rows = {}
    for case in cases():
        x, mn, mx = inputs(case, n)
        try:
            q = None
            if case[0] == "Dequantize":
                import qlinear.tf

                q = qlinear.tf.quantize_v2(x, mn, mx, case[1], mode=case[2], axis=case[4])[0]
            (best, med), = alternate([tf_call(tf, case, x, mn, mx, q)], args.repeat)
            rows[label(case)] = {"best_ms": best * 1e3, "median_ms": med * 1e3}
        except Exception as error:  # oneDNN rejects some cases
            rows[label(case)] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    print(json.dumps(rows))


def onednn_times(args) -> dict:
    cmd = [sys.executable, __file__, "--tf-only", "--size", args.size, "--threads", str(args.threads),
           "--repeat", str(args.repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return {"error": done.stderr[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="16M", choices=sorted(SIZES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--reference", action="store_true", help="also time qlinear's NumPy reference")
    parser.add_argument("--no-onednn-run", action="store_true", help="skip the TensorFlow oneDNN process")
    parser.add_argument("--cases", nargs="*", help="only rows whose label contains one of these strings")
    parser.add_argument("--json")
    parser.add_argument("--tf-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tf_only:
        tf_only(args)
        return

    import qlinear.tf
    from qlinear.kernels import quantize_linear as kernels
    from qlinear.kernels import threads

    tf = setup(args.threads)
    threads.set_num_threads(args.threads)
    n = SIZES[args.size]
    onednn = {} if args.no_onednn_run else onednn_times(args)
    result = {"machine": machine(), "elements": n, "threads": args.threads, "tensorflow": tf.__version__,
              "rows": []}
    print(f"{result['machine']}; {args.size} float32 elements, {args.threads} threads, TF {tf.__version__}; "
          "ms best/median")
    print("| operator | qlinear | TF (oneDNN off) | x | TF default (oneDNN) | x | bit-identical |"
          + (" NumPy reference |" if args.reference else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.reference else ""))
    for case in cases():
        name = label(case)
        if args.cases and not any(s in name for s in args.cases):
            continue
        x, mn, mx = inputs(case, n)
        q = None
        if case[0] == "Dequantize":
            q = qlinear.tf.quantize_v2(x, mn, mx, case[1], mode=case[2], axis=case[4])[0]
        ours, theirs = qlinear_call(case, x, mn, mx, q), tf_call(tf, case, x, mn, mx, q)
        (q_best, q_med), (t_best, t_med) = alternate([ours, theirs], args.repeat)
        a, b = np.asarray(ours()), np.asarray(theirs())
        same = a.dtype.itemsize == b.dtype.itemsize and np.array_equal(
            a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))
        row = {"case": name, "qlinear_ms": [q_best * 1e3, q_med * 1e3], "tf_ms": [t_best * 1e3, t_med * 1e3],
               "bit_identical": bool(same), "tf_onednn": onednn.get(name)}
        line = (f"| {name} | {q_best * 1e3:.1f} / {q_med * 1e3:.1f} | {t_best * 1e3:.1f} / {t_med * 1e3:.1f} | "
                f"{t_best / q_best:.2f} | ")
        d = onednn.get(name) or {}
        line += (f"{d['best_ms']:.1f} / {d['median_ms']:.1f} | {d['best_ms'] / 1e3 / q_best:.2f} | "
                 if "best_ms" in d else "n/a | |")
        line += "yes |" if same else "**no** |"
        if args.reference:
            with kernels.use_kernels(False):
                (r_best, r_med), = alternate([ours], max(1, args.repeat // 3))
            row["reference_ms"] = [r_best * 1e3, r_med * 1e3]
            line += f" {r_best * 1e3:.0f} |"
        print(line, flush=True)
        result["rows"].append(row)
    if "error" in onednn:
        print("oneDNN process failed:", onednn["error"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result | {"onednn": onednn}, f, indent=1)


if __name__ == "__main__":
    main()
