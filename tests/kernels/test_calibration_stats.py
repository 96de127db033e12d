"""qlinear.kernels.calibration_stats: each numba kernel gives the bits of its NumPy reference (the agreement sums:
to rounding, as they add in another order), on random data and on the edges (NaN, infinities, -0.0, subnormals,
float32's and float64's extremes, widths whose inverse overflows). The references themselves are checked against
NumPy's histogram and a brute-force quantizer in tests/io/test_observers.py."""

import math

import numpy as np
import pytest

from qlinear.kernels import calibration_stats as cs
from qlinear.kernels.quantize_linear import use_kernels


def _both(fn, *args):
    with use_kernels(True):
        fast = fn(*args)
    with use_kernels(False):
        reference = fn(*args)
    return fast, reference


def _edgy(rng, dtype, n=5000):
    info = np.finfo(dtype)
    x = rng.standard_normal(n).astype(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, info.tiny, -info.tiny, info.smallest_subnormal,
                         -info.smallest_subnormal, info.max, -info.max, 1.0, -1.0], dtype)
    x[rng.choice(n, len(specials), replace=False)] = specials
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_summary_equals_the_reference(dtype):
    rng = np.random.default_rng(0)
    for x in (_edgy(rng, dtype), rng.standard_normal(70_000).astype(dtype), np.zeros(0, dtype),
              np.array([np.nan, np.inf], dtype), np.array([-0.0, 0.0], dtype)):
        fast, reference = cs.summary(x), cs.summary_reference(x)
        assert fast == reference
        assert all(math.copysign(1.0, v) == 1.0 for v in fast[4:] if v == 0)  # never -0.0
    assert cs.summary(np.array([np.nan, 2.0, -np.inf, 0.0, -3.0], np.float32)) == (3, 1, 1, 1, -3.0, 2.0)


def _window(x, width):
    finite = x[np.isfinite(x)].astype(np.float64)
    low, high = min(finite.min(), 0.0), max(finite.max(), 0.0)
    lo = math.floor(low / width)
    return lo, math.floor(high / width) - lo + 1


@pytest.mark.parametrize("dtype, scale", [(np.float64, 1e-300), (np.float64, 1e300), (np.float32, 1e-40)]
                         + [(dtype, scale) for dtype in (np.float32, np.float64) for scale in (1e-3, 1.0, 1e5, 1e30)])
def test_add_bins_equals_the_reference_and_numpys_histogram(dtype, scale):
    rng = np.random.default_rng(1)
    with np.errstate(over="ignore", under="ignore"):
        x = (rng.standard_normal(20_000) * scale).astype(dtype)
    x[::97] = np.nan
    x[::101] = -np.inf
    finite = x[np.isfinite(x)].astype(np.float64)
    span = max(finite.max(), 0.0) - min(finite.min(), 0.0)
    for bins in (16, 2048):
        width = 2.0 ** math.ceil(math.log2(span / (bins - 2)))
        lo, size = _window(x, width)
        fast, reference = np.zeros(size, np.int64), np.zeros(size, np.int64)
        with use_kernels(True):
            cs.add_bins(x, width, lo, fast)
        with use_kernels(False):
            cs.add_bins(x, width, lo, reference)
        assert np.array_equal(fast, reference)
        finite_only = np.ascontiguousarray(x[np.isfinite(x)])
        fastest = np.zeros(size, np.int64)
        with use_kernels(True):
            cs.add_bins(finite_only, width, lo, fastest, all_finite=True)
        assert np.array_equal(fastest, reference)
        edges = (lo + np.arange(size + 1)) * width
        assert np.array_equal(fast, np.histogram(finite, edges)[0])


def test_add_bins_tiny_negatives_and_subnormal_widths():
    # float64: -1e-310 / 2**1000 underflows to -0.0, and still belongs in bin -1
    x = np.array([-1e-310, 1e-310, 2.0 ** 1000, -(2.0 ** 1000)])
    width = 2.0 ** 1000
    for flag in (True, False):
        counts = np.zeros(3, np.int64)
        with use_kernels(flag):
            cs.add_bins(x, width, -1, counts)
        assert counts.tolist() == [2, 1, 1]
    # a subnormal width: 1 / width overflows, the kernel divides
    width = 2.0 ** -1070
    x = np.array([-(2.0 ** -1065), 0.0, 2.0 ** -1068])
    for flag in (True, False):
        counts = np.zeros(37, np.int64)
        with use_kernels(flag):
            cs.add_bins(x, width, -32, counts)
        assert counts[0] == 1 and counts[32] == 1 and counts[36] == 1 and counts.sum() == 3


@pytest.mark.parametrize("all_finite", [False, True])
def test_add_bins_refuses_values_outside_the_window(all_finite):
    for flag in (True, False):
        for x in ([5.0], [-1.0], [0.5] * 10_000 + [-3.0]):
            counts = np.zeros(4, np.int64)
            with use_kernels(flag), pytest.raises(ValueError, match="outside"):
                cs.add_bins(np.array(x, np.float32), 1.0, 0, counts, all_finite=all_finite)


def _pieces(rng, n, zeros=True):
    edges = np.sort(np.append(rng.uniform(-3.0, 5.0, n), 0.0))  # 0 an edge: the zeros' piece fits between two
    u, v = edges[:-1].copy(), edges[1:].copy()
    c = rng.integers(0, 50, n).astype(np.float64)
    if zeros:  # a point piece at 0, as the exact zeros of a ReLU (sorted and disjoint, as the observer makes them)
        k = int(np.searchsorted(u, 0.0))
        u, v, c = np.insert(u, k, 0.0), np.insert(v, k, 0.0), np.insert(c, k, 1000.0)
    return u, v, c


@pytest.mark.parametrize("levels", [2, 16, 256])
def test_squared_errors_equal_the_reference_bit_for_bit(levels):
    rng = np.random.default_rng(2)
    for n, zeros in ((1, False), (7, True), (300, True), (2000, False)):
        pieces = _pieces(rng, n, zeros)
        sums = cs.squared_error_sums(*pieces)
        for s in (1e-4, 8.0 / (levels - 1) / 3, 8.0 / (levels - 1), 0.5, 7.0):
            fast, reference = _both(cs.squared_errors, pieces, sums, s, levels)
            assert fast.shape == (levels,)
            assert np.array_equal(fast, reference), (n, s)


def test_squared_errors_match_quantizing_samples_of_the_pieces():
    """The expected error against the mean error of quantizing many values drawn from the pieces."""
    rng = np.random.default_rng(3)
    u, v, c = _pieces(rng, 40)
    sums = cs.squared_error_sums(u, v, c)
    draws = np.concatenate([rng.uniform(a, b, int(k) * 200) for a, b, k in zip(u, v, c)])
    s, levels = 0.05, 64
    errors = cs.squared_errors((u, v, c), sums, s, levels)
    for z in (0, 20, 40, 63):
        q = np.clip(np.rint(draws / s) + z, 0, levels - 1)
        measured = np.sum((draws - (q - z) * s) ** 2) / 200
        assert errors[z] == pytest.approx(measured, rel=0.02)


def test_agreement_equals_the_reference_to_rounding():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 50_000)).astype(np.float32)
    y = (x + 0.01 * rng.standard_normal(x.shape)).astype(np.float32)
    fast, reference = _both(cs.agreement, x, y)
    assert fast[:2] == pytest.approx(reference[:2], rel=1e-12)
    assert fast[2] == float(np.float32(reference[2]))  # the exact maximum, rounded to float32
    with use_kernels(True):
        nan_y = cs.agreement(x[0], np.where(np.arange(x.shape[1]) == 9, np.nan, y[0]).astype(np.float32))
    assert math.isfinite(nan_y[0]) and math.isnan(nan_y[1]) and math.isnan(nan_y[2])
    assert cs.agreement(np.zeros(0, np.float32), np.zeros(0, np.float32)) == (0.0, 0.0, 0.0)


def _state(observer):
    counts, edges = observer.histogram()
    return (counts.tolist(), edges.tolist(), observer.count, observer.nan_count, observer.inf_count,
            observer.zero_count, observer.min, observer.max, observer.bin_width)


@pytest.mark.parametrize("seed", range(6))
def test_an_observer_fed_by_the_one_pass_kernel_equals_the_reference(seed):
    """Observer.update takes `observe_in_window` once its window is set: the state after a stream of samples
    (ReLU-like, signed, one-signed far from zero, growing now and then, with NaN, infinities, -0.0, samples
    larger than a chunk) is the reference's, bit for bit, and so is every range."""
    from qlinear.io.observers import Observer

    rng = np.random.default_rng(seed)
    samples = []
    for k in range(40):
        kind = rng.integers(0, 4)
        n = int(rng.choice([1, 7, 1000, 70_000, 300_000]))
        x = rng.standard_normal(n).astype(np.float32) * np.float32(1.0 + (k // 10))
        if kind == 0:
            x = np.maximum(x, np.float32(0.0))
        elif kind == 1:
            x = np.abs(x) + np.float32(3.0)
        elif kind == 2 and n > 10:
            x[rng.integers(0, n, 3)] = [np.nan, np.inf, -0.0]
        samples.append(x)
    fast, reference = Observer(), Observer()
    with use_kernels(True):
        for x in samples:
            fast.update(x)
    with use_kernels(False):
        for x in samples:
            reference.update(x)
    assert _state(fast) == _state(reference)
    for method in ("minmax", "percentile", "entropy", "mse"):
        with use_kernels(False):
            expected = reference.range(method)
        assert fast.range(method) == expected, method


def test_the_one_pass_kernel_gives_up_on_values_outside_the_window_or_not_finite():
    counts = np.zeros(8, np.int64)
    inside = np.array([0.5, 0.0, -0.0, 1.5], np.float32)
    assert cs.observe_in_window(inside, 1.0, -2, counts, -1.5, 5.0) == (2, -1.5, 5.0)
    assert counts.tolist() == [0, 0, 3, 1, 0, 0, 0, 0]  # the zeros went to the bin of 0
    for bad in ([6.5], [-2.5], [np.nan], [np.inf], [-np.inf]):
        before = counts.copy()
        assert cs.observe_in_window(np.array([0.5] + bad, np.float32), 1.0, -2, counts, -1.5, 5.0) is None
        assert np.array_equal(counts, before)
    # new extremes inside the window's end bins
    assert cs.observe_in_window(np.array([-1.75, 5.5], np.float32), 1.0, -2, counts, -1.5, 5.0) == (0, -1.75, 5.5)
