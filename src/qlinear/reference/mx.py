"""Microscaling (OCP MX v1.0) and NVFP4, transcribed in plain NumPy.

An MX block is 32 consecutive elements along one axis sharing a power-of-two scale X (an E8M0 byte:
2^(code - 127), 0xFF = NaN); each element is stored as P = V / X rounded to an element format. NVFP4
is float4 E2M1 elements in blocks of 16 sharing an E4M3 block scale, times one float32 tensor scale.

Every step is exact: block exponents come from the exponent bits (`np.frexp`), never from a float
log2 (float32 log2 rounds 2^k - 1 ulp up to k for 249 of 253 k); V / 2^e is exact in float64 and is
rounded to the element format once; NVFP4 codes are decided by exact comparisons with the midpoints.
These functions are the oracle `qlinear.kernels.mx` must equal bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .. import dtypes
from ..dtypes import ElementType
from .small_float import to_small_float

E8M0_MIN_EXPONENT = -127  # code 0x00
E8M0_MAX_EXPONENT = 127  # code 0xFE; 0xFF is NaN
E8M0_NAN = 0xFF


@dataclass(frozen=True)
class MXFormat:
    """One microscaling format.

    ``emax`` is the exponent of the element format's largest normal (the OCP rule subtracts it);
    ``mantissa_bits`` its explicit significand bits (6 for MXINT8: 1.f with 6 fraction bits, the
    implicit 2^-6); ``max_value`` its largest finite magnitude."""

    name: str
    element: ElementType
    block_size: int
    emax: int
    mantissa_bits: int
    max_value: float
    scale_type: ElementType

    @property
    def is_int(self) -> bool:
        return self.element.is_integer


def _mx(name: str, element: str, emax: int, mantissa_bits: int, max_value: float) -> MXFormat:
    return MXFormat(name, dtypes.get(element), 32, emax, mantissa_bits, max_value, dtypes.get("float8e8m0"))


FORMATS: dict[str, MXFormat] = {
    f.name: f
    for f in (
        _mx("mxfp8_e4m3", "float8e4m3fn", 8, 3, 448.0),
        _mx("mxfp8_e5m2", "float8e5m2", 15, 2, 57344.0),
        _mx("mxfp6_e3m2", "float6e3m2", 4, 2, 28.0),
        _mx("mxfp6_e2m3", "float6e2m3", 2, 3, 7.5),
        _mx("mxfp4", "float4e2m1", 2, 1, 6.0),
        _mx("mxint8", "int8", 0, 6, 127 / 64),
        MXFormat("nvfp4", dtypes.get("float4e2m1"), 16, 2, 1, 6.0, dtypes.get("float8e4m3fn")),
    )
}

SCALE_RULES = ("floor", "ceil", "even")
NVFP4_RULES = ("modelopt",)  # NVFP4's one alternative to its default (exact) rule
MXINT8_FRACTION_BITS = 6  # value = code * 2^-6 * X
NVFP4_GLOBAL_DIVISOR = np.float32(448.0 * 6.0)  # E4M3 max times E2M1 max


# ---------------------------------------------------------------------------------------------
# Blocks along the last axis
# ---------------------------------------------------------------------------------------------
def blocks(x: np.ndarray, block_size: int) -> np.ndarray:
    """x (..., K) as (..., ceil(K/bs), bs), the partial last block padded with zeros (zeros change no
    block maximum and their codes are dropped again by `unblocks`)."""
    k = x.shape[-1]
    n = -(-k // block_size)
    if n * block_size != k:
        pad = np.zeros(x.shape[:-1] + (n * block_size - k,), x.dtype)
        x = np.concatenate([x, pad], axis=-1)
    return x.reshape(x.shape[:-1] + (n, block_size))


def unblocks(b: np.ndarray, k: int) -> np.ndarray:
    # the explicit length, not -1: an array with no rows (shape (0, n, bs)) cannot infer it
    return b.reshape(b.shape[:-2] + (b.shape[-2] * b.shape[-1],))[..., :k]


def block_amax(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block: max |v| over the block (float32) and whether the block holds a NaN or an Inf."""
    finite = np.isfinite(b)
    bad = ~finite.all(axis=-1)
    amax = np.where(finite, np.abs(b), np.float32(0)).max(axis=-1)
    return amax.astype(np.float32), bad


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) for a > 0, exactly, from the exponent (frexp: a = m * 2^p, m in [0.5, 1))."""
    _, p = np.frexp(a.astype(np.float64))
    return p.astype(np.int64) - 1


def _ceil_log2(a: np.ndarray) -> np.ndarray:
    """ceil(log2(a)) for a > 0, exactly."""
    m, p = np.frexp(a.astype(np.float64))
    return p.astype(np.int64) - (m == 0.5)


# ---------------------------------------------------------------------------------------------
# MX: the shared exponent
# ---------------------------------------------------------------------------------------------
@np.errstate(all="ignore")
def shared_exponents(amax: np.ndarray, fmt: MXFormat, rule: str) -> np.ndarray:
    """The unbiased block exponent e (X = 2^e) for each block maximum, clamped to E8M0's range.

    - "floor" (OCP MX v1.0, Algorithm 1 of arXiv:2310.10537): e = floor(log2(amax)) - emax. The block
      maximum may clip (amax / X can reach just under 2^(emax+1), above the element's largest value).
    - "ceil" (cuBLAS's UE8M0 recipe, CUDA's e8m0 conversions, torchao RCEIL, triton ROUND_UP): the
      smallest power of two >= float32(amax / max_value), so the block maximum never clips. The
      quotient is rounded to float32 first, as those peers compute it (and as ONNX's
      Cast(Div(amax, max), to=FLOAT8E8M0, round_mode="up") does). One edge differs: a nonzero quotient at
      or below 2^-127 (a float32 subnormal) gets 2^-127 here, the exact power of two at or above it
      clamped to E8M0; the bit round-ups of onnx's Cast and triton add one to its zero exponent field
      (2^-126, code 0x01).
    - "even" (torchao EVEN): amax first rounded to the element's significand width (mantissa_bits + 1
      bits, halves rounded up), then floor: the maximum clips only when its rounded value would.
    An all-zero block gets e = -127 (code 0x00), as torchao and microxcaling give it.
    """
    amax = np.asarray(amax, np.float32)
    zero = amax == 0
    safe = np.where(zero, np.float32(1), amax)
    if rule == "floor":
        e = _floor_log2(safe) - fmt.emax
    elif rule == "ceil":
        quotient = safe / np.float32(fmt.max_value)  # float32 division, rounded to nearest even
        quotient = np.where(quotient == 0, np.float32(np.finfo(np.float32).smallest_subnormal), quotient)
        e = _ceil_log2(quotient)
    elif rule == "even":
        m, p = np.frexp(safe.astype(np.float64))
        # significand m in [0.5, 1) rounded to mantissa_bits + 1 bits, halves up: it becomes 1 (the next
        # binade) exactly when m >= 1 - 2^-(mantissa_bits + 2).
        carry = m >= 1.0 - 2.0 ** -(fmt.mantissa_bits + 2)
        e = p.astype(np.int64) - 1 + carry - fmt.emax
    else:
        raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {rule!r}")
    e = np.where(zero, E8M0_MIN_EXPONENT, e)
    return np.clip(e, E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT).astype(np.int64)


def e8m0_from_exponents(e: np.ndarray, nan: np.ndarray) -> np.ndarray:
    codes = np.where(nan, E8M0_NAN, e + 127).astype(np.uint8)
    return codes.view(ml_dtypes.float8_e8m0fnu)


def exponents_from_e8m0(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unbiased exponent, is NaN) of each E8M0 scale."""
    raw = np.asarray(scales).view(np.uint8).astype(np.int64)
    return raw - 127, raw == E8M0_NAN


@np.errstate(all="ignore")
def mx_elements(b: np.ndarray, e: np.ndarray, nan: np.ndarray, fmt: MXFormat) -> np.ndarray:
    """P = V / 2^e rounded to the element format (nearest, ties to even), clamped to +-max_value.

    V / 2^e is exact in float64 (V is float32, |e| <= 127), so there is one rounding. Elements of a
    block whose scale is NaN are stored as +0: the decoder makes every element of such a block NaN."""
    v = np.ldexp(b.astype(np.float64), -e[..., None])
    v = np.where(nan[..., None], 0.0, v)
    if fmt.is_int:
        steps = np.rint(v * 2.0**MXINT8_FRACTION_BITS)  # exact: a power-of-two multiple
        return np.clip(steps, -127, 127).astype(np.int8)
    return to_small_float(v, fmt.element, saturate=True)


def quantize_mx(x: np.ndarray, fmt: MXFormat, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """x (float32, blocks along the last axis) -> (codes, E8M0 scales)."""
    b = blocks(x, fmt.block_size)
    amax, nan = block_amax(b)
    e = shared_exponents(amax, fmt, rule)
    codes = unblocks(mx_elements(b, e, nan, fmt), x.shape[-1])
    return codes, e8m0_from_exponents(e, nan)


@np.errstate(all="ignore")
def dequantize_mx(codes: np.ndarray, scales: np.ndarray, fmt: MXFormat) -> np.ndarray:
    """value = P * 2^e (MXINT8: P * 2^-6 * 2^e), exact in float64 and rounded once to float32 (only an
    overflow past float32's range rounds: it becomes +-Inf, as the ONNX reference gives); a NaN scale
    makes the whole block NaN."""
    e, nan = exponents_from_e8m0(scales)
    k = codes.shape[-1]
    p = blocks(codes.astype(np.float64), fmt.block_size)
    if fmt.is_int:
        e = e - MXINT8_FRACTION_BITS
    y = np.ldexp(p, e[..., None])
    y = np.where(nan[..., None], np.nan, y)
    return unblocks(y, k).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------------------------
_E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MIDPOINTS = (_E2M1_MAGNITUDES[:-1] + _E2M1_MAGNITUDES[1:]) / 2  # 0.25, 0.75, ..., 5


@np.errstate(all="ignore")
def nvfp4_amax(x: np.ndarray, rule: str | None = None) -> np.float32:
    """The tensor maximum the tensor scale comes from: the largest finite magnitude (0 for none); "modelopt":
    max(|max x|, |min x|), as Model Optimizer's ``reduce_amax`` (a NaN anywhere makes it NaN, an Inf Inf)."""
    x = np.asarray(x, np.float32)
    if rule == "modelopt":
        if x.size == 0:
            return np.float32(0)
        return np.float32(np.maximum(np.abs(x.max()), np.abs(x.min())))
    finite = np.isfinite(x)
    return np.float32(np.abs(np.where(finite, x, np.float32(0))).max(initial=np.float32(0)))


@np.errstate(all="ignore")
def nvfp4_scale_from_amax(amax, rule: str | None = None) -> np.float32:
    """float32(amax / (448 * 6)); 1 when that is 0 (an all-zero tensor), except under "modelopt", which keeps
    the 0 (its block scales then come out NaN, and so its codes' values)."""
    g = np.float32(np.float32(amax) / NVFP4_GLOBAL_DIVISOR)
    return np.float32(1) if g == 0 and rule != "modelopt" else g


def nvfp4_global_scale(x: np.ndarray, rule: str | None = None) -> np.float32:
    """float32(amax / (448 * 6)) over the finite values (1 when that is 0: an all-zero tensor); ``rule``:
    see `nvfp4_amax` and `nvfp4_scale_from_amax`."""
    return nvfp4_scale_from_amax(nvfp4_amax(x, rule), rule)


@np.errstate(all="ignore")
def nvfp4_block_scales(amax: np.ndarray, nan: np.ndarray, g: np.float32) -> np.ndarray:
    """E4M3(amax_block / 6 / g), float32 arithmetic left to right (as torchao computes it), rounded to
    nearest even and saturated at 448; NaN for a block holding a NaN or an Inf."""
    s = (amax.astype(np.float32) / np.float32(6)) / np.float32(g)
    s = np.where(nan, np.float32(np.nan), np.minimum(s, np.float32(448)))
    return s.astype(ml_dtypes.float8_e4m3fn)


def nvfp4_effective_scales(block_scales: np.ndarray, g) -> np.ndarray:
    """float32(float32(block scale) * g): what DequantizeLinear(block scales, g) gives, i.e. the scale
    the float4 codes are multiplied by."""
    return (np.asarray(block_scales).astype(np.float32) * np.float32(g)).astype(np.float32)


@np.errstate(all="ignore")
def nvfp4_elements(b: np.ndarray, d: np.ndarray) -> np.ndarray:
    """E2M1 codes: |V| / d rounded to nearest, ties to even, saturated at 6, decided by exact
    comparisons of |V| with midpoint * d (each product has at most 3 + 24 significant bits, so it is
    exact in float64). A zero or NaN scale d gives +0 codes."""
    v = b.astype(np.float64)
    mag = np.abs(v)
    d = d.astype(np.float64)[..., None]
    index = np.zeros(b.shape, np.uint8)
    for k, midpoint in enumerate(_E2M1_MIDPOINTS):
        threshold = midpoint * d
        upper_even = (k + 1) % 2 == 0  # a tie goes to the even index (last significand bit 0)
        index += (mag > threshold) | ((mag == threshold) & upper_even)
    usable = (d > 0) & np.isfinite(d)
    sign = np.signbit(v) & usable
    index = np.where(usable, index, 0)
    bits = (sign.astype(np.uint8) << 3) | index
    return bits.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)


_MODELOPT_ODD_MIDPOINTS = np.array([0.75, 1.75, 3.5], np.float32)


@np.errstate(all="ignore")
def quantize_nvfp4_modelopt(x: np.ndarray, g=None) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """NVFP4 as TensorRT Model Optimizer 0.47.0 quantizes a weight (``NVFP4QTensor.quantize``, its PyTorch
    path, modelopt/torch/quantization/qtensor/nvfp4_tensor.py), step by step in float32:

        g     = float32(amax / 2688), amax = max(|max x|, |min x|)          (get_weights_scaling_factor_2)
        s     = block amax / float32(6 * g); 0 -> 1; clamped to [2^-9, 448]; to E4M3, nearest even
        d     = float32(float32(s) * g)
        q     = float32(x / d)
        code  = [q < 0] * 8 + #{midpoints m : m < |q|} + [|q| in {0.75, 1.75, 3.5}]   (_cast_fp4)

    So the code is decided on the rounded quotient q, not by exact comparison; -0.0 and quotients that
    underflow to -0.0 get +0; a partial last block is padded with zeros (reduce_block_padding), as here."""
    fmt = FORMATS["nvfp4"]
    x = np.asarray(x, np.float32)
    g = nvfp4_global_scale(x, "modelopt") if g is None else np.float32(g)
    b = blocks(x, fmt.block_size)
    amax = np.abs(b).max(axis=-1) if b.shape[-1] else np.zeros(b.shape[:-1], np.float32)
    s = amax.astype(np.float32) / np.float32(np.float32(6) * g)
    s = np.where(s == 0, np.float32(1), s)
    s = np.clip(s, np.float32(2.0**-9), np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    d = (s.astype(np.float32) * g).astype(np.float32)
    q = (b / d[..., None]).astype(np.float32)
    magnitude = np.abs(q)
    # searchsorted(midpoints, |q|): how many midpoints lie below |q| (a NaN sorts after them all: 7)
    index = sum((magnitude > m).astype(np.uint8) for m in _E2M1_MIDPOINTS.astype(np.float32))
    index = np.where(np.isnan(magnitude), np.uint8(7), index)
    index = index + ((magnitude == _MODELOPT_ODD_MIDPOINTS[0]) | (magnitude == _MODELOPT_ODD_MIDPOINTS[1])
                     | (magnitude == _MODELOPT_ODD_MIDPOINTS[2]))
    bits = ((q < 0).astype(np.uint8) << 3) | index.astype(np.uint8)
    codes = unblocks(bits.view(ml_dtypes.float4_e2m1fn), x.shape[-1])
    return codes, s, g


def quantize_nvfp4(x: np.ndarray, g=None, rule: str | None = None) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(codes, block scales, tensor scale); ``g``: the float32 tensor scale to use instead of x's own
    (`nvfp4_global_scale`), e.g. one calibrated on other data: block scales above 448 then saturate.
    ``rule="modelopt"``: `quantize_nvfp4_modelopt`."""
    if rule == "modelopt":
        return quantize_nvfp4_modelopt(x, g)
    fmt = FORMATS["nvfp4"]
    g = nvfp4_global_scale(x) if g is None else np.float32(g)
    b = blocks(x, fmt.block_size)
    amax, nan = block_amax(b)
    s = nvfp4_block_scales(amax, nan, g)
    d = nvfp4_effective_scales(s, g)
    codes = unblocks(nvfp4_elements(b, d), x.shape[-1])
    return codes, s, g


@np.errstate(all="ignore")
def dequantize_nvfp4(codes: np.ndarray, block_scales: np.ndarray, g) -> np.ndarray:
    """codes * float32(float32(block scale) * g), in float32: the two DequantizeLinear nodes."""
    d = nvfp4_effective_scales(block_scales, g)
    k = codes.shape[-1]
    p = blocks(codes.astype(np.float32), FORMATS["nvfp4"].block_size)
    return unblocks((p * d[..., None]).astype(np.float32), k)
