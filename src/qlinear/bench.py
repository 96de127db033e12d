"""`qlinear bench`: the element-wise kernels side by side with every installed peer, in one process run.

For each case (an operator, its types and granularity) and size, it times, best of ``repeat`` runs:
qlinear (kernels, ``threads`` threads), onnxruntime with 1 and 2 intra-op threads, the onnx reference
evaluator, TensorFlow (QuantizeV2/Dequantize, for the per-tensor uint8/int8 cases), plain NumPy, and a
bandwidth probe: a multithreaded kernel that reads as many bytes as x has and writes as many as y has into a
freshly allocated array, which is the time no element-wise kernel returning a new array can beat (and, for
reference, a multithreaded copy of the same number of bytes into preallocated memory: the bare bandwidth). Peers that are not installed, or that cannot run a case, show
"n/a". It also measures qlinear's peak extra memory per call (tracemalloc: bytes allocated beyond the
output) and, optionally, the kernels' JIT cost in fresh processes (cold cache, then warm cache).

Rows whose case ends in "out=" time qlinear writing into one preallocated array (``out=``, reused by every
call) instead of returning a new one; their peers are timed as in the row without it (they return new arrays),
and their "extraMB" is the whole peak, the output not being allocated.

Output: a table (times in ms; "x" columns are the peer's time over qlinear's, so > 1 means qlinear is
faster; "bw" is the fresh-output probe's time / qlinear time, 1.0 = at the memory-bandwidth bound; "bwP" the
same against the preallocated copy) and a JSON file.
Peers are imported only here, never by `import qlinear`.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

SIZES = {"64K": 1 << 16, "1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}
ROW = 1024  # per-axis / blocked cases view x as (n / ROW, ROW) and quantize along the last axis
BLOCK = 32


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # "Q", "DQ" (ONNX) or "TFQ", "TFDQ" (TensorFlow QuantizeV2 / Dequantize)
    quantized: str  # ONNX name of the quantized type
    granularity: str  # "tensor", "axis", "block"
    mode: str = "SCALED"  # TensorFlow mode (TF cases, and the TF column of per-tensor 8-bit ONNX cases)
    out: bool = False  # qlinear writes into a preallocated array (out=) instead of returning a new one

    @property
    def tf_mode(self) -> bool:
        return self.op.startswith("TF") or (self.granularity == "tensor" and self.quantized in ("uint8", "int8"))


CASES = (
    Case("Q f32->uint8 tensor", "Q", "uint8", "tensor"),
    Case("Q f32->uint8 tensor out=", "Q", "uint8", "tensor", out=True),
    Case("Q f32->int8 axis", "Q", "int8", "axis"),
    Case("Q f32->int8 block32", "Q", "int8", "block"),
    Case("Q f32->int8 block32 out=", "Q", "int8", "block", out=True),
    Case("Q f32->uint16 tensor", "Q", "uint16", "tensor"),
    Case("Q f32->int4 block32", "Q", "int4", "block"),
    Case("Q f32->float8e4m3fn tensor", "Q", "float8e4m3fn", "tensor"),
    Case("Q f32->float4e2m1 block32", "Q", "float4e2m1", "block"),
    Case("DQ uint8->f32 tensor", "DQ", "uint8", "tensor"),
    Case("DQ uint8->f32 tensor out=", "DQ", "uint8", "tensor", out=True),
    Case("DQ int8->f32 axis", "DQ", "int8", "axis"),
    Case("DQ int4->f32 block32", "DQ", "int4", "block"),
    Case("DQ float8e4m3fn->f32 tensor", "DQ", "float8e4m3fn", "tensor"),
    Case("TF QuantizeV2 qint8 SCALED", "TFQ", "int8", "tensor", "SCALED"),
    Case("TF QuantizeV2 quint8 MIN_COMBINED", "TFQ", "uint8", "tensor", "MIN_COMBINED"),
    Case("TF QuantizeV2 quint8 MIN_FIRST", "TFQ", "uint8", "tensor", "MIN_FIRST"),
    Case("TF Dequantize qint8 SCALED", "TFDQ", "int8", "tensor", "SCALED"),
    Case("TF Dequantize quint8 MIN_COMBINED", "TFDQ", "uint8", "tensor", "MIN_COMBINED"),
    Case("TF Dequantize quint8 MIN_FIRST", "TFDQ", "uint8", "tensor", "MIN_FIRST"),
)
_TF_TYPES = {"int8": "qint8", "uint8": "quint8"}
_TF_RANGE = (-100.0, 100.0)


# ----------------------------------------------------------------------------------------------- inputs
def _inputs(case: Case, n: int):
    """(x, scale, zero_point, axis, block_size) for a case; x has n elements."""
    from . import dtypes

    rng = np.random.default_rng(0)
    t = dtypes.get(case.quantized)
    shape = (n // ROW, ROW)
    if case.granularity == "tensor":
        pshape = ()
    elif case.granularity == "axis":
        pshape = (ROW,)
    else:
        pshape = (n // ROW, ROW // BLOCK)
    scale = (0.01 + rng.random(pshape)).astype(np.float32)
    if t.is_integer:
        zp = rng.integers(t.qmin, t.qmax, pshape, endpoint=True).astype(t.dtype)
    else:
        zp = np.zeros(pshape, t.dtype)
    if case.op == "TFDQ":
        x = rng.integers(t.qmin, t.qmax, shape, endpoint=True).astype(t.dtype)
    elif case.op in ("Q", "TFQ"):
        x = (rng.standard_normal(shape, np.float32) * 50).astype(np.float32)
    elif t.is_integer:
        x = rng.integers(t.qmin, t.qmax, shape, endpoint=True).astype(t.dtype)
    else:
        x = rng.integers(0, 1 << t.bits, shape).astype(np.uint8).view(t.dtype)
        x[np.isnan(x.astype(np.float32))] = 0
    axis = 1
    block = BLOCK if case.granularity == "block" else 0
    return x, scale, zp, axis, block


# ----------------------------------------------------------------------------------------------- timing
WARMUP_S = 0.3


def _best(fn, repeat: int) -> float:
    # warm-up: the first call compiles / starts a session; then run for WARMUP_S more, because on this
    # project's VM the first dozen 16M-element calls of any kernel (every peer's) are up to 2x slower
    # than the steady state (clock and page-cache effects), which a best-of-5 would not get past
    fn()
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_S:
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _qlinear_fn(case: Case, x, scale, zp, axis, block):
    import qlinear

    lo, hi = np.float32(_TF_RANGE[0]), np.float32(_TF_RANGE[1])
    if case.op == "TFQ":
        return lambda: qlinear.tf.quantize_v2(x, lo, hi, _TF_TYPES[case.quantized], mode=case.mode)[0]
    if case.op == "TFDQ":
        return lambda: qlinear.tf.dequantize(x, lo, hi, mode=case.mode)
    if case.out:  # one preallocated result, written by every call
        from . import dtypes

        y = np.empty(x.shape, dtypes.get(case.quantized).dtype if case.op == "Q" else np.float32)
        if case.op == "Q":
            return lambda: qlinear.quantize_linear(x, scale, zp, axis=axis, block_size=block, out=y)
        return lambda: qlinear.dequantize_linear(x, scale, zp, axis=axis, block_size=block, out=y)
    if case.op == "Q":
        return lambda: qlinear.quantize_linear(x, scale, zp, axis=axis, block_size=block)
    return lambda: qlinear.dequantize_linear(x, scale, zp, axis=axis, block_size=block)


def _numpy_fn(case: Case, x, scale, zp, axis, block):
    from . import dtypes

    t = dtypes.get(case.quantized)

    def expand(p):
        if case.granularity == "block":
            return np.repeat(p, BLOCK, axis=1)
        return p

    if case.op == "Q":
        if t.is_integer:
            return lambda: np.clip(np.rint(x / expand(scale)) + expand(zp).astype(np.float32), t.qmin, t.qmax).astype(t.dtype)
        return lambda: (x / expand(scale)).astype(t.dtype)
    return lambda: ((x.astype(np.float32) - expand(zp).astype(np.float32)) * expand(scale)).astype(np.float32)


def _onnx_model(case: Case, x, scale, zp, axis, block):
    import onnx
    from onnx import helper, numpy_helper

    from . import dtypes

    t = dtypes.get(case.quantized)
    if case.op == "Q":
        node_type, x_type, y_type = "QuantizeLinear", 1, t.tensorproto
    else:
        node_type, x_type, y_type = "DequantizeLinear", t.tensorproto, 1
    attrs = {}
    if case.granularity != "tensor":
        attrs["axis"] = axis
    if block:
        attrs["block_size"] = block
    node = helper.make_node(node_type, ["x", "scale", "zp"], ["y"], **attrs)

    def init(name, value, tp):
        if t.packs:  # 4-bit types are stored packed, two to a byte
            from .packing import pack

            return helper.make_tensor(name, tp, value.shape, vals=pack(value).tobytes(), raw=True)
        if value.dtype.itemsize == 1 and tp not in (2, 3):
            return helper.make_tensor(name, tp, value.shape, vals=value.view(np.uint8).tobytes(), raw=True)
        return numpy_helper.from_array(value, name)

    inits = [numpy_helper.from_array(scale, "scale"), init("zp", zp, t.tensorproto)]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", x_type, x.shape)],
        [helper.make_tensor_value_info("y", y_type, x.shape)], inits,
    )
    opset = 21 if case.quantized not in ("float4e2m1",) else 23
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _ort_fn(case, threads_n, x, scale, zp, axis, block):
    import onnxruntime as ort

    if case.op == "DQ" and x.dtype.itemsize == 1 and x.dtype not in (np.uint8, np.int8):
        return None  # onnxruntime's Python API cannot feed int4/float8 arrays
    model = _onnx_model(case, x, scale, zp, axis, block)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads_n
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"x": x}
    return lambda: session.run(None, feed)


def _onnx_reference_fn(case, x, scale, zp, axis, block):
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(_onnx_model(case, x, scale, zp, axis, block))
    return lambda: evaluator.run(None, {"x": x})


def _tf_fn(case, x, scale, zp):
    import tensorflow as tf

    t = tf.quint8 if case.quantized == "uint8" else tf.qint8
    if case.op == "TFQ":
        tx = tf.constant(x)
        return lambda: tf.raw_ops.QuantizeV2(input=tx, min_range=_TF_RANGE[0], max_range=_TF_RANGE[1], T=t,
                                             mode=case.mode).output.numpy()
    if case.op == "TFDQ":
        tq = tf.raw_ops.QuantizeV2(input=tf.constant(x.astype(np.float32)), min_range=_TF_RANGE[0],
                                   max_range=_TF_RANGE[1], T=t, mode=case.mode).output
        return lambda: tf.raw_ops.Dequantize(input=tq, min_range=_TF_RANGE[0], max_range=_TF_RANGE[1],
                                             mode=case.mode).numpy()
    if case.op == "Q":
        tx = tf.constant(x)
        lo, hi = float(x.min()), float(x.max())
        return lambda: tf.quantization.quantize(tx, lo, hi, t, mode="SCALED").output.numpy()
    q = tf.quantization.quantize(tf.constant(x.astype(np.float32)), -100.0, 100.0, t, mode="SCALED").output
    return lambda: tf.quantization.dequantize(q, -100.0, 100.0, mode="SCALED").numpy()


# ----------------------------------------------------------------------------------------------- probe
_PROBES = None


def _probe_kernels():
    global _PROBES
    if _PROBES is None:
        import numba

        @numba.njit(cache=True, nogil=True)
        def copy(src, dst, start, stop):
            dst[start:stop] = src[start:stop]

        @numba.njit(cache=True, nogil=True)
        def read_then_write(src, dst, passes, start, stop):
            # units [start, stop) of max(src.size, dst.size) cover the same fraction of both arrays; an
            # integer XOR reduction vectorises, and writing it keeps the reads from being optimised away.
            # ``passes``: how many times each thread reads its part of src, to the end each time (2: the
            # bound of a two-pass operator, NVFP4 quantize with its own tensor scale)
            n = max(src.size, dst.size)
            s = src[start * src.size // n:stop * src.size // n]
            d = dst[start * dst.size // n:stop * dst.size // n]
            acc = np.uint64(0)
            for p in range(passes):
                for i in range(s.size):
                    acc ^= s[i] + np.uint64(p)
            for i in range(d.size):
                d[i] = acc

        _PROBES = copy, read_then_write
    return _PROBES


def _bandwidth_probe(in_bytes: int, out_bytes: int, repeat: int) -> tuple[float, float]:
    """Best times of two memory-bound stand-ins for a case, threaded as the kernels are (`threads.run_chunked`:
    every core where waking them pays):

    - fresh: read ``in_bytes``, write ``out_bytes`` into a newly allocated array, as an operator that
      returns a new array must (the OS hands out zeroed pages: for outputs above glibc's 32 MB mmap
      threshold that first-touch cost is part of every call, of every peer's too);
    - copy: copy ``(in_bytes + out_bytes) / 2`` bytes into a preallocated array, the bare bandwidth.
    """
    from .kernels import threads

    copy, read_then_write = _probe_kernels()
    src = np.ones(max(in_bytes // 8, 1), np.uint64)
    n_out = max(out_bytes // 8, 1)
    units = max(src.size, n_out)
    fresh = _best(lambda: threads.run_chunked(read_then_write, units, src, np.empty(n_out, np.uint64), 1), repeat)
    half = max((in_bytes + out_bytes) // 2 // 8, 1)
    src = np.ones(half, np.float64)
    dst = np.empty_like(src)
    prealloc = _best(lambda: threads.run_chunked(copy, half, src, dst), repeat)
    return fresh, prealloc


def _peak_extra_bytes(fn, out_nbytes: int) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return max(int(peak - out_nbytes), 0)  # a pooled output reuses memory: no new allocation at all


def jit_times() -> dict:
    """Cold (empty cache) and warm (cache filled) first-call times of a Q and a DQ call, in fresh processes."""
    script = (
        "import time; t0 = time.perf_counter(); import numpy as np, qlinear; t1 = time.perf_counter();"
        "x = np.ones(100000, np.float32); qlinear.quantize_linear(x, np.float32(0.5), np.uint8(3)); t2 = time.perf_counter();"
        "qlinear.dequantize_linear(np.ones(100000, np.uint8), np.float32(0.5), np.uint8(3)); t3 = time.perf_counter();"
        "print(t1 - t0, t2 - t1, t3 - t2)"
    )
    result = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            imp, q, dq = (float(v) for v in out.stdout.split())
            result[label] = {"import_s": imp, "first_quantize_s": q, "first_dequantize_s": dq}
    return result


# ----------------------------------------------------------------------------------------------- driver
def _available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def cpu_model() -> str:
    """lscpu's model name (the CPU behind a virtual machine varies), else /proc/cpuinfo's."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in text.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    from .kernels import threads

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads.get_num_threads(), "python": sys.version.split()[0],
            "numpy": np.__version__, "platform": platform.platform()}


def run(sizes=("64K", "1M", "16M", "64M"), cases=None, repeat=5, peers=("onnxruntime", "onnx", "tensorflow", "numpy"),
        reference_max=1 << 24, measure_jit=True, out=sys.stdout) -> dict:
    import numba  # noqa: F401 - the kernels need it; fail early with a clear ImportError

    selected = [c for c in CASES if cases is None or any(s.lower() in c.name.lower() for s in cases)]
    peers = [p for p in peers if p == "numpy" or _available(p)]
    results = {"machine": machine(), "peers": peers, "rows": []}
    if measure_jit:
        results["jit"] = jit_times()
    header = f"{'case':28} {'size':>4} {'qlinear':>8} {'bw':>5} {'bwP':>5} {'ort1':>8} {'x':>6} {'ort2':>8} {'x':>6} " \
             f"{'onnxref':>8} {'x':>6} {'tf':>7} {'x':>5} {'numpy':>8} {'x':>6} {'probe':>7} {'extraMB':>7}"
    print(f"machine: {results['machine']}", file=out)
    print(header, file=out)
    for case in selected:
        for label in sizes:
            n = SIZES[label]
            x, scale, zp, axis, block = _inputs(case, n)
            row = {"case": case.name, "size": label, "elements": n}
            fn = _qlinear_fn(case, x, scale, zp, axis, block)
            row["qlinear_s"] = _best(fn, repeat)
            y = fn()
            row["peak_extra_bytes"] = _peak_extra_bytes(fn, 0 if case.out else y.nbytes)
            row["moved_bytes"] = x.nbytes + y.nbytes
            row["probe_s"], row["copy_probe_s"] = _bandwidth_probe(x.nbytes, y.nbytes, repeat)
            del y
            for peer in peers:
                if case.op.startswith("TF") and peer != "tensorflow":
                    continue
                try:
                    if peer == "onnxruntime":
                        for tn in (1, 2):
                            f = _ort_fn(case, tn, x, scale, zp, axis, block)
                            row[f"ort{tn}_s"] = _best(f, repeat) if f else None
                            del f
                    elif peer == "onnx":
                        row["onnxref_s"] = _best(_onnx_reference_fn(case, x, scale, zp, axis, block), 1) if n <= reference_max else None
                    elif peer == "tensorflow":
                        row["tf_s"] = _best(_tf_fn(case, x, scale, zp), repeat) if case.tf_mode else None
                    elif peer == "numpy":
                        row["numpy_s"] = _best(_numpy_fn(case, x, scale, zp, axis, block), repeat)
                except Exception as error:  # a peer that cannot run the case: n/a, with the reason kept
                    row[f"{peer}_error"] = f"{type(error).__name__}: {str(error)[:200]}"
            results["rows"].append(row)
            print(_format_row(row), file=out, flush=True)
            del x
            gc.collect()
    return results


def _format_row(row: dict) -> str:
    q = row["qlinear_s"]

    def cell(key, width, ratio_width):
        v = row.get(key)
        if v is None:
            return f"{'n/a':>{width}} {'':>{ratio_width}}"
        return f"{v * 1e3:>{width}.3f} {v / q:>{ratio_width}.1f}"

    return (f"{row['case']:28} {row['size']:>4} {q * 1e3:>8.3f} {row['probe_s'] / q:>5.2f} {row['copy_probe_s'] / q:>5.2f} "
            f"{cell('ort1_s', 8, 6)} {cell('ort2_s', 8, 6)} {cell('onnxref_s', 8, 6)} {cell('tf_s', 7, 5)} "
            f"{cell('numpy_s', 8, 6)} {row['probe_s'] * 1e3:>7.3f} {row['peak_extra_bytes'] / 1e6:>7.2f}")


def main(args) -> int:
    results = run(sizes=args.sizes, cases=args.case or None, repeat=args.repeat,
                  peers=[p for p in ("onnxruntime", "onnx", "tensorflow", "numpy") if p not in (args.skip or [])],
                  measure_jit=not args.no_jit)
    if "jit" in results:
        print(f"JIT (fresh processes): {json.dumps(results['jit'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0
