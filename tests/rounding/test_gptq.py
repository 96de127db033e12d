"""GPTQ and the machinery every rounding method shares (`qlinear.rounding`): the fast, lazily batched GPTQ
against the paper's per-column transcription (`qlinear.reference.gptq`), the codes against QuantizeLinear's
rule, the written values against qlinear's DequantizeLinear, and the layer views against onnxruntime's own
Conv, ConvTranspose, MatMul and Gemm (the Hessian's features times the weight's view are the layer's output)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import qlinear
from qlinear import dtypes
from qlinear.granularity import Granularity
from qlinear.reference import mx as mx_reference
from qlinear.reference.gptq import gptq as reference_gptq
from qlinear.rounding import round_weight
from qlinear.rounding.codec import Codec, Groups, Layout, Parameters
from qlinear.rounding.gptq import gptq

from ._helpers import codec as _codec
from ._helpers import granularity, output_error

SEED = 20261204


def _layer(rng, shape=(16, 40, 3, 3), samples=3000):
    """A Conv weight and the Hessian of correlated input features (so that compensation matters)."""
    w = rng.standard_normal(shape).astype(np.float32)
    k = int(np.prod(shape[1:]))
    x = rng.standard_normal((samples, k)) @ rng.standard_normal((k, k)) * 0.3
    return w, (x.T @ x)[None]


CASES = [("int4", "block", False), ("int4", "axis", False), ("int4", "tensor", True), ("uint4", "block", False),
         ("int2", "block", False), ("uint8", "axis", False), ("float4e2m1", "axis", True), ("mxfp4", "block", True),
         ("nvfp4", "block", True)]


@pytest.mark.parametrize("dtype,kind,symmetric", CASES)
def test_fast_gptq_gives_the_codes_of_the_papers_per_column_form(dtype, kind, symmetric):
    rng = np.random.default_rng(SEED)
    w, h = _layer(rng)
    layout = Layout.of("Conv", w.shape)
    block = 16 if dtype == "nvfp4" else 32
    gran = granularity(kind, w.shape, block)
    groups = Groups.of_granularity(layout, gran)
    codec = _codec(dtype, symmetric)
    codec.prepare(w)
    matrices = layout.view(w).astype(np.float64)
    fast = Parameters(groups, codec)
    slow = Parameters(groups, codec)
    if groups.starts is None:
        fast.choose_all(matrices)
        slow.choose_all(matrices)
    codes, values = gptq(matrices, h, groups, codec, fast)
    starts = groups.starts[0] if groups.starts is not None else ()

    def quant(j, current):
        if j in starts:
            at = starts.index(j)
            slow.choose_run(0, j, starts[at + 1] if at + 1 < len(starts) else current.shape[1], current)
        return codec.round(current[:, j], *slow.column(0, j))[1]

    expected = reference_gptq(matrices[0], h[0], quant)
    np.testing.assert_array_equal(values[0], expected)
    assert groups.starts is not None or kind != "block"


@pytest.mark.parametrize("dtype,kind,symmetric", CASES)
def test_gptq_lowers_the_layer_output_error_of_round_to_nearest(dtype, kind, symmetric):
    rng = np.random.default_rng(SEED + 1)
    w, h = _layer(rng, (24, 32, 3, 3))
    gran = granularity(kind, w.shape, 16 if dtype == "nvfp4" else 32)
    layout = Layout.of("Conv", w.shape)
    errors = {}
    for method in ("rtn", "gptq"):
        rounded = round_weight(w, gran, _codec(dtype, symmetric), method, "Conv", 1, h)
        errors[method] = output_error(layout.view(rounded.values), layout.view(w), h)
    assert errors["gptq"] < 0.8 * errors["rtn"], errors


@pytest.mark.parametrize("dtype,kind,symmetric", CASES)
@pytest.mark.parametrize("method", ["gptq", "hqq", "rtn"])
def test_the_values_are_dequantize_linear_of_the_stored_codes(dtype, kind, symmetric, method):
    if method == "hqq" and (dtype in mx_reference.FORMATS or dtype.startswith("float")):
        pytest.skip("hqq needs an integer zero point")
    rng = np.random.default_rng(SEED + 2)
    w, h = _layer(rng, (8, 64, 1, 1), 500)
    gran = granularity(kind, w.shape, 16 if dtype == "nvfp4" else 32)
    codec = _codec(dtype, symmetric)
    rounded = round_weight(w, gran, codec, method, "Conv", 1, h)
    attributes = gran.attributes()
    if dtype == "nvfp4":
        scales = qlinear.dequantize_linear(rounded.scale, rounded.global_scale, opset=23)
        restored = qlinear.dequantize_linear(rounded.codes, scales, opset=23, **attributes)
    elif dtype in mx_reference.FORMATS:
        restored = qlinear.dequantize_linear(rounded.codes, rounded.scale, output_dtype=np.float32, opset=28, **attributes)
    else:
        restored = qlinear.dequantize_linear(rounded.codes, rounded.scale, rounded.zero_point, **attributes)
    np.testing.assert_array_equal(rounded.values, np.asarray(restored, np.float64))
    assert rounded.codes.shape == w.shape and rounded.scale.shape == gran.param_shape


def test_round_to_nearest_is_quantize_linear_exactly():
    """The integer rule the algorithms round each column by is QuantizeLinear's, ties and saturation included."""
    rng = np.random.default_rng(SEED + 3)
    for dtype in ("int4", "uint4", "int2", "uint8", "int8"):
        qtype = dtypes.get(dtype)
        codec = Codec(qtype, False, np.float32)
        scale = np.float32(0.25) * rng.integers(1, 9, 4000).astype(np.float32)
        x = (rng.integers(-40, 40, 4000) * 0.5).astype(np.float32) * scale  # many exact halves: ties
        x[:50] = np.float32(1e6) * np.sign(x[:50] + 0.1)  # saturation
        zero = rng.integers(qtype.qmin, qtype.qmax + 1, 4000).astype(qtype.dtype)
        codes, values = codec.round(x, scale, zero)
        expected = qlinear.quantize_linear(x.reshape(-1, 1), scale.reshape(-1, 1), zero.reshape(-1, 1), axis=0,
                                           block_size=1).reshape(-1)
        np.testing.assert_array_equal(codes, expected)
        restored = qlinear.dequantize_linear(expected.reshape(-1, 1), scale.reshape(-1, 1), zero.reshape(-1, 1), axis=0,
                                             block_size=1).reshape(-1)
        np.testing.assert_array_equal(values, restored.astype(np.float64))


def test_gptq_is_the_same_on_every_run_and_thread_count():
    code = ("import numpy as np, hashlib\n"
            "from tests.rounding.test_gptq import _layer\n"
            "from tests.rounding._helpers import codec, granularity\n"
            "from qlinear.rounding import round_weight\n"
            f"w, h = _layer(np.random.default_rng({SEED}), (32, 64, 3, 3))\n"
            "r = round_weight(w, granularity('block', w.shape, 32), codec('int4'), 'gptq', 'Conv', 1, h)\n"
            "print(hashlib.sha256(r.codes.view(np.uint8).tobytes() + r.scale.tobytes()).hexdigest())\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digests = set()
    for threads in ("1", "2", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   NUMBA_NUM_THREADS=threads)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_dead_inputs_and_a_singular_hessian_are_handled():
    rng = np.random.default_rng(SEED + 4)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    x = rng.standard_normal((100, 16))
    x[:, 3] = 0.0  # an input never seen
    x[:, 5] = x[:, 6]  # two inputs always equal
    h = (x.T @ x)[None]
    gran = Granularity("block", w.shape, 0, 8)  # MatMul B [K, N]: blocks along K
    rounded = round_weight(w, gran, _codec("int4"), "gptq", "MatMul", 1, h)
    assert np.isfinite(rounded.values).all()


# ----------------------------------------------------------------------------------------------------
# The layers' views against onnxruntime


ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _run_layer(op, w, x, **attributes):
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, ["x", "W"], ["y"], **attributes)
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return node, session.run(None, {"x": x})[0]


LAYERS = [
    ("Conv", (8, 3, 3, 3), (2, 3, 9, 11), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ("Conv", (8, 2, 3, 3), (1, 4, 9, 11), {"group": 2, "dilations": [2, 1]}),
    ("Conv", (6, 1, 5, 5), (1, 6, 12, 12), {"group": 6, "pads": [2, 2, 2, 2]}),
    ("Conv", (8, 3, 3), (1, 3, 20), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    ("Conv", (8, 3, 3), (1, 3, 20), {"auto_pad": "SAME_LOWER", "strides": [2]}),
    ("ConvTranspose", (4, 6, 2, 2), (1, 4, 5, 7), {"strides": [2, 2]}),
    ("ConvTranspose", (4, 3, 3, 3), (1, 4, 5, 7), {"strides": [2, 2], "pads": [1, 1, 0, 1], "output_padding": [1, 0],
                                                   "group": 2}),
    ("MatMul", (12, 7), (2, 5, 12), {}),
    ("Gemm", (7, 12), (5, 12), {"transB": 1}),
    ("Gemm", (12, 7), (12, 5), {"transA": 1}),
]


@pytest.mark.parametrize("op,wshape,xshape,attributes", LAYERS)
def test_the_hessian_features_times_the_weight_view_are_the_layers_output(op, wshape, xshape, attributes, monkeypatch):
    from qlinear.io import hessians

    rng = np.random.default_rng(SEED + 5)
    w = rng.standard_normal(wshape).astype(np.float32)
    x = rng.standard_normal(xshape).astype(np.float32)
    node, y = _run_layer(op, w, x, **attributes)
    layer = hessians.layer_of(node, "W", wshape)
    layer.limit = 10**9
    features = layer.features(x, np.random.default_rng(0))
    view = Layout.of(layer.op, wshape, layer.group).view(w)
    out = np.matmul(view, features.transpose(0, 2, 1))  # [G, R, positions]
    if op.startswith("Conv"):
        expected = np.moveaxis(y, 1, 0).reshape(layer.group, -1, y.shape[0] * int(np.prod(y.shape[2:])))
    else:
        expected = y.reshape(-1, y.shape[-1]).T[None]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_act_order_is_the_papers_form_on_the_columns_in_that_order():
    rng = np.random.default_rng(SEED + 6)
    w, h = _layer(rng, (8, 24, 1, 1), 400)
    layout = Layout.of("Conv", w.shape)
    groups = Groups.of_granularity(layout, granularity("axis", w.shape, 32))
    codec = _codec("int4")
    matrices = layout.view(w).astype(np.float64)
    params = Parameters(groups, codec)
    params.choose_all(matrices)
    _, values = gptq(matrices, h, groups, codec, params, act_order=True)
    order = np.argsort(-np.diag(h[0]), kind="stable")
    expected = reference_gptq(matrices[0][:, order], h[0][np.ix_(order, order)],
                              lambda j, current: codec.round(current[:, j], *params.column(0, order[j]))[1])
    np.testing.assert_array_equal(values[0][:, order], expected)


@pytest.mark.parametrize("op,wshape,xshape,attributes", LAYERS[:1] + LAYERS[5:6] + LAYERS[7:8])
def test_subsampled_features_are_positions_of_the_layer(op, wshape, xshape, attributes):
    """With fewer rows than positions, each feature vector is still one of the layer's positions."""
    from qlinear.io import hessians

    rng = np.random.default_rng(SEED + 7)
    w = rng.standard_normal(wshape).astype(np.float32)
    x = rng.standard_normal(xshape).astype(np.float32)
    node, y = _run_layer(op, w, x, **attributes)
    layer = hessians.layer_of(node, "W", wshape)
    layer.limit = 7
    features = layer.features(x, np.random.default_rng(0))
    assert features.shape[1] == 7
    out = np.matmul(Layout.of(layer.op, wshape, layer.group).view(w), features.transpose(0, 2, 1))[0]  # [R, 7]
    expected = (np.moveaxis(y, 1, 0).reshape(y.shape[1], -1) if op.startswith("Conv") else y.reshape(-1, y.shape[-1]).T)
    for column in out.T:
        assert np.abs(expected - column[:, None]).max(axis=0).min() < 1e-4


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


@pytest.mark.parametrize("direction,initial", [("forward", False), ("bidirectional", True), ("reverse", True)])
def test_recurrent_features_are_the_inputs_and_states_the_lstm_multiplies(direction, initial):
    """An LSTM rebuilt from the collected features (W's: the sequence; R's: the previous hidden states) gives
    onnxruntime's own Y, step by step."""
    from onnx import TensorProto, helper, numpy_helper

    from qlinear.io import hessians

    rng = np.random.default_rng(SEED + 8)
    steps, batch, size, hidden = 5, 2, 3, 4
    dirs = 2 if direction == "bidirectional" else 1
    w = (rng.standard_normal((dirs, 4 * hidden, size)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((dirs, 4 * hidden, hidden)) * 0.5).astype(np.float32)
    x = rng.standard_normal((steps, batch, size)).astype(np.float32)
    h0 = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    inputs = ["x", "W", "R", "", "", "h0"] if initial else ["x", "W", "R"]
    node = helper.make_node("LSTM", inputs, ["y"], name="lstm", hidden_size=hidden, direction=direction)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    feeds = {"x": x}
    if initial:
        graph_inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, h0.shape))
        feeds["h0"] = h0
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    w_layer, r_layer = hessians.layer_of(node, "W", w.shape), hessians.layer_of(node, "R", r.shape)
    w_layer.limit = r_layer.limit = 10**9
    xs = w_layer.features(x, np.random.default_rng(0))[0]  # [steps * batch, size]
    hs = r_layer.features(y, np.random.default_rng(0), h0 if initial else None)  # [dirs, steps * batch, hidden]
    for d in range(dirs):
        backward = direction == "reverse" or d == 1
        c = np.zeros((batch, hidden))
        order = range(steps - 1, -1, -1) if backward else range(steps)
        for t in order:
            # R's rows: the initial state, then Y one step back in the direction's order (Y[0..T-2] forward,
            # Y[1..T-1] backward), a batch of rows per step
            first = t == (steps - 1 if backward else 0)
            step = 0 if first else (t + 1 if backward else t)
            h_prev = hs[d][step * batch:(step + 1) * batch]
            gates = xs[t * batch:(t + 1) * batch] @ w[d].T + h_prev @ r[d].T  # i, o, f, c (ONNX's order)
            i, o, f, g = np.split(gates, 4, axis=1)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            np.testing.assert_allclose(_sigmoid(o) * np.tanh(c), y[t, d], rtol=1e-4, atol=1e-5)


def test_nvfp4_block_scales_are_chosen_before_the_rounding_and_mxfp4_as_it_reaches_them():
    rng = np.random.default_rng(SEED + 9)
    w, h = _layer(rng, (16, 64, 1, 1), 800)
    for dtype, block in (("nvfp4", 16), ("mxfp4", 32)):
        gran = granularity("block", w.shape, block)
        nearest = round_weight(w, gran, _codec(dtype, True), "rtn")
        rounded = round_weight(w, gran, _codec(dtype, True), "gptq", "Conv", 1, h)
        same = np.array_equal(np.asarray(rounded.scale).view(np.uint8), np.asarray(nearest.scale).view(np.uint8))
        assert same == (dtype == "nvfp4"), dtype


_BLOCKED = [("Gemm.T", (24, 64), Granularity("block", (24, 64), 1, 16)),  # blocks along the input features
            ("MatMul", (64, 24), Granularity("block", (64, 24), 0, 16))]  # MatMul B [K, N]: blocks along K
_OTHERS = [("Conv", (12, 8, 3, 3), Granularity("axis", (12, 8, 3, 3), 0)),  # per output channel
           ("MatMul", (64, 24), Granularity("axis", (64, 24), 0)),  # per input feature: a group spans every row
           ("Gemm.T", (24, 64), Granularity("tensor", (24, 64)))]


@pytest.mark.parametrize("dtype, op, shape, gran", [(d, *case) for d in ("int4", "nvfp4", "mxfp4") for case in _BLOCKED]
                         + [("int4", *case) for case in _OTHERS])  # the microscaling formats are blocked
def test_round_to_nearest_a_slice_of_rows_at_a_time_is_the_whole_weights(dtype, op, shape, gran):
    """`nearest_rows` (the report's round to nearest on large layers) gives round_weight's rtn values to the bit,
    a few rows a slice; where a group spans rows it declines."""
    from qlinear.rounding import nearest_rows

    w = np.random.default_rng(SEED + 9).normal(0, 1, shape).astype(np.float32)
    whole = round_weight(w, gran, _codec(dtype), "rtn")
    pieces = nearest_rows(w, gran, _codec(dtype), op, 1, elements=3 * 64)
    spans_rows = gran.kind == "tensor" or (gran.kind == "axis" and op == "MatMul")
    assert (pieces is None) == spans_rows
    if pieces is None:
        return
    layout = Layout.of(op, shape, 1)
    expected = layout.view(whole.values)
    got = list(pieces)
    assert len(got) > 1 and got[-1][1] == expected.shape[1]
    for start, stop, values in got:
        np.testing.assert_array_equal(values, expected[:, start:stop])


@pytest.mark.parametrize("kind", ["block", "tensor"])
def test_the_reports_output_sqnr_summed_over_slices_of_rows_is_the_whole_layers(kind, monkeypatch):
    """`weight_rounding._output_db` sums tr(E H Eᵀ) over slices of the rows (a few rows a slice here): the same
    figures as one einsum over the whole layer, for round to nearest (by slices where the groups allow, per
    tensor at once) and for the weight the method applied."""
    from types import SimpleNamespace

    from qlinear.io import weight_rounding
    from qlinear.io.plan import Stats

    rng = np.random.default_rng(SEED + 11)
    w = rng.normal(0, 1, (24, 64)).astype(np.float32)  # Gemm.T: [N, K]
    x = rng.normal(0, 1, (300, 64))
    h = (x.T @ x)[None]
    gran = granularity(kind, w.shape, 16)
    applied = w.astype(np.float64) + rng.normal(0, 0.05, w.shape)
    choice = SimpleNamespace(granularity=gran, symmetric=False, found=SimpleNamespace(type_name="float32",
                                                                                     dtype=np.float32))
    settings = SimpleNamespace(qtype=dtypes.get("int4"), mx=None, scale_rule=None, rounding="gptq")
    layer = SimpleNamespace(op="Gemm.T", group=1, sums=h)
    monkeypatch.setattr(weight_rounding, "OUTPUT_ERROR_ROWS", 5 * 64)
    got = weight_rounding._output_db(w, applied, choice, settings, layer)
    nearest = round_weight(w, gran, _codec("int4"), "rtn").values
    matrices = w.astype(np.float64)[None]
    signal = float(np.einsum("grk,gkl,grl->", matrices, h, matrices))
    want = {"rtn": Stats(signal=signal, noise=output_error(nearest[None], matrices, h)).sqnr_db,
            "gptq": Stats(signal=signal, noise=output_error(applied[None], matrices, h)).sqnr_db}
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-9), name
