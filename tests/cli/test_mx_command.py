"""`qlinear quantize --dtype mxfp4` and the other microscaling formats on the committed example model:
the DequantizeLinear graphs onnx.checker accepts, run by onnx's reference evaluator and by `qlinear run`
to the same bits, with weights equal to `qlinear.mx`'s; the --dtype list that compares formats; and
the errors of the options an MX format does not take.

onnxruntime 1.32 has no CPU kernel for DequantizeLinear with float8e8m0 scales or float4 input, so the
onnx reference evaluator is the oracle of every graph here."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx

from ._helpers import EXAMPLE, REPO, in_process

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

FORMATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8", "nvfp4"]
# The codes' TensorProto type and the opset each format's DequantizeLinear needs (spelled out, not qlinear's table).
CODES = {"mxfp8_e4m3": (onnx.TensorProto.FLOAT8E4M3FN, 24), "mxfp8_e5m2": (onnx.TensorProto.FLOAT8E5M2, 24),
         "mxfp6_e3m2": (28, 28), "mxfp6_e2m3": (27, 28),  # FLOAT6E3M2, FLOAT6E2M3
         "mxfp4": (onnx.TensorProto.FLOAT4E2M1, 24), "mxint8": (onnx.TensorProto.INT8, 24),
         "nvfp4": (onnx.TensorProto.FLOAT4E2M1, 23)}
FLOAT8E8M0 = 24
WEIGHTS = ["fc1.weight", "fc2.weight", "fc3.weight"]
DATA = REPO / "examples" / "digits_mlp.eval.npz"
ACCURACY_FLOOR = 0.90  # a loose sanity floor: float is 97.56%; every format measured lands within 1 point


def _quantize(tmp_path, dtype, *extra, source=EXAMPLE):
    output = tmp_path / f"{source.stem}-{dtype}.onnx"
    result = in_process("quantize", source, "--dtype", dtype, "-o", output, "--json", *extra)
    assert result.returncode == 0, result.stderr
    return output, json.loads(result.stdout)


def _attributes(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _dequantized(model, names):
    """The DequantizeLinear nodes alone (with the initializers they read), run by onnx's reference."""
    nodes = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    graph = helper.make_graph(nodes, "dq", [], [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                                                for n in names], list(model.graph.initializer))
    probe = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return dict(zip(names, ReferenceEvaluator(probe).run(None, {})))


@pytest.fixture(scope="module")
def float_weights():
    model = onnx.load(str(EXAMPLE))
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


@pytest.mark.parametrize("dtype", FORMATS)
def test_every_format_gives_a_model_the_references_run_alike(tmp_path, dtype, float_weights):
    output, report = _quantize(tmp_path, dtype)
    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)  # (a)
    code_type, opset = CODES[dtype]
    assert _opset(model) == opset and report["model"]["opset_after"] == opset
    assert report["model"]["checker"] == "passed"

    initializers = {i.name: i for i in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    final = {n.output[0]: n for n in nodes if n.output[0] in WEIGHTS}
    assert sorted(final) == WEIGHTS and len(nodes) == (6 if dtype == "nvfp4" else 3)
    block = 16 if dtype == "nvfp4" else 32
    for name, node in final.items():
        # MatMul(pixels, W[K, N]): the blocks run along K, axis 0; the output is the weight's float type.
        assert _attributes(node) == {"axis": 0, "block_size": block, "output_dtype": onnx.TensorProto.FLOAT}
        assert initializers[node.input[0]].data_type == code_type
        if dtype == "nvfp4":
            first = next(n for n in nodes if n.output[0] == node.input[1])
            assert _attributes(first) == {}
            assert initializers[first.input[0]].data_type == onnx.TensorProto.FLOAT8E4M3FN
            assert initializers[first.input[1]].data_type == onnx.TensorProto.FLOAT
            assert list(initializers[first.input[1]].dims) == []
        else:
            assert initializers[node.input[1]].data_type == FLOAT8E8M0

    # (d) the weights inside the graph are qlinear.mx's, bit for bit
    inside = _dequantized(model, WEIGHTS)
    for name in WEIGHTS:
        quantized = mx.quantize(float_weights[name], dtype, axis=0)
        expected = mx.dequantize(*quantized[:2], axis=0, global_scale=quantized[2] if dtype == "nvfp4" else None)
        assert inside[name].dtype == np.float32
        np.testing.assert_array_equal(inside[name].view(np.uint32), expected.view(np.uint32))

    # (b), (c): onnx's reference and `qlinear run` on the labelled data, bit for bit
    data = np.load(DATA)
    reference = ReferenceEvaluator(model).run(None, {"pixels": data["pixels"]})[0]
    np.save(tmp_path / "pixels.npy", data["pixels"])
    ran = in_process("run", output, "--input", f"pixels={tmp_path / 'pixels.npy'}", "-o", tmp_path / "out.npz")
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "out.npz") as out:
        ours = out[model.graph.output[0].name]
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))

    # (e) the task figure the report measured is the reference's
    accuracy = report["model"]["accuracy"]
    assert accuracy["samples"] == 450 and accuracy["runtime"].startswith("qlinear run")
    assert accuracy["quantized"] == pytest.approx(np.mean(reference.argmax(axis=1) == data["labels"]))
    assert accuracy["quantized"] >= ACCURACY_FLOOR, accuracy
    row = next(r for r in report["tensors"] if r["name"] == "fc2.weight")
    assert row["to"] == dtype and row["granularity"] == f"blocked (axis 0, {block})"


@pytest.mark.parametrize("rule", ["floor", "ceil", "even"])
def test_the_scale_rule_chooses_the_scales(tmp_path, rule, float_weights):
    output, report = _quantize(tmp_path, "mxfp8_e4m3", "--scale-rule", rule, "--no-eval")
    model = onnx.load(str(output))
    inside = _dequantized(model, ["fc2.weight"])["fc2.weight"]
    codes, scales = mx.quantize(float_weights["fc2.weight"], "mxfp8_e4m3", axis=0, scale_rule=rule)
    np.testing.assert_array_equal(inside, mx.dequantize(codes, scales, axis=0))
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    stored = initializers["fc2.weight_scale"]
    np.testing.assert_array_equal(np.asarray(stored).view(np.uint8), scales.view(np.uint8))


def test_nvfp4_scale_rule_modelopt_writes_model_optimizers_codes(tmp_path, float_weights):
    """--dtype nvfp4 --scale-rule modelopt: the ONNX model holds qlinear.mx's scale_rule="modelopt" codes and
    scales (tests/mx/test_mx_modelopt.py: those are Model Optimizer's, bit for bit)."""
    # bfloat16-valued weights: many quotients x / d round onto a midpoint, where the two rules differ
    w = np.random.default_rng(4).standard_normal((128, 64)).astype(ml_dtypes.bfloat16).astype(np.float32)
    source = _small_model(tmp_path / "small.onnx", w)
    output, _ = _quantize(tmp_path, "nvfp4", "--scale-rule", "modelopt", "--no-eval", source=source)
    model = onnx.load(str(output))
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    codes, scales, g = mx.quantize(w, "nvfp4", axis=0, scale_rule="modelopt")
    stored = [a for a in initializers.values() if a.dtype == codes.dtype and a.shape == codes.shape]
    assert len(stored) == 1 and np.array_equal(stored[0].view(np.uint8), codes.view(np.uint8))
    exact = mx.quantize(w, "nvfp4", axis=0)
    assert np.count_nonzero(codes.view(np.uint8) != exact[0].view(np.uint8)) > 0  # the rules differ here (9 codes)


def test_a_scale_rule_in_a_list_goes_to_the_formats_it_is_a_rule_of(tmp_path, float_weights):
    result = in_process("quantize", EXAMPLE, "--dtype", "int4,mxfp4,nvfp4", "--scale-rule", "modelopt", "--json")
    assert result.returncode == 0, result.stderr
    row = next(r for r in json.loads(result.stdout)["tensors"] if r["name"] == "fc2.weight")
    w = float_weights["fc2.weight"].astype(np.float64)
    codes, scales, g = mx.quantize(float_weights["fc2.weight"], "nvfp4", axis=0, scale_rule="modelopt")
    noise = np.sum((w - mx.dequantize(codes, scales, axis=0, global_scale=g)) ** 2)
    assert row["formats"]["nvfp4"]["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(w * w) / noise), rel=1e-12)


def _small_model(path, weight, opset=13):
    """x @ W with W an initializer of W's own float type."""
    element = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float16): onnx.TensorProto.FLOAT16}
    kind = element[weight.dtype]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "small",
                              [helper.make_tensor_value_info("x", kind, [1, weight.shape[0]])],
                              [helper.make_tensor_value_info("y", kind, [1, weight.shape[1]])],
                              [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


@pytest.mark.parametrize("dtype", ["mxfp4", "nvfp4", "mxint8"])
def test_float16_weights_dequantize_to_float16(tmp_path, dtype):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((40, 24)).astype(np.float16)  # a partial block of 8 after 32 along K
    source = _small_model(tmp_path / "half.onnx", weight)
    output, _ = _quantize(tmp_path, dtype, source=source)
    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)
    node = next(n for n in model.graph.node if n.output[0] == "w")
    assert _attributes(node)["output_dtype"] == onnx.TensorProto.FLOAT16
    inside = _dequantized(model, ["w"])["w"]
    quantized = mx.quantize(weight, dtype, axis=0)
    expected = mx.dequantize(*quantized[:2], axis=0, global_scale=quantized[2] if dtype == "nvfp4" else None)
    assert inside.dtype == np.float16
    np.testing.assert_array_equal(inside, expected.astype(np.float16))
    x = rng.standard_normal((1, 40)).astype(np.float16)
    assert ReferenceEvaluator(model).run(None, {"x": x})[0].shape == (1, 24)


def test_mxint8_folds_its_implicit_scale_and_keeps_zero_and_tiny_blocks(tmp_path):
    """ONNX has no implicit 2^-6: it goes into the e8m0 scale (exponent - 6). A block whose scale would
    fall below 2^-127 that way (all zeros: scale 2^-127 by the rule; weights below 2^-121) is quantized
    again at 2^-121, exact for zeros, rather than refused."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((64, 8)).astype(np.float32)
    weight[:32, 0] = 0.0
    weight[32:, 1] *= np.float32(2.0**-124)
    source = _small_model(tmp_path / "zeros.onnx", weight)
    output, report = _quantize(tmp_path, "mxint8", source=source)
    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)
    inside = _dequantized(model, ["w"])["w"]
    codes, scales = mx.quantize(weight, "mxint8", axis=0)
    expected = mx.dequantize(codes, scales, axis=0)
    np.testing.assert_array_equal(inside[:, 2:], expected[:, 2:])  # ordinary blocks: exactly qlinear.mx's
    np.testing.assert_array_equal(inside[:32, 0], 0.0)
    tiny = weight[32:, 1].astype(np.float64)
    assert np.abs(inside[32:, 1] - tiny).max() <= 2.0**-128  # half a step of the 2^-127 grid
    stored = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w_scale"))
    exponents = np.asarray(stored).view(np.uint8).astype(int) - 127
    assert exponents.min() == -127 and exponents[0, 0] == -127 and exponents[1, 1] == -127
    assert report["model"]["checker"] == "passed"


def test_a_list_compares_formats_and_writes_nothing(tmp_path):
    before = set(tmp_path.iterdir())
    result = in_process("quantize", EXAMPLE, "--dtype", "int4,mxfp4,nvfp4", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["command"] == "compare" and report["formats"] == ["int4", "mxfp4", "nvfp4"]
    assert report["output"] is None and set(tmp_path.iterdir()) == before
    assert not list(EXAMPLE.parent.glob("digits_mlp.*.onnx"))
    row = next(r for r in report["tensors"] if r["name"] == "fc2.weight")
    assert row["bytes_before"] == 256 * 128 * 4
    # 4-bit codes plus a scale per block: int4 float32 scales and int4 zero points per 32, mxfp4 one byte
    # per 32, nvfp4 one byte per 16 and the float32 tensor scale
    assert row["formats"]["int4"]["bytes_after"] == 256 * 128 // 2 + 8 * 128 * 4 + 8 * 128 // 2
    assert row["formats"]["mxfp4"]["bytes_after"] == 256 * 128 // 2 + 8 * 128
    assert row["formats"]["nvfp4"]["bytes_after"] == 256 * 128 // 2 + 16 * 128 + 4
    for name in ("int4", "mxfp4", "nvfp4"):
        entry = row["formats"][name]
        assert entry["quantized"] and entry["to"] == name and 10 < entry["sqnr_db"] < 40
        totals = report["totals"][name]
        assert totals["model"]["checker"] == "passed" and totals["model"]["accuracy"]["quantized"] >= ACCURACY_FLOOR
    bias = next(r for r in report["tensors"] if r["name"] == "fc2.bias")
    assert not any(entry["quantized"] for entry in bias["formats"].values())
    # the figures are those a single --dtype reports
    single = json.loads(in_process("quantize", EXAMPLE, "--dtype", "mxfp4", "-o", tmp_path / "m.onnx", "--json",
                                   "--no-eval").stdout)
    single_row = next(r for r in single["tensors"] if r["name"] == "fc2.weight")
    assert single_row["sqnr_db"] == row["formats"]["mxfp4"]["sqnr_db"]

    table = in_process("quantize", EXAMPLE, "--dtype", "int4,mxfp4", "--no-eval")
    assert table.returncode == 0, table.stderr
    assert "mxfp4 SQNR dB" in table.stdout and "nothing written" in table.stdout
    assert "mxfp4: 28.37 kB (7.17x smaller)" in table.stdout


def test_a_list_compares_formats_on_a_tensor_file(tmp_path, float_weights):
    source = tmp_path / "weights.npz"
    np.savez(source, w=float_weights["fc2.weight"].T.copy(), b=float_weights["fc2.bias"])
    result = in_process("quantize", source, "--dtype", "int8,mxint8,mxfp4,nvfp4", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.npz"]
    row = next(r for r in report["tensors"] if r["name"] == "w")
    assert row["formats"]["mxfp4"]["granularity"] == "blocked (axis 1, 32)"  # the last axis, as gpt-oss blocks
    assert row["formats"]["mxint8"]["sqnr_db"] > row["formats"]["mxfp4"]["sqnr_db"]
    # the SQNR is that of qlinear.mx's round trip
    w = float_weights["fc2.weight"].T.astype(np.float64)
    codes, scales = mx.quantize(float_weights["fc2.weight"].T.copy(), "mxfp4", axis=1)
    noise = np.sum((w - mx.dequantize(codes, scales, axis=1)) ** 2)
    assert row["formats"]["mxfp4"]["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(w * w) / noise), rel=1e-12)
    assert "model" not in report["totals"]["mxfp4"]


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int4", "--scale-rule", "ceil"], "--scale-rule applies to the MX formats"),
    (["--dtype", "nvfp4", "--scale-rule", "ceil"], "nvfp4's block scales are float8e4m3fn"),
    (["--dtype", "mxfp4", "--scale-rule", "modelopt"], "--scale-rule modelopt is NVFP4's"),
    (["--dtype", "int4,mxfp4", "--scale-rule", "modelopt"], "--scale-rule modelopt is NVFP4's"),
    (["--dtype", "mxfp4", "--granularity", "axis"], "blocked by definition"),
    (["--dtype", "mxfp4", "--block-size", "16"], "its blocks are 32 elements"),
    (["--dtype", "nvfp4", "--block-size", "32"], "its blocks are 16 elements"),
    (["--dtype", "mxint8", "--asymmetric"], "--asymmetric does not apply"),
    (["--dtype", "mxfp4", "--calibrate", "x.npz"], "--calibrate does not apply to --dtype mxfp4"),
    (["--dtype", "int4,mxfp4", "-o", "out.onnx"], "a list compares the types and writes nothing"),
    (["--dtype", "int4,mxfp4,int4"], "names each type or format once"),
    (["--dtype", "int4,mxfp9"], "is not a type name qlinear knows"),
    (["--dtype", "int4", "--scale-rule", "round"], "invalid choice"),
])
def test_options_an_mx_format_does_not_take_are_one_line_errors(tmp_path, args, message):
    result = in_process("quantize", EXAMPLE, *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("suffix, dtype", [(".npz", "mxfp4"), (".npy", "mxint8"), (".safetensors", "mxfp8_e4m3")])
def test_an_mx_format_without_a_file_layout_is_a_one_line_error(tmp_path, suffix, dtype, float_weights):
    """Tensor files have no MX layout but safetensors' MXFP4 (gpt-oss's, tests/io/test_mx_checkpoint.py) and
    NVFP4 (Model Optimizer's, tests/io/test_nvfp4_checkpoint.py)."""
    source = tmp_path / f"weights{suffix}"
    if suffix == ".npz":
        np.savez(source, w=float_weights["fc2.weight"])
    elif suffix == ".npy":
        np.save(source, float_weights["fc2.weight"])
    else:
        from safetensors.numpy import save_file

        save_file({"w": float_weights["fc2.weight"]}, str(source))
    result = in_process("quantize", source, "--dtype", dtype)
    assert result.returncode == 2
    assert "the MX formats are written into ONNX models only" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]
