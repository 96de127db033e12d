"""The 27 official ONNX backend cases of QuantizeLinear and DequantizeLinear, bit-exact."""

import numpy as np
import pytest

import qlinear

from .onnx_backend import backend_cases

CASES = backend_cases("QuantizeLinear", "DequantizeLinear")


def test_all_official_cases_are_collected():
    assert len({c.name for c in CASES}) == 27


def assert_bits_equal(actual, expected):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(actual.view(np.uint8) if actual.dtype.itemsize == 1 else actual,
                                  expected.view(np.uint8) if expected.dtype.itemsize == 1 else expected)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_official_case(case):
    function = qlinear.quantize_linear if case.op_type == "QuantizeLinear" else qlinear.dequantize_linear
    kwargs = dict(case.attributes)
    if "saturate" in kwargs and case.op_type == "DequantizeLinear":
        kwargs.pop("saturate")
    (expected,) = case.outputs
    actual = function(*case.inputs, **kwargs, opset=case.opset)
    if expected.dtype.itemsize == 1:
        # Compare encodings: NaN payloads and the sign of zero count.
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8))
    else:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_array_equal(actual, expected)
