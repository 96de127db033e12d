"""Bad arguments to qlinear.torch: each rule raises ValueError or TypeError naming the function, the argument
and the rule. Runs without torch (tests/torch/test_torch_quantize.py checks, with torch, that torch rejects
the same inputs where it has the check, and accepts the ones only qlinear rejects).
"""

from __future__ import annotations

import numpy as np
import pytest

import qlinear.torch as qt

X = np.array([[-1.0, 0.0, 0.5], [1.0, 2.0, -3.0]], np.float32)  # shape (2, 3)
NAN, INF = float("nan"), float("inf")
Q, QC = qt.quantize_per_tensor, qt.quantize_per_channel
F, FC = qt.fake_quantize_per_tensor_affine, qt.fake_quantize_per_channel_affine

CASES = [
    # dtype
    ("unknown dtype name", Q, (X, 1.0, 0, "qint16"), {}, ValueError,
     r"quantize_per_tensor: dtype must be one of qint8, quint8, qint32 \(or the NumPy dtypes int8, uint8, int32\), got 'qint16'"),
    ("dtype int16", Q, (X, 1.0, 0, np.int16), {}, ValueError, r"quantize_per_tensor: dtype must be one of qint8, quint8, qint32"),
    ("dtype float32", QC, (X, [1.0, 1.0], [0, 0], 0, "float32"), {}, ValueError, r"quantize_per_channel: dtype must be one of"),
    ("dtype not a dtype", Q, (X, 1.0, 0, 1.5), {}, TypeError, r"quantize_per_tensor: dtype must be a name \(qint8, quint8, qint32\) or a NumPy dtype"),
    # scale
    ("scale 0", Q, (X, 0.0, 0, "quint8"), {}, ValueError,
     r"quantize_per_tensor: scale must be positive and finite with a finite float32 reciprocal .*got 0.0; torch does not check"),
    ("negative scale", Q, (X, -0.5, 0, "quint8"), {}, ValueError, r"quantize_per_tensor: scale must be positive and finite"),
    ("NaN scale", F, (X, NAN, 0, 0, 255), {}, ValueError, r"fake_quantize_per_tensor_affine: scale must be positive and finite"),
    ("infinite scale", Q, (X, INF, 0, "quint8"), {}, ValueError, r"scale must be positive and finite"),
    ("scale 0 in float32", Q, (X, 1e-50, 0, "quint8"), {}, ValueError, r"scale must be positive and finite .*got 1e-50"),
    ("scale with an infinite reciprocal", Q, (X, 1e-39, 0, "quint8"), {}, ValueError, r"with a finite float32 reciprocal"),
    ("scale beyond float32", Q, (X, 1e39, 0, "quint8"), {}, ValueError, r"scale must be positive and finite"),
    ("scale an array", Q, (X, [1.0], 0, "quint8"), {}, TypeError, r"quantize_per_tensor: scale must be a float \(one value for the whole tensor\), got list of shape \(1,\)"),
    ("scale a string", Q, (X, "1", 0, "quint8"), {}, TypeError, r"quantize_per_tensor: scale must be a float"),
    ("scale a bool", Q, (X, True, 0, "quint8"), {}, TypeError, r"quantize_per_tensor: scale must be a float, got bool"),
    ("per-channel scale 0 at index 1", QC, (X, [1.0, 0.0], [0, 0], 0, "quint8"), {}, ValueError,
     r"quantize_per_channel: scales\[1\] must be positive and finite .*got 0.0"),
    ("per-channel NaN scale", FC, (X, [NAN, 1.0, 1.0], [0, 0, 0], 1, 0, 255), {}, ValueError,
     r"fake_quantize_per_channel_affine: scale\[0\] must be positive and finite"),
    ("per-channel scales 2-D", QC, (X, [[1.0, 1.0]], [0, 0], 0, "quint8"), {}, ValueError,
     r"quantize_per_channel: scales must be a 1-D array \(one scale per channel\), got shape \(1, 2\)"),
    ("per-channel scales of strings", QC, (X, ["a", "b"], [0, 0], 0, "quint8"), {}, TypeError,
     r"quantize_per_channel: scales must be a 1-D array of floats"),
    # zero point
    ("quint8 zero point 256", Q, (X, 1.0, 256, "quint8"), {}, ValueError,
     r"quantize_per_tensor: zero_point must be in \[0, 255\] \(the range of quint8, torch's check\), got 256"),
    ("quint8 zero point -1", Q, (X, 1.0, -1, "quint8"), {}, ValueError, r"zero_point must be in \[0, 255\]"),
    ("qint8 zero point 128", Q, (X, 1.0, 128, "qint8"), {}, ValueError, r"zero_point must be in \[-128, 127\]"),
    ("qint32 zero point 2^31", Q, (X, 1.0, 2**31, "qint32"), {}, ValueError, r"zero_point must be in \[-2147483648, 2147483647\]"),
    ("zero point a float", Q, (X, 1.0, 3.0, "quint8"), {}, TypeError, r"quantize_per_tensor: zero_point must be an int, got float"),
    ("zero point a bool", Q, (X, 1.0, True, "quint8"), {}, TypeError, r"zero_point must be an int, got bool"),
    ("per-channel zero point out of range", QC, (X, [1.0, 1.0], [0, 300], 0, "quint8"), {}, ValueError,
     r"quantize_per_channel: zero_points\[1\] must be in \[0, 255\] \(the range of quint8, torch's check\), got 300"),
    ("per-channel float zero points", FC, (X, [1.0, 1.0], [0.0, 1.5], 0, 0, 255), {}, TypeError,
     r"fake_quantize_per_channel_affine: zero_point must hold integers, got dtype float64 \(torch's separate arithmetic"),
    ("per-channel zero points 2-D", QC, (X, [1.0, 1.0], [[0, 0]], 0, "quint8"), {}, ValueError,
     r"zero_points must be a 1-D array \(one zero point per channel\)"),
    # axis and lengths
    ("negative axis", QC, (X, [1.0, 1.0, 1.0], [0, 0, 0], -1, "quint8"), {}, ValueError,
     r"quantize_per_channel: axis must be in \[0, 2\) for an input of 2 dimensions, got -1 \(torch rejects negative axes too\)"),
    ("axis = ndim", FC, (X, [1.0] * 3, [0] * 3, 2, 0, 255), {}, ValueError, r"fake_quantize_per_channel_affine: axis must be in \[0, 2\)"),
    ("axis of a 0-d input", QC, (np.float32(1), [1.0], [0], 0, "quint8"), {}, ValueError, r"axis must be in \[0, 0\) for an input of 0 dimensions"),
    ("axis a float", QC, (X, [1.0] * 2, [0] * 2, 0.0, "quint8"), {}, TypeError, r"quantize_per_channel: axis must be an int, got float"),
    ("axis a bool", QC, (X, [1.0] * 2, [0] * 2, False, "quint8"), {}, TypeError, r"axis must be an int, got bool"),
    ("scales and zero points of different lengths", QC, (X, [1.0, 1.0], [0], 0, "quint8"), {}, ValueError,
     r"quantize_per_channel: scales and zero_points must have the same number of elements \(torch's check\), got 2 and 1"),
    ("per-channel length is not the axis'", QC, (X, [1.0] * 3, [0] * 3, 0, "quint8"), {}, ValueError,
     r"quantize_per_channel: scales must have one value per channel, x.shape\[0\] = 2, got 3"),
    ("fake per-channel lengths differ", FC, (X, [1.0] * 3, [0] * 2, 1, 0, 255), {}, ValueError,
     r"fake_quantize_per_channel_affine: scale and zero_point must have the same number of elements"),
    # quant_min / quant_max
    ("quant_min > quant_max", F, (X, 1.0, 0, 5, 4), {}, ValueError,
     r"fake_quantize_per_tensor_affine: quant_min must be less than or equal to quant_max \(torch's check\), got quant_min=5, quant_max=4"),
    ("zero point outside the range", F, (X, 1.0, 300, 0, 255), {}, ValueError,
     r"fake_quantize_per_tensor_affine: zero_point must be in \[0, 255\] \(between quant_min and quant_max, torch's check\), got 300"),
    ("per-channel zero point outside the range", FC, (X, [1.0, 1.0], [0, -1], 0, 0, 255), {}, ValueError,
     r"fake_quantize_per_channel_affine: zero_point\[1\] must be in \[0, 255\]"),
    ("quant_max beyond int32", F, (X, 1.0, 0, 0, 2**31), {}, ValueError,
     r"quant_max must be in the int32 range \[-2147483648, 2147483647\], got 2147483648 \(a qlinear limit: torch takes any int64\)"),
    ("quant_min a float", F, (X, 1.0, 0, 0.0, 255), {}, TypeError, r"fake_quantize_per_tensor_affine: quant_min must be an int, got float"),
    # x and flags
    ("x of strings", Q, (np.array(["a"]), 1.0, 0, "quint8"), {}, TypeError, r"quantize_per_tensor: x must be a real array-like"),
    ("complex x", F, (np.array([1j]), 1.0, 0, 0, 255), {}, TypeError, r"fake_quantize_per_tensor_affine: x must be a real array-like"),
    ("bool x", Q, (np.array([True]), 1.0, 0, "quint8"), {}, TypeError, r"x must be a real array-like \(it is converted to float32\), got dtype bool"),
    ("strict not a bool", Q, (X, 1.0, 0, "quint8"), {"strict": 1}, TypeError, r"quantize_per_tensor: strict must be a bool, got int"),
    ("legacy not a bool", QC, (X, [1.0] * 2, [0] * 2, 0, "quint8"), {"legacy": "yes"}, TypeError, r"quantize_per_channel: legacy must be a bool, got str"),
    ("strict with NaN", Q, (np.array([1.0, NAN], np.float32), 1.0, 0, "quint8"), {"strict": True}, ValueError,
     r"quantize_per_tensor: x contains NaN, which has no quantized value \(strict=True\)"),
    ("strict fake with NaN", FC, (np.array([[NAN]], np.float32), [1.0], [0], 0, 0, 255), {"strict": True}, ValueError,
     r"fake_quantize_per_channel_affine: x contains NaN"),
]


@pytest.mark.parametrize("name, func, args, kwargs, exc, match", CASES, ids=[c[0] for c in CASES])
def test_rejected(name, func, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        func(*args, **kwargs)


@pytest.mark.parametrize("dtype", ["qint8", "torch.qint8", np.int8, np.dtype("int8"), "int8"])
def test_dtype_spellings(dtype):
    assert qt.quantize_per_tensor(X, 0.5, 0, dtype).dtype == np.int8


def test_torch_dtype_objects_by_name():
    """A torch dtype is recognised by its str() ("torch.quint8") without importing torch."""

    class FakeTorchDtype:
        __module__ = "torch"

        def __str__(self):
            return "torch.quint8"

    assert qt.quantize_per_tensor(X, 0.5, 0, FakeTorchDtype()).dtype == np.uint8


def test_accepted_input_forms():
    assert qt.quantize_per_tensor(2.5, 1.0, 0, "quint8").shape == ()  # a 0-d input
    assert qt.quantize_per_tensor([[1, 2]], np.float32(0.5), np.int64(3), "qint32").tolist() == [[5, 7]]
    assert qt.quantize_per_channel(X.astype(np.float64), np.array([1.0, 2.0]), np.array([0, 1], np.int32), 0, "qint8").dtype == np.int8
    assert qt.fake_quantize_per_tensor_affine(np.zeros((0, 3)), 1.0, 0, 0, 255).shape == (0, 3)
    assert qt.fake_quantize_per_channel_affine(X, (1.0, 1.0, 1.0), (0, 0, 0), 1, -128, 127).dtype == np.float32
