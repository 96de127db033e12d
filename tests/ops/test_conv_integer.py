"""conv_integer (ONNX ConvInteger-10): differential tests against the int64 NumPy reference, the onnx
reference evaluator and onnxruntime; int32 overflow; argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from qlinear.ops._quant_args import AccumulatorOverflowError
from qlinear.ops.qlinear_conv import conv_geometry, conv_integer
from qlinear.reference.conv import conv_accumulate

from ._conv_family_cases import conv_cases
from ._conv_family_peers import (
    make_model, onnxruntime_conv_integer_exact_for_activations, onnxruntime_exact_for_weights, run_onnxruntime,
    run_reference,
)
from suite import examples

U8, S8 = np.dtype(np.uint8), np.dtype(np.int8)


def ours(case):
    return conv_integer(case.x, case.w, case.x_zero_point, case.w_zero_point, **case.attributes)


def model_of(case, w_zero_point=None):
    w_zero_point = case.w_zero_point if w_zero_point is None else w_zero_point
    inputs = [("x", case.x), ("w", case.w), ("x_zero_point", case.x_zero_point), ("w_zero_point", w_zero_point)]
    return make_model("ConvInteger", inputs, [np.int32], 10, **case.attributes)


@settings(max_examples=examples(100))
@given(case=conv_cases(bias=(False,)))
def test_matches_int64_reference_transcription(case):
    g = conv_geometry("t", case.x.shape, case.w.shape, **case.attributes)
    expected = conv_accumulate(case.x, case.x_zero_point, case.w, case.w_zero_point, None, group=g.group,
                               strides=g.strides, dilations=g.dilations, pads_begin=g.pads_begin, pads_end=g.pads_end)
    np.testing.assert_array_equal(ours(case), expected.astype(np.int32), strict=True)


@settings(max_examples=examples(150))
@given(case=conv_cases(bias=(False,)))
def test_matches_onnx_reference_evaluator(case):
    """The reference's per-channel w_zero_point is only right for 2-D convolutions (documented deviation);
    other ranks run once per output channel with that channel's zero point as a scalar."""
    got = ours(case)
    if case.w_zero_point.ndim == 0 or case.n_spatial == 2:
        expected = run_reference(model_of(case), case.x)[0]
    else:
        expected = np.stack(
            [run_reference(model_of(case, zp), case.x)[0][:, m] for m, zp in enumerate(case.w_zero_point)], axis=1
        )
    np.testing.assert_array_equal(got, expected, strict=True)


def test_onnx_reference_per_channel_zero_point_fails_outside_2d():
    """Documented deviation: the reference reshapes a per-channel w_zero_point to (M, 1, 1, 1)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 2, 7), dtype=np.uint8)
    w = rng.integers(-128, 128, (3, 2, 2), dtype=np.int8)
    w_zp = np.array([0, 1, 2], np.int8)
    model = make_model("ConvInteger", [("x", x), ("w", w), ("x_zero_point", np.asarray(np.uint8(3))), ("w_zero_point", w_zp)], [np.int32], 10)
    with pytest.raises(ValueError, match="broadcast"):
        run_reference(model, x)
    assert conv_integer(x, w, np.uint8(3), w_zp).shape == (1, 3, 6)


@settings(max_examples=examples(150))
@given(case=conv_cases(bias=(False,), per_channel=(False,)))
def test_matches_onnxruntime(case):
    """onnxruntime implements every type pair but only a per-tensor w_zero_point, and no SAME with dilations."""
    if case.attributes["auto_pad"].startswith("SAME") and case.attributes["dilations"]:
        case.attributes["dilations"] = None
    if not onnxruntime_exact_for_weights(case.w, case.x.dtype):
        return
    if not onnxruntime_conv_integer_exact_for_activations(case.x, case.x_zero_point, case.w):
        case.x, case.x_zero_point = case.x >> 1, np.asarray(case.x_zero_point >> 1)  # int8 into [-64, 63]
    np.testing.assert_array_equal(ours(case), run_onnxruntime(model_of(case), case.x)[0], strict=True)


def test_onnxruntime_refuses_per_channel_weight_zero_point():
    x = np.zeros((1, 1, 3, 3), np.uint8)
    w = np.zeros((2, 1, 2, 2), np.uint8)
    model = make_model("ConvInteger", [("x", x), ("w", w), ("x_zero_point", np.asarray(np.uint8(0))),
                                       ("w_zero_point", np.array([1, 2], np.uint8))], [np.int32], 10)
    with pytest.raises(Exception, match="Non per-tensor quantization is not supported"):
        run_onnxruntime(model, x)


def test_largest_exact_sum_and_overflow():
    """K = 33025 products of (255 - 0) * (0 - 255) sum to -2147450625, inside int32 (onnxruntime agrees);
    one more channel leaves int32 and is an error, not a wraparound."""
    k = 33025
    x = np.full((1, k, 1, 1), 255, np.uint8)
    w = np.zeros((1, k, 1, 1), np.uint8)
    w_zp = np.uint8(255)
    model = make_model("ConvInteger", [("x", x), ("w", w), ("x_zero_point", np.asarray(np.uint8(0))), ("w_zero_point", np.asarray(w_zp))], [np.int32], 10)
    expected = run_onnxruntime(model, x)[0]
    got = conv_integer(x, w, np.uint8(0), w_zp)
    np.testing.assert_array_equal(got, expected, strict=True)
    assert got.item() == -255 * 255 * k
    x1, w1 = np.full((1, k + 1, 1, 1), 255, np.uint8), np.zeros((1, k + 1, 1, 1), np.uint8)
    with pytest.raises(AccumulatorOverflowError, match=r"conv_integer: the exact accumulator .* leaves the int32 range: -2147515650"):
        conv_integer(x1, w1, np.uint8(0), w_zp)


def test_zero_points_default_to_zero():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 3, 5), dtype=np.int8)
    w = rng.integers(0, 256, (4, 3, 2), dtype=np.uint8)
    if not onnxruntime_conv_integer_exact_for_activations(x, np.int8(0), w):
        x >>= 1  # into [-64, 63], where onnxruntime is exact without VNNI too
    model = make_model("ConvInteger", [("x", x), ("w", w)], [np.int32], 10)
    np.testing.assert_array_equal(conv_integer(x, w), run_reference(model, x)[0], strict=True)
    np.testing.assert_array_equal(conv_integer(x, w), run_onnxruntime(model, x)[0], strict=True)


ERRORS = [
    ({"x": np.zeros((1, 2, 5, 5), np.int32)}, TypeError, "conv_integer: x must have dtype uint8 or int8, got int32"),
    ({"x_zero_point": np.int8(0)}, TypeError, r"conv_integer: x_zero_point must have the dtype of x \(uint8\), got int8"),
    ({"x_zero_point": np.zeros(2, np.uint8)}, ValueError, r"conv_integer: x_zero_point must be a scalar or a 1-element 1-D tensor"),
    ({"w_zero_point": np.zeros(3, np.uint8)}, ValueError, r"conv_integer: w_zero_point must be a scalar \(per tensor\) or a 1-D tensor of M=4"),
    ({"w_zero_point": -1}, ValueError, r"conv_integer: w_zero_point must be in \[0, 255\]"),
    ({"group": 3}, ValueError, r"conv_integer: x.shape\[1\] must equal w.shape\[1\] \* group"),
    ({"pads": [0, 0, 0]}, ValueError, r"conv_integer: pads must have 4 values"),
    ({"auto_pad": "same_upper"}, ValueError, r"conv_integer: auto_pad must be one of"),
]


@pytest.mark.parametrize("change,error,message", ERRORS, ids=[m[:60] for _, _, m in ERRORS])
def test_argument_errors(change, error, message):
    kwargs = dict(x=np.zeros((1, 2, 5, 5), np.uint8), w=np.zeros((4, 2, 3, 3), np.uint8), x_zero_point=np.uint8(1),
                  w_zero_point=np.zeros(4, np.uint8))
    with pytest.raises(error, match=message):
        conv_integer(**{**kwargs, **change})
