"""qlinear.mx against gguf (llama.cpp's Python package, pinned in the dev group), run in the test.

gguf 0.19.0's ``gguf.quants`` has a NumPy MXFP4 quantizer and dequantizer (ports of llama.cpp's
``quantize_row_mxfp4_ref`` / ``dequantize_row_mxfp4``) and an NVFP4 *dequantizer* with its UE4M3 scale
encoder ``NVFP4.fp32_to_ue4m3`` (a port of ``ggml_fp32_to_ue4m3``), but no NVFP4 quantizer; llama.cpp's
NVFP4 block (64 elements, four UE4M3 sub-block scales, no float32 tensor scale) differs from NVIDIA's.

gguf's MXFP4 differs from the OCP rule qlinear's "floor" follows in three ways, each checked here element
by element (every difference must be one of them, and each occurs in the inputs):
- ties: the element is the first of the candidates with the least float32 error (a strict ``<`` in C,
  ``argmin`` in NumPy), so an exact midpoint goes toward zero, where qlinear rounds to even;
- the scale is floor(float32 log2(amax)) - 2: float32 log2 rounds amax just below 2^k (1 ulp, and a few
  ulps for large |k|) up to k, one above the exact floor;
- an amax below 2^-125 gives a negative biased exponent that is cast to uint8 and wraps (0xFF, 0xFE, ...,
  a scale of up to 2^127 that zeroes the block), where the OCP rule clamps the exponent to -127 (0x00).
The layouts differ only in packing: gguf's block is the scale byte then 16 bytes, element j in the low
nibble and element j + 16 in the high nibble of byte j; its codes are E2M1 bit patterns (its table holds
the values doubled, with the scale halved).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx

from . import _mx_exact as ex
from ._mx_inputs import F32, edge_cases, pad_to_blocks, random_rows

gguf = pytest.importorskip("gguf")
quants = pytest.importorskip("gguf.quants")
Q = gguf.GGMLQuantizationType

pytestmark = [
    # gguf's own arithmetic on the inputs fed to it on purpose (a wrapped 2^127 scale times 12 overflows;
    # log2(0); a negative exponent cast to uint8).
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]
RNG_SEED = 20260903
E2M1_MAGNITUDES = [v for v, _ in ex.E2M1.grid]


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------
def to_gguf_mxfp4(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """qlinear (codes, E8M0 scales) along the last axis (a multiple of 32) -> gguf MXFP4 bytes."""
    c = codes.view(np.uint8).reshape(-1, 32)
    s = scales.view(np.uint8).reshape(-1, 1)
    blocks = np.concatenate([s, c[:, :16] | (c[:, 16:] << 4)], axis=1)
    return blocks.reshape(codes.shape[:-1] + (codes.shape[-1] // 32 * 17,))


def from_gguf_mxfp4(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = data.reshape(-1, 17)
    qs = b[:, 1:]
    c = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    shape = data.shape[:-1] + (data.shape[-1] // 17 * 32,)
    return c.reshape(shape).view(ml_dtypes.float4_e2m1fn), b[:, 0].reshape(shape[:-1] + (-1,)).view(ml_dtypes.float8_e8m0fnu)


def to_gguf_nvfp4(codes: np.ndarray, block_scales: np.ndarray) -> np.ndarray:
    """qlinear NVFP4 (codes, E4M3 block scales of 16) along the last axis (a multiple of 64) -> gguf NVFP4
    bytes: per 64 elements, the 4 sub-block scale bytes, then 4 x 8 bytes, byte j of sub-block b holding
    element 16b + j (low nibble) and 16b + 8 + j (high nibble)."""
    c = codes.view(np.uint8).reshape(-1, 4, 16)
    s = block_scales.view(np.uint8).reshape(-1, 4)
    qs = (c[:, :, :8] | (c[:, :, 8:] << 4)).reshape(-1, 32)
    return np.concatenate([s, qs], axis=1).reshape(codes.shape[:-1] + (codes.shape[-1] // 64 * 36,))


def same_value(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal as values (-0 == +0), NaN equal to NaN."""
    return (a == b) | (np.isnan(a) & np.isnan(b))


# ---------------------------------------------------------------------------------------------
# Explanations
# ---------------------------------------------------------------------------------------------
def log2_explains(amax: np.float32, ours: int, theirs: int) -> bool:
    """gguf's scale is one above the exact floor because float32 log2(amax) rounded up to the integer k
    with amax < 2^k: amax is within 2^-16 (relative) below 2^k."""
    k = ex.floor_log2(ex.exact(amax)) + 1
    return (theirs == ours + 1 and ex.exact(amax) >= ex.TWO**k * (1 - ex.TWO**-16)
            and float(np.log2(F32(amax))) == k)


def wrap_explains(amax: np.float32, ours: int, theirs: int) -> bool:
    """amax < 2^-125: the biased exponent floor(log2 amax) - 2 + 127 is negative (-1 ... -24 for float32
    amax) and wraps in gguf's uint8 cast; the OCP rule clamps it to 0x00."""
    return ex.exact(amax) < ex.TWO**-125 and ours == 0 and theirs >= 256 - 24


def tie_explains(v: np.float32, e: int, ours: float, theirs: float) -> bool:
    """v / 2^e is exactly the midpoint of two adjacent E2M1 magnitudes; qlinear took the even (upper) one,
    gguf the lower (toward zero)."""
    q = abs(ex.exact(v)) / ex.TWO**e
    for lo, hi in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:]):
        if q == (lo + hi) / 2:
            x = ex.TWO**e
            return abs(ex.exact(ours)) == hi * x and abs(ex.exact(theirs)) == lo * x
    return False


def mxfp4_inputs(rng) -> list[np.ndarray]:
    # bf16 Gaussian rows: about 1% of their elements are exact E2M1 midpoints under the floor rule.
    bf16 = rng.standard_normal((64, 128)).astype(F32).astype(ml_dtypes.bfloat16).astype(F32)
    return [bf16, random_rows(rng, 32, 128)] + [pad_to_blocks(x) for x in edge_cases("mxfp4", rng)]


# ---------------------------------------------------------------------------------------------
# MXFP4
# ---------------------------------------------------------------------------------------------
def test_mxfp4_quantizer_against_floor_rule():
    """Both quantizers on the same rows, decoded to values (each by its own dequantizer); every differing
    block or element explained (tie, log2 rounding, exponent wrap), and each explanation used."""
    rng = np.random.default_rng(RNG_SEED)
    counts = {"elements": 0, "tie": 0, "log2 blocks": 0, "wrap blocks": 0}
    for x in mxfp4_inputs(rng):
        codes, scales = mx.quantize(x, "mxfp4")
        ours = mx.dequantize(codes, scales)
        data = quants.quantize(x, Q.MXFP4)
        theirs = quants.dequantize(data, Q.MXFP4)
        ours_s = scales.view(np.uint8).reshape(-1)
        their_s = data.reshape(-1, 17)[:, 0]
        amax = np.abs(x.reshape(-1, 32)).max(axis=1)
        xb, ob, tb = x.reshape(-1, 32), ours.reshape(-1, 32), theirs.reshape(-1, 32)
        for j in range(ours_s.size):
            if ours_s[j] != their_s[j]:
                o, t = int(ours_s[j]), int(their_s[j])
                if log2_explains(amax[j], o, t):
                    counts["log2 blocks"] += 1
                elif wrap_explains(amax[j], o, t):
                    counts["wrap blocks"] += 1
                else:
                    raise AssertionError(f"block {j}: amax {amax[j]!r} ({float(amax[j]).hex()}): scale {o:#04x} "
                                         f"(qlinear) vs {t:#04x} (gguf), unexplained")
                continue
            for i in np.flatnonzero(~same_value(ob[j], tb[j])):
                assert tie_explains(xb[j, i], o := int(ours_s[j]) - 127, ob[j, i], tb[j, i]), (
                    f"block {j} element {i}: input {xb[j, i]!r}, scale 2^{o}: qlinear {ob[j, i]!r}, gguf {tb[j, i]!r}")
                counts["tie"] += 1
        counts["elements"] += x.size
    assert counts["elements"] > 10000
    assert counts["tie"] > 0 and counts["log2 blocks"] > 0 and counts["wrap blocks"] > 0, counts


def test_mxfp4_named_differences():
    """One block of each difference."""
    # A tie: 1.75 = midpoint of 1.5 and 2 (amax 4 -> X = 1): gguf 1.5 (toward zero), qlinear 2 (even).
    x = np.zeros((3, 32), F32)
    x[0, :2] = [4.0, 1.75]
    # amax = prev(2^10): float32 log2 gives exactly 10, so gguf's X is 2^8 where OCP's is 2^7.
    x[1, 0] = np.nextafter(F32(1024), F32(0))
    # amax = 2^-126: the biased exponent -126 - 2 + 127 = -1 wraps to 0xFF (gguf decodes it as 2^127).
    x[2, 0] = F32(2.0**-126)
    data = quants.quantize(x, Q.MXFP4)
    theirs = quants.dequantize(data, Q.MXFP4)
    codes, scales = mx.quantize(x, "mxfp4")
    ours = mx.dequantize(codes, scales)
    assert (theirs[0, 1], ours[0, 1]) == (1.5, 2.0)
    assert (data[1, 0], scales.view(np.uint8)[1, 0]) == (127 + 8, 127 + 7)
    assert (data[2, 0], scales.view(np.uint8)[2, 0]) == (0xFF, 0x00)
    assert theirs[2, 0] == 0 and ours[2, 0] == F32(2.0**-126)


def test_mxfp4_dequantizer_decodes_qlinear_codes():
    """qlinear's MXFP4 codes repacked into gguf's layout decode to the same float32 values under gguf's
    dequantizer: bit for bit, except that gguf has no -0 (its table's "-0" entry is 0, so -0 codes decode
    to +0)."""
    rng = np.random.default_rng(RNG_SEED + 1)
    cases = mxfp4_inputs(rng)
    # Every code with every finite scale byte (0x00 and 0x01 decode through gguf's subnormal special case;
    # 0xFE times 6 overflows to Inf in both).
    every = np.tile(np.arange(16, dtype=np.uint8), (255, 2)).view(ml_dtypes.float4_e2m1fn)
    every_scales = np.arange(255, dtype=np.uint8).reshape(255, 1).view(ml_dtypes.float8_e8m0fnu)
    pairs = [mx.quantize(x, "mxfp4", scale_rule=rule) for x in cases for rule in ex.RULES] + [(every, every_scales)]
    for codes, scales in pairs:
        ours = mx.dequantize(codes, scales)
        theirs = quants.dequantize(to_gguf_mxfp4(codes, scales), Q.MXFP4)
        assert theirs.dtype == F32 and theirs.shape == ours.shape
        bits_equal = ours.view(np.uint32) == theirs.view(np.uint32)
        negative_zero = (ours == 0) & np.signbit(ours) & (theirs == 0) & ~np.signbit(theirs)
        assert (bits_equal | negative_zero).all(), np.argwhere(~(bits_equal | negative_zero))[:4].tolist()


def test_gguf_codes_decode_the_same_in_qlinear():
    """The reverse: gguf's MXFP4 blocks, unpacked into qlinear's layout, decode to gguf's own values, except
    for 0xFF scales (only the exponent wrap makes them): gguf reads 0xFF as 2^127, E8M0 as NaN."""
    rng = np.random.default_rng(RNG_SEED + 2)
    for x in mxfp4_inputs(rng):
        data = quants.quantize(x, Q.MXFP4)
        codes, scales = from_gguf_mxfp4(data)
        theirs = quants.dequantize(data, Q.MXFP4)
        ours = mx.dequantize(codes, scales)
        nan_scale = np.repeat(scales.view(np.uint8) == 0xFF, 32, axis=-1)
        ok = (ours.view(np.uint32) == theirs.view(np.uint32)) | (ours == theirs)  # gguf's "-0" code is +0
        assert ok[~nan_scale].all()
        assert np.isnan(ours[nan_scale]).all()


# ---------------------------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------------------------
def test_nvfp4_has_no_gguf_quantizer():
    """gguf 0.19.0 has no NumPy NVFP4 quantizer (llama.cpp's is C only, and has no float32 tensor scale):
    only the dequantizer and the scale encoder are peers."""
    with pytest.raises(NotImplementedError):
        quants.quantize(np.ones((1, 64), F32), Q.NVFP4)


def test_nvfp4_dequantizer_decodes_qlinear_codes():
    """qlinear's NVFP4 codes and E4M3 block scales in gguf's layout decode, under gguf's dequantizer (which
    has no tensor scale), to what qlinear gives with a tensor scale of 1: codes * s8, bit for bit except
    -0 (gguf has none). Blocks whose scale is NaN (0x7F, gguf reads it as 0) are left out."""
    rng = np.random.default_rng(RNG_SEED + 3)
    xs = [random_rows(rng, 8, 128), rng.standard_normal((8, 64)).astype(F32) * F32(300)]
    x = random_rows(rng, 4, 64).astype(np.float64)
    x *= np.ldexp(1.0, rng.integers(-20, 1, (4, 1))) / np.abs(x).max(axis=1, keepdims=True)  # E4M3 subnormals
    xs.append(x.astype(F32))
    one = np.asarray(1.0, F32)
    for x in xs:
        codes, s, _ = mx.quantize(x, "nvfp4")
        ours = mx.dequantize(codes, s, global_scale=one)
        theirs = quants.dequantize(to_gguf_nvfp4(codes, s), Q.NVFP4)
        assert theirs.shape == ours.shape
        ok = (ours.view(np.uint32) == theirs.view(np.uint32)) | (ours == theirs)
        assert ok.all(), np.argwhere(~ok)[:4].tolist()
    # Every code with every non-negative, non-NaN E4M3 byte.
    codes = np.tile(np.arange(16, dtype=np.uint8), (127, 4)).view(ml_dtypes.float4_e2m1fn)
    s = np.repeat(np.arange(127, dtype=np.uint8)[:, None], 4, axis=1).view(ml_dtypes.float8_e4m3fn)
    ours = mx.dequantize(codes, s, global_scale=one)
    theirs = quants.dequantize(to_gguf_nvfp4(codes, s), Q.NVFP4)
    assert ((ours.view(np.uint32) == theirs.view(np.uint32)) | (ours == theirs)).all()


def ue4m3_difference(t: np.float32, ours: int, theirs: int) -> str | None:
    """Why ggml_fp32_to_ue4m3(t) differs from qlinear's E4M3 (nearest even, saturated at 448) of t >= 0."""
    q = ex.exact(t)
    lo = hi = None
    for (a, ca), (b, cb) in zip(ex.E4M3.grid, ex.E4M3.grid[1:]):
        if a <= q < b:
            lo, hi = (a, ca), (b, cb)
    if ours >= 0x78 and theirs == 0x7E:
        # ggml returns 0x7E once the E4M3 exponent field would be 15: every value that rounds to 256 or more
        # (from 248 on) becomes 448
        return "[248, 448) -> 448"
    if ex.TWO**-6 * (1 - ex.TWO**-4) <= q < ex.TWO**-6 and (ours, theirs) == (0x08, 0x07):  # [7.5, 8) * 2^-9
        return "subnormal clipped at 7"  # the subnormal path clips its mantissa at 7 instead of carrying to 0x08
    if lo is not None and q == (lo[0] + hi[0]) / 2 and (ours, theirs) == (lo[1], hi[1]):
        return "tie up"  # half up (adds the first dropped bit) where E4M3 rounds to even
    return None


def test_nvfp4_scale_encoder_against_block_scales():
    """ggml's UE4M3 encoder (gguf's NVFP4.fp32_to_ue4m3, what llama.cpp's NVFP4 quantizer applies to
    amax / 6) against qlinear's NVFP4 block scales on a tensor whose scale is exactly 1 (its maximum is
    2688), where qlinear's block scale is E4M3(float32(amax_b / 6)). Every difference explained: ties
    (ggml rounds half up), [248, 448) (everything that rounds to 256 or more becomes 448), and
    [7.5, 8) * 2^-9 (ggml's subnormal mantissa is clipped at 7 instead of carrying into 2^-6)."""
    rng = np.random.default_rng(RNG_SEED + 4)
    e4 = [v for v, _ in ex.E4M3.grid]
    targets = list(np.exp2(rng.uniform(-11, np.log2(448), 600)))
    targets += [float(a) for a in e4[1:]] + [float((a + b) / 2) for a, b in zip(e4[1:], e4[2:])]
    targets += list(rng.uniform(256, 448, 40)) + [float(a * 2.0**-9) for a in (7.25, 7.5, 7.75, 7.9999)]
    amax_b = np.asarray([F32(6 * t) for t in targets], F32)
    x = np.zeros((amax_b.size + 1, 16), F32)
    x[0, 0] = 2688.0
    x[1:, 0] = amax_b
    x[1:, 1] = -amax_b * F32(0.25)
    _, s, g = mx.quantize(x, "nvfp4")
    assert F32(g) == F32(1)
    t = (x[1:, 0] / F32(6)).astype(F32)  # llama.cpp: amax / 6.0f
    ours = s.view(np.uint8)[1:, 0]
    theirs = gguf.quants.NVFP4.fp32_to_ue4m3(t)
    counts: dict[str, int] = {}
    for i in np.flatnonzero(ours != theirs):
        why = ue4m3_difference(t[i], int(ours[i]), int(theirs[i]))
        assert why, f"t = {t[i]!r}: qlinear {ours[i]:#04x}, ggml {theirs[i]:#04x}, unexplained"
        counts[why] = counts.get(why, 0) + 1
    assert set(counts) == {"[248, 448) -> 448", "subnormal clipped at 7", "tie up"}, counts
    assert (ours == theirs).sum() > 500
