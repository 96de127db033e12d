"""The kernels' bit-level conversions against NumPy and ml_dtypes: exhaustive where the input space is
small (every float16/bfloat16 pattern), and on a dense float32 sweep around every rounding boundary of
every float8/float6/float4/float16 format (each representable value, each midpoint, and their float32
neighbours), plus special values and random float32 patterns. `encode_small_float` also sees every
upper 16-bit half of a float32 with the low halves that decide its rounding, and every float32 within 64
ulps of each power of two from 2**-40 to 2**39 (all 2**32 patterns agree too, checked once offline: too
slow for CI)."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

from qlinear import dtypes
from qlinear.kernels import small_float as sf
from qlinear.reference.small_float import to_small_float

SMALL_FLOATS = [t for t in dtypes.TYPES if t.is_small_float]

# The helpers below are not cached: numba keys a cache on this file alone, so a cached helper would keep the
# kernel code it inlined when it was written, after the kernel changed.


@numba.njit
def _map_f16_to_f32(h):
    out = np.empty(h.size, np.float32)
    for i in range(h.size):
        out[i] = sf.f16_bits_to_f32(h[i])
    return out


@numba.njit
def _map_bf16_to_f32(h):
    out = np.empty(h.size, np.float32)
    for i in range(h.size):
        out[i] = sf.bf16_bits_to_f32(h[i])
    return out


@numba.njit
def _map_round(v, bf16):
    out = np.empty(v.size, np.float32)
    for i in range(v.size):
        out[i] = sf.round_to_bf16(v[i]) if bf16 else sf.round_to_f16(v[i])
    return out


@numba.njit
def _map_bits(v, bf16):
    out = np.empty(v.size, np.uint16)
    for i in range(v.size):
        out[i] = sf.f32_to_bf16_bits(v[i]) if bf16 else sf.f32_to_f16_bits(v[i])
    return out


@numba.njit
def _map_encode(v, *fmt):
    out = np.empty(v.size, np.uint8)
    for i in range(v.size):
        out[i] = sf.encode_small_float(v[i], *fmt)
    return out


@numba.njit
def _map_decode(codes, *args):
    out = np.empty(codes.size, np.float32)
    for i in range(codes.size):
        out[i] = sf.decode_small_float(codes[i], *args)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    bad = np.flatnonzero(a.view(view) != b.view(view))
    assert bad.size == 0, f"{bad.size} differ, first at {bad[:5]}: {a[bad[:5]]} vs {b[bad[:5]]}"


ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_f16_and_bf16_widening_every_pattern():
    with np.errstate(invalid="ignore"):
        _same_bits(_map_f16_to_f32(ALL16), ALL16.view(np.float16).astype(np.float32))
        _same_bits(_map_bf16_to_f32(ALL16), ALL16.view(ml_dtypes.bfloat16).astype(np.float32))


def _boundary_sweep(values: np.ndarray) -> np.ndarray:
    """Every value, every midpoint between neighbours, and 3 float32 steps either side of each, both signs."""
    v = np.unique(np.abs(values[np.isfinite(values)].astype(np.float64)))
    mids = (v[:-1] + v[1:]) / 2
    centers = np.concatenate([v, mids, [v[-1] * 1.0625, v[-1] * 1.125, v[-1] * 2]]).astype(np.float32)
    steps = np.arange(-3, 4, dtype=np.int64)
    bits = centers.view(np.uint32).astype(np.int64)[:, None] + steps[None, :]
    bits = bits[(bits >= 0) & (bits < 0x7F800000)].astype(np.uint32)
    swept = bits.view(np.float32)
    specials = np.array([0.0, np.inf, np.nan, 1e-45, 1e-38, 3.4e38], np.float32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out = np.concatenate([swept, -swept, specials, -specials, random])
    return out


def _f16_sweep():
    return _boundary_sweep(ALL16.view(np.float16).astype(np.float32))


def test_round_to_f16_and_bits():
    v = _f16_sweep()
    with np.errstate(over="ignore", invalid="ignore"):
        expected = v.astype(np.float16)
    _same_bits(_map_bits(v, False), expected)
    finite_or_inf = ~np.isnan(v)
    _same_bits(_map_round(v, False)[finite_or_inf], expected.astype(np.float32)[finite_or_inf])
    assert np.all(np.isnan(_map_round(v[~finite_or_inf], False)))


def test_round_to_bf16_and_bits():
    v = _boundary_sweep(ALL16.view(ml_dtypes.bfloat16).astype(np.float32))
    expected = v.astype(ml_dtypes.bfloat16)
    _same_bits(_map_bits(v, True), expected)
    finite_or_inf = ~np.isnan(v)
    _same_bits(_map_round(v, True)[finite_or_inf], expected.astype(np.float32)[finite_or_inf])


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("target", SMALL_FLOATS, ids=lambda t: t.onnx_name)
def test_encode_small_float_against_reference(target, saturate):
    codes = np.arange(1 << target.bits, dtype=np.uint8).view(target.dtype)
    with np.errstate(invalid="ignore"):
        v = _boundary_sweep(codes.astype(np.float32))
    fmt = sf.SmallFloatFormat.of(target)
    got = _map_encode(v, *fmt.args(saturate))
    with np.errstate(invalid="ignore", over="ignore"):
        expected = to_small_float(v, target, saturate).view(np.uint8)
    _same_bits(got, expected)


# Every upper 16 bits (sign, exponent, top 7 mantissa bits) with low halves that hit each rounding case of
# every format: exact, just above a tie, the tie, just below it (a format keeps at most 3 mantissa bits, so
# its rounding bit is among the upper half's), plus the NaN payloads at 0x7F800001 / 0x7FFFFFFF.
_LOW_HALVES = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF], np.uint32)
_EVERY_UPPER_HALF = ((np.arange(1 << 16, dtype=np.uint32)[:, None] << np.uint32(16)) | _LOW_HALVES).reshape(-1)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("target", SMALL_FLOATS, ids=lambda t: t.onnx_name)
def test_encode_small_float_every_upper_half(target, saturate):
    v = _EVERY_UPPER_HALF.view(np.float32)
    got = _map_encode(v, *sf.SmallFloatFormat.of(target).args(saturate))
    with np.errstate(invalid="ignore", over="ignore"):
        expected = to_small_float(v, target, saturate).view(np.uint8)
    _same_bits(got, expected)


@pytest.mark.parametrize("target", SMALL_FLOATS, ids=lambda t: t.onnx_name)
def test_encode_small_float_around_binade_edges(target):
    """Every float32 within 64 ulps of each power of two in and around the format's range (the normal /
    subnormal boundary, each binade's carry, the overflow threshold's binade), both signs."""
    exponents = np.arange(-40, 40, dtype=np.int64)
    centers = (exponents + 127) << 23
    bits = (centers[:, None] + np.arange(-64, 65)[None, :]).reshape(-1).astype(np.uint32)
    v = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    for saturate in (True, False):
        got = _map_encode(v, *sf.SmallFloatFormat.of(target).args(saturate))
        with np.errstate(invalid="ignore", over="ignore"):
            expected = to_small_float(v, target, saturate).view(np.uint8)
        _same_bits(got, expected)


# Powers of two at the ends of float32's range (2**127 is Inf in float16 precision, 2**-127 is 0), their
# reciprocals representable or not, and non-power neighbours: quotients that are subnormal, Inf or NaN.
_EXTREME_SCALES = [2.0**-127, 2.0**127, 2.0**-126, -(2.0**-3), 1.0, 2.0**-128, 2.0**-149, 0.75, 2.0**-3 * 1.0000001]


@pytest.mark.parametrize("precision", ["float", "float16", "double"])
@pytest.mark.parametrize("target", [dtypes.get("float8e4m3fn"), dtypes.get("float8e5m2fnuz"), dtypes.get("float4e2m1")],
                         ids=lambda t: t.onnx_name)
def test_quantize_with_extreme_scales_equals_reference(target, precision):
    import qlinear
    from qlinear.kernels import quantize_linear as kernels
    from qlinear.ops import quantize_linear as ops

    def reference_must_not_run(*args, **kwargs):
        raise AssertionError("the reference ran although the kernel covers this case")

    x = _EVERY_UPPER_HALF[::5].view(np.float32)[: 64 * 1024].reshape(64, 1024)
    for scale in _EXTREME_SCALES:
        for block_scales in (np.float32(scale), np.full((64, 32), scale, np.float32)):
            kwargs = dict(axis=1, block_size=32 if block_scales.ndim else 0, output_dtype=target.dtype,
                          precision=precision, saturate=0 if target.kind == "float8" else 1)
            with np.errstate(all="ignore"):
                with kernels.use_kernels(True), pytest.MonkeyPatch.context() as patch:
                    patch.setattr(ops.reference, "quantize_linear", reference_must_not_run)
                    fast = qlinear.quantize_linear(x, block_scales, None, **kwargs)
                with kernels.use_kernels(False):
                    slow = qlinear.quantize_linear(x, block_scales, None, **kwargs)
            _same_bits(fast.view(np.uint8), slow.view(np.uint8))


@pytest.mark.parametrize("target", SMALL_FLOATS, ids=lambda t: t.onnx_name)
def test_decode_small_float_every_byte(target):
    """Every byte widened to float32 as ml_dtypes widens it: NaN and Inf bits, and float4/float6 bytes with
    their unused high bits set (ml_dtypes reads any of them as the sign)."""
    codes = np.arange(256, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        expected = codes.view(target.dtype).astype(np.float32)
    _same_bits(_map_decode(codes, *sf.decode_args(target)), expected)


def test_decode_args_refuses_other_types():
    with pytest.raises(ValueError, match="decode_args: int4 is not a float8/float6/float4 type"):
        sf.decode_args(dtypes.get("int4"))
