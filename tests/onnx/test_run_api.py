"""qlinear.onnx's API: the op classes in a user's own ReferenceEvaluator, argument errors, node errors, imports."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from _onnx_models import float_input, qoperator_chain, run_reference
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import qlinear
import qlinear.onnx as qonnx
from qlinear.onnx import ops


def test_op_classes_are_named_after_their_operators():
    # ReferenceEvaluator(new_ops=...) keys classes by (op_domain, class name).
    names = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
             "DynamicQuantizeLinear", "GatherBlockQuantized"}
    for requantize in ("float64", "float32"):
        classes = qonnx.op_classes(requantize)
        assert {cls.__name__ for cls in classes} == names
        assert all(cls.requantize == requantize for cls in classes)
        # onnxruntime's contrib operator (what --target onnxruntime writes for 4-bit Gather tables) in its domain
        assert {cls.__name__: cls.op_domain for cls in classes if cls.op_domain} == {"GatherBlockQuantized": "com.microsoft"}
    assert qonnx.op_classes() is ops.OPS
    assert ops.QLinearConv in ops.OPS


def test_users_own_reference_evaluator_with_the_op_classes():
    model = qoperator_chain(np.int8)
    feeds = float_input(model, 0)
    (ours,) = ReferenceEvaluator(model, new_ops=list(ops.OPS)).run(None, feeds)
    np.testing.assert_array_equal(ours, run_reference(model, feeds)[0], strict=True)
    np.testing.assert_array_equal(ours, qonnx.run(model, feeds)["y"], strict=True)


def test_model_as_path_bytes_and_evaluator(tmp_path):
    model = qoperator_chain(np.uint8)
    feeds = float_input(model, 1)
    expected = qonnx.run(model, feeds)["y"]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for given in (path, str(path), model.SerializeToString(), qonnx.evaluator(model)):
        np.testing.assert_array_equal(qonnx.run(given, feeds)["y"], expected, strict=True)


def test_argument_errors():
    model = qoperator_chain(np.uint8)
    x = float_input(model, 0)["x"]
    with pytest.raises(TypeError, match=r"qlinear.onnx.run: model must be an onnx.ModelProto, a path or serialized bytes, got int"):
        qonnx.run(42, {"x": x})
    with pytest.raises(TypeError, match=r"qlinear.onnx.run: inputs must be a mapping .*got list"):
        qonnx.run(model, [x])
    with pytest.raises(ValueError, match=r"qlinear.onnx.run: unknown input 'z'; the model's inputs are \['x'\]"):
        qonnx.run(model, {"x": x, "z": x})
    with pytest.raises(ValueError, match=r"qlinear.onnx.run: missing input 'x'"):
        qonnx.run(model, {})
    with pytest.raises(TypeError, match=r"qlinear.onnx.run: input 'x' must be a NumPy array, got list"):
        qonnx.run(model, {"x": x.tolist()})
    with pytest.raises(TypeError, match=r"qlinear.onnx.run: input 'x' must have the model's type float32, got float64"):
        qonnx.run(model, {"x": x.astype(np.float64)})
    with pytest.raises(ValueError, match=r"qlinear.onnx.run: input 'x' must have rank 4 \(the model's\), got shape \(3, 12, 12\)"):
        qonnx.run(model, {"x": x[0]})
    with pytest.raises(ValueError, match=r"qlinear.onnx.run: input 'x' must have size 12 along axis 2"):
        qonnx.run(model, {"x": x[:, :, :5]})
    with pytest.raises(ValueError, match=r"qlinear.onnx.run: 'y1' is not an output of the model; its outputs are \['y'\]"):
        qonnx.run(model, {"x": x}, outputs=["y1"])
    with pytest.raises(ValueError, match=r"op_classes: requantize must be one of 'float64', 'float32', 'tflite', 'tflite-single', 'xnnpack', got 'float16'"):
        qonnx.run(model, {"x": x}, requantize="float16")
    with pytest.raises(ValueError, match=r"op_classes: requantize must be one of"):
        qonnx.op_classes(["float32"])
    with pytest.raises(ValueError, match=r"qlinear.onnx.run: requantize is chosen when the evaluator is built"):
        qonnx.run(qonnx.evaluator(model), {"x": x}, requantize="float32")


def _one_node_model(node, inputs, output, initializers, opset=21):
    graph = helper.make_graph([node], "g", inputs, [output],
                              [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def test_node_errors_name_the_node_and_keep_qlinears_exception_type():
    # An exact accumulator beyond int32 (B near its maximum): AccumulatorOverflowError, a ValueError and an
    # OverflowError, with the node named first.
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], name="big")
    model = _one_node_model(
        node, [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 1, 1])],
        helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 1, 1, 1]),
        [("xs", np.float32(1)), ("xz", np.uint8(0)), ("w", np.full((1, 1, 1, 1), 255, np.uint8)), ("ws", np.float32(1)),
         ("wz", np.uint8(0)), ("ys", np.float32(1)), ("yz", np.uint8(0)), ("b", np.array([2**31 - 1], np.int32))],
    )
    with pytest.raises(qlinear.AccumulatorOverflowError, match=r"^node 'big' \(QLinearConv\): qlinear_conv: ") as caught:
        qonnx.run(model, {"x": np.full((1, 1, 1, 1), 255, np.uint8)})
    assert isinstance(caught.value, OverflowError)

    # A TypeError from qlinear reaches the caller as itself (onnx's OpRun would rewrap it as "Issues with types").
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"])
    model = _one_node_model(
        node, [helper.make_tensor_value_info("x", TensorProto.UINT8, [3])],
        helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3]), [("s", np.float64(0.5))],
    )
    with pytest.raises(TypeError, match=r"^DequantizeLinear node -> \['y'\]: dequantize_linear: .*x_scale"):
        qonnx.run(model, {"x": np.arange(3, dtype=np.uint8)})


def test_attributes_set_to_their_defaults_and_unset_dtypes():
    """An explicit attribute equal to the default, and output_dtype=0 (UNDEFINED), mean the default."""
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, saturate=1, output_dtype=0, block_size=0)
    model = _one_node_model(
        node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        helper.make_tensor_value_info("y", TensorProto.UINT8, [4]), [("s", np.float32(0.5))],
    )
    x = np.array([-1, 0.25, 0.75, 200], np.float32)
    np.testing.assert_array_equal(qonnx.run(model, {"x": x})["y"], run_reference(model, {"x": x})[0], strict=True)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_import_qlinear_and_the_command_parser_do_not_import_onnx():
    out = _python(
        "import sys, qlinear, qlinear.cli\n"
        "qlinear.cli.build_parser()\n"
        "print([m for m in ('onnx', 'onnxruntime', 'qlinear.onnx') if m in sys.modules])\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_onnx_is_a_clear_import_error():
    out = _python("import sys\nsys.modules['onnx'] = None\nimport qlinear.onnx\n")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        "ImportError: qlinear.onnx needs the onnx package, which is not installed: pip install 'qlinear[onnx]'"
    )


def _wrapped_in_function_and_if(flat: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The flat model's nodes as (a) a model-local function called from the graph, (b) the then-branch of an If."""
    graph = flat.graph
    opsets = list(flat.opset_import)
    inputs, outputs = [i.name for i in graph.input], [o.name for o in graph.output]
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in graph.initializer]
    function = helper.make_function("local", "block", inputs, outputs, constants + list(graph.node), opsets)
    call = helper.make_node("block", inputs, outputs, domain="local")
    as_function = helper.make_model(
        helper.make_graph([call], "f", list(graph.input), list(graph.output)),
        opset_imports=opsets + [helper.make_opsetid("local", 1)], functions=[function])
    branch = helper.make_graph(constants + list(graph.node), "then", [], list(graph.output))
    condition = helper.make_node("Constant", [], ["cond"], value=onnx.numpy_helper.from_array(np.array(True)))
    as_if = helper.make_model(
        helper.make_graph([condition, helper.make_node("If", ["cond"], outputs, then_branch=branch, else_branch=branch)],
                          "i", list(graph.input), list(graph.output)),
        opset_imports=[helper.make_opsetid("", 13)])
    for model in (as_function, as_if):
        model.ir_version = 9
    return as_function, as_if


def test_local_functions_and_subgraphs_run_on_qlinear_with_the_chosen_requantization():
    """onnx builds local-function evaluators without new_ops; qlinear's evaluator still reaches them (onnx's
    reference alone cannot run this opset-10 DequantizeLinear) and the requantize mode reaches both."""
    from _onnx_models import requantize_disagreement_model

    flat = requantize_disagreement_model()
    node = helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])
    flat.graph.node[0].output[0] = "yq"
    flat.graph.node.append(node)
    flat.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    feeds = {"x": np.zeros((1, 1, 2, 2), np.uint8)}
    expected = {mode: qonnx.run(flat, feeds, requantize=mode)["y"] for mode in ("float64", "float32")}
    assert not np.array_equal(expected["float64"], expected["float32"])
    for wrapped in _wrapped_in_function_and_if(flat):
        for mode in ("float64", "float32"):
            np.testing.assert_array_equal(qonnx.run(wrapped, feeds, requantize=mode)["y"], expected[mode], strict=True)
    with pytest.raises(RuntimeError, match="DequantizeLinear"):
        ReferenceEvaluator(_wrapped_in_function_and_if(flat)[0])


def test_operators_outside_the_default_domain_are_not_implemented():
    """com.microsoft.QLinearAdd (quantize_static's QOperator Add) is implemented by neither onnx's reference nor qlinear."""
    node = helper.make_node("QLinearAdd", ["a", "s", "z", "a", "s", "z", "s", "z"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])],
                              [onnx.numpy_helper.from_array(np.float32(1), "s"), onnx.numpy_helper.from_array(np.uint8(0), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(NotImplementedError, match="QLinearAdd"):
        qonnx.run(model, {"a": np.zeros(2, np.uint8)})


def test_callers_own_classes_take_precedence_in_qlinear_evaluator():
    from onnx.reference.op_run import OpRun

    class DequantizeLinear(OpRun):
        op_domain = ""

        def _run(self, x, scale, zero_point=None, **attributes):
            return (np.full(x.shape, -1, np.float32),)

    model = qoperator_chain(np.uint8)
    feeds = float_input(model, 0)
    ours = qonnx.QlinearEvaluator(model, new_ops=[DequantizeLinear]).run(None, feeds)[0]
    assert np.all(ours == -1)
    np.testing.assert_array_equal(qonnx.QlinearEvaluator(model).run(None, feeds)[0], run_reference(model, feeds)[0])


def _conv_nodes(session):
    return [node for node in session.rt_nodes_ if node.op_type in ("QLinearConv", "ConvInteger")]


def test_constant_convolution_weights_are_packed_once_and_reused():
    model = qoperator_chain(np.int8)
    session = qonnx.evaluator(model)
    feeds = float_input(model, 0)
    first = qonnx.run(session, feeds)["y"]
    packed = [node._packed[3] for node in _conv_nodes(session)]
    packed_type = type(qlinear.prepack_conv(np.zeros((1, 1, 1, 1), np.int8)))
    assert len(packed) == 2 and all(isinstance(p, packed_type) for p in packed)
    second = qonnx.run(session, feeds)["y"]
    assert [node._packed[3] for node in _conv_nodes(session)] == packed  # the same objects
    np.testing.assert_array_equal(first, second, strict=True)
    np.testing.assert_array_equal(first, run_reference(model, feeds)[0], strict=True)
    # the initializers packed are read-only copies: nothing can change them behind the cache
    with pytest.raises(ValueError, match="read-only"):
        session.rt_inits_["w1"][...] = 0


def test_writeable_or_runtime_weights_are_not_cached():
    """A user's own ReferenceEvaluator keeps writeable initializers: the op classes pack nothing, and changing
    the weights in place between runs changes the result as it must. A weight zero point fed at run time
    (a graph input) gives the reference's result for each value."""
    model = qoperator_chain(np.uint8)
    feeds = float_input(model, 0)
    session = ReferenceEvaluator(model, new_ops=list(ops.OPS))  # read-only views of the model's bytes
    session.run(None, feeds)
    assert all(node._packed is None for node in _conv_nodes(session))
    session.rt_inits_["w1"] = np.array(session.rt_inits_["w1"])  # writeable, owning its data
    before = session.run(None, feeds)[0]
    assert all(node._packed is None for node in _conv_nodes(session))
    session.rt_inits_["w1"][...] = 7
    changed = session.run(None, feeds)[0]
    assert not np.array_equal(changed, before)
    reference = ReferenceEvaluator(model)
    reference.rt_inits_["w1"] = np.full_like(reference.rt_inits_["w1"], 7)
    np.testing.assert_array_equal(changed, reference.run(None, feeds)[0], strict=True)

    node = helper.make_node("ConvInteger", ["x", "w", "", "wz"], ["y"])
    w = np.random.default_rng(3).integers(0, 256, (4, 2, 3, 3)).astype(np.uint8)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 5, 5]),
                      helper.make_tensor_value_info("wz", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4, 3, 3])], [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    session = qonnx.evaluator(model)
    x = np.random.default_rng(4).integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    for zero_point in (0, 200, 0, 17):
        feeds = {"x": x, "wz": np.array(zero_point, np.uint8)}
        np.testing.assert_array_equal(qonnx.run(session, feeds)["y"], run_reference(model, feeds)[0], strict=True)
        assert _conv_nodes(session)[0]._packed[1] == zero_point
