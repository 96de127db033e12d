"""Static quantization of a tensor that holds a sentinel: an exported transformer's attention mask adds the float
minimum (-3.4e38) to the scores of padding so that Softmax gives them 0. No quantized range holds that and the
scores both (a range to -3.4e38 puts every score on one level: paraphrase-MiniLM-L3's retrieval fell from 0.98 to
0.26), so the tensors that hold it stay float and the report says why.

The model is built here as HF exports attention: scores = Q K^T / sqrt(d); mask = (1 - attention_mask) * finfo.min;
Softmax(scores + mask) V, with MatMul weights for Q, K, V. The oracle is the float model in onnxruntime: the
quantized model's padding keeps exactly zero attention, and its output stays within quantization error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

T, D = 12, 16  # tokens, width


def _attention_model(layers: int = 2) -> onnx.ModelProto:
    """``layers`` attention layers in a row that share one mask, as real exports do."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(np.float32(v), n) for n, v in (("one", 1.0), ("minimum", np.finfo(np.float32).min),
                                                                   ("root", np.sqrt(D)))]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    nodes = [
        helper.make_node("Unsqueeze", ["attention_mask", "axis1"], ["mask2"], name="unsqueeze"),
        helper.make_node("Cast", ["mask2"], ["maskf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Sub", ["one", "maskf"], ["inverted"], name="invert"),
        helper.make_node("Mul", ["inverted", "minimum"], ["mask"], name="to_minimum"),
    ]
    x = "x"
    for i in range(layers):
        inits += [numpy_helper.from_array(rng.normal(0, 0.4, (D, D)).astype(np.float32), f"w{n}{i}") for n in "qkv"]
        y = "y" if i == layers - 1 else f"y{i}"
        nodes += [
            helper.make_node("MatMul", [x, f"wq{i}"], [f"q{i}"], name=f"q{i}"),
            helper.make_node("MatMul", [x, f"wk{i}"], [f"k{i}"], name=f"k{i}"),
            helper.make_node("MatMul", [x, f"wv{i}"], [f"v{i}"], name=f"v{i}"),
            helper.make_node("Transpose", [f"k{i}"], [f"kt{i}"], perm=[0, 2, 1], name=f"kt{i}"),
            helper.make_node("MatMul", [f"q{i}", f"kt{i}"], [f"qk{i}"], name=f"qk{i}"),
            helper.make_node("Div", [f"qk{i}", "root"], [f"scores{i}"], name=f"scale{i}"),
            helper.make_node("Add", [f"scores{i}", "mask"], [f"masked{i}"], name=f"mask_add{i}"),
            helper.make_node("Softmax", [f"masked{i}"], [f"probs{i}"], axis=-1, name=f"softmax{i}"),
            helper.make_node("MatMul", [f"probs{i}", f"v{i}"], [y], name=f"context{i}"),
        ]
        x = y
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, T, D]),
                               helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [None, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, T, D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(count: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (count, T, D)).astype(np.float32)
    lengths = rng.integers(3, T + 1, count)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    return {"x": x, "attention_mask": mask}


@pytest.mark.parametrize("target", ["qdq-portable"])  # onnxruntime: tests/corpus/test_corpus_transformer.py (MiniLM)
def test_a_tensor_holding_the_float_minimum_stays_float(tmp_path, capsys, target):
    source, out = tmp_path / "attention.onnx", tmp_path / "attention-int8.onnx"
    onnx.save(_attention_model(), str(source))
    np.savez(tmp_path / "cal.npz", **_feeds(32, 1))
    code = main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(tmp_path / "cal.npz"), "-o", str(out),
                 "--target", target, "--no-eval", "--no-latency", "--report-samples", "4", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)["activations"]
    quantized = {row["name"] for row in report["tensors"]}
    assert not quantized & {"mask", "masked0", "masked1"}
    assert all(abs(v) < 1e30 for row in report["tensors"] for v in row["range"])
    kept = {row["name"]: row["reason"] for row in report["kept"]}
    assert any("sentinel" in why and "-3.4e+38" in why for why in kept.values())
    assert {"probs0", "probs1", "qk0", "qk1"} <= quantized  # the products around it stay quantized

    # Run without onnxruntime's fusions: its u8s8 kernels on CPUs without VNNI saturate pairs of products.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feeds = _feeds(16, 2)
    runs = []
    for path in (source, out):
        model = onnx.load(str(path))
        model.graph.output.append(helper.make_tensor_value_info("probs1", TensorProto.FLOAT, None))
        runs.append(ort.InferenceSession(model.SerializeToString(), options,
                                         providers=["CPUExecutionProvider"]).run(["y", "probs1"], feeds))
    (y_float, p_float), (y, p) = runs
    padding = np.broadcast_to(feeds["attention_mask"][:, None, :] == 0, p.shape)
    assert padding.any() and np.all(p[padding] == 0.0) and np.all(p_float[padding] == 0.0)
    sqnr = 10 * np.log10(np.sum(y_float ** 2) / np.sum((y - y_float) ** 2))
    assert sqnr > 20, sqnr
