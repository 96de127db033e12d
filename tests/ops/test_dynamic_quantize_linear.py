"""dynamic_quantize_linear (ONNX DynamicQuantizeLinear-11): differential tests against the onnx reference
evaluator and onnxruntime; the all-zero input; rejected inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qlinear.ops.dynamic import dynamic_quantize_linear
from qlinear.reference.dynamic_quantize_linear import dynamic_quantize_linear as reference_dynamic_quantize_linear

from ._conv_family_peers import make_model, run_onnxruntime, run_reference
from suite import examples

f32 = np.float32
OUT_TYPES = [np.uint8, np.float32, np.uint8]


def model_of(x):
    return make_model("DynamicQuantizeLinear", [("x", x)], OUT_TYPES, 11)


def assert_outputs_equal(got, expected):
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e).reshape(np.shape(g)), strict=True)


def range_overflows(x):
    with np.errstate(over="ignore"):
        return not np.isfinite(np.maximum(f32(0), x.max()) - np.minimum(f32(0), x.min()))


@st.composite
def float_inputs(draw):
    """Any finite float32 values (subnormals and extremes included), or scaled normal data."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    if draw(st.booleans()):
        return draw(hnp.arrays(np.float32, shape, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = 10.0 ** rng.uniform(-30, 30)
    offset = draw(st.sampled_from([0.0, 1.0, -1.0, 3.0, -3.0]))
    return ((rng.standard_normal(shape) + offset) * magnitude).astype(np.float32)


@settings(max_examples=examples(300))
@given(x=float_inputs())
def test_matches_reference_transcription_and_onnx_reference_evaluator(x):
    if range_overflows(x):
        with pytest.raises(ValueError, match="dynamic_quantize_linear: the range max"):
            dynamic_quantize_linear(x)
        return
    got = dynamic_quantize_linear(x)
    assert got[0].dtype == np.uint8 and got[0].shape == x.shape
    assert got[1].shape == () and got[1].dtype == np.float32 and got[2].shape == () and got[2].dtype == np.uint8
    assert_outputs_equal(got, reference_dynamic_quantize_linear(x))
    assert_outputs_equal(got, run_reference(model_of(x), x))


@settings(max_examples=examples(200))
@given(x=float_inputs())
def test_matches_onnxruntime(x):
    if range_overflows(x) or not np.any(x):
        return  # all-zero input: see test_all_zero_input
    assert_outputs_equal(dynamic_quantize_linear(x), run_onnxruntime(model_of(x), x))


def test_ties_round_half_to_even():
    """x / y_scale lands exactly on .5 values: y_scale = 255/255 = 1 for a range of 255."""
    x_with_range = np.array([0.5, 1.5, 2.5, 3.5, 254.5, -0.0, 0.0, 255.0], f32)
    got = dynamic_quantize_linear(x_with_range)
    assert got[1] == f32(1.0)
    assert_outputs_equal(got, run_reference(model_of(x_with_range), x_with_range))
    assert_outputs_equal(got, run_onnxruntime(model_of(x_with_range), x_with_range))
    assert got[0][:5].tolist() == [0, 2, 2, 4, 254]


def test_all_zero_input():
    """The spec's formula divides 0 by 0. qlinear follows the onnx reference (scale 1/255); onnxruntime
    returns scale 1.0. y and the zero point are 0 everywhere."""
    x = np.zeros((2, 3), f32)
    got = dynamic_quantize_linear(x)
    reference = run_reference(model_of(x), x)
    onnxruntime = run_onnxruntime(model_of(x), x)
    assert_outputs_equal(got, reference)
    assert got[1] == f32(1) / f32(255)
    assert np.asarray(onnxruntime[1]).item() == 1.0
    assert_outputs_equal((got[0], got[2]), (onnxruntime[0], onnxruntime[2]))


@pytest.mark.parametrize("values", [[1.15e-43], [-1.15e-43], [1.7e-43, -1e-45, 0.0], [127 * 2.0**-149, 0.0, -0.0],
                                    [-(126 * 2.0**-149), 2.0**-149]])
def test_scale_underflowing_to_zero_matches_both_peers(values):
    """A non-zero range of at most 127 * 2**-149: (max - min) / 255 rounds to 0, and the spec's zero point is
    qmin - min / 0 (+Inf, or 0/0). Both peers give scale 0, zero point 255, y 255 where x > 0, else 0; so does
    qlinear (docs/semantics.md, DynamicQuantizeLinear row 28). One step wider, the scale is 2**-149."""
    x = np.array(values, f32)
    got = dynamic_quantize_linear(x)
    assert got[1] == 0
    assert_outputs_equal(got, run_reference(model_of(x), x))
    assert_outputs_equal(got, run_onnxruntime(model_of(x), x))
    wider = np.array([128 * 2.0**-149, 0.0], f32)
    got = dynamic_quantize_linear(wider)
    assert got[1] == f32(2.0**-149)
    assert_outputs_equal(got, run_reference(model_of(wider), wider))
    assert_outputs_equal(got, run_onnxruntime(model_of(wider), wider))


def test_empty_input():
    y, scale, zero_point = dynamic_quantize_linear(np.zeros((0, 3), f32))
    assert y.shape == (0, 3) and y.dtype == np.uint8
    assert scale == f32(1) / f32(255) and zero_point == 0


@pytest.mark.parametrize(
    "x,error,message",
    [
        (np.array([1.0, np.nan], f32), ValueError, r"dynamic_quantize_linear: x must be finite \(no NaN or infinity\)"),
        (np.array([1.0, np.inf], f32), ValueError, r"dynamic_quantize_linear: x must be finite"),
        (np.array([-3e38, 3e38], f32), ValueError, r"dynamic_quantize_linear: the range max\(x, 0\) - min\(x, 0\) overflows float32"),
        (np.array([1.0, 2.0]), TypeError, r"dynamic_quantize_linear: x must have dtype float32, got float64"),
        (np.array([1.0, 2.0], np.float16), TypeError, r"dynamic_quantize_linear: x must have dtype float32, got float16"),
        ([1.0, 2.0], TypeError, r"dynamic_quantize_linear: x must be a numpy array of float32, got list"),
    ],
)
def test_rejected_inputs(x, error, message):
    with pytest.raises(error, match=message):
        dynamic_quantize_linear(x)
