"""qlinear.tflite.conv speed on MobileNet-sized layers, per kernel family, beside the LiteRT interpreter.

    uv run python benchmarks/bench_tflite_conv.py [--repeats 5] [--threads 2]

For each layer and family ("reference" = BUILTIN_REF, "optimized" = BUILTIN_WITHOUT_DEFAULT_DELEGATES,
"xnnpack" = AUTO) the script times qlinear's function and the interpreter's ``invoke()`` of a one-operator
model of the same layer (``layer_model`` of tests/tflite/litert_models.py; weights and bias constant), best
of ``--repeats`` after one warm-up call, and checks that both give the same bits. qlinear's time includes the
argument checks and the NHWC <-> NCHW transposes around its integer core; the interpreter's is ``invoke()``
alone, with ``--threads`` threads. The CPU model comes from lscpu.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tflite"))

from litert_models import Runner, layer_model  # noqa: E402

from qlinear.tflite.conv import conv_2d, depthwise_conv_2d, fully_connected  # noqa: E402

FUNCTIONS = {"CONV_2D": conv_2d, "DEPTHWISE_CONV_2D": depthwise_conv_2d, "FULLY_CONNECTED": fully_connected}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (lscpu unavailable)"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def make_layers(rng):
    """(label, op, x, arguments) of MobileNet-sized layers."""
    def ints(dtype, shape, lo=None, hi=None):
        info = np.iinfo(dtype)
        return rng.integers(info.min if lo is None else lo, info.max if hi is None else hi, shape, dtype=dtype,
                            endpoint=True)

    def per_channel(n):
        return rng.uniform(0.002, 0.02, n).astype(np.float32)

    layers = []
    x = ints(np.int8, (1, 112, 112, 32))
    layers.append(("conv 3x3 32->64 @112 int8", "CONV_2D", x,
                   dict(w=ints(np.int8, (64, 3, 3, 32), -127, 127), bias=ints(np.int32, 64, -5000, 5000), x_scale=0.02,
                        x_zero_point=-3, w_scale=per_channel(64), y_scale=0.6, y_zero_point=5, padding="SAME",
                        activation="relu6")))
    x = ints(np.int8, (1, 56, 56, 144))
    layers.append(("conv 1x1 144->24 @56 int8", "CONV_2D", x,
                   dict(w=ints(np.int8, (24, 1, 1, 144), -127, 127), bias=ints(np.int32, 24, -5000, 5000), x_scale=0.02,
                        x_zero_point=-3, w_scale=per_channel(24), y_scale=0.3, y_zero_point=5)))
    x = ints(np.int8, (1, 112, 112, 64))
    layers.append(("dw 3x3 64 @112 int8", "DEPTHWISE_CONV_2D", x,
                   dict(w=ints(np.int8, (1, 3, 3, 64), -127, 127), bias=ints(np.int32, 64, -5000, 5000), x_scale=0.02,
                        x_zero_point=-3, w_scale=per_channel(64), y_scale=0.1, y_zero_point=5, padding="SAME",
                        activation="relu6")))
    x = ints(np.int8, (1, 112, 112, 96))
    layers.append(("dw 3x3/2 96 @112 int8", "DEPTHWISE_CONV_2D", x,
                   dict(w=ints(np.int8, (1, 3, 3, 96), -127, 127), bias=ints(np.int32, 96, -5000, 5000), x_scale=0.02,
                        x_zero_point=-3, w_scale=per_channel(96), y_scale=0.1, y_zero_point=5, padding="SAME",
                        strides=(2, 2), activation="relu6")))
    x = ints(np.uint8, (1, 112, 112, 32))
    layers.append(("conv 3x3 32->64 @112 uint8", "CONV_2D", x,
                   dict(w=ints(np.uint8, (64, 3, 3, 32)), bias=ints(np.int32, 64, -5000, 5000), x_scale=0.02,
                        x_zero_point=128, w_scale=0.01, w_zero_point=120, y_scale=0.6, y_zero_point=100, padding="SAME")))
    x = ints(np.int16, (1, 112, 112, 32), -4000, 4000)
    layers.append(("conv 3x3 32->64 @112 16x8", "CONV_2D", x,
                   dict(w=ints(np.int8, (64, 3, 3, 32), -127, 127), bias=ints(np.int64, 64, -50000, 50000),
                        x_scale=0.0005, x_zero_point=0, w_scale=per_channel(64), y_scale=0.01, y_zero_point=0,
                        padding="SAME")))
    x = ints(np.int8, (1, 1280))
    layers.append(("fc 1280->1000 int8", "FULLY_CONNECTED", x,
                   dict(w=ints(np.int8, (1000, 1280), -127, 127), bias=ints(np.int32, 1000, -5000, 5000), x_scale=0.02,
                        x_zero_point=-3, w_scale=0.004, y_scale=0.5, y_zero_point=5)))
    return layers


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="interpreter threads")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); interpreter threads: {args.threads}")
    print(f"{'layer':<28} {'family':<10} {'qlinear ms':>11} {'LiteRT ms':>10} {'ratio':>7}  equal")
    model_keys = ("strides", "padding", "dilations", "activation", "depth_multiplier", "w_zero_point")
    for label, op, x, kw in make_layers(np.random.default_rng(0)):
        args_ = dict(kw)
        positional = [args_.pop(k) for k in ("w", "bias", "x_scale", "x_zero_point", "w_scale", "y_scale", "y_zero_point")]
        model = layer_model(op, x.shape, x.dtype, *positional, **{k: v for k, v in args_.items() if k in model_keys})
        for family in ("reference", "optimized", "xnnpack"):
            runner = Runner(model, family, num_threads=args.threads)
            runner.set_inputs(x)
            litert = best(runner.invoke, args.repeats)
            expected = runner.outputs()
            got = None

            def run(family=family):
                nonlocal got
                got = FUNCTIONS[op](x, *positional, **args_, kernel=family)

            ours = best(run, args.repeats)
            equal = "yes" if np.array_equal(got, expected) else f"NO ({np.count_nonzero(got != expected)} differ)"
            print(f"{label:<28} {family:<10} {ours * 1e3:>11.2f} {litert * 1e3:>10.2f} {ours / litert:>7.2f}  {equal}")


if __name__ == "__main__":
    main()
