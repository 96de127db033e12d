"""Test models for qlinear.onnx, built with onnx.helper from fixed random weights, and the peers that run them.

Hand-built: a QOperator chain (QuantizeLinear -> QLinearConv -> QLinearConv -> DequantizeLinear) and a QDQ
model (Q/DQ around a float Conv and MatMul). Quantized by onnxruntime.quantization (a test-only dependency):
a small float CNN and MLP, statically (QDQ and QOperator formats) and dynamically (DynamicQuantizeLinear +
ConvInteger/MatMulInteger).
"""

from __future__ import annotations

import copy
import io
import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _finish(nodes, name, inputs, outputs, initializers, opset, extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _init(name, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def qoperator_chain(weight_dtype=np.int8, *, opset=21, channels=(3, 8, 16), size=12, seed=0,
                    weight_range=None) -> onnx.ModelProto:
    """x (float32) -> QuantizeLinear -> QLinearConv 3x3 (pad 1, bias) -> QLinearConv 3x3 (stride 2, per-channel
    w_scale) -> DequantizeLinear. uint8 activations; weights of ``weight_dtype`` over its full range unless
    ``weight_range`` is given."""
    rng = np.random.default_rng(seed)
    c0, c1, c2 = channels
    info = np.iinfo(weight_dtype)
    low, high = weight_range if weight_range is not None else (info.min, info.max)
    w_zero = weight_dtype(0 if weight_dtype == np.int8 else 128)
    initializers = [
        _init("x_scale", np.float32(0.02)), _init("x_zero", np.uint8(128)),
        _init("w1", rng.integers(low, high + 1, (c1, c0, 3, 3)).astype(weight_dtype)),
        _init("w1_scale", np.float32(0.003)), _init("w1_zero", w_zero),
        _init("b1", rng.integers(-2000, 2000, (c1,)).astype(np.int32)),
        _init("y1_scale", np.float32(0.05)), _init("y1_zero", np.uint8(100)),
        _init("w2", rng.integers(low, high + 1, (c2, c1, 3, 3)).astype(weight_dtype)),
        _init("w2_scale", rng.uniform(0.001, 0.004, c2).astype(np.float32)), _init("w2_zero", w_zero),
        _init("y2_scale", np.float32(0.04)), _init("y2_zero", np.uint8(120)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="quantize"),
        helper.make_node("QLinearConv", ["xq", "x_scale", "x_zero", "w1", "w1_scale", "w1_zero", "y1_scale",
                                         "y1_zero", "b1"], ["y1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("QLinearConv", ["y1", "y1_scale", "y1_zero", "w2", "w2_scale", "w2_zero", "y2_scale",
                                         "y2_zero"], ["y2"], name="conv2", kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("DequantizeLinear", ["y2", "y2_scale", "y2_zero"], ["y"], name="dequantize"),
    ]
    out = (size - 3) // 2 + 1
    return _finish(
        nodes, "qoperator_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c0, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c2, out, out])], initializers, opset,
    )


def qdq_model(weight_dtype=np.int8, *, opset=21, seed=1) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (float, DQ'd weights and int32 bias) -> Q -> DQ -> Reshape -> MatMul (DQ'd
    per-column weights) -> Q -> DQ -> y. The quantized tensors xq, cq, mq are also outputs."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(weight_dtype)
    w_zero = weight_dtype(0 if weight_dtype == np.int8 else 128)
    initializers = [
        _init("x_scale", np.float32(0.025)), _init("x_zero", np.uint8(128)),
        _init("wc", rng.integers(info.min, info.max + 1, (6, 3, 3, 3)).astype(weight_dtype)),
        _init("wc_scale", rng.uniform(0.002, 0.006, 6).astype(np.float32)), _init("wc_zero", np.full(6, w_zero)),
        _init("bc", rng.integers(-3000, 3000, (6,)).astype(np.int32)),
        _init("bc_scale", (np.float32(0.025) * rng.uniform(0.002, 0.006, 6)).astype(np.float32)),
        _init("c_scale", np.float32(0.06)), _init("c_zero", np.uint8(110)),
        _init("shape", np.array([2, 6 * 8 * 8], np.int64)),
        _init("wm", rng.integers(info.min, info.max + 1, (6 * 8 * 8, 10)).astype(weight_dtype)),
        _init("wm_scale", rng.uniform(0.001, 0.003, 10).astype(np.float32)), _init("wm_zero", np.full(10, w_zero)),
        _init("m_scale", np.float32(0.3)), _init("m_zero", np.uint8(128)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wc", "wc_scale", "wc_zero"], ["wcd"], axis=0),
        helper.make_node("DequantizeLinear", ["bc", "bc_scale"], ["bcd"], axis=0),
        helper.make_node("Conv", ["xd", "wcd", "bcd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "c_scale", "c_zero"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "c_scale", "c_zero"], ["cd"]),
        helper.make_node("Reshape", ["cd", "shape"], ["f"]),
        helper.make_node("DequantizeLinear", ["wm", "wm_scale", "wm_zero"], ["wmd"], axis=1),
        helper.make_node("MatMul", ["f", "wmd"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "m_scale", "m_zero"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "m_scale", "m_zero"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])] + [
        helper.make_tensor_value_info(name, TensorProto.UINT8, shape)
        for name, shape in (("xq", [2, 3, 8, 8]), ("cq", [2, 6, 8, 8]), ("mq", [2, 10]))
    ]
    return _finish(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                   outputs, initializers, opset)


def float_cnn(seed=2) -> onnx.ModelProto:
    """Conv 3->8 (3x3, pad 1) -> Relu -> Conv 8->16 (3x3, stride 2) -> Relu -> Reshape -> MatMul -> Add."""
    rng = np.random.default_rng(seed)
    initializers = [
        _init("w1", (rng.normal(size=(8, 3, 3, 3)) * 0.3).astype(np.float32)),
        _init("b1", (rng.normal(size=8) * 0.1).astype(np.float32)),
        _init("w2", (rng.normal(size=(16, 8, 3, 3)) * 0.2).astype(np.float32)),
        _init("b2", (rng.normal(size=16) * 0.1).astype(np.float32)),
        _init("shape", np.array([-1, 16 * 8 * 8], np.int64)),
        _init("w3", (rng.normal(size=(16 * 8 * 8, 10)) * 0.05).astype(np.float32)),
        _init("b3", (rng.normal(size=10) * 0.1).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Reshape", ["r2", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["m"]),
        helper.make_node("Add", ["m", "b3"], ["y"]),
    ]
    return _finish(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], initializers, 17)


def float_residual(seed=4) -> onnx.ModelProto:
    """A ResNet basic block and head: Conv 3->16 -> Relu -> [Conv 16->16 -> Relu -> Conv 16->16] + skip -> Relu
    -> MaxPool 2x2 -> GlobalAveragePool -> Flatten -> Gemm 16->10."""
    rng = np.random.default_rng(seed)
    initializers = [
        _init("w0", (rng.normal(size=(16, 3, 3, 3)) * 0.3).astype(np.float32)),
        _init("b0", (rng.normal(size=16) * 0.1).astype(np.float32)),
        _init("w1", (rng.normal(size=(16, 16, 3, 3)) * 0.1).astype(np.float32)),
        _init("b1", (rng.normal(size=16) * 0.1).astype(np.float32)),
        _init("w2", (rng.normal(size=(16, 16, 3, 3)) * 0.1).astype(np.float32)),
        _init("b2", (rng.normal(size=16) * 0.1).astype(np.float32)),
        _init("wg", (rng.normal(size=(10, 16)) * 0.3).astype(np.float32)),
        _init("bg", (rng.normal(size=10) * 0.1).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r0"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    return _finish(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], initializers, 17)


def float_mlp(seed=3) -> onnx.ModelProto:
    """MatMul 32->64 -> Add -> Relu -> MatMul 64->10 -> Add."""
    rng = np.random.default_rng(seed)
    initializers = [
        _init("w1", (rng.normal(size=(32, 64)) * 0.2).astype(np.float32)),
        _init("b1", (rng.normal(size=64) * 0.1).astype(np.float32)),
        _init("w2", (rng.normal(size=(64, 10)) * 0.2).astype(np.float32)),
        _init("b2", (rng.normal(size=10) * 0.1).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["y"]),
    ]
    return _finish(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 10])], initializers, 17)


def float_input(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """A fixed random input for the model's single float input."""
    (value,) = model.graph.input
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    return {value.name: np.random.default_rng(seed).normal(size=shape).astype(np.float32)}


def ort_quantize(model: onnx.ModelProto, tmp_path, *, static=True, quant_format="QDQ", weight_type="QInt8",
                 per_channel=False, calibration_batches=8) -> onnx.ModelProto:
    """Quantize with onnxruntime.quantization: statically (MinMax calibration on fixed-seed random inputs)
    or dynamically (Conv and MatMul)."""
    from onnxruntime.quantization import (  # noqa: PLC0415
        CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static,
    )

    source, target = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, source)
    logging.getLogger().setLevel(logging.ERROR)  # its "consider pre-processing" advice
    if not static:
        quantize_dynamic(source, target, weight_type=getattr(QuantType, weight_type), per_channel=per_channel,
                         op_types_to_quantize=["Conv", "MatMul"])
        return onnx.load(target)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(float_input(model, seed) for seed in range(100, 100 + calibration_batches))

        def get_next(self):
            return next(self.batches, None)

    # QDQ format: every operator the quantizer knows gets Q/DQ around it (standard ops only); QOperator: only
    # Conv and MatMul, whose QOperator forms are standard (Add, Gemm, pooling would be com.microsoft ops).
    op_types = None if quant_format == "QDQ" else ["Conv", "MatMul"]
    quantize_static(source, target, Reader(), quant_format=getattr(QuantFormat, quant_format),
                    weight_type=getattr(QuantType, weight_type), activation_type=QuantType.QUInt8,
                    per_channel=per_channel, op_types_to_quantize=op_types)
    return onnx.load(target)


def with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """A copy importing another ai.onnx opset (for onnx's reference, which has no DequantizeLinear before 19)."""
    copied = copy.deepcopy(model)
    for entry in copied.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    return copied


def run_reference(model: onnx.ModelProto, feeds, intermediate=False):
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    return ReferenceEvaluator(model).run(None, feeds, intermediate=intermediate)


def run_onnxruntime(model: onnx.ModelProto, feeds, optimize=True) -> list[np.ndarray]:
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    buffer = io.BytesIO()
    onnx.save(model, buffer)
    session = ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def cpu_has_vnni() -> bool:
    """onnxruntime's u8s8 GEMM uses VPDPBUSD (exact) with VNNI, VPMADDUBSW (saturating pairs) without it."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_vnni", "avx_vnni"} & set(flags))


def requantize_disagreement_model() -> onnx.ModelProto:
    """One QLinearConv (opset 10) where the peers' requantization differs (docs/semantics.md conv row 1): with
    x == x_zero_point the accumulator is B = 179782; scales 0.041557427 * 0.021050757 / 1.1036915 give 143 in
    onnx's reference (float64 product) and 142 in onnxruntime (float32 product). Input x: uint8 (1, 1, 2, 2)."""
    initializers = [_init(n, v) for n, v in (
        ("xs", np.float32(0.041557427)), ("xz", np.uint8(0)), ("w", np.ones((1, 1, 1, 1), np.uint8)),
        ("ws", np.float32(0.021050757)), ("wz", np.uint8(0)), ("ys", np.float32(1.1036915)), ("yz", np.uint8(0)),
        ("b", np.array([179782], np.int32)))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"])
    return _finish([node], "requantize", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 2, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 1, 2, 2])], initializers, 10)
