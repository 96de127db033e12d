"""`qlinear quantize` on ONNX models, weight by weight: where the weights of each weight-bearing operator
are found (initializers, Constant nodes, If/Loop/Scan subgraphs, behind constant-foldable chains), which
axis each is quantized along (the consumer's output-channel or reduction axis carried back to the stored
tensor), where the DequantizeLinear goes, and the user errors of malformed weights.

The oracles are independent of qlinear: the report rows are checked against the DequantizeLinear nodes
and tensors the output model stores; the stored values against onnx's reference QuantizeLinear run on
the float weight with the stored scale and zero point; onnxruntime's DequantizeLinear output against
onnx's reference DequantizeLinear on the same stored tensors (bit for bit); the model's outputs against
onnxruntime running the float model with each weight replaced by that reference dequantization (float
rounding only), and against the float model itself (loosely)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

FLOAT, FLOAT16, BFLOAT16, INT64, BOOL = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                                        TensorProto.INT64, TensorProto.BOOL)
QTYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int4": TensorProto.INT4,
          "float8e4m3fn": TensorProto.FLOAT8E4M3FN}
PACKED = {TensorProto.INT4, TensorProto.UINT4}
# How far the quantized model's outputs may move, relative to the float model's largest output.
LOOSE = {"int8": 0.05, "uint8": 0.05, "float8e4m3fn": 0.15, "int4": 0.4}


# ----------------------------------------------------------------------------------------------------
# Building models


def _value(name, elem=FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=(), opset=21, name="g"):
    """A model from nodes; ``inputs`` maps name -> (elem type, shape), ``outputs`` lists float outputs
    (their shapes inferred) or maps them to their shapes."""
    shapes = outputs if isinstance(outputs, dict) else dict.fromkeys(outputs)
    graph = helper.make_graph(nodes, name, [_value(n, *spec) for n, spec in inputs.items()],
                              [_value(n, FLOAT, shape) for n, shape in shapes.items()], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model)  # the outputs' shapes (the checker wants them)
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    return model


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _const(name, array):
    """A Constant node holding ``array`` (its output named ``name``)."""
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name),
                            name=f"{name}_node")


def _normal(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# Reading models


def _graphs(graph, scope=""):
    """(scope, graph) for ``graph`` and every subgraph in it, scopes like "cond.then_branch"."""
    yield scope, graph
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs) \
                if attr.type == onnx.AttributeProto.GRAPHS else []
            for sub in subs:
                yield from _graphs(sub, f"{scope}/{node.name}.{attr.name}".lstrip("/"))


def _stored(model) -> dict[str, tuple[str, str, object]]:
    """Every tensor the model stores: name -> (scope, "initializer" or "Constant node", TensorProto)."""
    found = {}
    for scope, graph in _graphs(model.graph):
        for tensor in graph.initializer:
            assert tensor.name not in found, tensor.name
            found[tensor.name] = (scope, "initializer", tensor)
        for node in graph.node:
            if node.op_type == "Constant":
                value = next(a.t for a in node.attribute if a.name == "value")
                assert node.output[0] not in found, node.output[0]
                found[node.output[0]] = (scope, "Constant node", value)
    return found


def _dq_nodes(model) -> dict[str, list[tuple[str, object]]]:
    """output name -> [(scope, DequantizeLinear node)] over every graph."""
    found: dict[str, list] = {}
    for scope, graph in _graphs(model.graph):
        for node in graph.node:
            if node.op_type == "DequantizeLinear":
                found.setdefault(node.output[0], []).append((scope, node))
    return found


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _array(tensor) -> np.ndarray:
    return numpy_helper.to_array(tensor)


def _bits_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _tiny(nodes, tensors, outputs, opset):
    """A model of ``nodes`` whose inputs are all initializers (copies of ``tensors``, renamed)."""
    initializers = []
    for name, tensor in tensors.items():
        copy = TensorProto()
        copy.CopyFrom(tensor)
        copy.name = name
        initializers.append(copy)
    graph = helper.make_graph(nodes, "tiny", [], [_value(name, elem) for name, elem in outputs], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _zero_like(qtensor, dims):
    """A zero zero point of ``qtensor``'s type (for QuantizeLinear with a float 8 output)."""
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = (count + 1) // 2 if qtensor.data_type in PACKED else count
    return helper.make_tensor("z", qtensor.data_type, list(dims), b"\0" * nbytes, raw=True)


# ----------------------------------------------------------------------------------------------------
# Running qlinear


def _quantize(tmp_path, capsys, model, dtype, *extra, name="model"):
    source = tmp_path / f"{name}.onnx"
    output = tmp_path / f"{name}-{dtype}.onnx"
    onnx.save(model, str(source))
    code = main(["quantize", str(source), "--dtype", dtype, *extra, "-o", str(output), "--json", "--no-eval"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["model"]["checker"] == "passed"
    quantized = onnx.load(str(output))
    onnx.checker.check_model(quantized, full_check=True)
    return report, quantized


def _rows(report) -> dict[str, dict]:
    rows = {r["name"]: r for r in report["tensors"]}
    assert len(rows) == len(report["tensors"]), "a tensor reported twice"
    return rows


def _granularity_of(node, scale) -> str:
    """The report's granularity wording, from the DequantizeLinear node and its stored scale."""
    attrs = _attrs(node)
    if len(scale.dims) == 0 or (len(scale.dims) == 1 and scale.dims[0] == 1 and "block_size" not in attrs
                                and "axis" not in attrs):
        return "per-tensor"
    if attrs.get("block_size"):
        return f"blocked (axis {attrs.get('axis', 1)}, {attrs['block_size']})"
    return f"per-axis (axis {attrs.get('axis', 1)})"


def _check_weights(original, quantized, report, dtype, *, runs_in_onnxruntime=True) -> dict[str, np.ndarray]:
    """For every quantized row: one DequantizeLinear with the row's name, in the graph that stored the
    float constant (or, for a constant defined in an outer graph, where it was defined); its granularity
    the row's; the stored values what onnx's reference QuantizeLinear gives for the float weight with the
    stored scale and zero point; onnxruntime's DequantizeLinear bit-identical to the reference's; the
    largest difference from the float weight the reported max |error|. Returns the reference
    dequantized weights by name."""
    before, after = _stored(original), _stored(quantized)
    dq = _dq_nodes(quantized)
    opset = _opset(quantized)
    restored = {}
    quantized_rows = [r for r in report["tensors"] if r["quantized"]]
    assert sum(len(v) for v in dq.values()) == len(quantized_rows) == report["model"]["dequantize_nodes"]
    for row in quantized_rows:
        name = row["name"]
        scope, kind, weight = before[name]
        assert name not in after, f"{name} is still stored as a float constant"
        assert len(dq[name]) == 1, f"{name}: {len(dq[name])} DequantizeLinear nodes"
        dq_scope, node = dq[name][0]
        assert dq_scope == scope, (name, dq_scope, scope)
        stored = [after[i] for i in node.input]
        assert all(s[0] == scope and s[1] == kind for s in stored), (name, [(s[0], s[1]) for s in stored])
        q, scale = stored[0][2], stored[1][2]
        zero = stored[2][2] if len(stored) > 2 else None
        assert q.data_type == QTYPES[dtype] and list(q.dims) == list(weight.dims) == row["shape"]
        assert scale.data_type == weight.data_type
        assert (zero is None) == (dtype.startswith("float"))
        assert row["granularity"] == _granularity_of(node, scale), (name, row["granularity"])
        attrs = _attrs(node)
        # the stored values are onnx's QuantizeLinear of the float weight with the stored scale and zero point
        tensors = {"w": weight, "scale": scale, "z": zero if zero is not None else _zero_like(q, scale.dims),
                   "q": q}
        tiny = _tiny([helper.make_node("QuantizeLinear", ["w", "scale", "z"], ["q_ref"], **attrs),
                      helper.make_node("DequantizeLinear", ["q", "scale"] + (["z"] if zero is not None else []),
                                       ["y"], **attrs)],
                     tensors, [("q_ref", q.data_type), ("y", weight.data_type)], max(opset, 19))
        q_ref, y_ref = ReferenceEvaluator(tiny).run(None, {})
        q_stored = _array(q)
        assert q_ref.shape == q_stored.shape
        np.testing.assert_array_equal(q_ref.astype(np.float64), q_stored.astype(np.float64), err_msg=name)
        if runs_in_onnxruntime:
            alone = _tiny([helper.make_node("DequantizeLinear", ["q", "scale"] + (["z"] if zero is not None else []),
                                            ["y"], **attrs)],
                          {k: v for k, v in tensors.items() if k != "w" and (k != "z" or zero is not None)},
                          [("y", weight.data_type)], opset)
            (y_ort,) = _session(alone).run(None, {})
            assert _bits_equal(y_ort, y_ref), name
        w = _array(weight).astype(np.float64)
        error = float(np.max(np.abs(y_ref.astype(np.float64) - w)))
        assert error == pytest.approx(row["max_abs_error"], rel=1e-9, abs=1e-12), name
        assert error <= 0.6 * float(np.max(np.abs(w)))  # not a wildly wrong scale
        restored[name] = y_ref
    return restored


def _substituted(original, restored: dict[str, np.ndarray]):
    """The float model with each named constant replaced by ``restored[name]`` where it is stored."""
    model = onnx.ModelProto()
    model.CopyFrom(original)
    for _, graph in _graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.name in restored:
                tensor.CopyFrom(numpy_helper.from_array(restored[tensor.name], tensor.name))
        for node in graph.node:
            if node.op_type == "Constant" and node.output[0] in restored:
                attr = next(a for a in node.attribute if a.name == "value")
                attr.t.CopyFrom(numpy_helper.from_array(restored[node.output[0]], node.output[0]))
    return model


def _check_outputs(original, quantized, restored, feeds_list, dtype):
    """onnxruntime: the QDQ model computes what the float model with the dequantized weights computes
    (float rounding only), and stays near the float model."""
    float_session, quantized_session = _session(original), _session(quantized)
    substituted_session = _session(_substituted(original, restored))
    for feeds in feeds_list:
        y_float = float_session.run(None, feeds)
        y_quant = quantized_session.run(None, feeds)
        y_subst = substituted_session.run(None, feeds)
        for f, q, s in zip(y_float, y_quant, y_subst):
            size = max(1.0, float(np.max(np.abs(f))))
            np.testing.assert_allclose(q, s, rtol=1e-5, atol=1e-5 * size)
            assert float(np.max(np.abs(q - f))) <= LOOSE[dtype] * size
            assert float(np.max(np.abs(q - f))) > 0  # the weights did change


def _probe(quantized, names, feeds):
    """onnxruntime's value of main-graph DequantizeLinear outputs, made graph outputs of a copy."""
    probe = onnx.ModelProto()
    probe.CopyFrom(quantized)
    stored = _stored(quantized)
    for name in names:
        node = next(n for n in probe.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == name)
        probe.graph.output.append(_value(name, stored[node.input[1]][2].data_type))
    values = _session(probe).run(names, feeds)
    return dict(zip(names, values))


def _check(tmp_path, capsys, model, feeds_list, dtype, *extra, name="model"):
    """Quantize ``model`` and run every check; returns the report rows, the output model, the reference
    dequantized weights."""
    report, quantized = _quantize(tmp_path, capsys, model, dtype, *extra, name=name)
    restored = _check_weights(model, quantized, report, dtype)
    main_graph = [n for n, nodes in _dq_nodes(quantized).items() if nodes[0][0] == ""]
    if main_graph:
        probed = _probe(quantized, main_graph, feeds_list[0])
        for weight_name, value in probed.items():
            assert _bits_equal(value, restored[weight_name]), weight_name
    _check_outputs(model, quantized, restored, feeds_list, dtype)
    return _rows(report), quantized, restored


def _expect(rows, quantized=None, kept=None):
    """``quantized``: name -> (granularity, location[, note fragment]); ``kept``: name -> note fragment."""
    for name, (granularity, location, *note) in (quantized or {}).items():
        row = rows[name]
        assert row["quantized"], (name, row["note"])
        assert (row["granularity"], row["location"]) == (granularity, location), name
        if note:
            assert note[0] in row["note"], (name, row["note"])
        else:
            assert row["note"] == "", (name, row["note"])
    for name, fragment in (kept or {}).items():
        row = rows[name]
        assert not row["quantized"] and row["granularity"] is None, name
        assert fragment in row["note"], (name, row["note"])
    assert set(rows) == set(quantized or {}) | set(kept or {})


# ----------------------------------------------------------------------------------------------------
# Convolutions


@pytest.mark.parametrize("dtype, dense, depthwise", [
    ("int8", "per-axis (axis 0)", "per-axis (axis 0)"),
    ("int4", "blocked (axis 1, 32)", "per-axis (axis 0)"),
])
def test_conv_dense_and_depthwise(tmp_path, capsys, dtype, dense, depthwise):
    """Conv W [M, C, kH, kW]: output channels on axis 0, reduction (input channels) on axis 1. A
    depthwise W [C, 1, 3, 3] has one input channel: int4 falls back to per-channel, and says so."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "dense.w", "dense.b"], ["c"], pads=[1, 1, 1, 1], name="dense"),
             helper.make_node("Conv", ["c", "dw.w"], ["y"], pads=[1, 1, 1, 1], group=8, name="dw")]
    model = _model(nodes, {"x": (FLOAT, [1, 32, 5, 5])}, ["y"],
                   [_init("dense.w", _normal(rng, 8, 32, 3, 3)), _init("dense.b", _normal(rng, 8)),
                    _init("dw.w", _normal(rng, 8, 1, 3, 3))])
    rows, _, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 1, 32, 5, 5)}], dtype)
    fallback = ("per channel: the reduction axis has 1 elements",) if dtype == "int4" else ()
    _expect(rows, {"dense.w": (dense, "initializer"), "dw.w": (depthwise, "initializer", *fallback)},
            {"dense.b": "not a weight: Conv B"})


@pytest.mark.parametrize("dtype, expected", [("int8", "per-axis (axis 1)"), ("int4", "blocked (axis 0, 32)")])
def test_conv_transpose(tmp_path, capsys, dtype, expected):
    """ConvTranspose W [C_in, C_out, kH, kW]: output channels on axis 1, reduction on axis 0."""
    rng = np.random.default_rng(2)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], name="deconv")
    model = _model([node], {"x": (FLOAT, [1, 64, 3, 3])}, ["y"],
                   [_init("w", _normal(rng, 64, 6, 3, 3)), _init("b", _normal(rng, 6))])
    rows, _, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 1, 64, 3, 3)}], dtype)
    _expect(rows, {"w": (expected, "initializer")}, {"b": "not a weight: ConvTranspose B"})


# ----------------------------------------------------------------------------------------------------
# Gemm and MatMul


def _gemm_b(trans_b):
    rng = np.random.default_rng(3)
    w = _normal(rng, 10, 64) if trans_b else _normal(rng, 64, 10)
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, name="gemm")
    model = _model([node], {"x": (FLOAT, [3, 64])}, ["y"], [_init("w", w), _init("c", _normal(rng, 10))])
    return model, [{"x": _x(rng, 3, 64)}], {"c": "not a weight: Gemm C"}


def _gemm_a(trans_a):
    """A constant first operand: Y = A' B with A' = A (transA=0, [M, K]) or A^T (transA=1, A [K, M])."""
    rng = np.random.default_rng(4)
    a = _normal(rng, 64, 6) if trans_a else _normal(rng, 6, 64)
    node = helper.make_node("Gemm", ["a", "x"], ["y"], transA=trans_a, name="gemm")
    model = _model([node], {"x": (FLOAT, [64, 5])}, ["y"], [_init("a", a)])
    return model, [{"x": _x(rng, 64, 5)}], {}


def _matmul(shape, right=True):
    rng = np.random.default_rng(5)
    w = _normal(rng, *shape)
    if right:
        x_shape = [3, shape[-2]] if len(shape) == 2 else [shape[0], 3, shape[-2]]
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    else:
        x_shape = [shape[-1], 5]
        node = helper.make_node("MatMul", ["w", "x"], ["y"], name="mm")
    model = _model([node], {"x": (FLOAT, x_shape)}, ["y"], [_init("w", w)])
    return model, [{"x": _x(rng, *x_shape)}], {}


@pytest.mark.parametrize("case, dtype, name, expected", [
    ("gemm transB=0 [K, N]", "int8", "w", "per-axis (axis 1)"),
    ("gemm transB=0 [K, N]", "int4", "w", "blocked (axis 0, 32)"),
    ("gemm transB=1 [N, K]", "int8", "w", "per-axis (axis 0)"),
    ("gemm transB=1 [N, K]", "int4", "w", "blocked (axis 1, 32)"),
    ("gemm A transA=0 [M, K]", "int8", "a", "per-axis (axis 0)"),
    ("gemm A transA=0 [M, K]", "int4", "a", "blocked (axis 1, 32)"),
    ("gemm A transA=1 [K, M]", "int8", "a", "per-axis (axis 1)"),
    ("gemm A transA=1 [K, M]", "int4", "a", "blocked (axis 0, 32)"),
    ("matmul right [K, N]", "int8", "w", "per-axis (axis 1)"),
    ("matmul right [K, N]", "int4", "w", "blocked (axis 0, 32)"),
    ("matmul right [K=40, N]", "int4", "w", "blocked (axis 0, 32)"),  # a last block of 8
    ("matmul left [M, K]", "int8", "w", "per-axis (axis 0)"),
    ("matmul left [M, K]", "int4", "w", "blocked (axis 1, 32)"),
    ("matmul batched [B, K, N]", "int8", "w", "per-axis (axis 2)"),
    ("matmul batched [B, K, N]", "int4", "w", "blocked (axis 1, 32)"),
])
def test_gemm_and_matmul_operands(tmp_path, capsys, case, dtype, name, expected):
    """The channel axis is the operand's output axis (N of B, M of A) and the blocks run along K."""
    build = {
        "gemm transB=0 [K, N]": lambda: _gemm_b(0), "gemm transB=1 [N, K]": lambda: _gemm_b(1),
        "gemm A transA=0 [M, K]": lambda: _gemm_a(0), "gemm A transA=1 [K, M]": lambda: _gemm_a(1),
        "matmul right [K, N]": lambda: _matmul((64, 10)),
        "matmul right [K=40, N]": lambda: _matmul((40, 10)), "matmul left [M, K]": lambda: _matmul((6, 64), right=False),
        "matmul batched [B, K, N]": lambda: _matmul((2, 64, 10)),
    }[case]
    model, feeds, kept = build()
    rows, quantized, _ = _check(tmp_path, capsys, model, feeds, dtype)
    _expect(rows, {name: (expected, "initializer")}, kept)
    # |y - y_float| <= sum_k |x_k| * max|error|: the float model run on |x| with every element of the
    # weight set to the reported max |error| and no bias
    shape = rows[name]["shape"]
    bound_model = _substituted(model, {name: np.full(shape, rows[name]["max_abs_error"], np.float32),
                                       **{c: np.zeros(rows[c]["shape"], np.float32) for c in kept}})
    (x,) = feeds[0].values()
    (bound,) = _session(bound_model).run(None, {"x": np.abs(x)})
    (y_float,), (y_quant,) = _session(model).run(None, feeds[0]), _session(quantized).run(None, feeds[0])
    assert np.all(np.abs(y_quant - y_float) <= bound * (1 + 1e-5) + 1e-5)


# ----------------------------------------------------------------------------------------------------
# Recurrent layers


@pytest.mark.parametrize("op, gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_recurrent_weights_per_gate_row(tmp_path, capsys, op, gates):
    """W [D, G*H, I] and R [D, G*H, H] per gate row (axis 1); B [D, 2*G*H] is 2-D but a bias: kept."""
    rng = np.random.default_rng(6)
    hidden, size, steps, batch = 8, 16, 5, 2
    w = 0.3 * _normal(rng, 2, gates * hidden, size)
    r = 0.3 * _normal(rng, 2, gates * hidden, hidden)
    b = 0.1 * _normal(rng, 2, 2 * gates * hidden)
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden, direction="bidirectional",
                            name="rnn")
    model = _model([node], {"x": (FLOAT, [steps, batch, size])}, ["y", "y_h"],
                   [_init("W", w), _init("R", r), _init("B", b)])
    rows, _, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, steps, batch, size)}], "int8")
    _expect(rows, {"W": ("per-axis (axis 1)", "initializer"), "R": ("per-axis (axis 1)", "initializer")},
            {"B": f"not a weight: {op} B"})


# ----------------------------------------------------------------------------------------------------
# Embeddings


@pytest.mark.parametrize("dtype, expected", [("int8", "per-axis (axis 0)"), ("int4", "blocked (axis 1, 32)")])
def test_embedding_table(tmp_path, capsys, dtype, expected):
    """Gather of a table [V, D] with indices from the input: one scale per row (token) for int8, blocks
    along D for int4. A table gathered with constant indices is a folded lookup, not an embedding."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Gather", ["fixed", "picks"], ["p"], name="pick"),
             helper.make_node("Add", ["e", "p"], ["y"])]
    model = _model(nodes, {"ids": (INT64, [2, 3])}, ["y"],
                   [_init("table", _normal(rng, 16, 64)), _init("fixed", _normal(rng, 5, 64)),
                    _ints("picks", [[1, 4, 0]])])
    feeds = [{"ids": np.array([[0, 5, 15], [3, 3, 9]], np.int64)}]
    # the standard DequantizeLinear -> Gather that these checks read; --target onnxruntime (the default) writes the
    # int4 table as onnxruntime's GatherBlockQuantized instead (test_gather_tables.py)
    rows, _, _ = _check(tmp_path, capsys, model, feeds, dtype, "--target", "qdq-portable")
    _expect(rows, {"table": (expected, "initializer")}, {"fixed": "not a weight: Add input 1 (through Gather)"})


# ----------------------------------------------------------------------------------------------------
# Where weights are stored: Constant nodes, If/Loop/Scan subgraphs, outer-scope names


def test_constant_nodes_in_the_main_graph(tmp_path, capsys):
    """A Constant node weight is replaced at the node's place by Constant nodes of the quantized values,
    scale and zero point and a DequantizeLinear that keeps the name."""
    rng = np.random.default_rng(8)
    nodes = [_const("w", _normal(rng, 16, 8)), _const("bias", _normal(rng, 8)),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Add", ["m", "bias"], ["y"])]
    model = _model(nodes, {"x": (FLOAT, [3, 16])}, ["y"])
    rows, quantized, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 3, 16)}], "int8")
    _expect(rows, {"w": ("per-axis (axis 1)", "Constant node")}, {"bias": "not a weight: Add input 1"})
    ops = [(n.op_type, list(n.output)) for n in quantized.graph.node]
    assert not quantized.graph.initializer
    assert ops[:4] == [("Constant", ["w_quantized"]), ("Constant", ["w_scale"]), ("Constant", ["w_zero_point"]),
                       ("DequantizeLinear", ["w"])]
    assert [op for op, _ in ops[4:]] == ["Constant", "MatMul", "Add"]


@pytest.mark.parametrize("dtype", ["float6e2m3", "mxfp6_e3m2"])
def test_codes_of_a_type_the_constant_operator_does_not_take_become_an_initializer(tmp_path, capsys, dtype):
    """float6 codes: DequantizeLinear takes them, a Constant node may not hold them (onnx.checker), so a Constant
    node's weight leaves its codes in an initializer of the same graph; they are the codes an initializer weight
    gets, and the model passes the full check (`_quantize`)."""
    rng = np.random.default_rng(18)
    w = _normal(rng, 64, 8)
    as_constant = _model([_const("w", w), helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                         {"x": (FLOAT, [3, 64])}, ["y"])
    as_initializer = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"x": (FLOAT, [3, 64])}, ["y"],
                            [_init("w", w)])
    _, quantized = _quantize(tmp_path, capsys, as_constant, dtype, name="constant")
    _, reference = _quantize(tmp_path, capsys, as_initializer, dtype, name="initializer")
    (codes,) = [t for t in quantized.graph.initializer]
    assert codes.name == "w_quantized"
    assert codes.SerializeToString() == next(t for t in reference.graph.initializer
                                             if t.name == "w_quantized").SerializeToString()
    constants = [n.output[0] for n in quantized.graph.node if n.op_type == "Constant"]
    assert "w_scale" in constants and "w_quantized" not in constants


def _branch(name, nodes, output, initializers=(), shape=(3, 8)):
    return helper.make_graph(nodes, name, [], [_value(output, FLOAT, list(shape))], list(initializers))


def test_weights_inside_both_branches_of_an_if(tmp_path, capsys):
    """Each branch's weight is quantized inside its branch: a Constant node there is replaced there, an
    initializer of the branch stays the branch's."""
    rng = np.random.default_rng(9)
    then_branch = _branch("then", [_const("w_then", _normal(rng, 16, 8)),
                                   helper.make_node("MatMul", ["x", "w_then"], ["y_then"], name="mm_then")], "y_then")
    else_branch = _branch("else", [helper.make_node("MatMul", ["x", "w_else"], ["y_else"], name="mm_else")], "y_else",
                          [_init("w_else", _normal(rng, 16, 8))])
    node = helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch, name="cond")
    model = _model([node], {"x": (FLOAT, [3, 16]), "flag": (BOOL, [])}, ["y"])
    x = _x(rng, 3, 16)
    feeds = [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}]
    rows, quantized, _ = _check(tmp_path, capsys, model, feeds, "int8")
    _expect(rows, {"w_then": ("per-axis (axis 1)", "If 'cond' then_branch: Constant node"),
                   "w_else": ("per-axis (axis 1)", "If 'cond' else_branch: initializer")})
    assert [n.op_type for n in quantized.graph.node] == ["If"] and not quantized.graph.initializer
    (if_node,) = quantized.graph.node
    branches = {a.name: a.g for a in if_node.attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Constant"] * 3 + ["DequantizeLinear", "MatMul"]
    assert [n.op_type for n in branches["else_branch"].node] == ["DequantizeLinear", "MatMul"]
    assert sorted(i.name for i in branches["else_branch"].initializer) == [
        "w_else_quantized", "w_else_scale", "w_else_zero_point"]


def test_outer_scope_weight_read_inside_an_if(tmp_path, capsys):
    """A weight defined in the main graph and read by name inside both branches: its DequantizeLinear
    stays in the main graph (where the name is defined) and the branches still read the name."""
    rng = np.random.default_rng(10)
    then_branch = _branch("then", [helper.make_node("MatMul", ["x", "w"], ["y_then"], name="mm_then")], "y_then")
    else_branch = _branch("else", [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm_else"),
                                   helper.make_node("Relu", ["m"], ["y_else"])], "y_else")
    node = helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch, name="cond")
    model = _model([node], {"x": (FLOAT, [3, 16]), "flag": (BOOL, [])}, ["y"], [_init("w", _normal(rng, 16, 8))])
    x = _x(rng, 3, 16)
    feeds = [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}]
    rows, quantized, _ = _check(tmp_path, capsys, model, feeds, "int8")
    _expect(rows, {"w": ("per-axis (axis 1)", "initializer")})
    assert [n.op_type for n in quantized.graph.node] == ["DequantizeLinear", "If"]
    branches = {a.name: a.g for a in quantized.graph.node[1].attribute}
    assert branches["then_branch"].node[0].input[1] == "w" and branches["else_branch"].node[0].input[1] == "w"
    assert not any(n.op_type == "DequantizeLinear" for g in branches.values() for n in g.node)


def test_outer_scope_weight_transposed_in_the_main_graph(tmp_path, capsys):
    """w [N, K] transposed in the main graph and read as MatMul B [K, N] inside a branch: the channel axis
    (N) is followed through the Transpose across the scope, to w's axis 0."""
    rng = np.random.default_rng(10)
    then_branch = _branch("then", [helper.make_node("MatMul", ["x", "w_t"], ["y_then"], name="mm_then")], "y_then")
    else_branch = _branch("else", [helper.make_node("Relu", ["x"], ["r"]),
                                   helper.make_node("MatMul", ["r", "w_t"], ["y_else"], name="mm_else")], "y_else")
    nodes = [helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
             helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch, name="cond")]
    model = _model(nodes, {"x": (FLOAT, [3, 64]), "flag": (BOOL, [])}, ["y"], [_init("w", _normal(rng, 8, 64))])
    x = _x(rng, 3, 64)
    feeds = [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}]
    for dtype, expected in (("int8", "per-axis (axis 0)"), ("int4", "blocked (axis 1, 32)")):
        rows, quantized, _ = _check(tmp_path, capsys, model, feeds, dtype)
        _expect(rows, {"w": (expected, "initializer")})
        assert [n.op_type for n in quantized.graph.node] == ["DequantizeLinear", "Transpose", "If"]


def test_same_name_in_both_branches(tmp_path, capsys):
    """Each branch of an If is its own scope, so both may define a constant named "w" (onnx.checker and
    onnxruntime accept it; a model that builds both branches from one template does this). Each is a
    weight of its own and should be quantized in its own branch, with a row of its own."""
    rng = np.random.default_rng(23)
    then_branch = _branch("then", [_const("w", _normal(rng, 16, 8)),
                                   helper.make_node("MatMul", ["x", "w"], ["y_then"])], "y_then")
    else_branch = _branch("else", [helper.make_node("MatMul", ["x", "w"], ["y_else"])], "y_else",
                          [_init("w", 10 * _normal(rng, 16, 8))])
    node = helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch, name="cond")
    model = _model([node], {"x": (FLOAT, [3, 16]), "flag": (BOOL, [])}, ["y"])
    report, quantized = _quantize(tmp_path, capsys, model, "int8")
    float_session, quantized_session = _session(model), _session(quantized)
    x = _x(rng, 3, 16)
    for flag in (True, False):  # onnxruntime runs both branches of the output
        y_float = float_session.run(None, {"x": x, "flag": np.array(flag)})[0]
        y_quant = quantized_session.run(None, {"x": x, "flag": np.array(flag)})[0]
        assert 0 < float(np.max(np.abs(y_quant - y_float))) <= 0.05 * float(np.max(np.abs(y_float))), flag
    branches = {a.name: a.g for a in quantized.graph.node[0].attribute}
    for branch in branches.values():
        assert [n.output[0] for n in branch.node if n.op_type == "DequantizeLinear"] == ["w"]
    assert sorted(r["location"] for r in report["tensors"]) == [
        "If 'cond' else_branch: initializer", "If 'cond' then_branch: Constant node"]
    assert report["model"]["dequantize_nodes"] == 2


def test_weights_inside_loop_and_nested_if(tmp_path, capsys):
    """A Loop body's Constant-node weight, and weights in both branches of an If nested in the body
    (the If's condition a main-graph input read from two levels down)."""
    rng = np.random.default_rng(11)
    inner_then = _branch("inner_then", [helper.make_node("MatMul", ["h", "w_deep"], ["t"], name="mm_deep")], "t",
                         [_init("w_deep", 0.3 * _normal(rng, 8, 8))], shape=(2, 8))
    inner_else = _branch("inner_else", [_const("w_other", 0.3 * _normal(rng, 8, 8)),
                                        helper.make_node("MatMul", ["h", "w_other"], ["e"], name="mm_other")], "e",
                         shape=(2, 8))
    body = helper.make_graph(
        [_const("w_loop", 0.3 * _normal(rng, 8, 8)),
         helper.make_node("MatMul", ["h", "w_loop"], ["m"], name="mm_loop"),
         helper.make_node("If", ["flag"], ["n"], then_branch=inner_then, else_branch=inner_else, name="inner"),
         helper.make_node("Add", ["m", "n"], ["a"]), helper.make_node("Tanh", ["a"], ["h_next"]),
         helper.make_node("Identity", ["c"], ["c_next"])],
        "body", [_value("i", INT64, []), _value("c", BOOL, []), _value("h", FLOAT, [2, 8])],
        [_value("c_next", BOOL, []), _value("h_next", FLOAT, [2, 8])])
    node = helper.make_node("Loop", ["trips", "go", "h0"], ["h_final"], body=body, name="loop")
    model = _model([node], {"h0": (FLOAT, [2, 8]), "flag": (BOOL, [])}, {"h_final": [2, 8]},
                   [_ints("trips", 3), numpy_helper.from_array(np.array(True), "go")])
    h0 = _x(rng, 2, 8)
    feeds = [{"h0": h0, "flag": np.array(True)}, {"h0": h0, "flag": np.array(False)}]
    rows, _, _ = _check(tmp_path, capsys, model, feeds, "int8")
    _expect(rows, {"w_loop": ("per-axis (axis 1)", "Loop 'loop' body: Constant node"),
                   "w_deep": ("per-axis (axis 1)", "Loop 'loop' body > If 'inner' then_branch: initializer"),
                   "w_other": ("per-axis (axis 1)", "Loop 'loop' body > If 'inner' else_branch: Constant node")})


def test_weight_inside_a_scan_body(tmp_path, capsys):
    rng = np.random.default_rng(12)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["xt", "w_scan"], ["m"], name="mm_scan"), helper.make_node("Add", ["m", "h"], ["a"]),
         helper.make_node("Tanh", ["a"], ["h_next"]), helper.make_node("Identity", ["h_next"], ["yt"])],
        "body", [_value("h", FLOAT, [2, 8]), _value("xt", FLOAT, [2, 16])],
        [_value("h_next", FLOAT, [2, 8]), _value("yt", FLOAT, [2, 8])], [_init("w_scan", 0.3 * _normal(rng, 16, 8))])
    node = helper.make_node("Scan", ["h0", "xs"], ["h_final", "ys"], body=body, num_scan_inputs=1, name="scan")
    model = _model([node], {"h0": (FLOAT, [2, 8]), "xs": (FLOAT, [4, 2, 16])},
                   {"h_final": [2, 8], "ys": [4, 2, 8]})
    rows, _, _ = _check(tmp_path, capsys, model, [{"h0": _x(rng, 2, 8), "xs": _x(rng, 4, 2, 16)}], "int4",
                        "--granularity", "axis")
    _expect(rows, {"w_scan": ("per-axis (axis 1)", "Scan 'scan' body: initializer")})


# ----------------------------------------------------------------------------------------------------
# Weights behind constant-foldable chains


@pytest.mark.parametrize("dtype, expected, opset", [("int8", "per-axis (axis 0)", 19),
                                                    ("int4", "blocked (axis 1, 32)", 21)])
def test_float16_constant_cast_and_transposed(tmp_path, capsys, dtype, expected, opset):
    """float16 Constant [N, K] -> Cast(float) -> Transpose -> MatMul B [K, N]: B's channel axis (N) is the
    constant's axis 0 through the Transpose. The scale is float16 (the constant's type), which needs
    DequantizeLinear 19: the opset-17 model is raised."""
    rng = np.random.default_rng(13)
    nodes = [_const("w16", _normal(rng, 10, 64, dtype=np.float16)),
             helper.make_node("Cast", ["w16"], ["w32"], to=FLOAT),
             helper.make_node("Transpose", ["w32"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    model = _model(nodes, {"x": (FLOAT, [3, 64])}, ["y"], opset=17)
    rows, quantized, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 3, 64)}], dtype)
    _expect(rows, {"w16": (expected, "Constant node")})
    assert rows["w16"]["from"] == "float16" and rows["w16"]["to"] == dtype
    assert _opset(quantized) == opset
    dq = _dq_nodes(quantized)["w16"][0][1]
    assert _stored(quantized)[dq.input[1]][2].data_type == FLOAT16
    assert [n.op_type for n in quantized.graph.node][-3:] == ["Cast", "Transpose", "MatMul"]


@pytest.mark.parametrize("dtype, expected", [("int8", "per-axis (axis 2)"), ("int4", "blocked (axis 1, 32)")])
def test_reshape_unsqueeze_squeeze_chain(tmp_path, capsys, dtype, expected):
    """[1, K, N] -> Squeeze -> Unsqueeze -> Reshape [K, N] -> MatMul B: the reshapes keep K and N, so
    the channel axis is the constant's axis 2 and the blocks run along its axis 1."""
    rng = np.random.default_rng(14)
    nodes = [helper.make_node("Squeeze", ["w", "zero"], ["s"]), helper.make_node("Unsqueeze", ["s", "zero"], ["u"]),
             helper.make_node("Reshape", ["u", "shape"], ["r"]), helper.make_node("MatMul", ["x", "r"], ["y"], name="mm")]
    model = _model(nodes, {"x": (FLOAT, [3, 64])}, ["y"],
                   [_init("w", _normal(rng, 1, 64, 10)), _ints("zero", [0]), _ints("shape", [64, -1])])
    rows, _, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 3, 64)}], dtype)
    _expect(rows, {"w": (expected, "initializer")})


def test_lstm_gates_reordered_by_slice_and_concat(tmp_path, capsys):
    """PyTorch's export of an LSTM: weight_ih [4H, I] in its gate order i, f, g, o, sliced per gate,
    concatenated in ONNX's order i, o, f, c and unsqueezed to W [1, 4H, I] (R likewise). The gate rows
    are W's axis 1, which is the 2-D constant's axis 0."""
    rng = np.random.default_rng(15)
    hidden, size = 8, 16
    nodes, inits = [], [_ints("axis0", [0])] + [_ints(f"at{k}", [k * hidden]) for k in range(5)]
    for name in ("weight_ih", "weight_hh"):
        inits.append(_init(name, 0.3 * _normal(rng, 4 * hidden, size if name == "weight_ih" else hidden)))
        for k, gate in enumerate("ifgo"):  # PyTorch's gate order: rows [k*H, (k+1)*H)
            nodes.append(helper.make_node("Slice", [name, f"at{k}", f"at{k + 1}", "axis0"], [f"{name}_{gate}"]))
        nodes.append(helper.make_node("Concat", [f"{name}_{g}" for g in "iofg"], [f"{name}_iofc"], axis=0))
        nodes.append(helper.make_node("Unsqueeze", [f"{name}_iofc", "axis0"], [f"{name}_onnx"]))
    inits.append(_init("bias", 0.1 * _normal(rng, 1, 8 * hidden)))
    nodes.append(helper.make_node("LSTM", ["x", "weight_ih_onnx", "weight_hh_onnx", "bias"], ["y"],
                                  hidden_size=hidden, name="lstm"))
    model = _model(nodes, {"x": (FLOAT, [5, 2, size])}, ["y"], inits)
    rows, _, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 5, 2, size)}], "int8")
    _expect(rows, {"weight_ih": ("per-axis (axis 0)", "initializer"),
                   "weight_hh": ("per-axis (axis 0)", "initializer")}, {"bias": "not a weight: LSTM B"})


def _bfloat16_model(rng):
    w = numpy_helper.from_array(_normal(rng, 64, 10).astype(ml_dtypes.bfloat16), "w")
    assert w.data_type == BFLOAT16
    nodes = [helper.make_node("Cast", ["w"], ["w32"], to=FLOAT), helper.make_node("MatMul", ["x", "w32"], ["y"])]
    return _model(nodes, {"x": (FLOAT, [3, 64])}, ["y"], [w])


@pytest.mark.parametrize("dtype, expected", [("int8", "per-axis (axis 1)"), ("int4", "blocked (axis 0, 32)"),
                                             ("float8e4m3fn", "per-axis (axis 1)")])
def test_bfloat16_weights(tmp_path, capsys, dtype, expected):
    """bfloat16 weights get float32 scales and a Cast to bfloat16 after the DequantizeLinear: onnxruntime
    1.32.0 has no DequantizeLinear with a bfloat16 scale (NOT_IMPLEMENTED when the session is made, though it
    runs the float bfloat16 model), and a bfloat16 DequantizeLinear is defined as the float32 product rounded
    to bfloat16, which is what the Cast gives. Checked: the stored values are onnx's QuantizeLinear of the
    bfloat16 weight with the stored float32 scale, the Cast of onnx's DequantizeLinear is the weight the model
    computes with (onnxruntime's value bit for bit), and the model runs in onnxruntime."""
    rng = np.random.default_rng(16)
    model = _bfloat16_model(rng)
    report, quantized = _quantize(tmp_path, capsys, model, dtype)
    rows = _rows(report)
    _expect(rows, {"w": (expected, "initializer")})
    assert rows["w"]["from"] == "bfloat16"
    assert [n.op_type for n in quantized.graph.node][:2] == ["DequantizeLinear", "Cast"]
    dq, cast = quantized.graph.node[:2]
    assert cast.input[0] == dq.output[0] and cast.output[0] == "w" and _attrs(cast)["to"] == BFLOAT16
    stored = _stored(quantized)
    q, scale = stored[dq.input[0]][2], stored[dq.input[1]][2]
    assert scale.data_type == FLOAT
    zero = stored[dq.input[2]][2] if len(dq.input) > 2 else _zero_like(q, scale.dims)
    attrs = _attrs(dq)
    tiny = _tiny([helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q_ref"], **attrs),
                  helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
                  helper.make_node("Cast", ["y"], ["w_ref"], to=BFLOAT16)],
                 {"w": _stored(model)["w"][2], "s": scale, "z": zero, "q": q},
                 [("q_ref", q.data_type), ("y", FLOAT), ("w_ref", BFLOAT16)], 21)
    q_ref, y_ref, w_ref = ReferenceEvaluator(tiny).run(None, {})
    np.testing.assert_array_equal(q_ref.astype(np.float64), _array(q).astype(np.float64))
    w = _array(_stored(model)["w"][2]).astype(np.float64)
    assert float(np.max(np.abs(w_ref.astype(np.float64) - w))) == pytest.approx(rows["w"]["max_abs_error"], rel=1e-9)
    probe = onnx.ModelProto()  # onnxruntime returns no bfloat16 arrays: its DequantizeLinear output, before the Cast
    probe.CopyFrom(quantized)
    probe.graph.output.append(_value(dq.output[0], FLOAT))
    x = _x(rng, 3, 64)
    y_quant, y_ort = _session(probe).run(None, {"x": x})
    assert _bits_equal(y_ort, y_ref)
    (y_subst,) = _session(_substituted(model, {"w": w_ref})).run(None, {"x": x})
    np.testing.assert_allclose(y_quant, y_subst, rtol=1e-5, atol=1e-5)
    (y_float,) = _session(model).run(None, {"x": x})
    assert 0 < float(np.max(np.abs(y_quant - y_float))) <= LOOSE[dtype] * float(np.max(np.abs(y_float)))


def test_float16_weights_are_onnx_quantize_linear_of_the_stored_scale(tmp_path, capsys):
    """The stored values of a float16 weight are what QuantizeLinear gives for that weight with the stored
    float16 scale: the quotient x / scale in the scale's type, then rounded to an integer (the ONNX spec as
    docs/semantics.md row 1 reads it, onnx's reference, and qlinear.quantize_linear itself). A division in
    float32 instead put 6 of these 640 elements one code away, where float16 rounds the quotient across a
    half-way point."""
    from qlinear.ops.quantize_linear import quantize_linear

    rng = np.random.default_rng(13)
    w = _normal(rng, 64, 10).astype(np.float16)
    nodes = [helper.make_node("Cast", ["w"], ["w32"], to=FLOAT), helper.make_node("MatMul", ["x", "w32"], ["y"])]
    model = _model(nodes, {"x": (FLOAT, [3, 64])}, ["y"], [numpy_helper.from_array(w, "w")])
    _, quantized = _quantize(tmp_path, capsys, model, "int8")
    stored = _stored(quantized)
    q, scale = _array(stored["w_quantized"][2]), _array(stored["w_scale"][2])
    assert scale.dtype == np.float16
    tiny = _tiny([helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q"], axis=1)],
                 {"w": numpy_helper.from_array(w, "w"), "s": stored["w_scale"][2], "z": stored["w_zero_point"][2]},
                 [("q", TensorProto.INT8)], 21)
    (reference,) = ReferenceEvaluator(tiny).run(None, {})
    np.testing.assert_array_equal(quantize_linear(w, scale, np.zeros(10, np.int8), axis=1), reference)
    np.testing.assert_array_equal(q, reference)
    assert np.sum(quantize_linear(w.astype(np.float32), scale.astype(np.float32), np.zeros(10, np.int8), axis=1)
                  != reference) > 0  # the case a float32 division gets wrong is in the data


# ----------------------------------------------------------------------------------------------------
# Shared weights and uses that disagree


def test_weight_shared_by_two_matmuls(tmp_path, capsys):
    rng = np.random.default_rng(17)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm1"),
             helper.make_node("MatMul", ["x2", "w"], ["b"], name="mm2")]
    model = _model(nodes, {"x": (FLOAT, [3, 16]), "x2": (FLOAT, [2, 5, 16])}, ["a", "b"],
                   [_init("w", _normal(rng, 16, 8))])
    rows, quantized, _ = _check(tmp_path, capsys, model, [{"x": _x(rng, 3, 16), "x2": _x(rng, 2, 5, 16)}], "int8")
    _expect(rows, {"w": ("per-axis (axis 1)", "initializer")})
    assert [n.op_type for n in quantized.graph.node] == ["DequantizeLinear", "MatMul", "MatMul"]


@pytest.mark.parametrize("dtype, expected", [("int8", "per-axis (axis 0)"), ("int4", "blocked (axis 1, 32)")])
def test_tied_embedding_read_by_gather_and_matmul(tmp_path, capsys, dtype, expected):
    """A table [V, D] that embeds the tokens (Gather) and, transposed, projects back onto the vocabulary
    (MatMul B [D, V]): both read V as the channel axis and D as the reduction, so it is quantized once."""
    rng = np.random.default_rng(18)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["e", "table_t"], ["logits"], name="head")]
    model = _model(nodes, {"ids": (INT64, [2, 3])}, ["logits"], [_init("table", 0.2 * _normal(rng, 16, 64))])
    feeds = [{"ids": np.array([[0, 5, 15], [3, 3, 9]], np.int64)}]
    rows, quantized, _ = _check(tmp_path, capsys, model, feeds, dtype)
    _expect(rows, {"table": (expected, "initializer")})
    assert [n.op_type for n in quantized.graph.node] == ["DequantizeLinear", "Gather", "Transpose", "MatMul"]


def _disagreeing_model(rng):
    """c [16, 24] read as MatMul B (channels on its axis 1) and, transposed, as another MatMul's B
    (channels on its axis 0)."""
    nodes = [helper.make_node("MatMul", ["x", "c"], ["a"], name="mm1"),
             helper.make_node("Transpose", ["c"], ["c_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x2", "c_t"], ["b"], name="mm2")]
    model = _model(nodes, {"x": (FLOAT, [3, 16]), "x2": (FLOAT, [3, 24])}, ["a", "b"],
                   [_init("c", _normal(rng, 16, 24))])
    return model, [{"x": _x(rng, 3, 16), "x2": _x(rng, 3, 24)}]


@pytest.mark.parametrize("dtype, extra, expected, note", [
    ("int8", [], "per-tensor", "its 2 uses read it along different axes; per tensor: no output-channel axis"),
    ("int4", [], "per-tensor", "its 2 uses read it along different axes; per tensor: no reduction axis"),
    ("int8", ["--granularity", "axis", "--axis", "0"], "per-axis (axis 0)", "its 2 uses read it along different axes"),
    ("int4", ["--block-size", "8", "--axis", "1"], "blocked (axis 1, 8)", "its 2 uses read it along different axes"),
])
def test_uses_that_disagree_on_the_axis(tmp_path, capsys, dtype, extra, expected, note):
    """The defaults fall back to one scale for the tensor and say why; an explicit --axis is followed."""
    model, feeds = _disagreeing_model(np.random.default_rng(19))
    rows, _, _ = _check(tmp_path, capsys, model, feeds, dtype, *extra)
    _expect(rows, {"c": (expected, "initializer", note)})


@pytest.mark.parametrize("extra", [["--granularity", "axis"], ["--granularity", "block"]])
def test_uses_that_disagree_refuse_an_explicit_granularity_without_an_axis(tmp_path, capsys, extra):
    model, _ = _disagreeing_model(np.random.default_rng(19))
    source = tmp_path / "m.onnx"
    onnx.save(model, str(source))
    err = _fails(capsys, source, tmp_path / "q.onnx", "int8", *extra)
    what = "output-channel" if "axis" in extra else "reduction"
    assert f"tensor 'c': has no {what} axis that its uses agree on (MatMul B, MatMul B (through Transpose)); " \
           "give --axis N or --granularity tensor" in err


# ----------------------------------------------------------------------------------------------------
# Raising the opset


@pytest.mark.parametrize("dtype, granularity, note, opset", [
    ("int8", "per-axis (axis 0)", "", 13),
    ("int4", "per-axis (axis 0)", "per channel: the reduction axis has 3 elements", 21),
    ("float8e4m3fn", "per-axis (axis 0)", "", 19),
])
def test_opset_11_model_is_raised_to_what_the_type_needs(tmp_path, capsys, dtype, granularity, note, opset):
    rng = np.random.default_rng(20)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")
    model = _model([node], {"x": (FLOAT, [1, 3, 6, 6])}, ["y"], [_init("w", _normal(rng, 8, 3, 3, 3)),
                                                                 _init("b", _normal(rng, 8))], opset=11)
    report, quantized = _quantize(tmp_path, capsys, model, dtype)
    rows = _rows(report)
    _expect(rows, {"w": (granularity, "initializer", *([note] if note else []))}, {"b": "not a weight: Conv B"})
    assert _opset(quantized) == opset
    section = report["model"]
    assert (section["opset_before"], section["opset_after"]) == (11, opset)
    conversion = section["conversion"]
    assert conversion["checked"] is True and conversion["max_difference"] <= 1e-4
    assert conversion["note"].startswith(f"11 -> {opset} by onnx's version converter; the float model before and after")
    restored = _check_weights(model, quantized, report, dtype)
    _check_outputs(model, quantized, restored, [{"x": _x(rng, 1, 3, 6, 6)}], dtype)


# ----------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit status 2, nothing written


def _fails(capsys, source, output, dtype="int8", *extra):
    code = main(["quantize", str(source), "--dtype", dtype, *extra, "-o", str(output), "--json", "--no-eval"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith("qlinear quantize: error: ")
    assert not output.exists() and not output.with_name(output.name + ".data").exists()
    return captured.err


def _only(path, *names):
    assert sorted(p.name for p in path.iterdir()) == sorted(names)


def test_model_without_float_constants(tmp_path, capsys):
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = _model([node], {"x": (FLOAT, [2, 6])}, ["y"], [_ints("shape", [3, 4])])
    onnx.save(model, str(tmp_path / "m.onnx"))
    err = _fails(capsys, tmp_path / "m.onnx", tmp_path / "q.onnx")
    assert "m.onnx: no float constants (initializers or Constant nodes, in any graph)" in err
    _only(tmp_path, "m.onnx")


def test_model_with_only_biases(tmp_path, capsys):
    """Nothing to quantize: the message says why each is kept and to use --include, which then works."""
    rng = np.random.default_rng(21)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1), helper.make_node("Add", ["g", "b"], ["y"])]
    model = _model(nodes, {"x": (FLOAT, [2, 6]), "w": (FLOAT, [4, 6])}, ["y"],
                   [_init("c", _normal(rng, 4)), _init("b", _normal(rng, 4))])
    onnx.save(model, str(tmp_path / "m.onnx"))
    err = _fails(capsys, tmp_path / "m.onnx", tmp_path / "q.onnx")
    assert "nothing to quantize among its 2 float constants (" in err
    assert "1 is kept: not a weight: Gemm C" in err and "1 is kept: not a weight: Add input 1" in err
    assert "name tensors with --include to quantize them anyway" in err
    _only(tmp_path, "m.onnx")
    feeds = [{"x": _x(rng, 2, 6), "w": _x(rng, 4, 6)}]
    rows, _, _ = _check(tmp_path, capsys, model, feeds, "int8", "--include", "b", name="m")
    _expect(rows, {"b": ("per-tensor", "initializer", "per tensor: no output-channel axis")},
            {"c": "not matched by --include"})


def _matmul_model_with(tensor, x_shape):
    node = helper.make_node("MatMul", ["x", tensor.name], ["y"])
    graph = helper.make_graph([node], "g", [_value("x", FLOAT, x_shape)], [_value("y", FLOAT, None)], [tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_initializer_whose_dims_promise_more_than_its_data(tmp_path, capsys):
    """dims [4, 1000000000] (16 GB of float) with 64 bytes of raw_data: refused, nothing allocated."""
    tensor = TensorProto(name="w", data_type=FLOAT, dims=[4, 1_000_000_000], raw_data=b"\x01" * 64)
    onnx.save(_matmul_model_with(tensor, [3, 4]), str(tmp_path / "m.onnx"))
    err = _fails(capsys, tmp_path / "m.onnx", tmp_path / "q.onnx")
    assert "initializer 'w': has 64 bytes of data, and its dims [4, 1000000000] of float need 16000000000" in err
    _only(tmp_path, "m.onnx")


def test_typed_float_data_shorter_than_its_dims(tmp_path, capsys):
    tensor = TensorProto(name="w", data_type=FLOAT, dims=[4, 8], float_data=[0.5] * 10)
    assert len(tensor.float_data) == 10 and not tensor.raw_data
    onnx.save(_matmul_model_with(tensor, [3, 4]), str(tmp_path / "m.onnx"))
    err = _fails(capsys, tmp_path / "m.onnx", tmp_path / "q.onnx")
    assert "initializer 'w': has 10 values, and its dims [4, 8] need 32" in err
    _only(tmp_path, "m.onnx")


def _external_model(folder):
    """A MatMul model saved with its weight w [16, 8] (512 bytes) in w.data beside it."""
    rng = np.random.default_rng(22)
    model = _matmul_model_with(_init("w", _normal(rng, 16, 8)), [3, 16])
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.data", size_threshold=0)
    assert (folder / "w.data").stat().st_size == 512


def test_external_data_file_truncated(tmp_path, capsys):
    _external_model(tmp_path)
    with open(tmp_path / "w.data", "r+b") as f:
        f.truncate(100)
    err = _fails(capsys, tmp_path / "m.onnx", tmp_path / "q.onnx")
    assert "initializer 'w': external data file 'w.data' has 100 bytes, and the tensor needs bytes [0, 512)" in err
    _only(tmp_path, "m.onnx", "w.data")


def test_external_data_outside_the_model_folder(tmp_path, capsys):
    """A location "../x.data" naming a real file of the right size, one folder up: refused as outside."""
    folder = tmp_path / "model"
    folder.mkdir()
    _external_model(folder)
    (folder / "w.data").rename(tmp_path / "x.data")
    proto = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    entry = next(e for e in proto.graph.initializer[0].external_data if e.key == "location")
    entry.value = "../x.data"
    (folder / "m.onnx").write_bytes(proto.SerializeToString())
    err = _fails(capsys, folder / "m.onnx", folder / "q.onnx")
    assert "initializer 'w': external data location '../x.data' is not a file beside the model" in err
    _only(folder, "m.onnx")
    _only(tmp_path, "model", "x.data")
