"""A real int8 (or 16x8) .tflite model, layer by layer: qlinear.tflite.conv against the LiteRT interpreter.

    uv run python benchmarks/tflite_layers.py [MODEL.tflite ...] [--runs 3] [--int16]

Every CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED node of each model is recomputed by qlinear from the
node's own input tensor and compared with the node's output tensor, bit for bit, per kernel family:

- "reference" and "optimized": the whole model runs under BUILTIN_REF / BUILTIN_WITHOUT_DEFAULT_DELEGATES
  with ``experimental_preserve_all_tensors=True``, which keeps every intermediate tensor;
- "xnnpack": preserving the tensors makes the interpreter skip the delegate, so each node is rebuilt as a
  one-operator model (its weights, bias, scales and options; tests/tflite/conv_models.py) and run under AUTO
  on the node's input from the optimized run.

Without a model argument the script converts a MobileNetV2 (alpha 0.35, 96x96, 100 classes, random
initial weights, seeded, batch norms set to one batch's statistics) with TensorFlow's TFLiteConverter and full-integer quantization calibrated on
random images: a converter-made model, with the converter's choices of per-channel weights, fused ReLU6,
biases and scales (``--int16`` converts it to 16x8 instead). The mediapipe wheels that were meant to supply
trained int8 models ship float32 ones (0.10.14) or none (1.2.3).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tflite"))

from ai_edge_litert import schema_py_generated as schema  # noqa: E402
from ai_edge_litert.interpreter import Interpreter  # noqa: E402
from conv_models import KERNELS, Runner, layer_model  # noqa: E402

from qlinear.tflite.conv import conv_2d, depthwise_conv_2d, fully_connected  # noqa: E402

OPS = {schema.BuiltinOperator.CONV_2D: "CONV_2D", schema.BuiltinOperator.DEPTHWISE_CONV_2D: "DEPTHWISE_CONV_2D",
       schema.BuiltinOperator.FULLY_CONNECTED: "FULLY_CONNECTED"}
FUNCTIONS = {"CONV_2D": conv_2d, "DEPTHWISE_CONV_2D": depthwise_conv_2d, "FULLY_CONNECTED": fully_connected}
ACTIVATIONS = {schema.ActivationFunctionType.NONE: None, schema.ActivationFunctionType.RELU: "relu",
               schema.ActivationFunctionType.RELU6: "relu6", schema.ActivationFunctionType.RELU_N1_TO_1: "relu_n1_to_1"}
DTYPES = {schema.TensorType.INT8: np.int8, schema.TensorType.UINT8: np.uint8, schema.TensorType.INT16: np.int16,
          schema.TensorType.INT32: np.int32, schema.TensorType.INT64: np.int64}


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


def layers(model: schema.ModelT):
    """(node index, op name, arguments for qlinear / layer_model) of each quantized CONV/DW/FC node."""
    graph = model.subgraphs[0]

    def constant(index):
        t = graph.tensors[index]
        raw = model.buffers[t.buffer].data
        return np.frombuffer(bytes(bytearray(raw)), DTYPES[t.type]).reshape(tuple(t.shape))

    for i, op in enumerate(graph.operators):
        code = model.operatorCodes[op.opcodeIndex]
        name = OPS.get(max(code.builtinCode, code.deprecatedBuiltinCode))
        if name is None:
            continue
        x_t, w_t, y_t = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
        if x_t.type not in DTYPES or x_t.quantization is None or w_t.quantization is None:
            continue  # float or hybrid node
        options = op.builtinOptions
        if options.fusedActivationFunction not in ACTIVATIONS:
            continue
        w_scale = np.asarray(w_t.quantization.scale, np.float32)
        args = dict(w=constant(op.inputs[1]),
                    bias=constant(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None,
                    x_scale=float(x_t.quantization.scale[0]), x_zero_point=int(x_t.quantization.zeroPoint[0]),
                    w_scale=w_scale if w_scale.size > 1 else w_scale[0],
                    y_scale=float(y_t.quantization.scale[0]), y_zero_point=int(y_t.quantization.zeroPoint[0]))
        kw = dict(activation=ACTIVATIONS[options.fusedActivationFunction])
        if name != "FULLY_CONNECTED":
            kw.update(padding="SAME" if options.padding == schema.Padding.SAME else "VALID",
                      strides=(options.strideH, options.strideW), dilations=(options.dilationHFactor, options.dilationWFactor))
        if w_t.type == schema.TensorType.UINT8:
            kw["w_zero_point"] = int(w_t.quantization.zeroPoint[0])
        yield i, name, op.inputs[0], op.outputs[0], args, kw


def truncated(model: schema.ModelT, last: int) -> bytes:
    """The model cut after node ``last`` (its output becomes the graph's), so that nodes after the last
    compared one cannot stop the run: BUILTIN_REF aborts in Prepare on an int8 SOFTMAX, for one."""
    import flatbuffers

    graph = model.subgraphs[0]
    graph.operators = graph.operators[: last + 1]
    graph.outputs = np.asarray([graph.operators[-1].outputs[0]], np.int32)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def compare(model_bytes: bytes, label: str, runs: int) -> None:
    model = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    nodes = list(layers(model))
    if not nodes:
        print(f"{label}: no quantized CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED node")
        return
    model_bytes = truncated(model, nodes[-1][0])
    counts = {}  # (family, op) -> [layers equal, layers, outputs differing, outputs, qlinear s, differ from ref]
    rng = np.random.default_rng(0)
    for run in range(runs):
        preserved = {}
        for family in ("reference", "optimized"):
            it = Interpreter(model_content=model_bytes, experimental_op_resolver_type=KERNELS[family],
                             experimental_preserve_all_tensors=True)
            it.allocate_tensors()
            detail = it.get_input_details()[0]
            info = np.iinfo(detail["dtype"])
            x = rng.integers(info.min, info.max, detail["shape"], endpoint=True).astype(detail["dtype"]) if family == "reference" else x
            it.set_tensor(detail["index"], x)
            it.invoke()
            preserved[family] = it
        for _, name, x_index, y_index, args, kw in nodes:
            for family in ("reference", "optimized", "xnnpack"):
                source = preserved["optimized" if family == "xnnpack" else family]
                x = source.get_tensor(x_index)
                if name == "FULLY_CONNECTED":
                    x = x.reshape(-1, args["w"].shape[1])
                one_op = layer_model(name, x.shape, x.dtype, **args, **kw)
                reference = Runner(one_op, "reference")(x).reshape(-1)
                if family == "xnnpack":
                    expected = Runner(one_op, "xnnpack")(x)
                else:
                    expected = source.get_tensor(y_index).reshape(-1) if name == "FULLY_CONNECTED" else source.get_tensor(y_index)
                start = time.perf_counter()
                got = FUNCTIONS[name](x, **args, **kw, kernel=family)
                seconds = time.perf_counter() - start
                if name == "FULLY_CONNECTED":
                    got = got.reshape(-1)
                c = counts.setdefault((family, name), [0, 0, 0, 0, 0.0, 0])
                bad = int(np.count_nonzero(got != expected))
                c[0] += bad == 0
                c[1] += 1
                c[2] += bad
                c[3] += got.size
                c[4] += seconds
                c[5] += int(np.count_nonzero(expected.reshape(-1) != reference))
    print(f"\n{label}: {len(nodes)} quantized CONV/DW/FC nodes, {runs} random input(s)")
    print("(last column: outputs of the interpreter under this family that differ from the reference kernel's on\n"
          " the same node input, i.e. how far the families are apart on this model)")
    print(f"{'family':<10} {'op':<18} {'layers equal':>13} {'outputs differing':>20} {'qlinear time':>13} {'vs reference':>13}")
    for (family, name), (equal, total, bad, size, seconds, apart) in sorted(counts.items()):
        print(f"{family:<10} {name:<18} {f'{equal}/{total}':>13} {f'{bad}/{size}':>20} {seconds * 1000:>10.1f} ms "
              f"{apart:>13}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=".tflite files (default: a converted MobileNetV2)")
    parser.add_argument("--runs", type=int, default=2, help="random inputs per model")
    parser.add_argument("--int16", action="store_true", help="convert the default MobileNetV2 to 16x8")
    args = parser.parse_args()
    if args.models:
        for path in args.models:
            with open(path, "rb") as f:
                compare(f.read(), path, args.runs)
        return
    start = time.perf_counter()
    blob = make_mobilenet(args.int16)
    path = os.path.join(tempfile.gettempdir(), f"qlinear_mobilenet_v2_{'16x8' if args.int16 else 'int8'}.tflite")
    with open(path, "wb") as f:
        f.write(blob)
    print(f"converted MobileNetV2 (alpha 0.35, 96x96) in {time.perf_counter() - start:.1f} s -> {path}")
    compare(blob, "MobileNetV2 " + ("16x8" if args.int16 else "int8"), args.runs)


if __name__ == "__main__":
    main()
