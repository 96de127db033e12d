"""Element-wise kernels on one thread, split between all threads, and as `threads.run_chunked` decides per call
(the kernel's measured time per element against the measured cost of waking a helper), side by side in one
process, in alternating blocks of --repeats calls, the best of all: where the decision lands against the break-even of this CPU.

    uv run python benchmarks/bench_split.py [--repeats 30]

Prints the CPU's model name (lscpu) and the wake cost measured; BENCHMARKS.md has the table of one run.
"""

from __future__ import annotations

import argparse
import subprocess
import time

import numpy as np

from qlinear.kernels import threads
from qlinear.ops.quantize_linear import dequantize_linear, quantize_linear

SIZES = [1 << k for k in (14, 16, 18, 19, 20, 21, 22, 24)]


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no lscpu)"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    workers = threads._max_threads()
    print(f"CPU: {_cpu()}; {workers} threads")
    rng = np.random.default_rng(0)
    print("| elements | operator | 1 thread µs | split µs | decided µs | decided / best of the two |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in SIZES:
        x = rng.standard_normal(n).astype(np.float32)
        scale, zero_point = np.float32(0.02), np.uint8(128)
        q = quantize_linear(x, scale, zero_point)
        calls = {"QuantizeLinear f32->u8": lambda: quantize_linear(x, scale, zero_point),
                 "DequantizeLinear u8->f32": lambda: dequantize_linear(q, scale, zero_point)}
        for name, call in calls.items():
            best = {}
            # Blocks of calls per mode, the blocks alternated: a split call's helpers finish waking after it returns,
            # which slows whatever call comes next, so calls of different modes are not interleaved one by one.
            for _ in range(3):
                for mode in ("one", "split", "decided"):
                    threads.set_num_threads(1 if mode == "one" else workers)
                    threads.SPLIT_ALWAYS = mode == "split"
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        call()
                        best[mode] = min(best.get(mode, np.inf), time.perf_counter() - start)
            threads.SPLIT_ALWAYS = False
            threads.set_num_threads(workers)
            ratio = best["decided"] / min(best["one"], best["split"])
            print(f"| {n} | {name} | {best['one'] * 1e6:.0f} | {best['split'] * 1e6:.0f} | "
                  f"{best['decided'] * 1e6:.0f} | {ratio:.2f} |")
    print(f"wake cost measured: {threads.pool_wake_cost() * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
