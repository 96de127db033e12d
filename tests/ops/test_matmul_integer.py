"""matmul_integer (ONNX MatMulInteger-10): differential tests against the int64 NumPy reference, the onnx
reference evaluator and onnxruntime; full-range int8; overflow; argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from qlinear.ops._quant_args import AccumulatorOverflowError
from qlinear.ops.qlinear_matmul import matmul_integer
from qlinear.reference.matmul import matmul_accumulate

from ._conv_family_cases import matmul_cases
from ._conv_family_peers import cpu_has_vnni, make_model, onnxruntime_exact_for_weights, run_onnxruntime, run_reference
from suite import examples

U8, S8 = np.dtype(np.uint8), np.dtype(np.int8)


def spec_zero_points(case):
    """An (M,) per-row vector of a 2-D A means (M, 1) (the spec's text); numpy would broadcast it along K."""
    a_zp = case.a_zero_point.reshape(-1, 1) if case.a_granularity == "row-vector" else case.a_zero_point
    return a_zp, case.b_zero_point


def model_of(a, b, a_zp, b_zp):
    return make_model("MatMulInteger", [("A", a), ("B", b), ("a_zero_point", a_zp), ("b_zero_point", b_zp)], [np.int32], 10)


@settings(max_examples=examples(100))
@given(case=matmul_cases())
def test_matches_int64_reference_transcription(case):
    a_zp, b_zp = spec_zero_points(case)
    expected = matmul_accumulate(case.a, a_zp, case.b, b_zp).astype(np.int32)
    np.testing.assert_array_equal(matmul_integer(case.a, case.b, case.a_zero_point, case.b_zero_point), expected, strict=True)


@settings(max_examples=examples(200))
@given(case=matmul_cases())
def test_matches_onnx_reference_evaluator(case):
    a_zp, b_zp = spec_zero_points(case)
    expected = run_reference(model_of(case.a, case.b, a_zp, b_zp), case.a)[0]
    np.testing.assert_array_equal(matmul_integer(case.a, case.b, case.a_zero_point, case.b_zero_point), expected, strict=True)


@settings(max_examples=examples(200))
@given(case=matmul_cases(a_granularities=("tensor",), b_granularities=("tensor", "column-exact")))
def test_matches_onnxruntime(case):
    """onnxruntime implements every type pair; a per-tensor a_zero_point; b's per tensor or b.shape[:-2] + (1, N)."""
    if not onnxruntime_exact_for_weights(case.b, case.a.dtype):
        return
    expected = run_onnxruntime(model_of(case.a, case.b, case.a_zero_point, case.b_zero_point), case.a)[0]
    np.testing.assert_array_equal(matmul_integer(case.a, case.b, case.a_zero_point, case.b_zero_point), expected, strict=True)


def test_onnxruntime_full_range_int8_weights_large():
    """The survey's shape, 3136x576x64 u8 x s8: onnxruntime without VNNI was wrong on nearly every output;
    with VNNI it is exact. The onnx reference pins the expected values."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3136, 576), dtype=np.uint8)
    b = rng.integers(-128, 128, (576, 64), dtype=np.int8)
    model = model_of(a, b, np.asarray(np.uint8(0)), np.asarray(np.int8(0)))
    expected = run_reference(model, a)[0]
    got = matmul_integer(a, b, np.uint8(0), np.int8(0))
    np.testing.assert_array_equal(got, expected, strict=True)
    onnxruntime = run_onnxruntime(model, a)[0]
    if cpu_has_vnni():
        np.testing.assert_array_equal(onnxruntime, expected, strict=True)
    else:
        assert np.mean(onnxruntime != expected) > 0.5, "onnxruntime became exact without VNNI: update docs/semantics.md"


def test_largest_exact_sum_and_overflow():
    k = 33025  # 33025 * 255 * 255 = 2147450625 <= 2**31 - 1
    a = np.full((1, k), 255, np.uint8)
    b = np.zeros((k, 2), np.uint8)
    b_zp = np.uint8(255)
    expected = run_onnxruntime(model_of(a, b, np.asarray(np.uint8(0)), np.asarray(b_zp)), a)[0]
    np.testing.assert_array_equal(matmul_integer(a, b, np.uint8(0), b_zp), expected, strict=True)
    assert expected[0, 0] == -2147450625
    with pytest.raises(AccumulatorOverflowError, match=r"matmul_integer: the exact accumulator .* leaves the int32 range: -2147515650"):
        matmul_integer(np.full((1, k + 1), 255, np.uint8), np.zeros((k + 1, 2), np.uint8), np.uint8(0), b_zp)


def test_zero_points_default_to_zero():
    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (3, 5), dtype=np.int8)
    b = rng.integers(0, 256, (5, 2), dtype=np.uint8)
    model = make_model("MatMulInteger", [("A", a), ("B", b)], [np.int32], 10)
    np.testing.assert_array_equal(matmul_integer(a, b), run_onnxruntime(model, a)[0], strict=True)
    np.testing.assert_array_equal(matmul_integer(a, b), run_reference(model, a)[0], strict=True)


ERRORS = [
    ({"A": np.zeros((3, 4), np.int32)}, TypeError, "matmul_integer: A must have dtype uint8 or int8, got int32"),
    ({"B": [[1]]}, TypeError, "matmul_integer: B must be a numpy array of uint8 or int8, got list"),
    ({"B": np.zeros((5, 2), np.uint8)}, ValueError, r"matmul_integer: the last dimension of A \(4\) must equal the second-to-last dimension of B \(5\)"),
    ({"B": np.zeros(5, np.uint8), "b_zero_point": None}, ValueError, r"matmul_integer: the last dimension of A \(4\) must equal the first dimension of B \(5\)"),
    ({"a_zero_point": np.int8(0)}, TypeError, r"matmul_integer: a_zero_point must have the dtype of A \(uint8\), got int8"),
    ({"a_zero_point": np.zeros(4, np.uint8)}, ValueError, r"matmul_integer: a_zero_point must be a scalar \(per tensor\) or per row of A, shape \(3,\) or \(3, 1\)"),
    ({"b_zero_point": np.zeros((2, 1), np.uint8)}, ValueError, r"matmul_integer: b_zero_point must be a scalar \(per tensor\) or per column of B"),
    ({"b_zero_point": 300}, ValueError, r"matmul_integer: b_zero_point must be in \[0, 255\]"),
]


@pytest.mark.parametrize("change,error,message", ERRORS, ids=[m[:60] for _, _, m in ERRORS])
def test_argument_errors(change, error, message):
    kwargs = dict(A=np.zeros((3, 4), np.uint8), B=np.zeros((4, 2), np.uint8), a_zero_point=np.uint8(0), b_zero_point=np.zeros(2, np.uint8))
    with pytest.raises(error, match=message):
        matmul_integer(**{**kwargs, **change})


@pytest.mark.parametrize("types", [(U8, U8), (U8, S8), (S8, S8), (S8, U8)], ids=lambda t: "".join("u8" if d == U8 else "s8" for d in t))
@pytest.mark.parametrize("shapes", [((96, 256), (256, 80)), ((2, 3, 33, 65), (3, 65, 47)), ((1, 300), (300, 64))], ids=["gemm", "batched", "gemv"])
def test_realistic_shapes_match_both_peers(types, shapes):
    a_t, b_t = types
    rng = np.random.default_rng(len(shapes[0]) * 10 + types[0].itemsize)
    ai, bi = np.iinfo(a_t), np.iinfo(b_t)
    a = rng.integers(ai.min, ai.max + 1, shapes[0]).astype(a_t)
    b = rng.integers(bi.min, bi.max + 1, shapes[1]).astype(b_t)
    b_zp = rng.integers(bi.min, bi.max + 1, shapes[1][:-2] + (1, shapes[1][-1])).astype(b_t)
    a_zp = np.asarray(a_t.type(rng.integers(ai.min, ai.max + 1)))
    model = model_of(a, b, a_zp, b_zp)
    got = matmul_integer(a, b, a_zp, b_zp)
    np.testing.assert_array_equal(got, run_reference(model, a)[0], strict=True)
    if onnxruntime_exact_for_weights(b, a_t):
        np.testing.assert_array_equal(got, run_onnxruntime(model, a)[0], strict=True)
