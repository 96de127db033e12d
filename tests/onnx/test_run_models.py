"""qlinear.onnx.run on whole models, against onnx's ReferenceEvaluator and onnxruntime run in the test.

Oracles: the plain ReferenceEvaluator (qlinear's default ``requantize="float64"`` is its arithmetic, and the
float operators are the same code in both, so every tensor of the graph must be bit-identical), and
onnxruntime (bit-identical with ``requantize="float32"`` where onnxruntime is exact: uint8 weights, or any
weights on a CPU with VNNI; docs/onnx.md). Models: hand-built with onnx.helper, and a float CNN and MLP
quantized by onnxruntime.quantization (static QDQ and QOperator, dynamic).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qlinear.onnx as qonnx
from _onnx_models import (
    cpu_has_vnni,
    float_cnn,
    float_input,
    float_mlp,
    float_residual,
    ort_quantize,
    qdq_model,
    qoperator_chain,
    requantize_disagreement_model,
    run_onnxruntime,
    run_reference,
    with_opset,
)

pytest.importorskip("onnxruntime")


def _intermediates(model, feeds, requantize="float64") -> dict[str, np.ndarray]:
    results = qonnx.evaluator(model, requantize=requantize).run(None, feeds, intermediate=True)
    return {name: value for name, value in results.items() if name}


def _assert_every_tensor_equals_reference(model, feeds, reference_model=None):
    """Every tensor the graph computes (not only its outputs) is bit-identical to onnx's reference."""
    ours = _intermediates(model, feeds)
    theirs = run_reference(reference_model or model, feeds, intermediate=True)
    assert ours.keys() == {name for name in theirs if name}
    for name, value in ours.items():
        expected = np.asarray(theirs[name])
        assert value.dtype == expected.dtype, name
        np.testing.assert_array_equal(value, expected, err_msg=name, strict=True)


def _weights_exact_on_onnxruntime(weight_type) -> bool:
    """onnxruntime's u8s8 GEMM is exact with VNNI; without it full-range int8 weights may saturate (docs/semantics.md)."""
    return weight_type in ("QUInt8", np.uint8) or cpu_has_vnni()


# The input each integer operator (or a QDQ model's DequantizeLinear) takes its weights from.
_WEIGHT_INPUT = {"QLinearConv": 3, "QLinearMatMul": 3, "ConvInteger": 1, "MatMulInteger": 1, "DequantizeLinear": 0}


def _with_weights_exact_on_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model if onnxruntime is exact on its weights, else a copy with every int8 weight halved into
    [-64, 63] (an arithmetic shift), where it is exact without VNNI too (docs/semantics.md). The weights in the
    model decide, not the weight type asked of the quantizer: onnxruntime's quantizer writes int8 weights for
    a per-channel QLinearConv even when asked for QUInt8."""
    initializers = {init.name: init for init in model.graph.initializer}
    names = {node.input[index] for node in model.graph.node
             if (index := _WEIGHT_INPUT.get(node.op_type)) is not None and index < len(node.input)}
    weights = {name: numpy_helper.to_array(initializers[name]) for name in names
               if name in initializers and initializers[name].data_type == TensorProto.INT8}
    if cpu_has_vnni() or all(w.min(initial=0) >= -64 and w.max(initial=0) <= 63 for w in weights.values()):
        return model
    narrowed = onnx.ModelProto()
    narrowed.CopyFrom(model)
    for init in narrowed.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name] >> 1, init.name))
    return narrowed


# --- hand-built QOperator chain -------------------------------------------------------------------------


@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
def test_qoperator_chain_every_tensor_equals_onnx_reference(weight_dtype):
    model = qoperator_chain(weight_dtype)
    for seed in range(3):
        _assert_every_tensor_equals_reference(model, float_input(model, seed))


@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
def test_qoperator_chain_float32_requantization_equals_onnxruntime(weight_dtype):
    weight_range = None if _weights_exact_on_onnxruntime(weight_dtype) else (-64, 63)
    model = qoperator_chain(weight_dtype, channels=(16, 32, 32), size=20, weight_range=weight_range)
    evaluator = qonnx.evaluator(model, requantize="float32")
    for seed in range(4):
        feeds = float_input(model, seed)
        ours = qonnx.run(evaluator, feeds)["y"]
        np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0], strict=True)


def test_requantize_modes_reproduce_each_peer_in_a_model():
    """docs/semantics.md conv row 1 inside a model: the reference evaluator gives 143, onnxruntime 142; each
    requantize mode gives its peer's value, the default the reference's."""
    model = requantize_disagreement_model()
    feeds = {"x": np.array([[[[0, 0], [1, 2]]]], np.uint8)}
    reference, onnxruntime = run_reference(model, feeds)[0], run_onnxruntime(model, feeds)[0]
    assert reference[0, 0, 0, 0] == 143 and onnxruntime[0, 0, 0, 0] == 142
    np.testing.assert_array_equal(qonnx.run(model, feeds)["y"], reference, strict=True)
    np.testing.assert_array_equal(qonnx.run(model, feeds, requantize="float32")["y"], onnxruntime, strict=True)


@pytest.mark.parametrize("opset", [10, 13])
def test_opsets_before_19_run_where_onnx_reference_cannot(opset):
    """onnx's reference has no DequantizeLinear before opset 19 (docs/semantics.md Q/DQ row 17); qlinear runs
    the model at the opset it declares, with the same result as at 21 and as onnxruntime."""
    model = qoperator_chain(np.uint8, opset=opset)
    feeds = float_input(model, 0)
    with pytest.raises(RuntimeError, match="No implementation for operator 'DequantizeLinear'"):
        run_reference(model, feeds)
    ours = qonnx.run(model, feeds)["y"]
    np.testing.assert_array_equal(ours, qonnx.run(qoperator_chain(np.uint8, opset=21), feeds)["y"], strict=True)
    np.testing.assert_array_equal(qonnx.run(model, feeds, requantize="float32")["y"], run_onnxruntime(model, feeds)[0],
                                  strict=True)


def _per_axis_quantize_model(opset: int) -> onnx.ModelProto:
    initializers = [onnx.numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "s"),
                    onnx.numpy_helper.from_array(np.array([0, 10, 250], np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="per_axis_q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="per_axis_dq")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def test_quantize_linear_gets_the_models_opset():
    """Per-axis scales came with QuantizeLinear-13 (at 10 y_scale is "a scalar"): a model importing opset 10 is
    refused with the version named; importing 13 it runs and equals onnxruntime. onnxruntime also accepts the
    opset-10 model and applies the opset-13 meaning (a documented peer deviation, docs/onnx.md)."""
    feeds = {"x": np.random.default_rng(7).normal(scale=20, size=(2, 3, 4)).astype(np.float32)}
    with pytest.raises(ValueError, match=r"node 'per_axis_q' \(QuantizeLinear\): quantize_linear: .*QuantizeLinear-10"):
        qonnx.run(_per_axis_quantize_model(10), feeds)
    ours = qonnx.run(_per_axis_quantize_model(13), feeds)["y"]
    np.testing.assert_array_equal(ours, run_onnxruntime(_per_axis_quantize_model(13), feeds)[0], strict=True)
    np.testing.assert_array_equal(ours, run_onnxruntime(_per_axis_quantize_model(10), feeds)[0], strict=True)


# --- hand-built QDQ model ---------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
def test_qdq_model_every_tensor_equals_onnx_reference(weight_dtype):
    model = qdq_model(weight_dtype)
    for seed in range(3):
        _assert_every_tensor_equals_reference(model, float_input(model, seed))


def _assert_qdq_within_documented_tolerance(ours: dict, theirs: list, model, first_quantized: str | None):
    """docs/onnx.md: a Q after a float operator may differ by one step where the float result lies within float
    rounding of a rounding boundary (and that propagates downstream); the quantized model input is exact."""
    names = [o.name for o in model.graph.output]
    for name, expected in zip(names, theirs):
        value = ours[name]
        assert value.dtype == expected.dtype and value.shape == expected.shape, name
        if value.dtype.kind in "ui":
            steps = np.abs(value.astype(np.int64) - expected.astype(np.int64))
            if name == first_quantized:
                assert steps.max(initial=0) == 0, name
            assert steps.max(initial=0) <= 2, name
            assert np.count_nonzero(steps) <= max(1, value.size // 100), name
        else:
            np.testing.assert_allclose(value, expected, rtol=0.05, atol=0.05 * np.abs(expected).max(), err_msg=name)


@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
def test_qdq_model_against_onnxruntime(weight_dtype):
    if not _weights_exact_on_onnxruntime(weight_dtype):
        pytest.skip("full-range int8 weights: onnxruntime saturates without VNNI")
    model = qdq_model(weight_dtype)
    for seed in range(3):
        feeds = float_input(model, seed)
        ours = qonnx.run(model, feeds)
        for optimize in (True, False):  # fused into QLinearConv/QLinearMatMul, or float ops as written
            _assert_qdq_within_documented_tolerance(ours, run_onnxruntime(model, feeds, optimize), model, "xq")


# --- float models quantized by onnxruntime.quantization --------------------------------------------------


@pytest.fixture(scope="module")
def ort_models(tmp_path_factory):
    """Quantize once per module: {(model, format, weight type): ModelProto}."""
    models = {}
    for float_model in (float_cnn(), float_mlp(), float_residual()):
        name = float_model.graph.name
        for fmt in ("QOperator", "QDQ"):
            for weight_type in ("QInt8", "QUInt8"):
                per_channel = name != "mlp"
                models[name, fmt, weight_type] = ort_quantize(
                    float_model, tmp_path_factory.mktemp(f"{name}{fmt}{weight_type}"), quant_format=fmt,
                    weight_type=weight_type, per_channel=per_channel,
                )
        for weight_type in ("QInt8", "QUInt8"):
            models[name, "dynamic", weight_type] = ort_quantize(
                float_model, tmp_path_factory.mktemp(f"{name}dyn{weight_type}"), static=False, weight_type=weight_type,
            )
    return models


ORT_CASES = [(m, f, w) for m in ("cnn", "mlp", "residual") for f in ("QOperator", "QDQ", "dynamic")
             for w in ("QInt8", "QUInt8")]


def test_quantized_models_use_the_expected_operators(ort_models):
    """The quantizer produced what the cases below claim to test."""
    ops = {key: {node.op_type for node in model.graph.node} for key, model in ort_models.items()}
    assert {"QuantizeLinear", "QLinearConv", "QLinearMatMul", "DequantizeLinear"} <= ops["cnn", "QOperator", "QInt8"]
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "MatMul"} <= ops["cnn", "QDQ", "QInt8"]
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= ops["cnn", "dynamic", "QUInt8"]
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops["mlp", "dynamic", "QInt8"]
    # QDQ around the residual Add, MaxPool, GlobalAveragePool and Gemm too
    assert {"Add", "MaxPool", "GlobalAveragePool", "Gemm"} <= ops["residual", "QDQ", "QInt8"]
    qdq = ort_models["residual", "QDQ", "QInt8"]
    producers = {out: node.op_type for node in qdq.graph.node for out in node.output}
    assert all(producers.get(node.input[0]) == "DequantizeLinear"
               for node in qdq.graph.node if node.op_type in ("Add", "Gemm", "GlobalAveragePool"))
    assert all(node.domain in ("", "ai.onnx") for model in ort_models.values() for node in model.graph.node)
    assert all(entry.version < 19 for model in ort_models.values() for entry in model.opset_import if entry.domain == "")


@pytest.mark.parametrize("key", ORT_CASES, ids=["-".join(k) for k in ORT_CASES])
def test_onnxruntime_quantized_model_every_tensor_equals_onnx_reference(ort_models, key):
    """The quantizer writes opset < 19, which onnx's reference cannot run (no DequantizeLinear-13); it runs the
    same model at opset 19, whose operators here compute the same values."""
    model = ort_models[key]
    for seed in range(2):
        _assert_every_tensor_equals_reference(model, float_input(model, seed), with_opset(model, 19))


INTEGER_OPS = {"QuantizeLinear", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}


def _with_integer_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy whose outputs also include every tensor an integer operator produces."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    names = [out for node in model.graph.node if node.op_type in INTEGER_OPS for out in node.output
             if out and out not in {o.name for o in model.graph.output}]
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    for name in names:
        copied.graph.output.append(helper.make_tensor_value_info(name, types[name].tensor_type.elem_type, None))
    return copied, names


FLOAT_REDUCTIONS = {"Conv", "MatMul", "Gemm", "GlobalAveragePool", "AveragePool", "ReduceMean", "ReduceSum"}


def _after_float_reductions(model: onnx.ModelProto) -> set[str]:
    """Tensors computed from the result of a float reduction, which may round differently in onnxruntime."""
    tainted: set[str] = set()
    for node in model.graph.node:  # graphs are topologically sorted
        if node.op_type in FLOAT_REDUCTIONS or tainted.intersection(node.input):
            tainted.update(node.output)
    return tainted


def _float_outputs_match(ours, theirs, exact: bool, name: str):
    if exact:
        np.testing.assert_array_equal(ours, theirs, strict=True, err_msg=name)
    else:  # float reductions (GlobalAveragePool, Gemm) sum in another order in onnxruntime
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(theirs).max())), err_msg=name)


@pytest.mark.parametrize("key", ORT_CASES, ids=["-".join(k) for k in ORT_CASES])
def test_onnxruntime_quantized_model_against_onnxruntime(ort_models, key):
    """QOperator and dynamic models: every integer tensor bit-identical to onnxruntime (QOperator with
    requantize="float32"); float outputs too where only single IEEE operations (DequantizeLinear, Cast, Mul,
    Add, Relu) follow the integer operators, within 1e-5 after float reductions. QDQ: the documented tolerance.
    Without VNNI, full-range int8 weights are halved into [-64, 63] first (onnxruntime saturates on them)."""
    model = _with_weights_exact_on_onnxruntime(ort_models[key])
    name, fmt, weight_type = key
    float_exact = name != "residual"
    for seed in range(2):
        feeds = float_input(model, seed)
        if fmt == "QDQ":
            ours = qonnx.run(model, feeds)
            for optimize in (True, False):
                _assert_qdq_within_documented_tolerance(ours, run_onnxruntime(model, feeds, optimize), model, None)
            continue
        requantize = "float32" if fmt == "QOperator" else None
        exposed, integer_names = _with_integer_outputs(model)
        assert integer_names
        ours = qonnx.run(exposed, feeds, requantize=requantize)
        # Without graph optimizations onnxruntime runs the operators as written; optimized, it fuses the dynamic
        # models' MatMulInteger/Cast/Mul into com.microsoft kernels (MatMulIntegerToFloat), which may round the
        # float products in another order.
        theirs = dict(zip([o.name for o in exposed.graph.output], run_onnxruntime(exposed, feeds, optimize=False)))
        after_reductions = _after_float_reductions(model)
        checked_exactly = 0
        for out, value in ours.items():
            if out in integer_names and out not in after_reductions:
                np.testing.assert_array_equal(value, theirs[out], strict=True, err_msg=out)
                checked_exactly += 1
            elif value.dtype.kind in "ui":  # quantized from a float reduction's result: the QDQ tolerance
                steps = np.abs(value.astype(np.int64) - theirs[out].astype(np.int64))
                assert steps.max(initial=0) <= 2 and np.count_nonzero(steps) <= max(1, value.size // 100), out
            else:
                _float_outputs_match(value, theirs[out], float_exact and out not in after_reductions, out)
        assert checked_exactly >= 2
        (optimized,) = run_onnxruntime(model, feeds)
        _float_outputs_match(qonnx.run(model, feeds, requantize=requantize)["y"], optimized,
                             float_exact and fmt == "QOperator", "y (optimized onnxruntime)")
