"""qlinear.prepack_conv: packed weights reused across calls give the bits of unpacked weights, which equal
the int64 reference; mismatched zero point or group is an error."""

import numpy as np
import pytest

import qlinear
from qlinear.reference.conv import conv_accumulate


def test_prepacked_weights_equal_the_reference_on_repeated_calls():
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, size=(8, 2, 3, 3), dtype=np.int8)
    w_zp = rng.integers(-5, 5, size=8).astype(np.int8)
    packed = qlinear.prepack_conv(w, w_zp, group=2)
    for shape in [(1, 4, 9, 9), (2, 4, 6, 11), (1, 4, 9, 9)]:
        x = rng.integers(0, 256, size=shape, dtype=np.uint8)
        expected = conv_accumulate(x, np.uint8(3), w, w_zp, None, group=2, strides=(1, 2), dilations=(1, 1),
                                   pads_begin=(1, 0), pads_end=(1, 2))
        got = qlinear.conv_integer(x, packed, np.uint8(3), w_zp, group=2, strides=[1, 2], pads=[1, 0, 1, 2])
        np.testing.assert_array_equal(got, expected)
        y = qlinear.qlinear_conv(x, np.float32(0.02), np.uint8(3), packed, np.float32(0.01), w_zp,
                                 np.float32(0.5), np.int8(-3), group=2, strides=[1, 2], pads=[1, 0, 1, 2])
        y_plain = qlinear.qlinear_conv(x, np.float32(0.02), np.uint8(3), w, np.float32(0.01), w_zp,
                                       np.float32(0.5), np.int8(-3), group=2, strides=[1, 2], pads=[1, 0, 1, 2])
        np.testing.assert_array_equal(y, y_plain)


def test_prepacked_weights_must_be_used_with_their_zero_point_and_group():
    w = np.ones((4, 2, 3, 3), np.int8)
    packed = qlinear.prepack_conv(w, np.int8(1))
    x = np.zeros((1, 2, 5, 5), np.uint8)
    with pytest.raises(ValueError, match="w_zero_point differs from the one the weights were packed with"):
        qlinear.conv_integer(x, packed, np.uint8(0), np.int8(2))
    with pytest.raises(ValueError, match=r"group=2 but the weights were packed with group=1"):
        qlinear.conv_integer(np.zeros((1, 4, 5, 5), np.uint8), packed, np.uint8(0), np.int8(1), group=2)
    with pytest.raises(ValueError, match=r"prepack_conv: group must be a positive divisor of M=4, got 3"):
        qlinear.prepack_conv(w, np.int8(1), group=3)
    with pytest.raises(TypeError, match=r"prepack_conv: w must"):
        qlinear.prepack_conv(w.astype(np.int16), 0)
