"""qlinear.io.activation_calibration.Segments: a model run in consecutive segments (each exposing its share
of the wanted tensors, handing on what later segments read) gives, tensor for tensor, what onnxruntime gives
running the whole model once with every wanted tensor exposed; and the calibration built on it sees the same
values as that one run."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qlinear.io.activation_calibration import CalibrationData, Segments, collect, compare

ort = pytest.importorskip("onnxruntime")


def _model():
    """Conv -> Relu -> Conv, a skip connection (Add of the first Relu, read three nodes later), a Shape that
    an int64 Reshape reads further on, an If whose branches read an outer-scope tensor, and a dead branch."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w2")
    flag = numpy_helper.from_array(np.array(True), "flag")
    then_graph = helper.make_graph([helper.make_node("Neg", ["skip"], ["then_out"])], "then", [],
                                   [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [1, 4, 8, 8])])
    else_graph = helper.make_graph([helper.make_node("Abs", ["skip"], ["else_out"])], "else", [],
                                   [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [1, 4, 8, 8])])
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["skip"]),
        helper.make_node("Shape", ["skip"], ["shape"]),
        helper.make_node("Conv", ["skip", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Exp", ["c2"], ["dead"]),
        helper.make_node("Add", ["s2", "skip"], ["sum"]),
        helper.make_node("Flatten", ["sum"], ["flat"]),
        helper.make_node("Reshape", ["flat", "shape"], ["back"]),
        helper.make_node("If", ["flag"], ["branch"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Mul", ["back", "branch"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("dead", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [w1, w2, flag])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


NAMES = ["x", "c1", "skip", "c2", "s2", "sum", "back", "branch", "y"]


def _whole(model, names, feeds):
    """onnxruntime running the whole model once, every name exposed."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    for name in names:
        exposed.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    options = ort.SessionOptions()  # as calibration runs it (the full optimizations pick other Conv kernels)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


@pytest.mark.parametrize("budget", [1, 300, 1 << 30])
def test_segments_give_what_one_run_gives(budget):
    model = _model()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    run = Segments(model, NAMES, feeds, budget=budget)
    if budget == 1:
        assert len(run.segments) == len(NAMES) - 1  # every produced name ends a segment of its own
        assert "skip" in run.carried[1] and "shape" in sum(run.carried, [])
    if budget == 1 << 30:
        assert len(run.segments) == 1
    assert all(node.op_type != "Exp" for nodes, _ in run.segments for node in nodes)
    expected = _whole(model, NAMES, feeds)
    for _ in range(2):  # the sessions made on the first sample serve the next
        seen = {}
        for values in run(feeds):
            assert not set(values) & set(seen)
            seen.update(values)
        assert sorted(seen) == sorted(NAMES)
        for name in NAMES:
            assert np.array_equal(seen[name], expected[name]), name


def test_calibration_and_comparison_in_segments(tmp_path, monkeypatch):
    """The observers' extremes are those of one whole run over every sample; a model compared with itself
    in segments agrees exactly."""
    from qlinear.io import activation_calibration

    model = _model()
    samples = np.random.default_rng(2).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=samples)
    data = CalibrationData.open([tmp_path / "calib.npz"], ["x"])
    monkeypatch.setattr(activation_calibration, "GROUP_BYTES", 300)  # several segments
    observers = collect(model, NAMES, data)
    runs = [_whole(model, NAMES, {"x": samples[i:i + 1]}) for i in range(3)]
    for name in NAMES:
        assert observers[name].min == min(float(r[name].min()) for r in runs), name
        assert observers[name].max == max(float(r[name].max()) for r in runs), name
    assert len(Segments(model, NAMES, {"x": samples[:1]}).segments) > 2
    agreements = compare(model, model, NAMES, data)
    for name in NAMES:
        assert agreements[name].noise == 0.0 and agreements[name].signal > 0.0, name


def test_what_the_same_run_also_collects_comes_out_of_the_segments_budget(tmp_path, monkeypatch):
    """`collect(also=...)` (the layers' Hessians from the activations' run): the bytes they hold are taken from
    the segments' budget, down to a quarter of it, and every exposed tensor still reaches ``consume``."""
    from qlinear.io import activation_calibration

    model = _model()
    samples = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=samples)
    data = CalibrationData.open([tmp_path / "calib.npz"], ["x"])
    budgets = []

    class Recorded(Segments):
        def __init__(self, *args, **kwargs):
            budgets.append(args[3])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(activation_calibration, "Segments", Recorded)
    monkeypatch.setattr(activation_calibration, "GROUP_BYTES", 4000)
    seen = []
    for held, budget in ((1000, 3000), (3900, 1000)):
        collect(model, NAMES[:2], data, also=(NAMES[2:], lambda values: seen.extend(values), held))
        assert budgets[-1] == budget
    assert sorted(set(seen)) == sorted(NAMES)
