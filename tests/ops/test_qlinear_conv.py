"""qlinear_conv (ONNX QLinearConv-10): differential tests against the int64 NumPy reference, the onnx
reference evaluator and onnxruntime; geometry; worst cases; int32 overflow; argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.ops._quant_args import AccumulatorOverflowError
from qlinear.ops.qlinear_conv import conv_geometry, qlinear_conv
from qlinear.reference.conv import conv_accumulate
from qlinear.reference.requantize import requantize, requantize_multiplier

from ._conv_family_cases import conv_cases
from ._conv_family_peers import cpu_has_vnni, make_model, onnxruntime_exact_for_weights, run_onnxruntime, run_reference
from suite import examples

f32 = np.float32
U8, S8 = np.dtype(np.uint8), np.dtype(np.int8)


def ours(case, mode="float64"):
    return qlinear_conv(*case.qlinear_args(), **case.attributes, requantize=mode)


def model_of(case):
    return make_model("QLinearConv", case.onnx_inputs(), [case.y_zero_point.dtype], 10, **case.attributes)


# ---------------------------------------------------------------- against the int64 spec transcription


@settings(max_examples=examples(150))
@given(case=conv_cases())
def test_matches_int64_reference_transcription(case):
    """The public function (whatever kernel it dispatches to) equals the readable int64 reference."""
    geometry = conv_geometry("t", case.x.shape, case.w.shape, **{k: v for k, v in case.attributes.items()})
    acc = conv_accumulate(
        case.x, case.x_zero_point, case.w, case.w_zero_point, case.B, group=geometry.group,
        strides=geometry.strides, dilations=geometry.dilations, pads_begin=geometry.pads_begin,
        pads_end=geometry.pads_end,
    )
    assert acc.shape == geometry.output_shape
    w_scale = case.w_scale.reshape((1, -1) + (1,) * case.n_spatial) if case.per_channel_scale else case.w_scale.reshape(())
    for mode in ("float64", "float32"):
        multiplier = requantize_multiplier(case.x_scale.reshape(()), w_scale, case.y_scale.reshape(()), mode)
        expected = requantize(acc, multiplier, case.y_zero_point.reshape(()), mode)
        np.testing.assert_array_equal(ours(case, mode), expected, strict=True)


# ---------------------------------------------------------------- against the onnx reference evaluator


def _reference_evaluator_output(case):
    """The onnx reference's QLinearConv, worked around where it is known to be wrong (docs/semantics.md):
    with a per-channel w_scale it is only right for 2-D convolutions, so other ranks run once per output
    channel with that channel's scale as a per-tensor scale, keeping that channel of the result."""
    if not case.per_channel_scale or case.n_spatial == 2:
        return run_reference(model_of(case), case.x)[0]
    channels = []
    for m, scale in enumerate(case.w_scale):
        per_tensor = type(case)(**{**case.__dict__, "w_scale": np.asarray(scale)})
        channels.append(run_reference(model_of(per_tensor), case.x)[0][:, m])
    return np.stack(channels, axis=1)


@settings(max_examples=examples(250))
@given(case=conv_cases())
def test_matches_onnx_reference_evaluator(case):
    np.testing.assert_array_equal(ours(case), _reference_evaluator_output(case), strict=True)


def test_onnx_reference_1d_per_channel_shape_is_wrong():
    """Documented deviation: the reference gives (N, M, M, L) for a 1-D conv with per-channel w_scale."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 2, 7), dtype=np.uint8)
    w = rng.integers(-128, 128, (3, 2, 2), dtype=np.int8)
    case_args = (x, f32(0.1), np.uint8(3), w, np.array([0.01, 0.02, 0.03], f32), np.zeros(3, np.int8), f32(2.0), np.uint8(100))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point")
    reference = run_reference(make_model("QLinearConv", list(zip(names, map(np.asarray, case_args))), [np.uint8], 10), x)[0]
    assert reference.shape == (1, 3, 3, 6)
    assert qlinear_conv(*case_args).shape == (1, 3, 6)


def test_onnx_reference_3d_per_channel_is_wrong():
    """Documented deviation: the reference broadcasts a per-channel w_scale of a 3-D conv against the first
    spatial axis instead of the channel axis: a broadcast error when D1 != M, wrong values when D1 == M."""
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (3, 2, 2, 2, 2), dtype=np.int8)
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point")
    w_scale = np.array([0.01, 0.02, 0.03], f32)

    x = rng.integers(0, 256, (1, 2, 5, 5, 6), dtype=np.uint8)  # output D1 = 4 != M = 3
    args = (x, f32(0.1), np.uint8(3), w, w_scale, np.zeros(3, np.int8), f32(2.0), np.uint8(100))
    with pytest.raises(ValueError, match="broadcast"):
        run_reference(make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10), x)
    assert qlinear_conv(*args).shape == (1, 3, 4, 4, 5)

    x = rng.integers(0, 256, (1, 2, 4, 5, 6), dtype=np.uint8)  # output D1 = 3 == M
    args = (x, f32(0.1), np.uint8(3), w, w_scale, np.zeros(3, np.int8), f32(2.0), np.uint8(100))
    reference = run_reference(make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10), x)[0]
    ours_out = qlinear_conv(*args)
    assert reference.shape == ours_out.shape and np.any(reference != ours_out)
    # Channel by channel with a per-tensor scale, the reference agrees with qlinear.
    for m in range(3):
        per_tensor = args[:4] + (w_scale[m],) + args[5:]
        model = make_model("QLinearConv", list(zip(names, map(np.asarray, per_tensor))), [np.uint8], 10)
        np.testing.assert_array_equal(run_reference(model, x)[0][:, m], ours_out[:, m])


@pytest.mark.parametrize("per_channel_zero_point", [False, True])
def test_four_spatial_dimensions_match_onnx_reference_evaluator(per_channel_zero_point):
    """The spec is N-D; the reference (per-tensor w_scale) computes 4-D convolutions too."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (1, 4, 4, 3, 5, 4), dtype=np.uint8)
    w = rng.integers(-128, 128, (4, 2, 2, 1, 3, 2), dtype=np.int8)
    w_zp = rng.integers(-128, 128, 4).astype(np.int8) if per_channel_zero_point else np.int8(-3)
    args = (x, f32(0.02), np.uint8(100), w, f32(0.01), w_zp, f32(0.8), np.uint8(120), rng.integers(-999, 999, 4).astype(np.int32))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
    attrs = dict(group=2, strides=[1, 2, 1, 2], pads=[1, 0, 0, 1, 0, 1, 2, 0], dilations=[1, 1, 2, 1])
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10, **attrs)
    np.testing.assert_array_equal(qlinear_conv(*args, **attrs), run_reference(model, x)[0], strict=True)


# ---------------------------------------------------------------- against onnxruntime


# The (x, w, y) types onnxruntime 1.32 implements QLinearConv for (others: NOT_IMPLEMENTED).
ONNXRUNTIME_TYPES = [(U8, U8, U8), (U8, S8, U8), (S8, S8, S8)]


@settings(max_examples=examples(250))
@given(case=conv_cases(type_combos=ONNXRUNTIME_TYPES))
def test_matches_onnxruntime_with_float32_requantization(case):
    if case.attributes["auto_pad"].startswith("SAME") and case.attributes["dilations"]:
        case.attributes["dilations"] = None  # onnxruntime refuses SAME with dilations (tested below)
    if not onnxruntime_exact_for_weights(case.w, case.x.dtype):
        return  # full-range int8 weights without VNNI: see test_onnxruntime_full_range_int8_weights
    np.testing.assert_array_equal(ours(case, "float32"), run_onnxruntime(model_of(case), case.x)[0], strict=True)


@pytest.mark.parametrize("channels,size,stride", [(37, 9, 1), (64, 14, 2), (96, 7, 1)])
def test_depthwise_3x3_with_7bit_weights_matches_onnxruntime(channels, size, stride):
    # MobileNet-like depthwise layers with the weights onnxruntime's quantizer writes for CPUs without VNNI
    # (7 bits, per channel): the channels-last kernels, on AVX2 without VNNI the vpmaddubsw one (C-K2b)
    rng = np.random.default_rng(channels + size)
    x = rng.integers(0, 256, (1, channels, size, size), dtype=np.uint8)
    w = rng.integers(-64, 64, (channels, 1, 3, 3)).astype(np.int8)
    w_scale = (rng.random(channels) * 0.004 + 0.001).astype(np.float32)
    args = (x, f32(0.02), np.uint8(123), w, w_scale, np.zeros(channels, np.int8), f32(0.05), np.uint8(120),
            rng.integers(-20000, 20000, channels).astype(np.int32))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
    attrs = dict(group=channels, strides=[stride, stride], pads=[1, 1, 1, 1])
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10, **attrs)
    np.testing.assert_array_equal(qlinear_conv(*args, **attrs, requantize="float32"), run_onnxruntime(model, x)[0],
                                  strict=True)


@pytest.mark.parametrize("x_dtype,w_dtype", [(U8, U8), (U8, S8), (S8, S8)])
def test_onnxruntime_accepts_distinct_per_channel_weight_zero_points(x_dtype, w_dtype):
    """Measured on onnxruntime 1.32: per-channel w zero points that differ are accepted and exact (its
    sources once refused them); qlinear allows them too. The zero points span the whole int8 range; the
    weights do where onnxruntime is exact on them (uint8, or with VNNI), else [-64, 63] (docs/semantics.md)."""
    rng = np.random.default_rng(5)
    xi, wi = np.iinfo(x_dtype), np.iinfo(w_dtype)
    x = rng.integers(xi.min, xi.max + 1, (1, 4, 6, 6)).astype(x_dtype)
    w = rng.integers(wi.min, wi.max + 1, (3, 4, 3, 3)).astype(w_dtype)
    if not onnxruntime_exact_for_weights(w, x_dtype):
        w >>= 1  # int8 into [-64, 63]: no pair of u8*s8 products saturates int16 without VNNI
    w_zp = np.array([wi.min, 5, wi.max], w_dtype)
    args = (x, f32(0.05), x_dtype.type(3), w, np.array([0.01, 0.02, 0.03], f32), w_zp, f32(1.5), x_dtype.type(10))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point")
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [x_dtype], 10)
    np.testing.assert_array_equal(qlinear_conv(*args, requantize="float32"), run_onnxruntime(model, x)[0], strict=True)
    np.testing.assert_array_equal(qlinear_conv(*args), run_reference(model, x)[0], strict=True)


LAYERS = {
    # name: (x shape, w shape, attributes): shapes large enough to reach onnxruntime's production kernels
    "pointwise": ((1, 64, 14, 14), (96, 64, 1, 1), {}),
    "3x3_stride2": ((2, 24, 17, 17), (48, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "depthwise": ((1, 32, 15, 15), (32, 1, 3, 3), {"group": 32, "auto_pad": "SAME_UPPER"}),
    "depthwise_x2": ((1, 16, 12, 12), (32, 1, 5, 5), {"group": 16, "pads": [2, 2, 2, 2]}),
    "grouped": ((1, 48, 10, 10), (48, 12, 3, 3), {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "conv1d": ((2, 40, 50), (64, 40, 7), {"strides": [3], "auto_pad": "SAME_LOWER"}),
    "conv3d": ((1, 8, 6, 9, 9), (16, 8, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("types", ONNXRUNTIME_TYPES, ids=lambda t: "".join("u8" if d == U8 else "s8" for d in t))
def test_realistic_layers_match_both_peers(layer, types):
    x_shape, w_shape, attributes = LAYERS[layer]
    x_dtype, w_dtype, y_dtype = types
    rng = np.random.default_rng([sorted(LAYERS).index(layer), ONNXRUNTIME_TYPES.index(types)])
    xi, wi = np.iinfo(x_dtype), np.iinfo(w_dtype)
    x = rng.integers(xi.min, xi.max + 1, x_shape).astype(x_dtype)
    w = rng.integers(wi.min, wi.max + 1, w_shape).astype(w_dtype)
    m = w_shape[0]
    w_zp = np.full(m, 0 if w_dtype == S8 else 128, w_dtype) if rng.integers(2) else rng.integers(wi.min, wi.max + 1, m).astype(w_dtype)
    taps = int(np.prod(w_shape[1:]))
    y_scale = f32(0.02 * 0.005 * 74 * 74 * np.sqrt(taps) / 64)
    args = (x, f32(0.02), x_dtype.type(rng.integers(xi.min, xi.max + 1)), w, (rng.uniform(0.5, 1.5, m) * 0.005).astype(f32),
            w_zp, y_scale, y_dtype.type(0 if y_dtype == S8 else 128), rng.integers(-5000, 5000, m).astype(np.int32))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [y_dtype], 10, **attributes)
    ours_out = qlinear_conv(*args, **attributes)
    if len(x_shape) == 4:
        np.testing.assert_array_equal(ours_out, run_reference(model, x)[0], strict=True)
    else:  # the reference's per-channel w_scale is wrong outside 2-D: one per-tensor run per output channel
        for channel in range(m):
            per_tensor = args[:4] + (args[4][channel],) + args[5:]
            channel_model = make_model("QLinearConv", list(zip(names, map(np.asarray, per_tensor))), [y_dtype], 10, **attributes)
            np.testing.assert_array_equal(ours_out[:, channel], run_reference(channel_model, x)[0][:, channel], strict=True)
    if onnxruntime_exact_for_weights(w, x_dtype):
        np.testing.assert_array_equal(qlinear_conv(*args, **attributes, requantize="float32"), run_onnxruntime(model, x)[0], strict=True)


def test_onnxruntime_refuses_same_auto_pad_with_dilations():
    """Documented peer limitation: the spec allows it (the onnx reference computes it), onnxruntime does not."""
    x = np.zeros((1, 1, 6, 6), np.uint8)
    args = (x, f32(1), np.uint8(0), np.ones((1, 1, 2, 2), np.uint8), f32(1), np.uint8(0), f32(1), np.uint8(0))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point")
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10,
                       auto_pad="SAME_UPPER", dilations=[2, 2])
    with pytest.raises(Exception, match="Dilation not supported for AutoPadType::SAME_UPPER"):
        run_onnxruntime(model, x)
    np.testing.assert_array_equal(qlinear_conv(*args, auto_pad="SAME_UPPER", dilations=[2, 2]), run_reference(model, x)[0])


def _saturating_pair_case():
    """x all 255 and w all -128 (zero points 0): each pair of products is -65280, below int16's -32768,
    which is what a VPMADDUBSW-based kernel saturates. The exact result is well inside the output range."""
    x = np.full((1, 8, 4, 4), 255, np.uint8)
    w = np.full((2, 8, 3, 3), -128, np.int8)
    w[1] = 127
    acc_magnitude = 255 * 128 * 8 * 9
    y_scale = f32(acc_magnitude / 100)
    return (x, f32(1.0), np.uint8(0), w, f32(1.0), np.int8(0), y_scale, np.uint8(128))


def test_onnxruntime_full_range_int8_weights():
    """onnxruntime is exact on full-range int8 weights on a CPU with VNNI; without VNNI it saturates pairs of
    u8*s8 products to int16 (measured on an AVX2 CPU: up to 255 off). Detect, do not assume."""
    args = _saturating_pair_case()
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point")
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10, pads=[1, 1, 1, 1])
    expected = qlinear_conv(*args, pads=[1, 1, 1, 1], requantize="float32")
    # The onnx reference is exact on every CPU: it pins the expected values.
    np.testing.assert_array_equal(qlinear_conv(*args, pads=[1, 1, 1, 1]), run_reference(model, args[0])[0])
    got = run_onnxruntime(model, args[0])[0]
    if cpu_has_vnni():
        np.testing.assert_array_equal(got, expected, strict=True)
    else:
        assert np.any(got != expected), "onnxruntime became exact without VNNI: update docs/semantics.md"


# ---------------------------------------------------------------- worst cases and arithmetic edges


@pytest.mark.parametrize("x_dtype,w_dtype,y_dtype", [(U8, U8, U8), (U8, S8, U8), (S8, S8, S8), (S8, U8, U8), (U8, U8, S8)])
@pytest.mark.parametrize("x_high,w_high", [(True, False), (False, True), (True, True), (False, False)])
def test_worst_case_extremes_match_reference_evaluator(x_dtype, w_dtype, y_dtype, x_high, w_high):
    """Every operand and zero point at opposite extremes: |x - x_zp| = |w - w_zp| = 255 everywhere."""
    xi, wi, yi = np.iinfo(x_dtype), np.iinfo(w_dtype), np.iinfo(y_dtype)
    x = np.full((2, 6, 5, 5), xi.max if x_high else xi.min, x_dtype)
    w = np.full((4, 3, 3, 3), wi.max if w_high else wi.min, w_dtype)
    x_zp = x_dtype.type(xi.min if x_high else xi.max)
    w_zp = np.full(4, wi.min if w_high else wi.max, w_dtype)
    acc = 255 * 255 * 27
    B = np.array([0, 2**31 - 1 - acc, -(2**31) + acc, 12345], np.int32)
    for y_zp in (yi.min, yi.max, 0 if y_dtype == S8 else 128):
        args = (x, f32(0.5), x_zp, w, np.array([1e-4, 2e-4, 3e-4, 4e-4], f32), w_zp, f32(7.25), y_dtype.type(y_zp), B)
        names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
        model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [y_dtype], 10, group=2, pads=[1, 0, 1, 0])
        np.testing.assert_array_equal(qlinear_conv(*args, group=2, pads=[1, 0, 1, 0]), run_reference(model, x)[0], strict=True)


def test_requantization_modes_differ_where_the_peers_differ():
    """The survey's measured case: acc 179782 (given through B), x_scale 0.041557427, w_scale 0.021050757,
    y_scale 1.1036915: onnxruntime gives 142, the onnx reference 143. Each mode matches its peer."""
    x = np.zeros((1, 1, 1, 1), np.uint8)
    w = np.zeros((1, 1, 1, 1), np.uint8)
    args = (x, f32(0.041557427), np.uint8(0), w, f32(0.021050757), np.uint8(0), f32(1.1036915), np.uint8(0),
            np.array([179782], np.int32))
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10)
    assert run_reference(model, x)[0].item() == 143 == qlinear_conv(*args).item()
    assert run_onnxruntime(model, x)[0].item() == 142 == qlinear_conv(*args, requantize="float32").item()


def test_float32_mode_rounds_large_accumulators_like_onnxruntime():
    """Above 2**24 onnxruntime first rounds the int32 accumulator to float32 (spacing 64 near 2**30). 4096
    output channels get consecutive accumulators (through B) around one where acc * multiplier = 100.5, so
    some outputs differ between the two arithmetics; each mode matches its peer on all of them."""
    channels = 4096
    multiplier = f32(9.3e-8)
    center = int(round(100.5 / float(multiplier)))
    B = np.arange(center - channels // 2, center + channels // 2, dtype=np.int64).astype(np.int32)
    x = np.zeros((1, 1, 1, 1), np.uint8)
    w = np.zeros((channels, 1, 1, 1), np.uint8)
    args = (x, multiplier, np.uint8(0), w, f32(1.0), np.uint8(0), f32(1.0), np.uint8(0), B)
    names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")
    model = make_model("QLinearConv", list(zip(names, map(np.asarray, args))), [np.uint8], 10)
    reference, onnxruntime = run_reference(model, x)[0], run_onnxruntime(model, x)[0]
    assert np.any(reference != onnxruntime)
    np.testing.assert_array_equal(qlinear_conv(*args), reference, strict=True)
    np.testing.assert_array_equal(qlinear_conv(*args, requantize="float32"), onnxruntime, strict=True)


def test_accumulator_leaving_int32_is_an_error():
    assert issubclass(AccumulatorOverflowError, ValueError) and issubclass(AccumulatorOverflowError, OverflowError)
    x = np.full((1, 1, 1, 1), 255, np.uint8)
    w = np.full((1, 1, 1, 1), 255, np.uint8)
    args = (x, f32(1.0), np.uint8(0), w, f32(1.0), np.uint8(0), f32(1.0), np.uint8(0))
    # 65025 + (2**31 - 65025) = 2**31: one past int32.
    with pytest.raises(AccumulatorOverflowError, match=r"qlinear_conv: the exact accumulator .* leaves the int32 range: 2147483648"):
        qlinear_conv(*args, np.array([2**31 - 65025], np.int32))
    assert qlinear_conv(*args, np.array([2**31 - 65026], np.int32)).item() == 255


# ---------------------------------------------------------------- geometry (the spec's auto_pad rules)


@pytest.mark.parametrize(
    "auto_pad,size,kernel,stride,dilation,expected_pads,expected_out",
    [
        # SAME: output = ceil(size / stride); an odd total pad puts the extra unit at the end (UPPER) or the
        # beginning (LOWER).
        ("SAME_UPPER", 5, 2, 1, 1, (0, 1), 5),
        ("SAME_LOWER", 5, 2, 1, 1, (1, 0), 5),
        ("SAME_UPPER", 5, 3, 2, 1, (1, 1), 3),
        ("SAME_LOWER", 6, 3, 2, 2, (2, 1), 3),
        ("SAME_UPPER", 6, 3, 2, 2, (1, 2), 3),
        ("SAME_UPPER", 5, 1, 3, 1, (0, 0), 2),  # stride past the kernel: no padding needed
        ("VALID", 7, 3, 2, 1, (0, 0), 3),
        ("NOTSET", 7, 3, 2, 1, (0, 0), 3),
    ],
)
def test_auto_pad_geometry(auto_pad, size, kernel, stride, dilation, expected_pads, expected_out):
    g = conv_geometry("t", (1, 1, size), (1, 1, kernel), auto_pad=auto_pad, dilations=[dilation], group=1,
                      kernel_shape=None, pads=None, strides=[stride])
    assert (g.pads_begin[0], g.pads_end[0]) == expected_pads
    assert g.output_shape == (1, 1, expected_out)


# ---------------------------------------------------------------- argument errors


def _valid():
    return dict(
        x=np.zeros((1, 4, 5, 5), np.uint8), x_scale=f32(0.1), x_zero_point=np.uint8(0),
        w=np.zeros((6, 2, 3, 3), np.int8), w_scale=np.full(6, 0.1, f32), w_zero_point=np.zeros(6, np.int8),
        y_scale=f32(0.2), y_zero_point=np.uint8(0), B=np.zeros(6, np.int32), group=2,
    )


ERRORS = [
    ({"x": [[1]]}, TypeError, "qlinear_conv: x must be a numpy array of uint8 or int8, got list"),
    ({"x": np.zeros((1, 4, 5, 5), np.int16)}, TypeError, "qlinear_conv: x must have dtype uint8 or int8, got int16"),
    ({"w": np.zeros((6, 2, 3, 3), np.float32)}, TypeError, "qlinear_conv: w must have dtype uint8 or int8, got float32"),
    ({"x": np.zeros((4, 5), np.uint8)}, ValueError, r"qlinear_conv: x must have at least 3 dimensions"),
    ({"w": np.zeros((6, 2, 3), np.int8)}, ValueError, r"qlinear_conv: w must have the rank of x"),
    ({"group": 3}, ValueError, r"qlinear_conv: x.shape\[1\] must equal w.shape\[1\] \* group"),
    ({"group": 0}, ValueError, "qlinear_conv: group must be >= 1, got 0"),
    ({"group": 2.0}, TypeError, "qlinear_conv: group must be an integer"),
    ({"w": np.zeros((5, 2, 3, 3), np.int8), "w_scale": f32(0.1), "w_zero_point": np.int8(0), "B": None},
     ValueError, r"qlinear_conv: w.shape\[0\] \(M=5\) must be a multiple of group \(2\)"),
    ({"kernel_shape": [3, 2]}, ValueError, r"qlinear_conv: kernel_shape must equal w.shape\[2:\] \(3, 3\), got \(3, 2\)"),
    ({"strides": [1]}, ValueError, r"qlinear_conv: strides must have 2 values, got 1"),
    ({"strides": [1, 0]}, ValueError, r"qlinear_conv: strides must be >= 1 everywhere"),
    ({"dilations": [0, 1]}, ValueError, r"qlinear_conv: dilations must be >= 1 everywhere"),
    ({"pads": [0, 0, -1, 0]}, ValueError, r"qlinear_conv: pads must be >= 0 everywhere"),
    ({"pads": [1, 1]}, ValueError, r"qlinear_conv: pads must have 4 values"),
    ({"pads": "1111"}, TypeError, r"qlinear_conv: pads must be a sequence of integers"),
    ({"strides": [1.5, 1]}, TypeError, r"qlinear_conv: strides must be a sequence of integers"),
    ({"auto_pad": "SAME"}, ValueError, r"qlinear_conv: auto_pad must be one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"),
    ({"auto_pad": 1}, TypeError, r"qlinear_conv: auto_pad must be a string"),
    ({"auto_pad": "VALID", "pads": [0, 0, 0, 0]}, ValueError, r"qlinear_conv: pads cannot be used together with auto_pad='VALID'"),
    ({"dilations": [3, 3]}, ValueError, r"qlinear_conv: the dilated kernel \(7\) is larger than the padded input \(5\)"),
    ({"w": np.zeros((6, 2, 0, 3), np.int8)}, ValueError, r"qlinear_conv: w's spatial dimensions must be >= 1"),
    ({"x_scale": np.float64(0.1)}, TypeError, "qlinear_conv: x_scale must have dtype float32, got float64"),
    ({"x_scale": "0.1"}, TypeError, "qlinear_conv: x_scale must be a numpy array of float32 or a Python float"),
    ({"x_scale": np.array([0.1, 0.2], f32)}, ValueError, r"qlinear_conv: x_scale must be a scalar or a 1-element 1-D tensor"),
    ({"y_scale": f32(0)}, ValueError, r"qlinear_conv: y_scale must be positive and finite"),
    ({"w_scale": np.array([0.1, np.nan, 0.1, 0.1, 0.1, 0.1], f32)}, ValueError, r"qlinear_conv: w_scale must be positive and finite"),
    ({"x_scale": f32(-1)}, ValueError, r"qlinear_conv: x_scale must be positive and finite"),
    ({"w_scale": np.full(5, 0.1, f32)}, ValueError, r"qlinear_conv: w_scale must be a scalar \(per tensor\) or a 1-D tensor of M=6"),
    ({"w_scale": np.full((6, 1), 0.1, f32)}, ValueError, r"qlinear_conv: w_scale must be a scalar \(per tensor\) or a 1-D tensor of M=6"),
    ({"w_zero_point": np.zeros(3, np.int8)}, ValueError, r"qlinear_conv: w_zero_point must be a scalar \(per tensor\) or a 1-D tensor of M=6"),
    ({"x_zero_point": np.int8(0)}, TypeError, r"qlinear_conv: x_zero_point must have the dtype of x \(uint8\), got int8"),
    ({"w_zero_point": np.zeros(6, np.uint8)}, TypeError, r"qlinear_conv: w_zero_point must have the dtype of w \(int8\), got uint8"),
    ({"x_zero_point": 256}, ValueError, r"qlinear_conv: x_zero_point must be in \[0, 255\]"),
    ({"x_zero_point": np.zeros(2, np.uint8)}, ValueError, r"qlinear_conv: x_zero_point must be a scalar or a 1-element 1-D tensor"),
    ({"y_zero_point": 3}, TypeError, r"qlinear_conv: y_zero_point must be a numpy array of uint8 or int8 \(its dtype sets the output type\)"),
    ({"y_zero_point": np.int32(3)}, TypeError, r"qlinear_conv: y_zero_point must have dtype uint8 or int8, got int32"),
    ({"y_zero_point": np.zeros(2, np.uint8)}, ValueError, r"qlinear_conv: y_zero_point must be a scalar or a 1-element 1-D tensor"),
    ({"B": np.zeros(6, np.int64)}, TypeError, r"qlinear_conv: B must have dtype int32, got int64"),
    ({"B": np.zeros(5, np.int32)}, ValueError, r"qlinear_conv: B must be a 1-D tensor of M=6 elements, got shape \(5,\)"),
    ({"requantize": "float16"}, ValueError, r"qlinear_conv: requantize must be one of 'float64', 'float32', 'tflite', 'tflite-single', 'xnnpack', got 'float16'"),
    ({"x_scale": f32(3e38), "w_scale": f32(3e38)}, ValueError, r"qlinear_conv: x_scale \* w_scale / y_scale overflows"),
]


@pytest.mark.parametrize("change,error,message", ERRORS, ids=[m[:60] for _, _, m in ERRORS])
def test_argument_errors(change, error, message):
    kwargs = {**_valid(), **change}
    with pytest.raises(error, match=message):
        qlinear_conv(**kwargs)


def test_valid_arguments_and_python_scalars_are_accepted():
    out = qlinear_conv(**_valid())
    assert out.shape == (1, 6, 3, 3) and out.dtype == np.uint8
    kwargs = {**_valid(), "x_scale": 0.1, "x_zero_point": 0, "w_zero_point": 0, "auto_pad": b"SAME_UPPER"}
    assert qlinear_conv(**kwargs).shape == (1, 6, 5, 5)


@settings(max_examples=examples(20))
@given(seed=st.integers(0, 2**32 - 1))
def test_scalar_and_one_element_parameters_are_interchangeable(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (1, 2, 4, 4), dtype=np.uint8)
    w = rng.integers(-128, 128, (1, 2, 2, 2), dtype=np.int8)
    a = qlinear_conv(x, f32(0.1), np.uint8(7), w, f32(0.05), np.int8(3), f32(0.3), np.uint8(9))
    b = qlinear_conv(x, np.array([0.1], f32), np.array([7], np.uint8), w, np.array([0.05], f32),
                     np.array([3], np.int8), np.array([0.3], f32), np.array([9], np.uint8))
    np.testing.assert_array_equal(a, b, strict=True)
