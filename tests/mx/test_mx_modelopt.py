"""qlinear.mx.quantize(x, "nvfp4", scale_rule="modelopt") against TensorRT Model Optimizer 0.47.0 itself:
``NVFP4QTensor.quantize`` (its PyTorch path, run here on the CPU) gives the same packed codes, E4M3 block
scales and tensor scale, bit for bit, on random float32 and bfloat16 weights, ties, tensors spanning many
binades, partial blocks, zeros, -0, Inf and NaN, with its own tensor scale and a given one. The default
(exact) rule differs from it where the float32 quotient x / d rounds onto a midpoint: the bfloat16 case
shows that the comparison is not vacuous."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx
from qlinear.kernels.quantize_linear import use_kernels

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")

F32 = np.float32


def modelopt(x: np.ndarray, g=None):
    """(codes one per byte, block-scale bytes, tensor scale) from Model Optimizer's quantizer; its packed
    bytes hold the even element in the low nibble."""
    t = torch.from_numpy(np.ascontiguousarray(x, F32).copy())
    given = None if g is None else torch.tensor(F32(g))
    q, scales, g = nvfp4_tensor.NVFP4QTensor.quantize(t, 16, weights_scaling_factor_2=given)
    packed = q._quantized_data.numpy()
    codes = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes[..., : x.shape[-1]], scales.view(torch.uint8).numpy(), F32(g.item())


def ours(x: np.ndarray, g=None, rule="modelopt"):
    with np.errstate(all="ignore"):
        codes, scales, tensor_scale = mx.quantize(x, "nvfp4", scale_rule=rule,
                                                  global_scale=None if g is None else F32(g))
    return codes.view(np.uint8), scales.view(np.uint8), F32(tensor_scale)


def assert_same(x, g=None):
    want_codes, want_scales, want_g = modelopt(x, g)
    for kernels in (True, False):  # the reference runs either way; both paths go through qlinear.mx
        with use_kernels(kernels):
            codes, scales, got_g = ours(x, g)
        assert got_g.view(np.uint32) == want_g.view(np.uint32) or (np.isnan(got_g) and np.isnan(want_g))
        np.testing.assert_array_equal(scales, want_scales)
        np.testing.assert_array_equal(codes, want_codes)


CASES = {
    "float32 normal": lambda rng: rng.standard_normal((64, 256)).astype(F32),
    "bfloat16 normal": lambda rng: rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16).astype(F32),
    "rows across 2^-30..2^30": lambda rng: (rng.standard_normal((64, 64))
                                            * np.exp2(rng.integers(-30, 31, (64, 1)))).astype(F32),
    "one tensor across 2^-60..2^60": lambda rng: (rng.standard_normal((32, 64))
                                                  * np.exp2(rng.integers(-60, 61, (32, 64)))).astype(F32),
    "partial last block": lambda rng: rng.standard_normal((8, 40)).astype(F32),
    "zeros": lambda rng: np.zeros((2, 32), F32),
    "-0 and a quotient underflowing to -0": lambda rng: np.array([[-0.0] * 16 + [1.0] * 16,
                                                                  [-1e-45, 1e30] + [0.0] * 30], F32),
    "Inf": lambda rng: np.array([[np.inf, 1.0] + [0.5] * 14, [2.0] * 16], F32),
    "NaN": lambda rng: np.array([[np.nan, 1.0] + [0.5] * 14, [2.0] * 16], F32),
}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_model_optimizer(case):
    x = CASES[case](np.random.default_rng(sorted(CASES).index(case)))
    assert_same(x)


@pytest.mark.parametrize("factor", [1.0, 0.25, 3.0])
def test_equals_model_optimizer_with_a_given_tensor_scale(factor):
    x = np.random.default_rng(7).standard_normal((32, 128)).astype(ml_dtypes.bfloat16).astype(F32)
    g = F32(F32(np.abs(x).max()) / F32(2688) * F32(factor))
    assert_same(x, g)


def test_the_default_rule_differs_where_the_quotient_rounds_onto_a_midpoint():
    x = CASES["bfloat16 normal"](np.random.default_rng(sorted(CASES).index("bfloat16 normal")))
    exact, _, g = ours(x, rule=None)
    theirs, scales, _ = modelopt(x)
    differ = np.argwhere(exact != theirs)
    assert len(differ) > 20
    for r, k in differ[:50]:  # each difference: x / d is not a midpoint, but its float32 rounding is one
        d = F32(np.float32(scales[r, k // 16:k // 16 + 1].view(ml_dtypes.float8_e4m3fn)[0]) * g)
        quotient = np.float64(x[r, k]) / np.float64(d)
        assert abs(F32(x[r, k] / d)) in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
        assert abs(quotient) not in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def test_dask_takes_the_rule():
    da = pytest.importorskip("dask.array")
    x = CASES["bfloat16 normal"](np.random.default_rng(3))
    lazy = mx.quantize(da.from_array(x, chunks=(40, 96)), "nvfp4", scale_rule="modelopt")
    codes, scales, g = da.compute(*lazy)
    want_codes, want_scales, want_g = modelopt(x)
    assert F32(g) == want_g
    np.testing.assert_array_equal(scales.view(np.uint8), want_scales)
    np.testing.assert_array_equal(codes.view(np.uint8), want_codes)
