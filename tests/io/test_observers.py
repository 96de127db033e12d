"""qlinear.io.observers: streaming calibration statistics, checked against oracles that are not the module's
own output: NumPy's min/max/histogram/percentile on the concatenated data, onnxruntime's own entropy
threshold search, scipy's KL divergence, and the squared error of actually quantizing the raw samples.

(No __init__.py here: as a package this folder would be named ``io`` and shadowed by the standard library.)
"""

import contextlib
import io
import math
import tracemalloc

import numpy as np
import pytest

from qlinear.io.observers import DEFAULT_MAX_BINS, Observer, kl_divergences, merged

METHODS = ("minmax", "percentile", "entropy", "mse")


def _observe(*samples, max_bins=DEFAULT_MAX_BINS):
    observer = Observer(max_bins=max_bins)
    for sample in samples:
        observer.update(sample)
    return observer


def _same_state(a: Observer, b: Observer, ranges=True):
    """Everything an observer knows, bit for bit (the ranges are functions of it: checked when asked)."""
    counts_a, edges_a = a.histogram()
    counts_b, edges_b = b.histogram()
    assert np.array_equal(counts_a, counts_b)
    assert np.array_equal(edges_a, edges_b)
    assert (a.count, a.nan_count, a.inf_count, a.zero_count) == (b.count, b.nan_count, b.inf_count, b.zero_count)
    assert (a.min, a.max, a.bin_width) == (b.min, b.max, b.bin_width)
    for method in METHODS if ranges else ():
        assert a.range(method) == b.range(method), method


def _mixture(rng, n):
    """Signed, skewed, with a heavy tail."""
    return np.concatenate([rng.standard_normal(n // 2), 3.0 + rng.exponential(2.0, n - n // 2)]).astype(np.float32)


# -- histogram and min/max against NumPy ----------------------------------------------------------------

@pytest.mark.parametrize("max_bins", [16, 100, DEFAULT_MAX_BINS])
def test_minmax_and_histogram_equal_numpy_on_the_concatenated_data(max_bins):
    rng = np.random.default_rng(0)
    # The range grows twice by large factors (one-signed, then signed, then 50x), forcing merges.
    samples = [rng.exponential(1.0, 500).astype(np.float32), rng.standard_normal(700).astype(np.float32),
               (50 * rng.standard_normal(300)).astype(np.float32)]
    observer = _observe(*samples, max_bins=max_bins)
    data = np.concatenate(samples)

    assert observer.count == data.size
    assert observer.min == float(np.min(data)) and observer.max == float(np.max(data))
    assert observer.range("minmax") == (float(np.min(data)), float(np.max(data)))
    counts, edges = observer.histogram()
    width = observer.bin_width
    assert math.frexp(width)[0] == 0.5  # a power of two
    assert len(counts) <= max_bins
    assert np.array_equal(counts, np.histogram(data, edges)[0])  # exact per bin, after the merges
    assert counts.sum() == data.size
    # the finest power of two: at half the width, the window from min(.,0) to max(.,0) would not fit
    low, high = min(data.min(), 0), max(data.max(), 0)
    half = width / 2
    assert math.floor(high / half) - math.floor(low / half) + 1 > max_bins


def test_one_signed_data_keep_zero_in_the_window():
    observer = _observe(np.array([3.0, 5.0, 7.5], np.float32))
    counts, edges = observer.histogram()
    assert edges[0] == 0.0 and edges[-1] > 7.5
    assert np.array_equal(counts, np.histogram([3.0, 5.0, 7.5], edges)[0])
    assert observer.range("minmax") == (0.0, 7.5)
    negative = _observe(np.array([-3.0, -1.0]))
    assert negative.range("minmax") == (-3.0, 0.0)
    assert negative.histogram()[1][-1] > 0.0


def test_tiny_negative_float64_values_stay_in_the_negative_bin():
    # -1e-320 / w underflows to -0.0 in float64; it must still land in bin -1 ([-w, 0)).
    data = np.array([-1e-320, 5e-324, 0.0, -0.0, 1e3, -1e3])
    observer = _observe(data)
    counts, edges = observer.histogram()
    assert np.array_equal(counts, np.histogram(data, edges)[0])
    assert observer.zero_count == 2


def test_float16_and_integer_inputs():
    rng = np.random.default_rng(1)
    half = rng.standard_normal(1000).astype(np.float16)
    observer = _observe(half)
    assert observer.min == float(half.min()) and observer.max == float(half.max())
    counts, edges = observer.histogram()
    assert np.array_equal(counts, np.histogram(half.astype(np.float64), edges)[0])
    assert _observe(np.arange(-5, 10)).range("minmax") == (-5.0, 9.0)


# -- streaming equals batch -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_streaming_equals_one_batch_bit_for_bit(dtype):
    rng = np.random.default_rng(2)
    samples = [(rng.standard_normal(rng.integers(1, 60)) * rng.uniform(0.5, 2.0)).astype(dtype) for _ in range(99)]
    samples.append((1000 * rng.standard_normal(50)).astype(dtype))  # 1000x larger, last
    data = np.concatenate(samples)

    streamed = _observe(*samples)
    batch = _observe(data)
    _same_state(streamed, batch)
    _same_state(_observe(*samples[::-1]), batch, ranges=False)  # order does not matter either
    splits = np.sort(rng.choice(np.arange(1, data.size), 7, replace=False))
    _same_state(_observe(*np.split(data, splits)), batch, ranges=False)


def test_streaming_with_a_range_growing_by_orders_of_magnitude():
    rng = np.random.default_rng(3)
    # each sample 10**0.1 times the previous one: 1e-3 up to 1e7, one-signed at first
    samples = [np.abs(rng.standard_normal(20)) * 10.0 ** (k / 10 - 3) for k in range(30)]
    samples += [rng.standard_normal(20) * 10.0 ** (k / 10 - 3) for k in range(30, 100)]
    data = np.concatenate(samples)
    streamed, batch = _observe(*samples), _observe(data)
    _same_state(streamed, batch)
    counts, edges = streamed.histogram()
    assert np.array_equal(counts, np.histogram(data, edges)[0])


# -- percentile against np.percentile -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["normal", "laplace", "mixture"])
@pytest.mark.parametrize("percentile", [99.0, 99.9, 99.99, 99.999])
def test_percentile_is_within_a_bin_of_numpy(name, percentile):
    rng = np.random.default_rng(4)
    n = 400_000
    data = {"normal": lambda: rng.standard_normal(n).astype(np.float32),
            "laplace": lambda: rng.laplace(0.0, 1.0, n).astype(np.float32),
            "mixture": lambda: _mixture(rng, n)}[name]()
    observer = _observe(*np.array_split(data, 10))
    low, high = observer.range("percentile", percentile=percentile)
    cut = (100.0 - percentile) / 2
    width = observer.bin_width
    assert abs(low - np.percentile(data, cut)) <= width
    assert abs(high - np.percentile(data, 100.0 - cut)) <= width
    assert observer.min <= low <= 0.0 <= high <= observer.max


def test_percentile_of_one_signed_data_clips_only_the_far_tail():
    rng = np.random.default_rng(5)
    relu = np.maximum(rng.standard_normal(400_000), 0.0).astype(np.float32)
    observer = _observe(relu)
    low, high = observer.range("percentile", percentile=99.9)
    assert low == 0.0
    assert abs(high - np.percentile(relu, 99.9)) <= observer.bin_width  # the whole 0.1 % off the top
    negative = _observe(-relu)
    low, negative_high = negative.range("percentile", percentile=99.9)
    assert negative_high == 0.0 and abs(low + high) <= observer.bin_width  # the mirror image, to a bin


def test_percentile_extremes():
    rng = np.random.default_rng(6)
    data = rng.standard_normal(10_000)
    observer = _observe(data)
    assert observer.range("percentile", percentile=100.0) == observer.range("minmax")
    default = observer.range("percentile")  # 99.999: within [min, max]
    assert observer.min <= default[0] and default[1] <= observer.max
    with pytest.raises(ValueError, match="percentile"):
        observer.range("percentile", percentile=100.5)


# -- entropy against onnxruntime and scipy --------------------------------------------------------------

def _distributions(rng, n):
    return {
        "normal": rng.standard_normal(n).astype(np.float32),
        "relu-exponential": (np.maximum(rng.standard_normal(n), 0) * rng.exponential(1.0, n)).astype(np.float32),
        "laplace-with-outliers": np.concatenate([rng.laplace(0, 1, n), [60.0, -45.0, 80.0]]).astype(np.float32),
    }


def _onnxruntime_windows(bins: int, quantized_bins: int):
    """The windows onnxruntime's search tries on a histogram of ``bins`` bins, zero at bins // 2."""
    zero = bins // 2
    half = np.arange(quantized_bins // 2, zero + 1)
    return zero - half, np.minimum(zero + half + 1, bins)


def _onnxruntime_threshold(hist, edges, low, high, quantized_bins):
    calibrate = pytest.importorskip("onnxruntime.quantization.calibrate")
    collector = calibrate.HistogramCollector(method="entropy", symmetric=False, num_bins=len(hist),
                                             num_quantized_bins=quantized_bins, percentile=99.999, scenario="same")
    return collector.get_entropy_threshold((hist, edges, low, high), quantized_bins)


def _our_onnxruntime_threshold(hist, edges, low, high, quantized_bins):
    starts, stops = _onnxruntime_windows(len(hist), quantized_bins)
    best = int(np.argmin(kl_divergences(hist, starts, stops, quantized_bins, flavor="onnxruntime")))
    return max(edges[starts[best]], low), min(edges[stops[best]], high)


@pytest.mark.parametrize("quantized_bins", [128, 64])
def test_entropy_search_equals_onnxruntime_on_the_observers_histogram(quantized_bins):
    """onnxruntime's search wants a histogram symmetric around 0 with the zero at bin bins // 2: the
    observer's own bins (0 is an edge) padded with empty bins to [-K w, K w) are exactly that."""
    rng = np.random.default_rng(7)
    for name, data in _distributions(rng, 100_000).items():
        observer = _observe(data, max_bins=512)
        counts, edges = observer.histogram()
        width = observer.bin_width
        first = int(round(edges[0] / width))
        half = max(first + len(counts), -first)
        hist = np.zeros(2 * half, np.int64)
        hist[half + first:half + first + len(counts)] = counts
        ort_edges = ((np.arange(2 * half + 1) - half) * width).astype(np.float32)
        low, high = np.float32(observer.min), np.float32(observer.max)
        theirs = _onnxruntime_threshold(hist, ort_edges, low, high, quantized_bins)
        ours = _our_onnxruntime_threshold(hist, ort_edges, low, high, quantized_bins)
        assert (float(theirs[0]), float(theirs[1])) == (float(ours[0]), float(ours[1])), name


def test_entropy_search_equals_onnxruntime_on_its_own_histogram():
    calibrate = pytest.importorskip("onnxruntime.quantization.calibrate")
    rng = np.random.default_rng(8)
    for name, data in _distributions(rng, 100_000).items():
        collector = calibrate.HistogramCollector(method="entropy", symmetric=False, num_bins=601,
                                                 num_quantized_bins=128, percentile=99.999, scenario="same")
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its progress
            collector.collect({"x": [data]})
        hist, edges, low, high, _ = collector.get_histogram_dict()["x"]
        theirs = collector.get_entropy_threshold((hist, edges, low, high), 128)
        ours = _our_onnxruntime_threshold(hist, edges, low, high, 128)
        assert (float(theirs[0]), float(theirs[1])) == (float(ours[0]), float(ours[1])), name


def test_onnxruntime_entropy_with_its_default_bins_is_minmax():
    """What quantize_static's Entropy does (num_bins=128 = num_quantized_bins, which it cannot change):
    the search has a single candidate, the whole histogram. Recorded here as the reason qlinear's entropy
    differs from onnxruntime's in practice."""
    calibrate = pytest.importorskip("onnxruntime.quantization.calibrate")
    data = _distributions(np.random.default_rng(9), 20_000)["laplace-with-outliers"]
    collector = calibrate.HistogramCollector(method="entropy", symmetric=False, num_bins=128,
                                             num_quantized_bins=128, percentile=99.999, scenario="same")
    with contextlib.redirect_stdout(io.StringIO()):
        collector.collect({"x": [data]})
        low, high = collector.compute_collection_result()["x"][:2]
    assert (float(low), float(high)) == (float(data.min()), float(data.max()))


def _scipy_divergence(hist, start, stop, levels):
    """KL(P || Q) of one window, built bin by bin (the TensorRT/MXNet definition) and measured by scipy."""
    rel_entr = pytest.importorskip("scipy.special").rel_entr  # what scipy.stats.entropy sums (faster import)
    h = np.asarray(hist, np.float64)
    window = h[start:stop]
    p = window.copy()
    p[0] += h[:start].sum()
    p[-1] += h[stop:].sum()
    level = np.minimum(np.arange(stop - start) // ((stop - start) // levels), levels - 1)  # the last takes the rest
    mass = np.bincount(level, weights=window, minlength=levels)
    nonzero = np.bincount(level, weights=p > 0, minlength=levels)
    q = np.where(p > 0, mass[level] / np.maximum(nonzero[level], 1), 0.0)
    return float(np.sum(rel_entr(p / p.sum(), q / q.sum())))


def test_kl_divergences_equal_scipy_window_by_window():
    rng = np.random.default_rng(10)
    hist = np.histogram(np.abs(rng.standard_t(2, 20_000)), 300, (0, 12))[0]  # sparse tail, empty bins
    hist[-1] += 3  # outliers past the last candidate
    for levels, starts, stops in [(32, np.zeros(269, int), np.arange(32, 301)),
                                  (16, np.arange(0, 140), np.arange(160, 300))]:
        ours = kl_divergences(hist, starts, stops, levels)
        expected = np.array([_scipy_divergence(hist, a, b, levels) for a, b in zip(starts, stops)])
        assert np.array_equal(np.isinf(ours), np.isinf(expected))
        finite = np.isfinite(expected)
        assert np.allclose(ours[finite], expected[finite], rtol=1e-9, atol=1e-12)
    assert np.isinf(kl_divergences([5, 0, 0, 0, 0, 7], [0], [4], 2))[0]  # Q = 0 where the clipped 7 lands


@pytest.mark.parametrize("name", ["normal", "relu-exponential", "laplace-with-outliers"])
def test_entropy_range_equals_a_brute_force_search_on_numpys_histogram_of_abs_x(name):
    rng = np.random.default_rng(11)
    data = _distributions(rng, 200_000)[name]
    observer = _observe(*np.array_split(data, 4), max_bins=1024)
    width = observer.bin_width
    # np.histogram of x on the edges k * width, folded at 0: bin [-(k+1) w, -k w) joins [k w, (k+1) w)
    # (so a value exactly on a negative edge goes one bin lower than its |x| would: -45.0 here).
    top = int(np.max(np.abs(data)) // width) + 1
    signed = np.histogram(data[data != 0], np.arange(-top, top + 1) * width)[0]  # exact zeros: left out
    hist = signed[top:] + signed[:top][::-1]
    levels = 256 if data.min() >= 0 else 128
    median = int(np.searchsorted(np.cumsum(hist), hist.sum() / 2.0))  # a window keeps half the values at least
    stops = np.arange(max(levels, median + 1), top + 1)
    divergence = np.array([_scipy_divergence(hist, 0, stop, levels) for stop in stops])
    best = np.flatnonzero(divergence <= divergence.min() * (1 + 1e-7))  # near-ties: any of them
    thresholds = {min(float(stops[i]) * width, float(np.abs(data).max())) for i in best}
    low, high = observer.range("entropy")
    assert high in thresholds
    assert low == (0.0 if data.min() >= 0 else max(float(data.min()), -high))  # never past the data


def test_entropy_range_shapes():
    rng = np.random.default_rng(12)
    data = rng.standard_normal(50_000)
    low, high = _observe(data).range("entropy")
    assert low == max(-high, data.min()) and 0 < high <= np.abs(data).max()
    low, high = _observe(np.maximum(data, 0)).range("entropy")
    assert low == 0.0 and 0 < high <= data.max()
    low, high = _observe(np.minimum(data, 0)).range("entropy")
    assert high == 0.0 and data.min() <= low < 0


# -- mse against the squared error of really quantizing the samples ------------------------------------------

def _measured_mse(x, low, high, levels=256):
    """Quantize x with the range as a quantizer would (scale, zero point, round, clip) and measure."""
    scale = (high - low) / (levels - 1)
    zero = np.rint(-low / scale)
    q = np.clip(np.rint(x / scale) + zero, 0, levels - 1)
    return float(np.mean((x - (q - zero) * scale) ** 2))


def _best_mse_on_a_grid(x, steps, levels=256):
    """The least squared error of the raw samples over every zero point of every step: exact, from
    prefix sums over the sorted samples (clipped parts) and over their rounding errors (the rest)."""
    xs = np.sort(np.asarray(x, np.float64))
    n = xs.size
    c1 = np.concatenate(([0.0], np.cumsum(xs)))
    c2 = np.concatenate(([0.0], np.cumsum(xs * xs)))
    z = np.arange(levels)
    best = (math.inf, None)
    for s in steps:
        a, b = -z * s, (levels - 1 - z) * s
        ia = np.searchsorted(xs, a, side="left")
        ib = np.searchsorted(xs, b, side="right")
        rounding = np.concatenate(([0.0], np.cumsum((xs - s * np.rint(xs / s)) ** 2)))
        error = (c2[ia] - 2 * a * c1[ia] + a * a * ia
                 + (c2[n] - c2[ib]) - 2 * b * (c1[n] - c1[ib]) + b * b * (n - ib)
                 + rounding[ib] - rounding[ia]) / n
        k = int(np.argmin(error))
        if error[k] < best[0]:
            best = (float(error[k]), (float(a[k]), float(b[k])))
    return best


def test_the_grid_oracle_measures_like_a_quantizer():
    x = np.random.default_rng(13).laplace(0, 1, 5000)
    for s, z in [(0.05, 128), (0.01, 40), (0.2, 250)]:
        low, high = -z * s, (255 - z) * s
        error, _ = _best_mse_on_a_grid(x, [s])
        assert error <= _measured_mse(x, low, high) + 1e-12
    error, (low, high) = _best_mse_on_a_grid(x, [0.03])
    assert math.isclose(error, _measured_mse(x, low, high), rel_tol=1e-9)


def test_mse_clips_a_few_huge_outliers():
    rng = np.random.default_rng(14)
    x = np.concatenate([rng.standard_normal(2_000_000), [400.0, -300.0]]).astype(np.float32)
    observer = _observe(*np.array_split(x, 20))
    low, high = observer.range("mse")
    assert high < 0.3 * observer.max and low > 0.3 * observer.min  # much narrower than minmax
    x64 = x.astype(np.float64)
    assert _measured_mse(x64, low, high) < 0.5 * _measured_mse(x64, observer.min, observer.max)


def test_mse_of_a_uniform_distribution_stays_near_minmax():
    x = np.random.default_rng(15).uniform(-1.0, 3.0, 200_000)
    low, high = _observe(x).range("mse")
    assert abs(low - x.min()) < 0.02 and abs(high - x.max()) < 0.02


@pytest.mark.parametrize("name", ["normal", "laplace", "relu-exponential", "outlier"])
def test_mse_is_within_a_few_percent_of_a_brute_force_grid(name):
    rng = np.random.default_rng(16)
    n = 50_000
    x = {"normal": lambda: rng.standard_normal(n),
         "laplace": lambda: rng.laplace(0, 1, n),
         "relu-exponential": lambda: np.maximum(rng.standard_normal(n), 0) * rng.exponential(1.0, n),
         "outlier": lambda: np.concatenate([rng.standard_normal(n), [80.0]])}[name]().astype(np.float32)
    x64 = x.astype(np.float64)
    observer = _observe(x)
    low, high = observer.range("mse")
    full = (max(x64.max(), 0) - min(x64.min(), 0)) / 255
    steps = full * 2.0 ** (-np.arange(0, 7 * 32 + 1) / 32)  # 7 octaves below minmax's step, 2 % apart
    best, _ = _best_mse_on_a_grid(x64, steps)
    ours = _measured_mse(x64, low, high)
    assert ours <= 1.03 * best
    assert ours <= _measured_mse(x64, min(x64.min(), 0), max(x64.max(), 0))


# -- memory ----------------------------------------------------------------------------------------------

def test_memory_stays_bounded_over_1000_samples():
    rng = np.random.default_rng(17)
    samples = [rng.standard_normal(100_000, dtype=np.float32) for _ in range(10)]  # reused, to save time
    Observer().update(samples[0])  # the kernels compile (or load from numba's cache) before memory is traced
    observer = Observer()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        for k in range(1000):
            if k % 100 == 99:
                samples[k % 10] *= 3.0  # in place: the range keeps growing now and then
            observer.update(samples[k % 10])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert observer.count == 100_000_000
    assert peak - start < 2_000_000  # the temporaries of one chunk (~1 MB), not of the data
    arrays = [value for value in vars(observer).values() if isinstance(value, np.ndarray)]
    assert arrays and all(a.size <= observer.max_bins for a in arrays)
    assert sum(a.nbytes for a in arrays) <= 8 * observer.max_bins
    # and a sample far larger than a chunk costs no more than a chunk's temporaries
    big = rng.standard_normal(3_000_000, dtype=np.float32)
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        observer.update(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start < 2_000_000


# -- NaN, infinities, zeros, empty updates -------------------------------------------------------------------

def test_nan_and_inf_are_counted_apart_and_never_widen_the_range():
    observer = _observe(np.array([np.nan, np.inf, -np.inf, 1.0, -2.0, np.nan], np.float32))
    assert (observer.count, observer.nan_count, observer.inf_count) == (2, 2, 2)
    assert (observer.min, observer.max) == (-2.0, 1.0)
    for method in ("minmax", "percentile"):
        low, high = observer.range(method)
        assert -2.0 <= low <= 0.0 <= high <= 1.0
    low, high = observer.range("entropy")  # within [min, max] on each side
    assert -2.0 <= low < 0.0 < high <= 1.0
    low, high = observer.range("mse")  # the quantizer's own range: to half a step (3/255) of [min, max]
    assert -2.0 - 1.5 / 255 <= low <= 0.0 <= high <= 1.0 + 1.5 / 255
    counts, edges = observer.histogram()
    assert np.array_equal(counts, np.histogram([1.0, -2.0], edges)[0])


def test_no_finite_value_has_no_range():
    for data in ([np.nan, np.nan], [np.inf, -np.inf, np.nan], []):
        observer = _observe(np.array(data, np.float32))
        for method in METHODS:
            with pytest.raises(ValueError, match="no finite value"):
                observer.range(method)
    assert Observer().count == 0 and Observer().min is None


def test_all_zero_data_give_zero_ranges():
    observer = _observe(np.zeros((3, 4), np.float32), np.array([-0.0]))
    assert observer.bin_width is None and observer.zero_count == 13
    for method in METHODS:
        low, high = observer.range(method)
        assert (low, high) == (0.0, 0.0) and math.copysign(1, low) == 1.0  # no -0.0
    observer.update(np.array([0.5, -0.25]))  # then real data: the zeros sit in bin 0
    counts, edges = observer.histogram()
    assert np.array_equal(counts, np.histogram(np.r_[np.zeros(13), 0.5, -0.25], edges)[0])


def test_an_empty_update_changes_nothing():
    observer = _observe(np.array([1.0, -3.0]))
    before = observer.histogram(), observer.count, observer.range("mse")
    observer.update(np.zeros((0, 5), np.float32))
    assert observer.count == before[1] and observer.range("mse") == before[2]
    assert np.array_equal(observer.histogram()[0], before[0][0])


# -- merging ---------------------------------------------------------------------------------------------

def test_merged_equals_one_observer_over_all_the_data():
    rng = np.random.default_rng(18)
    parts = [np.zeros(100, np.float32),
             (1e-3 * rng.standard_normal(5000)).astype(np.float32),
             np.concatenate([1e3 * rng.standard_normal(300), [np.nan, np.inf]]).astype(np.float32),
             np.maximum(rng.standard_normal(4000), 0).astype(np.float32)]
    everything = _observe(*parts)
    observers = [_observe(part) for part in parts]
    _same_state(merged(observers), everything)
    _same_state(merged(observers[::-1]), everything, ranges=False)
    _same_state(merged([Observer(), *observers, Observer()]), everything, ranges=False)
    pairwise = _observe(parts[0]).merge(_observe(parts[1]))
    pairwise.merge(merged(observers[2:]))
    _same_state(pairwise, everything, ranges=False)
    assert observers[0].count == 100  # merged() leaves its inputs alone
    with pytest.raises(ValueError, match="max_bins"):
        Observer(max_bins=512).merge(Observer())


def test_merging_widely_different_scales_is_exact():
    tiny = np.array([1e-30, -3e-30])
    huge = np.array([1e30, 2.5e29])
    _same_state(merged([_observe(tiny), _observe(huge)]), _observe(tiny, huge))


# -- arguments ---------------------------------------------------------------------------------------------

def test_bad_methods_and_options():
    observer = _observe(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="unknown calibration method"):
        observer.range("kl")
    with pytest.raises(TypeError, match="no option"):
        observer.range("minmax", percentile=99.0)
    with pytest.raises(ValueError):
        Observer(max_bins=4)
    with pytest.raises(ValueError, match="unknown flavor"):
        kl_divergences([1, 2, 3], [0], [3], 2, flavor="mxnet")


def test_entropy_keeps_data_far_from_zero():
    """TensorRT's search, on values that do not start near zero (a HardSigmoid's output in [0.13, 0.69]),
    would clip every one of them to a threshold below the smallest: windows start past the median |x|."""
    rng = np.random.default_rng(21)
    data = rng.uniform(0.13, 0.69, 100_000)
    low, high = _observe(data).range("entropy")
    assert low == 0.0 and np.median(data) <= high <= data.max()
    data = np.concatenate([rng.exponential(0.5, 100_000), [-0.375]])  # nearly one-signed: the negative side stays at its min
    low, high = _observe(data).range("entropy")
    assert low == -0.375 and 0 < high <= data.max()
