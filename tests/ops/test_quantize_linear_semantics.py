"""One targeted test per row of docs/semantics.md (ONNX QuantizeLinear / DequantizeLinear): what
qlinear does, and what each peer does, run here. Expected values come from a peer run in the test or
from the spec's own tables (float4.md, the Cast tables), never from qlinear."""

import ml_dtypes
import numpy as np
import pytest

import qlinear

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

F32 = np.float32


def _model(op, inputs, out_type, opset, cast_to=None, **attrs):
    """One-node model; inputs are (name, array) and become initializers (so any dtype works).
    ``cast_to`` appends an exact Cast of the output (onnxruntime cannot return float8 arrays)."""
    names = [n for n, _ in inputs]
    nodes = [helper.make_node(op, names, ["y" if cast_to is None else "q"], **attrs)]
    if cast_to is not None:
        nodes.append(helper.make_node("Cast", ["q"], ["y"], to=cast_to))
        out_type = cast_to
    graph = helper.make_graph(
        nodes, "g", [], [helper.make_tensor_value_info("y", out_type, None)],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset < 23 else 11
    return model


def reference_run(op, inputs, out_type, opset, **attrs):
    return ReferenceEvaluator(_model(op, inputs, out_type, opset, **attrs)).run(None, {})[0]


def ort_run(op, inputs, out_type, opset, **attrs):
    model = _model(op, inputs, out_type, opset, **attrs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {})[0]


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


def test_division_precision_is_the_scale_type():
    # float32 x, float16 scale: the spec divides in float16. -1.149 / 0.09998 is -11.5 in float16 (a tie,
    # rounding to -12) but not in float32 (-11.49..., rounding to -11).
    x = np.array([-1.149], F32)
    s = np.float16(0.09998)
    ours = qlinear.quantize_linear(x, s, np.int8(0))
    spec_by_reference = reference_run(
        "QuantizeLinear", [("x", x), ("s", s), ("z", np.int8(0))], TensorProto.INT8, 23, precision=TensorProto.FLOAT16)
    reference_default = reference_run("QuantizeLinear", [("x", x), ("s", s), ("z", np.int8(0))], TensorProto.INT8, 23)
    onnxruntime = ort_run("QuantizeLinear", [("x", x), ("s", s), ("z", np.int8(0))], TensorProto.INT8, 23)
    np.testing.assert_array_equal(ours, spec_by_reference)
    np.testing.assert_array_equal(ours, onnxruntime)
    assert ours[0] == -12 and reference_default[0] == -11  # the reference divides in float32 (NumPy promotion)


def test_precision_attribute_overrides_the_scale_type():
    x = np.array([-1.149], F32)
    s = np.float16(0.09998)
    ours = qlinear.quantize_linear(x, s, np.int8(0), precision="float")
    peer = reference_run("QuantizeLinear", [("x", x), ("s", s), ("z", np.int8(0))], TensorProto.INT8, 23,
                         precision=TensorProto.FLOAT)
    np.testing.assert_array_equal(ours, peer)
    assert ours[0] == -11


@pytest.mark.parametrize("zp_type", [np.uint8, np.int8, np.int16, np.uint16])
def test_quotients_beyond_int32_and_infinities_saturate(zp_type):
    x = np.array([1e30, -1e30, np.inf, -np.inf, 3e9, -3e9, 2.5e9], F32)
    zp = zp_type(3)
    ours = qlinear.quantize_linear(x, F32(1), zp)
    peer = ort_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], helper.np_dtype_to_tensor_dtype(np.dtype(zp_type)), 21)
    np.testing.assert_array_equal(ours, peer)
    info = np.iinfo(zp_type)
    np.testing.assert_array_equal(ours, [info.max, info.min] * 3 + [info.max])
    reference = reference_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], helper.np_dtype_to_tensor_dtype(np.dtype(zp_type)), 21)
    assert reference[0] == info.min and reference[2] == info.min  # the reference's int32 cast overflows


@pytest.mark.parametrize("zp_type", [np.uint8, np.int8, np.int16, np.uint16])
def test_nan_gives_the_type_minimum_like_both_peers(zp_type):
    x = np.array([np.nan, -np.nan], F32)
    zp = zp_type(7)
    ours = qlinear.quantize_linear(x, F32(1), zp)
    for run in (ort_run, reference_run):
        np.testing.assert_array_equal(ours, run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], helper.np_dtype_to_tensor_dtype(np.dtype(zp_type)), 21))
    assert (ours == np.iinfo(zp_type).min).all()


def test_float8_non_saturating_follows_the_cast_tables():
    # E4M3FN: 464 is the tie between 448 and 480 (NaN) and rounds to even 448; 465..481 round to NaN.
    # E5M2: 61440 and above round past 57344 to Inf. The reference implements the tables.
    x = np.array([464, 465, 480, 481, 61440, 65000, 1e6, -1e6], F32)
    for name, tp in (("float8_e4m3fn", TensorProto.FLOAT8E4M3FN), ("float8_e5m2", TensorProto.FLOAT8E5M2)):
        zp = np.array(0, getattr(ml_dtypes, name))
        ours = qlinear.quantize_linear(x, F32(1), output_dtype=name, saturate=0)
        reference = reference_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], tp, 21, saturate=0)
        np.testing.assert_array_equal(bits(ours), bits(reference))
    e4 = qlinear.quantize_linear(x[:4], F32(1), output_dtype="float8e4m3fn", saturate=0).astype(F32)
    assert e4[0] == 448 and np.isnan(e4[1:]).all()
    e5 = qlinear.quantize_linear(x[4:], F32(1), output_dtype="float8e5m2", saturate=0).astype(F32)
    np.testing.assert_array_equal(e5, [np.inf, np.inf, np.inf, -np.inf])


def test_float8_saturating_clamps_to_the_largest_finite_value():
    x = np.array([np.inf, -np.inf, 1e9, np.nan], F32)
    for name, tp in (("float8_e4m3fn", 17), ("float8_e4m3fnuz", 18), ("float8_e5m2", 19), ("float8_e5m2fnuz", 20)):
        zp = np.array(0, getattr(ml_dtypes, name))
        ours = qlinear.quantize_linear(x, F32(1), zp)
        peer = ort_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], tp, 21, cast_to=TensorProto.FLOAT)
        np.testing.assert_array_equal(ours.astype(F32), peer)
        top = float(ml_dtypes.finfo(getattr(ml_dtypes, name)).max)
        np.testing.assert_array_equal(ours.astype(F32)[:3], [top, -top, top])


def test_float4_follows_the_float4_cast_table():
    # onnx docs/technical/float4.md: x > 6 -> 6, x < -6 -> -6, +Inf -> 6, -Inf -> -6, NaN -> 6.
    x = np.array([7, -7, np.inf, -np.inf, np.nan, 2.5, 5], F32)
    ours = qlinear.quantize_linear(x, F32(1), output_dtype="float4e2m1").astype(F32)
    np.testing.assert_array_equal(ours, [6, -6, 6, -6, 6, 2, 4])
    zp = np.array(0, ml_dtypes.float4_e2m1fn)
    reference = reference_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], TensorProto.FLOAT4E2M1, 23).astype(F32)
    np.testing.assert_array_equal(reference[:4], ours[:4])
    assert reference[4] != 6  # the reference (ml_dtypes) turns NaN into -0


def test_float6_saturates_like_float4():
    x = np.array([100, -100, np.inf, -np.inf, np.nan], F32)
    for name in ("float6e2m3", "float6e3m2"):
        top = qlinear.dtypes.get(name).max_finite
        ours = qlinear.quantize_linear(x, F32(1), output_dtype=name).astype(F32)
        np.testing.assert_array_equal(ours, [top, -top, top, -top, top])


def test_float8_zero_point_is_added_as_the_formula_says():
    # -0 / 1 + 0 = +0. The reference ignores a float8 zero point (and keeps -0).
    x = np.array([-0.0, 1.0], F32)
    zp = np.array(0, ml_dtypes.float8_e4m3fn)
    ours = qlinear.quantize_linear(x, F32(1), zp)
    reference = reference_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", zp)], TensorProto.FLOAT8E4M3FN, 21)
    assert bits(ours)[0] == 0x00 and bits(reference)[0] == 0x80
    assert bits(ours)[1] == bits(reference)[1]
    # Without a zero point nothing is added and -0 stays -0.
    assert bits(qlinear.quantize_linear(x, F32(1), output_dtype="float8e4m3fn"))[0] == 0x80


def test_dequantize_subtracts_a_float8_zero_point():
    x = np.array([1, 2, 448], F32).astype(ml_dtypes.float8_e4m3fn)
    zp = np.array(1, ml_dtypes.float8_e4m3fn)
    ours = qlinear.dequantize_linear(x, F32(2), zp)
    np.testing.assert_array_equal(ours, [0, 2, 894])
    with pytest.raises(ValueError):  # the reference refuses a non-zero float8 zero point
        reference_run("DequantizeLinear", [("x", x), ("s", F32(2)), ("z", zp)], TensorProto.FLOAT, 21)


def test_dequantize_float16_output_is_the_float32_product_rounded_like_both_peers():
    rng = np.random.default_rng(0)
    x = rng.integers(-32768, 32767, size=4096, dtype=np.int16)
    scale = np.float16(0.0123)
    ours = qlinear.dequantize_linear(x, scale, np.int16(5))
    for run in (ort_run, reference_run):
        np.testing.assert_array_equal(ours, run("DequantizeLinear", [("x", x), ("s", scale), ("z", np.int16(5))], TensorProto.FLOAT16, 21))


def test_blocked_needs_the_ceil_rule_the_reference_skips():
    # D=10, 3 scales, block_size 5: ceil(10/5) = 2 != 3. The reference accepts it; onnxruntime refuses.
    x = np.arange(20, dtype=F32).reshape(10, 2)
    s = np.ones((3, 2), F32)
    z = np.zeros((3, 2), np.uint8)
    with pytest.raises(ValueError, match=r"ceil\(10 / 5\) = 2, got 3"):
        qlinear.quantize_linear(x, s, z, axis=0, block_size=5)
    reference_run("QuantizeLinear", [("x", x), ("s", s), ("z", z)], TensorProto.UINT8, 21, axis=0, block_size=5)
    with pytest.raises(Exception):
        ort_run("QuantizeLinear", [("x", x), ("s", s), ("z", z)], TensorProto.UINT8, 21, axis=0, block_size=5)


@pytest.mark.parametrize("opset", [10, 13])
def test_dequantize_at_opsets_10_and_13(opset):
    x = np.array([[0, 3, 128, 255]], np.uint8)
    ours = qlinear.dequantize_linear(x, F32(0.5), np.uint8(128), opset=opset)
    np.testing.assert_array_equal(ours, ort_run("DequantizeLinear", [("x", x), ("s", F32(0.5)), ("z", np.uint8(128))], TensorProto.FLOAT, opset))
    with pytest.raises(Exception, match="No implementation|version"):
        reference_run("DequantizeLinear", [("x", x), ("s", F32(0.5)), ("z", np.uint8(128))], TensorProto.FLOAT, opset)


def test_one_element_scale_is_per_tensor_like_both_peers():
    x = np.arange(6, dtype=F32).reshape(2, 3)
    s, z = np.array([2], F32), np.array([1], np.uint8)
    ours = qlinear.quantize_linear(x, s, z)
    for run in (ort_run, reference_run):
        np.testing.assert_array_equal(ours, run("QuantizeLinear", [("x", x), ("s", s), ("z", z)], TensorProto.UINT8, 21))


def test_rank1_input_per_tensor_ignores_axis_per_axis_needs_a_valid_one():
    x = np.arange(4, dtype=F32)
    ours = qlinear.quantize_linear(x, F32(2), np.uint8(0))  # axis defaults to 1, out of range for rank 1
    np.testing.assert_array_equal(ours, ort_run("QuantizeLinear", [("x", x), ("s", F32(2)), ("z", np.uint8(0))], TensorProto.UINT8, 21))
    s, z = np.array([1, 2, 3, 4], F32), np.zeros(4, np.uint8)
    ours = qlinear.quantize_linear(x, s, z, axis=0)
    np.testing.assert_array_equal(ours, ort_run("QuantizeLinear", [("x", x), ("s", s), ("z", z)], TensorProto.UINT8, 21, axis=0))
    with pytest.raises(ValueError, match="axis=1 is out of range for x of rank 1"):
        qlinear.quantize_linear(x, s, z)
    with pytest.raises(Exception):
        ort_run("QuantizeLinear", [("x", x), ("s", s), ("z", z)], TensorProto.UINT8, 21)


def test_int32_scale_divides_exactly():
    # int32 / int32 rounds the exact quotient half to even: 5/2 -> 2, 7/2 -> 4, -5/2 -> -2.
    x = np.array([5, 7, -5, 2**31 - 1, 3], np.int32)
    ours = qlinear.quantize_linear(x, np.int32(2), np.int16(0), opset=21)
    reference = reference_run("QuantizeLinear", [("x", x), ("s", np.int32(2)), ("z", np.int16(0))], TensorProto.INT16, 21)
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(ours[[0, 1, 2, 4]], [2, 4, -2, 2])


def test_e8m0_scale_is_a_power_of_two():
    x = np.array([1.0, 3.0, -100.0], F32)
    s = np.array(0.5, ml_dtypes.float8_e8m0fnu)
    ours = qlinear.quantize_linear(x, s, np.int8(0))
    reference = reference_run("QuantizeLinear", [("x", x), ("s", s), ("z", np.int8(0))], TensorProto.INT8, 24)
    np.testing.assert_array_equal(ours, reference)
    back = qlinear.dequantize_linear(ours, s, np.int8(0), output_dtype="float")
    reference = reference_run("DequantizeLinear", [("x", ours), ("s", s), ("z", np.int8(0))], TensorProto.FLOAT, 24,
                              output_dtype=TensorProto.FLOAT)
    np.testing.assert_array_equal(back, reference)


def test_int32_dequantize_applies_a_zero_point_like_both_peers():
    x = np.array([1, 2, 2**31 - 1], np.int32)
    ours = qlinear.dequantize_linear(x, F32(2), np.int32(1))
    np.testing.assert_array_equal(ours, ort_run("DequantizeLinear", [("x", x), ("s", F32(2)), ("z", np.int32(1))], TensorProto.FLOAT, 21))


def test_python_values_take_the_operator_default_types():
    # Lists and Python floats are float32; a Python zero point needs output_dtype to know its type.
    ours = qlinear.quantize_linear([0.0, 1.0, 2.5], 0.5, 10, output_dtype="int8")
    expected = reference_run("QuantizeLinear", [("x", np.array([0, 1, 2.5], F32)), ("s", F32(0.5)), ("z", np.int8(10))], TensorProto.INT8, 21)
    np.testing.assert_array_equal(ours, expected)
    assert ours.dtype == np.int8


def test_saturate_does_not_change_integer_outputs():
    x = np.array([1e9, -3.5, 2.5], F32)
    np.testing.assert_array_equal(qlinear.quantize_linear(x, F32(1), np.int8(0), saturate=0),
                                  ort_run("QuantizeLinear", [("x", x), ("s", F32(1)), ("z", np.int8(0))], TensorProto.INT8, 21, saturate=0))


def _round_to_grid(value, dtype):
    """Round a Fraction to the nearest finite value of a small float type, ties to the even code (an
    oracle from first principles: the type's value table, ml_dtypes only decoding its codes)."""
    from fractions import Fraction

    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    candidates = sorted({(Fraction(v), c) for c, v in enumerate(codes) if np.isfinite(v) and v >= 0},
                        key=lambda vc: vc[0])
    magnitude = abs(value)
    best = min(candidates, key=lambda vc: (abs(vc[0] - magnitude), vc[1] & 1))
    return float(best[0]) * (1 if value >= 0 else -1)


@pytest.mark.parametrize("kernels", [True, False], ids=["kernel", "reference"])
def test_float64_quotients_are_rounded_once(kernels):
    # An int32 scale divides in float64. 4980737 / 4194305 is 2**-24.4 below the E4M3FN tie 1.1875:
    # rounding it to float32 first would land on the tie and give 1.25; rounded once it is 1.125.
    from fractions import Fraction

    from qlinear.kernels.quantize_linear import use_kernels

    x = np.array([4980737, -4980737], np.int32)
    with use_kernels(kernels):
        got = qlinear.quantize_linear(x, np.int32(4194305), output_dtype="float8e4m3fn").astype(np.float64)
    expected = [_round_to_grid(Fraction(int(v), 4194305), ml_dtypes.float8_e4m3fn) for v in x]
    np.testing.assert_array_equal(got, expected)
    assert got[0] == 1.125


@pytest.mark.parametrize("kernels", [True, False], ids=["kernel", "reference"])
def test_int32_x_is_rounded_once_to_bfloat16(kernels):
    # 2**24 + 2**16 + 1 is just above the bfloat16 tie between 2**24 and 2**24 + 2**17; through float32
    # (to nearest) it would become the tie itself and round down.
    from fractions import Fraction

    from qlinear.kernels.quantize_linear import use_kernels

    x = np.array([2**24 + 2**16 + 1], np.int32)
    with use_kernels(kernels):
        got = qlinear.quantize_linear(x, ml_dtypes.bfloat16(2**17), np.int16(0))
    assert got[0] == round(Fraction(int(x[0]), 2**17)) == 129
