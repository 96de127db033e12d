"""qlinear_matmul with float8 a, b and/or y (QLinearMatMul-21): no peer computes these, so the oracles are
(a) an exact Fraction transcription of qlinear's documented semantics (docs/semantics.md, QLinearMatMul rows),
written here without qlinear's code, over every (a, b, y) type combination; (b) the real peers on a
DequantizeLinear -> DequantizeLinear -> MatMul -> QuantizeLinear model, with power-of-two scales and values
whose float32 sums are exact, where that model must equal QLinearMatMul bit for bit; (c) the numba kernel
against the exact-integer reference; (d) what the peers do with a float8 QLinearMatMul node; (e) errors."""

from __future__ import annotations

import bisect
import itertools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import qlinear.ops.qlinear_matmul as qmm_module
from qlinear.kernels import float8_gemm
from qlinear.ops.qlinear_matmul import qlinear_matmul
from qlinear.reference.matmul_float8 import matmul_accumulate_exact, requantize_to_output
from qlinear.reference.requantize import requantize_multiplier

f32, f16, bf16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
U8, S8 = np.dtype(np.uint8), np.dtype(np.int8)
E4M3FN, E4M3FNUZ = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz)
E5M2, E5M2FNUZ = np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.float8_e5m2fnuz)
FLOAT8 = (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ)
ALL_TYPES = (U8, S8) + FLOAT8
COMBOS = [c for c in itertools.product(ALL_TYPES, repeat=3) if any(t in FLOAT8 for t in c)]
SHORT = {U8: "u8", S8: "s8", E4M3FN: "e4m3fn", E4M3FNUZ: "e4m3fnuz", E5M2: "e5m2", E5M2FNUZ: "e5m2fnuz"}
ONNX_TYPE = {U8: TensorProto.UINT8, S8: TensorProto.INT8, E4M3FN: TensorProto.FLOAT8E4M3FN,
             E4M3FNUZ: TensorProto.FLOAT8E4M3FNUZ, E5M2: TensorProto.FLOAT8E5M2, E5M2FNUZ: TensorProto.FLOAT8E5M2FNUZ}
NAMES = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")


def combo_id(combo):
    return "-".join(SHORT[t] for t in combo)


# ----------------------------------------------------------------------------------------------------------
# The Fraction oracle: the documented semantics, transcribed with exact rationals.

def finite_magnitudes(dtype):
    """(value, code) of every finite non-negative value of a float8 type, in increasing order (= code order)."""
    values = np.arange(128, dtype=np.uint8).view(dtype).astype(np.float64)
    return [(Fraction(float(v)), code) for code, v in enumerate(values) if np.isfinite(v)]


TABLES = {t: finite_magnitudes(t) for t in FLOAT8}


def round_to_float8_code(x: Fraction, negative_zero: bool, dtype) -> int:
    """x rounded to nearest, ties to the even code, saturating to +/-max; returns the byte."""
    table = TABLES[dtype]
    magnitude = abs(x)
    if magnitude >= table[-1][0]:
        code = table[-1][1]
    else:
        values = [v for v, _ in table]
        i = bisect.bisect_right(values, magnitude) - 1  # values[i] <= magnitude < values[i + 1]
        (low, low_code), (high, high_code) = table[i], table[i + 1]
        if magnitude - low < high - magnitude:
            code = low_code
        elif magnitude - low > high - magnitude:
            code = high_code
        else:
            code = low_code if low_code % 2 == 0 else high_code
    has_negative_zero = dtype in (E4M3FN, E5M2)
    if code == 0:
        return 0x80 if (x < 0 or (x == 0 and negative_zero)) and has_negative_zero else 0
    return code | (0x80 if x < 0 else 0)


def as_fractions(values: np.ndarray) -> np.ndarray:
    """Exact values (ml_dtypes float8 or integers -> float64, exact) as an object array of Fractions."""
    return np.vectorize(lambda v: Fraction(float(v)), otypes=[object])(np.asarray(values).astype(np.float64))


def oracle_accumulator(a, a_zp, b, b_zp) -> np.ndarray:
    """The exact sum of the products (Fractions), each rounded to float64 by Fraction.__float__ (int / int:
    correctly rounded)."""
    exact = np.matmul(as_fractions(a) - as_fractions(a_zp), as_fractions(b) - as_fractions(b_zp))
    return np.vectorize(lambda v: float(Fraction(v)), otypes=[np.float64])(exact)


def oracle(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) -> np.ndarray:
    """Expected y as bytes (uint8 view) for spec-shaped finite arguments: a (..., M, K), b (..., K, N), a's
    parameters 0-d or (..., M, 1), b's 0-d, (N,) or (..., 1, N), y's 0-d."""
    exact = oracle_accumulator(a, a_zp, b, b_zp)
    # the multiplier in the scales' own type (NumPy / ml_dtypes arithmetic rounds each operation to it)
    multiplier = np.asarray(a_scale * b_scale / y_scale)
    exact, multiplier = np.broadcast_arrays(exact, multiplier)
    y_type = y_zp.dtype
    zero_point = Fraction(float(y_zp))
    out = np.empty(exact.shape, np.uint8)
    for index in np.ndindex(*exact.shape):
        acc = exact[index]
        v = float(Fraction(acc) * Fraction(float(multiplier[index])))
        v = float(Fraction(v) + zero_point) if v != 0 or zero_point != 0 else v + float(y_zp)
        if y_type in FLOAT8:
            out[index] = round_to_float8_code(Fraction(v), np.signbit(v), y_type)
        else:
            info = np.iinfo(y_type)
            q = min(max(round(Fraction(v)), info.min), info.max)  # round(): half to even
            out[index] = np.array(q).astype(y_type).view(np.uint8)
    return out


# ----------------------------------------------------------------------------------------------------------
# Random cases.

def finite_values(rng, dtype, shape, extremes=False):
    if dtype in FLOAT8:
        table = TABLES[dtype]
        if extremes:  # the largest and the smallest magnitudes, mixed
            picks = [table[1][1], table[2][1], table[-1][1], table[-2][1]]
            codes = rng.choice(picks, shape)
        else:
            codes = rng.choice([c for _, c in table], shape)
        signs = rng.integers(0, 2, shape) * 0x80
        result = (codes | signs).astype(np.uint8).view(dtype)
        if dtype in (E4M3FNUZ, E5M2FNUZ):  # 0x80 is their NaN: keep finite
            result = np.where(result.view(np.uint8) == 0x80, np.zeros((), dtype), result)
        return result
    info = np.iinfo(dtype)
    if extremes:
        return rng.choice([info.min, info.max], shape).astype(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def zero_points(rng, dtype, shape):
    if dtype in FLOAT8:  # must be 0; -0 (0x80) where the type has it
        signed = dtype in (E4M3FN, E5M2)
        return (rng.integers(0, 2, shape) * 0x80 * signed).astype(np.uint8).view(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def random_case(rng, combo, scale_type):
    """Arguments for qlinear_matmul and their spec-shaped form (the oracle's)."""
    a_t, b_t, y_t = combo
    m, k, n = (int(v) for v in rng.integers(1, 6, 3))
    k = int(rng.integers(0, 13)) if rng.integers(4) else k
    form = rng.choice(["2d", "batched", "broadcast", "vector_a", "vector_b"])
    a_shape, b_shape = {
        "2d": ((m, k), (k, n)),
        "batched": ((2, m, k), (2, k, n)),
        "broadcast": ((2, 1, m, k), (3, k, n)),
        "vector_a": ((k,), (2, k, n)),
        "vector_b": ((2, m, k), (k,)),
    }[form]
    extremes = rng.integers(4) == 0
    a = finite_values(rng, a_t, a_shape, extremes)
    b = finite_values(rng, b_t, b_shape, extremes)
    a2 = a[np.newaxis] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b
    # granularity: a per tensor / per row (M,) for 2-D a / (..., M, 1); b per tensor / (N,) / (..., 1, N)
    a_gran = "tensor" if a.ndim == 1 else rng.choice(["tensor", "row"])
    b_gran = "tensor" if b.ndim == 1 else rng.choice(["tensor", "column", "column_nd"])
    a_param = () if a_gran == "tensor" else ((m,) if a.ndim == 2 and rng.integers(2) else a.shape[:-1] + (1,))
    b_param = {"tensor": (), "column": (n,), "column_nd": b.shape[:-2] + (1, n)}[b_gran]
    a_zp, b_zp = zero_points(rng, a_t, a_param), zero_points(rng, b_t, b_param)
    a_scale = np.exp2(rng.uniform(-5, 2, a_param)).astype(scale_type)
    b_scale = np.exp2(rng.uniform(-5, 2, b_param)).astype(scale_type)
    # y_scale: a typical |acc * a_scale * b_scale| mapped near a random target in y's range
    a_c = a2.astype(np.float64) - (a_zp.reshape(-1, 1) if a_param == (m,) else a_zp).astype(np.float64)
    b_c = b2.astype(np.float64) - b_zp.astype(np.float64)
    sums = np.abs(np.matmul(a_c, b_c))
    typical = float(np.median(sums)) if sums.size else 0.0
    typical = typical if typical > 0 else 1.0
    top = float(ml_dtypes.finfo(y_t).max) if y_t in FLOAT8 else 127.0
    target = np.exp2(rng.uniform(-4, np.log2(top) + 1))
    y_scale = np.asarray(typical * float(np.mean(a_scale)) * float(np.mean(b_scale)) / target)
    # keep the multiplier finite in the scales' type: a_scale * b_scale <= 16
    low, high = (2.0**-10, 2.0**15) if scale_type == f16 else (2.0**-100, 2.0**100)
    y_scale = np.clip(y_scale, low, high).astype(scale_type)
    y_zp = zero_points(rng, y_t, ())
    args = (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    # spec-shaped: (M,) per row -> (M, 1); numpy.matmul drops M/N of a 1-D operand from the result
    a_scale_s, a_zp_s = (p.reshape(-1, 1) if a_param == (m,) else p for p in (a_scale, a_zp))
    shaped = (a2, a_scale_s, a_zp_s, b2, b_scale, b_zp, y_scale, y_zp)
    return args, shaped, (a.ndim == 1, b.ndim == 1)


def drop_vector_axes(expected, vectors):
    a_vector, b_vector = vectors
    if b_vector:
        expected = expected[..., 0]
    if a_vector:
        expected = expected[..., 0, :] if not b_vector else expected[..., 0]
    return expected


def seeded_cases(seeds_per_combo):
    for combo in COMBOS:
        for seed in range(seeds_per_combo):
            yield pytest.param(combo, seed, id=f"{combo_id(combo)}-{seed}")


@pytest.mark.parametrize("combo,seed", list(seeded_cases(2)))
def test_matches_exact_fraction_oracle_and_the_reference(combo, seed, monkeypatch):
    """(a) every type combination with a float8 in it, random shapes/batches/granularities/scale types,
    against the Fraction oracle; (c) the kernel path (the reference patched out of the op) equals the
    exact-integer reference bit for bit."""
    rng = np.random.default_rng([COMBOS.index(combo), seed])
    scale_type = (f32, f16, bf16)[seed % 3 if COMBOS.index(combo) % 2 else (seed + 1) % 3]
    args, shaped, vectors = random_case(rng, combo, scale_type)

    def reference_called(*_):
        raise AssertionError("the op must run the kernel, not the reference")

    assert float8_gemm.HAVE_NUMBA
    monkeypatch.setattr(qmm_module, "matmul_accumulate_exact", reference_called)
    got = qlinear_matmul(*args)
    assert got.dtype == combo[2]
    expected = drop_vector_axes(oracle(*shaped), vectors)
    np.testing.assert_array_equal(got.view(np.uint8), expected, strict=True)

    a2, a_s, a_zp, b2, b_s, b_zp, y_s, y_zp = shaped
    reference_acc = matmul_accumulate_exact(a2, a_zp, b2, b_zp)
    kernel_acc = float8_gemm.exact_matmul(
        a2.astype(np.float64) - a_zp.astype(np.float64), b2.astype(np.float64) - b_zp.astype(np.float64),
        sum(int(-np.log2(float(ml_dtypes.finfo(t).smallest_subnormal))) for t in (a2.dtype, b2.dtype) if t in FLOAT8))
    exact_acc = oracle_accumulator(a2, a_zp, b2, b_zp)
    np.testing.assert_array_equal(reference_acc, exact_acc, strict=True)
    np.testing.assert_array_equal(kernel_acc, exact_acc, strict=True)
    reference = requantize_to_output(reference_acc, requantize_multiplier(a_s, b_s, y_s, "float64"), y_zp)
    np.testing.assert_array_equal(got.view(np.uint8), drop_vector_axes(reference, vectors).view(np.uint8), strict=True)


@pytest.mark.parametrize("combo", [(E5M2, E5M2FNUZ, E4M3FN), (S8, E4M3FNUZ, U8), (E5M2, U8, E5M2)], ids=combo_id)
def test_without_numba_the_op_uses_the_reference(combo, monkeypatch):
    rng = np.random.default_rng(COMBOS.index(combo) + 1000)
    args, _, _ = random_case(rng, combo, f32)
    with_kernel = qlinear_matmul(*args)
    monkeypatch.setattr(float8_gemm, "HAVE_NUMBA", False)
    monkeypatch.setattr(float8_gemm, "exact_matmul", None)  # would fail if called
    np.testing.assert_array_equal(qlinear_matmul(*args).view(np.uint8), with_kernel.view(np.uint8), strict=True)


E5M2_MAX = 57344.0


@pytest.mark.parametrize("dtype", [E5M2, E5M2FNUZ])
def test_e5m2_extremes_need_the_exact_sum(dtype):
    """57344^2 + 2^-32 (or 2^-34) - 57344^2: a float64 sum in k order loses the tiny product; the exact sum
    keeps it, and a 2^16 x 2^16 multiplier makes it visible."""
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    a = np.array([[E5M2_MAX, tiny, -E5M2_MAX]], dtype)
    b = np.array([[E5M2_MAX], [tiny], [E5M2_MAX]], dtype)
    naive = a.astype(np.float64) @ b.astype(np.float64)
    assert naive[0, 0] == 0.0  # the float64 sum is wrong
    exact = Fraction(tiny) ** 2
    assert matmul_accumulate_exact(a, np.zeros((), dtype), b, np.zeros((), dtype))[0, 0] == float(exact)
    zero = np.zeros((), dtype)
    scale = f32.type(2.0**17 if dtype == E5M2FNUZ else 2.0**16)
    for y_zp in (np.zeros((), E4M3FN), np.uint8(10)):
        got = qlinear_matmul(a, scale, zero, b, scale, zero, f32.type(1.0), y_zp)
        shaped = (a, scale, zero, b, scale, zero, f32.type(1.0), np.asarray(y_zp))
        np.testing.assert_array_equal(got.view(np.uint8), oracle(*shaped), strict=True)
        assert float(got[0, 0]) == (1.0 if y_zp.dtype == E4M3FN else 11.0)


@pytest.mark.parametrize("y_t", [E4M3FN, E4M3FNUZ])
def test_output_is_rounded_once(y_t):
    """acc = 1.1875 - 2^-32 (exact in float64): rounded to float32 first it would be the e4m3 tie 1.1875 and
    go to 1.25 (ml_dtypes' float64 astype does that); rounded once it is 1.125."""
    tiny = 2.0**-16
    a = np.array([[1.0, 0.1875, -tiny]], E5M2)
    b = np.array([[1.0], [1.0], [tiny]], E5M2)
    zero = np.zeros((), E5M2)
    args = (a, f32.type(1.0), zero, b, f32.type(1.0), zero, f32.type(1.0), np.zeros((), y_t))
    assert float(np.float64(1.1875 - 2.0**-32).astype(y_t)) == 1.25  # the double rounding avoided
    got = qlinear_matmul(*args)
    assert float(got[0, 0]) == 1.125
    np.testing.assert_array_equal(got.view(np.uint8), oracle(*args[:7], np.asarray(args[7])), strict=True)


@pytest.mark.parametrize("dtype", [E5M2, E5M2FNUZ, E4M3FN])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_longest_allowed_k_is_exact_and_one_more_is_refused(dtype, sign):
    """At K = max_depth the accumulator's integer part is near 2^53: still exact (Fraction oracle).
    The first and last products are the smallest subnormal's square and its negative, plus a 0.5."""
    depth = float8_gemm.max_depth(dtype, dtype)
    if dtype == E4M3FN:
        depth = 3_000_000  # its limit (~4e10) is out of reach; a long K all the same
    top, tiny = float(ml_dtypes.finfo(dtype).max), float(ml_dtypes.finfo(dtype).smallest_subnormal)
    a = np.full((1, depth), sign * top, dtype)
    b = np.full((depth, 1), top, dtype)
    a[0, :3] = [tiny, 0.5, -tiny]
    b[:3, 0] = [tiny, 1.0, tiny * 2]
    exact = Fraction(sign * top) * Fraction(top) * (depth - 3) + Fraction(tiny) ** 2 + Fraction(1, 2) - 2 * Fraction(tiny) ** 2
    zero = np.zeros((), dtype)
    got = float8_gemm.exact_matmul(a.astype(np.float64), b.astype(np.float64), 2 * int(-np.log2(tiny)))
    assert got[0, 0] == float(exact)
    y = qlinear_matmul(a, f32.type(1.0), zero, b, f32.type(1.0), zero, f32.type(2.0**40), np.zeros((), E5M2))
    assert y.view(np.uint8)[0, 0] == round_to_float8_code(Fraction(float(Fraction(float(exact)) / 2**40)), False, E5M2)
    if dtype != E4M3FN:
        longer = np.zeros((depth + 1, 1), dtype)
        with pytest.raises(ValueError, match=rf"qlinear_matmul: K = {depth + 1} is too long for the exact float8 "
                                             rf"accumulator of {dtype} x {dtype} \(at most {depth}\)"):
            qlinear_matmul(np.zeros((1, depth + 1), dtype), 1.0, None, longer, 1.0, None, 1.0, np.uint8(0))


def test_one_accumulator_rounds_its_int64_once_to_nearest_even():
    """e4m3fn x e4m3fn (L = 18): 171200 products 448 * 448 are 2^53 + 192 * 2^30 units of 2^-18, then column j
    adds j % 8 units (2^-9 * 2^-9 each): above 2^53 float64 keeps even units only, so 1 and 5 are ties
    (down to even), 3 and 7 ties up, 2 and 6 exact. The one-accumulator kernel (an int64 rounded once to
    float64) and the split one must both give the correctly rounded sum."""
    big, extra = 171_200, 8
    top, tiny = 448.0, 2.0**-9
    a = np.concatenate([np.full(big, top), np.full(extra, tiny)]).reshape(1, -1).astype(E4M3FN)
    units = np.arange(16) % 8
    b = np.zeros((big + extra, 16))
    b[:big] = top
    b[big:] = np.where(np.arange(extra)[:, None] < units[None, :], tiny, 0.0)
    b = b.astype(E4M3FN)
    assert big + extra <= float8_gemm.single_accumulator_depth(E4M3FN, E4M3FN)
    exact = [Fraction(top) ** 2 * big + Fraction(tiny) ** 2 * int(u) for u in units]
    assert big * 448 * 448 * 2**18 == 2**53 + 192 * 2**30
    expected = np.array([[float(v) for v in exact]])
    for split in (False, True):
        got = float8_gemm.exact_matmul(a.astype(np.float64), b.astype(np.float64), 18, split=split)
        np.testing.assert_array_equal(got, expected, strict=True)
    # and through the op, which picks one accumulator here: y = acc * 2^-20 rounded to e5m2
    y = qlinear_matmul(a, f32.type(1.0), np.zeros((), E4M3FN), b, f32.type(1.0), np.zeros((), E4M3FN),
                       f32.type(2.0**20), np.zeros((), E5M2))
    np.testing.assert_array_equal(y.view(np.uint8)[0], [round_to_float8_code(Fraction(v) / 2**20, False, E5M2) for v in expected[0]])


# ----------------------------------------------------------------------------------------------------------
# NaN and Inf (IEEE): the kernel against the reference and the documented outcomes.

def test_non_finite_operands_kernel_equals_reference_and_ieee():
    rng = np.random.default_rng(11)
    for a_t, b_t in itertools.product(ALL_TYPES, FLOAT8):
        for y_t in (E4M3FN, E5M2FNUZ, S8, U8):
            a = rng.integers(0, 256, (2, 3, 9), dtype=np.uint8)
            a = a.view(a_t) if a_t in FLOAT8 else a.astype(a_t)
            b = rng.integers(0, 256, (9, 4), dtype=np.uint8).view(b_t)  # every code, NaN/Inf included
            zero_a, zero_b = np.zeros((), a_t), np.zeros((), b_t)
            acc = matmul_accumulate_exact(a, zero_a, b, zero_b)
            fast = float8_gemm.exact_matmul(a.astype(np.float64), b.astype(np.float64),
                                            (int(-np.log2(float(ml_dtypes.finfo(a_t).smallest_subnormal))) if a_t in FLOAT8 else 0)
                                            + int(-np.log2(float(ml_dtypes.finfo(b_t).smallest_subnormal))))
            np.testing.assert_array_equal(fast, acc, strict=True)  # NaN positions and Inf signs included
            y_zp = np.zeros((), y_t)
            expected = requantize_to_output(acc, requantize_multiplier(f32.type(0.5), f32.type(0.25), f32.type(3.0), "float64"), y_zp)
            got = qlinear_matmul(a, f32.type(0.5), zero_a, b, f32.type(0.25), zero_b, f32.type(3.0), y_zp)
            np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8), strict=True)


NAN_CODE = {E4M3FN: 0x7F, E4M3FNUZ: 0x80, E5M2: 0x7E, E5M2FNUZ: 0x80}


@pytest.mark.parametrize("y_t", [E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, S8, U8], ids=lambda t: SHORT[t])
def test_nan_and_infinity_outcomes(y_t):
    """NaN operand -> NaN; Inf * 0 -> NaN; Inf - Inf -> NaN; +/-Inf alone -> +/-Inf, saturated. A float8 y
    gets the type's positive NaN and +/-max; an integer y gets the type minimum for NaN and saturates Inf."""
    inf, nan = np.inf, np.nan
    a = np.array([[1.0, 2.0], [inf, 1.0], [inf, inf], [-inf, 2.0], [nan, 0.0], [-nan, 1.0]], E5M2)
    b = np.array([[1.0], [-1.0]], E5M2)
    b0 = np.array([[1.0], [0.0]], E5M2)  # Inf * 0 in row 2
    zero = np.zeros((), E5M2)
    y_zp = np.zeros((), y_t)
    run = lambda bb: qlinear_matmul(a, f32.type(1.0), zero, bb, f32.type(1.0), zero, f32.type(1.0), y_zp)[:, 0]
    got, got0 = run(b), run(b0)
    if y_t in FLOAT8:
        top = TABLES[y_t][-1][1]
        nan_code = NAN_CODE[y_t]
        assert list(got.view(np.uint8)) == [round_to_float8_code(Fraction(-1), False, y_t), top, nan_code, 0x80 | top, nan_code, nan_code]
        assert list(got0.view(np.uint8)[:3]) == [round_to_float8_code(Fraction(1), False, y_t), top, nan_code]
    else:
        info = np.iinfo(y_t)
        assert list(got) == [max(-1, info.min), info.max, info.min, info.min, info.min, info.min]
        assert list(got0[:3]) == [1, info.max, info.min]


# ----------------------------------------------------------------------------------------------------------
# (b) A real peer: DequantizeLinear -> DequantizeLinear -> MatMul -> QuantizeLinear with exact float32 sums.

# onnxruntime's Python binding takes no float8 arrays as inputs (it returns float8 outputs as uint8 bytes), so
# every tensor is an initializer and the graph's one input is the per-tensor a_scale (float32).

def qdq_model(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp, a_axis=None, b_axis=None):
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in
             (("a", a), ("a_zero_point", a_zp), ("b", b), ("b_scale", b_scale), ("b_zero_point", b_zp),
              ("y_scale", y_scale), ("y_zero_point", y_zp))]
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "a_scale", "a_zero_point"], ["a_float"], **({} if a_axis is None else {"axis": a_axis})),
        helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zero_point"], ["b_float"], **({} if b_axis is None else {"axis": b_axis})),
        helper.make_node("MatMul", ["a_float", "b_float"], ["product"]),
        helper.make_node("QuantizeLinear", ["product", "y_scale", "y_zero_point"], ["y"]),
        # y's values as float32: onnxruntime's binding cannot return the fnuz types
        helper.make_node("DequantizeLinear", ["y", "unit", "y_zero_point"], ["y_value"]),
    ]
    inits.append(numpy_helper.from_array(np.ones((), np.float32), "unit"))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", ONNX_TYPE[np.asarray(y_zp).dtype], None),
                               helper.make_tensor_value_info("y_value", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def run_reference(model, a_scale, output="y"):
    """The onnx reference evaluator's output (the graph input is a_scale)."""
    return np.asarray(ReferenceEvaluator(model).run([output], {"a_scale": np.asarray(a_scale, np.float32)})[0])


def run_onnxruntime(model, a_scale, output="y"):
    """onnxruntime's output, one thread (an e4m3fn output comes back as uint8 bytes)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run([output], {"a_scale": np.asarray(a_scale, np.float32)})[0])


def test_exact_zero_sum_is_positive_zero():
    """Real arithmetic has no -0: an exact zero accumulator is +0. The reference evaluator's float32 MatMul
    keeps the sign of a single -0 product (K = 1: 0 * -1), onnxruntime's gives +0; both give +0 for K = 2."""
    zero = np.zeros((), E4M3FN)
    for k, reference_byte in ((1, 0x80), (2, 0x00)):
        a = np.zeros((1, k), E4M3FN)
        b = np.full((k, 1), -1.0, E4M3FN)
        args = (a, f32.type(1.0), zero, b, f32.type(1.0), zero, f32.type(1.0), zero)
        model = qdq_model(*args)
        assert run_reference(model, 1.0).view(np.uint8)[0, 0] == reference_byte
        assert run_onnxruntime(model, 1.0).view(np.uint8)[0, 0] == 0x00
        assert qlinear_matmul(*args).view(np.uint8)[0, 0] == 0x00
        # a -0 y_zero_point adds to +0 as IEEE says: still +0
        assert qlinear_matmul(*args[:7], np.array(0x80, np.uint8).view(E4M3FN)).view(np.uint8)[0, 0] == 0x00


def bounded_values(rng, dtype, shape):
    """Non-zero values whose products and sums stay exact in float32: float8 magnitudes in [1/8, 16),
    integers of the full range. (No zeros: a sum of -0 products is -0 in float32, +0 here; see
    test_exact_zero_sum_is_positive_zero.)"""
    if dtype in FLOAT8:
        codes = [c for v, c in TABLES[dtype] if Fraction(1, 8) <= v < 16]
        signs = rng.integers(0, 2, shape) * 0x80
        return (rng.choice(codes, shape) | signs).astype(np.uint8).view(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_matches_both_peers_on_a_dequantize_matmul_quantize_model(combo):
    """With power-of-two float32 scales and |sums| < 2^12 on a 2^-12 grid (K <= 16), every float32 operation
    of the model is exact except QuantizeLinear's rounding, which is QLinearMatMul's single final rounding."""
    a_t, b_t, y_t = combo
    rng = np.random.default_rng(COMBOS.index(combo))
    m, k, n = 3, int(rng.integers(1, 17)), 4
    batched = bool(rng.integers(2))
    a = bounded_values(rng, a_t, (2, m, k) if batched else (m, k))
    b = bounded_values(rng, b_t, (k, n))
    per_column = not batched and bool(rng.integers(2))
    a_zp = zero_points(rng, a_t, ())
    if a_t in FLOAT8:
        a_zp = np.zeros((), a_t)  # onnxruntime's DequantizeLinear takes +0 only
    b_zp = np.zeros((n,) if per_column else (), b_t) if b_t in FLOAT8 else zero_points(rng, b_t, (n,) if per_column else ())
    a_scale = f32.type(2.0 ** int(rng.integers(-3, 3)))
    b_scale = np.exp2(rng.integers(-3, 3, (n,) if per_column else ())).astype(f32)
    a_c = a.astype(np.float64) - a_zp.astype(np.float64)
    b_c = b.astype(np.float64) - b_zp.astype(np.float64)
    largest = float(np.max(np.abs(a_c @ b_c))) * float(a_scale) * float(np.max(b_scale)) or 1.0
    top = float(ml_dtypes.finfo(y_t).max) if y_t in FLOAT8 else 100.0
    y_scale = f32.type(2.0 ** np.ceil(np.log2(largest / top) + rng.integers(-1, 3)))
    # an even integer zero point: with an odd one QuantizeLinear's round-then-add and QLinearMatMul's
    # add-then-round differ on ties (test_odd_zero_point_ties_follow_qlinear_matmul_not_quantize_linear)
    y_zp = np.zeros((), y_t) if y_t in FLOAT8 else (zero_points(rng, y_t, ()).view(np.uint8) & 0xFE).view(y_t)
    args = (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    model = qdq_model(*args, b_axis=1 if per_column else None)
    got = qlinear_matmul(*args)
    np.testing.assert_array_equal(got.view(np.uint8), run_reference(model, a_scale).view(np.uint8), strict=True)
    if y_t in FLOAT8:  # onnxruntime's binding returns no float8 outputs but e4m3fn's bytes: compare values
        onnxruntime = run_onnxruntime(model, a_scale, "y_value")
        expected = got.astype(np.float32)
        np.testing.assert_array_equal(onnxruntime, expected, strict=True)
        np.testing.assert_array_equal(np.signbit(onnxruntime), np.signbit(expected), strict=True)
    else:
        np.testing.assert_array_equal(got, run_onnxruntime(model, a_scale), strict=True)


def test_odd_zero_point_ties_follow_qlinear_matmul_not_quantize_linear():
    """An integer y adds y_zero_point before rounding, as the onnx reference's QLinearMatMul does (and qlinear's
    int8 path): 4.5 + 69 = 73.5 -> 74. A DequantizeLinear/MatMul/QuantizeLinear model rounds first: 4 + 69 = 73."""
    a = np.array([[1.5]], E4M3FN)
    b = np.array([[3]], np.int8)
    args = (a, f32.type(1.0), np.zeros((), E4M3FN), b, f32.type(1.0), np.int8(0), f32.type(1.0), np.int8(69))
    model = qdq_model(*args)
    assert run_reference(model, 1.0)[0, 0] == 73 and run_onnxruntime(model, 1.0)[0, 0] == 73
    assert qlinear_matmul(*args)[0, 0] == 74
    # the same tie with integer operands: the onnx reference's QLinearMatMul gives 74 like qlinear
    int_args = (np.array([[3]], np.uint8), f32.type(0.5), np.uint8(0)) + args[3:]
    model = qlinear_matmul_model(int_args)
    assert run_reference(model, int_args[1])[0, 0] == 74 == qlinear_matmul(*int_args)[0, 0]


# ----------------------------------------------------------------------------------------------------------
# (d) The peers on a QLinearMatMul-21 node with float8 types.

def qlinear_matmul_model(args):
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in zip(NAMES, args) if name != "a_scale"]
    node = helper.make_node("QLinearMatMul", list(NAMES), ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", ONNX_TYPE[args[7].dtype], None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("combo", [(E4M3FN, E4M3FN, E4M3FN), (U8, U8, E5M2), (S8, E4M3FNUZ, U8), (E5M2FNUZ, U8, S8),
                                   (E5M2, E5M2, U8)], ids=combo_id)
def test_peers_do_not_compute_float8_qlinear_matmul(combo):
    """onnxruntime: NOT_IMPLEMENTED for every float8 combination. onnx reference: np.iinfo of a float8 y
    fails ("Invalid integer data type"); a float8 a/b with an integer y is cast to int32, truncating
    the values (1.5 -> 1, 0.5 -> 0), so its result is wrong."""
    a_t, b_t, y_t = combo
    a = np.array([[1.5, 2.0, 0.5]]).astype(a_t) if a_t in FLOAT8 else np.array([[1, 2, 3]], a_t)
    b = np.array([[0.5], [3.0], [1.5]]).astype(b_t) if b_t in FLOAT8 else np.array([[4], [5], [6]], b_t)
    args = (a, f32.type(0.5), np.zeros((), a_t), b, f32.type(1.0), np.zeros((), b_t), f32.type(0.25), np.zeros((), y_t))
    model = qlinear_matmul_model(args)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED : Could not find an implementation for QLinearMatMul"):
        run_onnxruntime(model, args[1])
    ours = qlinear_matmul(*args)
    if y_t in FLOAT8:
        with pytest.raises(ValueError, match="Invalid integer data type"):
            run_reference(model, args[1])
        return
    truncated = np.matmul(a.astype(np.float64).astype(np.int32), b.astype(np.float64).astype(np.int32)) * 2.0
    info = np.iinfo(y_t)
    expected_reference = np.clip(np.rint(truncated), info.min, info.max).astype(y_t)
    reference = run_reference(model, args[1])
    np.testing.assert_array_equal(reference, expected_reference, strict=True)
    assert np.any(reference != ours)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64)) * 2.0
    np.testing.assert_array_equal(ours, np.clip(np.rint(exact), info.min, info.max).astype(y_t), strict=True)


# ----------------------------------------------------------------------------------------------------------
# (e) Errors.

def _valid(a_t=E4M3FN, b_t=E5M2, y_t=E4M3FNUZ):
    return dict(a=np.zeros((2, 3, 4), a_t), a_scale=f32.type(0.1), a_zero_point=np.zeros((), a_t),
                b=np.zeros((4, 5), b_t), b_scale=np.full(5, 0.1, f32), b_zero_point=np.zeros(5, b_t),
                y_scale=f32.type(0.2), y_zero_point=np.zeros((), y_t))


ERRORS = [
    ({"a_zero_point": np.ones((), E4M3FN)}, ValueError, r"qlinear_matmul: a_zero_point of a float8 a must be 0 \(\+0 or -0\), got 1.0"),
    ({"b_zero_point": np.array([0, 0, 0.5, 0, 0], E5M2)}, ValueError, r"qlinear_matmul: b_zero_point of a float8 b must be 0"),
    ({"b_zero_point": np.full(5, np.nan, E5M2)}, ValueError, r"qlinear_matmul: b_zero_point of a float8 b must be 0"),
    ({"y_zero_point": np.full((), 2, E4M3FNUZ)}, ValueError, r"qlinear_matmul: y_zero_point of a float8 y must be 0 \(\+0 or -0\), got 2.0"),
    ({"a_zero_point": 3}, ValueError, r"qlinear_matmul: a_zero_point of a float8 a must be 0 \(\+0 or -0\), got 3"),
    ({"a_zero_point": 0.0}, TypeError, r"qlinear_matmul: a_zero_point must be a numpy array of float8_e4m3fn \(the type of a\), got float"),
    ({"a_zero_point": np.zeros((), E5M2)}, TypeError, r"qlinear_matmul: a_zero_point must have the dtype of a \(float8_e4m3fn\), got float8_e5m2"),
    ({"requantize": "float32"}, ValueError,
     r"qlinear_matmul: requantize='float32' is not defined with a float8 a \(float8_e4m3fn\): "
     r"no runtime but the onnx reference implements a float8 QLinearMatMul; use requantize='float64'"),
    ({"requantize": "tflite"}, ValueError, r"requantize='tflite' is not defined with a float8 a"),
    ({"a": np.zeros((2, 3, 4), np.uint8), "a_zero_point": np.uint8(0), "requantize": "float32"}, ValueError,
     r"requantize='float32' is not defined with a float8 b \(float8_e5m2\)"),
    ({"a": np.zeros((2, 3, 4), np.uint8), "a_zero_point": np.uint8(0), "b": np.zeros((4, 5), np.int8),
      "b_zero_point": np.zeros(5, np.int8), "requantize": "float32"}, ValueError,
     r"requantize='float32' is not defined with a float8 y_zero_point \(float8_e4m3fnuz\)"),
    ({"opset": 10}, TypeError,
     r"qlinear_matmul: float8 a \(float8_e4m3fn\) needs QLinearMatMul-21 \(opset >= 21\); QLinearMatMul-10 allows uint8 or int8, got opset 10"),
    ({"y_zero_point": 0.0}, TypeError, r"qlinear_matmul: y_zero_point must be a numpy array of uint8 or int8 or float8_e4m3fn"),
    ({"y_zero_point": np.zeros((), ml_dtypes.float8_e8m0fnu)}, TypeError, r"qlinear_matmul: y_zero_point must have dtype uint8 or int8 or float8"),
    ({"a_zero_point": np.zeros(3, E4M3FN)}, ValueError, r"qlinear_matmul: a_zero_point must be a scalar \(per tensor\) or per row of a"),
    # valid: None and Python 0 zero points, -0 zero points
    ({"a_zero_point": None, "b_zero_point": 0}, None, None),
    ({"a_zero_point": np.array(0x80, np.uint8).view(E4M3FN), "b_zero_point": np.full(5, 0x80, np.uint8).view(E5M2)}, None, None),
]


@pytest.mark.parametrize("change,error,message", ERRORS, ids=[str(m)[:60] for _, _, m in ERRORS])
def test_argument_errors(change, error, message):
    kwargs = {**_valid(), **change}
    if error is None:
        assert np.all(qlinear_matmul(**kwargs).astype(np.float64) == 0)
        return
    with pytest.raises(error, match=message):
        qlinear_matmul(**kwargs)
