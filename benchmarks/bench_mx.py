"""Microscaling kernels (`qlinear.mx`, kernels in `qlinear.kernels.mx`) against the bandwidth probe.

    uv run python benchmarks/bench_mx.py [--size 16M] [--threads 2] [--repeat 9] [--no-reference]
                                         [--formats nvfp4 ...] [--json benchmarks/results/mx.json]

For each MX format (floor rule; ``--rules`` adds the others) and NVFP4: quantize and dequantize through the
public functions (``qlinear.mx.quantize`` / ``dequantize``, output allocation included), x float32 of shape
(n / 1024, 1024) from N(0, 1), blocks along the last axis. Beside each, the bandwidth probes of `qlinear bench`
(`qlinear.bench._bandwidth_probe`): "probe" reads as many bytes as the call reads and writes as many as it
writes into a fresh array, "copy" copies (read + written) / 2 bytes into preallocated memory. Kernel and
probes are timed in alternating rounds (best of ``repeat`` each), so that load from other processes on a
shared machine hits both alike. ``bw`` = probe time / kernel time and ``bwP`` = copy time / kernel time (1.0: at
the bound; the goal is bwP >= 0.67, i.e. within 1.5x). "reference" is the NumPy reference
(`qlinear.reference.mx`, one call) and "x" its time over the kernel's.

Bytes counted per call: quantize reads x (4 bytes an element) and writes the codes (1) and scales (1 per
block); dequantize reads codes and scales and writes float32. NVFP4 quantize reads x twice (the tensor scale
needs the whole tensor before any block scale): the probes count it once, and its row has a third probe,
"probe2", the fresh probe reading its input twice (each thread its part, to the end, then again), with
``bw2`` = probe2 time / kernel time: the bound of any two-pass quantizer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import qlinear.mx as mx
from qlinear.bench import _probe_kernels, machine
from qlinear.kernels import threads
from qlinear.kernels.quantize_linear import use_kernels
from qlinear.reference import mx as ref

SIZES = {"1M": 1 << 20, "4M": 1 << 22, "16M": 1 << 24, "64M": 1 << 26}
WARMUP_S = 0.3


def _once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternating(fns, repeat: int) -> list[float]:
    """Best time of each function, timed in alternating rounds after a warm-up of each."""
    for fn in fns:
        fn()
        start = time.perf_counter()
        while time.perf_counter() - start < WARMUP_S:
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], _once(fn))
    return best


def _probes(in_bytes: int, out_bytes: int):
    copy, read_then_write = _probe_kernels()
    src = np.ones(max(in_bytes // 8, 1), np.uint64)
    n_out = max(out_bytes // 8, 1)
    units = max(src.size, n_out)
    half = max((in_bytes + out_bytes) // 2 // 8, 1)
    csrc = np.ones(half, np.float64)
    cdst = np.empty_like(csrc)

    def fresh(passes=1):
        threads.run_chunked(read_then_write, units, src, np.empty(n_out, np.uint64), passes)

    def prealloc():
        threads.run_chunked(copy, half, csrc, cdst)

    def twice():  # the bound of a two-pass quantizer: each thread reads its part of the input to the end, twice
        fresh(2)

    return fresh, prealloc, twice


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return machine()["cpu"]


def cases(rules, formats=None):
    out = []
    for name in formats or mx.FORMATS:
        if name == "nvfp4":
            # "given": the tensor scale passed in (one pass over x); "modelopt": Model Optimizer's rule (two passes)
            out += [(name, None), (name, "given"), (name, "modelopt")]
        else:
            out.extend((name, rule) for rule in rules)
    return out


def run(n: int, repeat: int, rules, reference: bool, out=sys.stdout, formats=None) -> dict:
    x = np.random.default_rng(0).standard_normal((n // 1024, 1024)).astype(np.float32)
    info = machine()
    results = {"machine": info, "lscpu_model": cpu_model(), "elements": n, "rows": []}
    print(f"lscpu model name: {results['lscpu_model']}; {info['cores']} cores, {threads.get_num_threads()} threads; "
          f"numpy {info['numpy']}", file=out)
    header = (f"{'format':12} {'rule':8} {'op':3} {'kernel ms':>9} {'probe':>7} {'copy':>7} {'bw':>5} {'bwP':>5} "
              f"{'reference ms':>12} {'x':>6} {'probe2':>7} {'bw2':>5}")
    print(header, file=out)
    for name, rule in cases(rules, formats):
        f = mx.FORMATS[name]
        blocks = n // f.block_size
        kwargs = {} if rule is None else {"scale_rule": rule}
        if rule == "given":
            kwargs = {"global_scale": mx.quantize(x[:1], name)[2] * np.float32(2.0)}  # calibrated elsewhere, say
        quantized = mx.quantize(x, name, **kwargs)
        codes, scales = quantized[0], quantized[1]
        extra = quantized[2:]

        def q():
            mx.quantize(x, name, **kwargs)

        def dq():
            mx.dequantize(codes, scales, global_scale=extra[0] if extra else None)

        for op, fn, in_bytes, out_bytes in (("Q", q, x.nbytes, codes.nbytes + scales.nbytes),
                                            ("DQ", dq, codes.nbytes + scales.nbytes, x.nbytes)):
            if op == "DQ" and rule not in (None, "floor"):  # (NVFP4's "given" and "modelopt" included)
                continue  # dequantize does not depend on the rule
            fresh, prealloc, twice = _probes(in_bytes, out_bytes)
            two_pass = name == "nvfp4" and op == "Q" and rule in (None, "modelopt")
            times = _alternating([fn, fresh, prealloc] + ([twice] if two_pass else []), repeat)
            t, tp, tc = times[:3]
            row = {"format": name, "rule": rule, "op": op, "kernel_s": t, "probe_s": tp, "copy_probe_s": tc,
                   "in_bytes": in_bytes, "out_bytes": out_bytes, "blocks": blocks}
            if two_pass:
                row["probe_read_twice_s"] = times[3]
            if reference:
                with use_kernels(False):
                    row["reference_s"] = _once(fn)
            results["rows"].append(row)
            r = row.get("reference_s")
            rcell = f"{r * 1e3:>12.1f} {r / t:>6.0f}" if r is not None else f"{'':>12} {'':>6}"
            twice_cell = f" {times[3] * 1e3:>7.3f} {times[3] / t:>5.2f}" if two_pass else f" {'':>7} {'':>5}"
            print(f"{name:12} {rule or '':8} {op:3} {t * 1e3:>9.3f} {tp * 1e3:>7.3f} {tc * 1e3:>7.3f} {tp / t:>5.2f} "
                  f"{tc / t:>5.2f} {rcell}{twice_cell}", file=out, flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="16M", choices=SIZES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--rules", nargs="+", default=["floor"], choices=ref.SCALE_RULES)
    parser.add_argument("--formats", nargs="+", choices=list(mx.FORMATS), help="only these formats")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    threads.set_num_threads(args.threads)
    results = run(SIZES[args.size], args.repeat, args.rules, not args.no_reference, formats=args.formats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
