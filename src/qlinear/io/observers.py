"""Streaming statistics of an activation over many calibration samples, and the calibrated range.

An `Observer` sees a tensor's values sample by sample (`update`) and keeps only O(max_bins) numbers:
the count, min and max of the finite values, the counts of NaN, infinite and exactly-zero values, and a
histogram. onnxruntime's histogram methods keep every activation of every sample until the end (so their
memory grows with the number of samples); here each sample is binned as it arrives and then dropped.
Observers of different data `merge` exactly: the result equals one observer that saw all the data.

**The histogram** has bins of width w = 2**e, bin k covering [k*w, (k+1)*w) (index floor(x / w)), over
the window of indices from floor(min(low, 0) / w) to floor(max(high, 0) / w): 0 is always inside, as
every calibrated range contains 0. w is always the *finest* power of two at which that window fits in
``max_bins`` bins (default `DEFAULT_MAX_BINS` = 2048, as onnxruntime's percentile calibrator); the
data thus spans between about max_bins/2 and max_bins bins. When new values need a wider window, w
doubles by adding pairs of bins aligned at even indices, which is exact (floor(floor(x/w)/2) =
floor(x/2w)): no count is ever redistributed. Because w is a function of the overall min and max alone,
the histogram does not depend on how the values were split into samples, on their order, or on merges:
streaming gives the batch result bit for bit. (A first width chosen with headroom, e.g. spanning
max_bins/2 bins, would break this: the final width would then depend on the first sample.) Since w is a
power of two, x / w is exact and the bins are exactly np.histogram's with edges k*w.

**Ranges** (`Observer.range`), all containing 0 (low <= 0 <= high); all-zero data give [0, 0]:

- ``"minmax"``: [min(min, 0), max(max, 0)].
- ``"percentile"`` (``percentile=99.999``, onnxruntime's default): the range holding that percentage of
  the values. Signed data lose (100 - p)/2 % of the values at each end; one-signed data (e.g. after a
  ReLU, all >= 0) lose the whole (100 - p) % at the far end only, since the near end is pinned at 0.
  Quantiles are interpolated linearly inside a bin (exact zeros are an atom at 0 and the outermost bins
  are cut at min and max), so the range is never wider than [min, max].
- ``"entropy"`` (``quantized_bins=128``, int8's levels per sign): TensorRT's threshold search (Migacz,
  "8-bit inference with TensorRT", GTC 2017) on the histogram of |x|: the threshold t (a bin edge, at
  least ``quantized_bins`` bins out) whose clipped and requantized distribution is closest in KL
  divergence to the observed one; of windows within 1e-9 of the least divergence, the narrowest. [-t, t]
  for signed data; [0, t] (or [-t, 0]) for one-signed data, searched with twice the levels since an
  asymmetric quantizer then spends all its codes on one side (TensorRT's ``unsigned``). Exact zeros are
  left out of the search (see `Observer._entropy_range`). With the default max_bins, the |x| histogram
  of signed data has 512 to 1024 bins (TensorRT uses 2048): max_bins=4096 matches it. See
  `kl_divergences` for the divergence and how onnxruntime's differs.
- ``"mse"`` (``levels=256``, uint8 or asymmetric int8): the range whose quantizer (``levels`` codes, step
  s, zero at code z so that 0 is exact) has the least expected squared error over the histogram
  (rounding inside the range, clipping outside). Every zero point is tried for each step s = minmax's
  step * 2**(-e/32), first every 4th e, then the e around the best, down to ranges ~2 bins wide. The
  range returned is the quantizer's own, [-z s, (levels-1-z) s]. See
  `qlinear.kernels.calibration_stats.squared_errors` for how each bin's error is estimated.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import calibration_stats

DEFAULT_MAX_BINS = 2048
_CHUNK = 1 << 18  # values observed at once: 1 MB of float32, which stays in a core's cache between passes


class Observer:
    """Streaming statistics of one float tensor over many samples."""

    def __init__(self, max_bins: int = DEFAULT_MAX_BINS):
        if int(max_bins) != max_bins or max_bins < 16:
            raise ValueError(f"max_bins must be an integer >= 16, not {max_bins!r}")
        self.max_bins = int(max_bins)
        self._count = 0  # finite values
        self._nan = 0
        self._inf = 0
        self._zeros = 0  # exact zeros among the finite values (the ReLU spike; always exact in a range)
        self._min: float | None = None
        self._max: float | None = None
        self._width: float | None = None  # None while every value seen is 0 (any width would do)
        self._lo = 0  # index of the first bin of _counts
        self._counts = np.zeros(0, np.int64)

    # -- statistics ---------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Finite values seen (the ones the statistics describe); NaN and infinities are counted apart."""
        return self._count

    @property
    def nan_count(self) -> int:
        return self._nan

    @property
    def inf_count(self) -> int:
        """+inf and -inf values seen: ignored by the statistics, they never widen the range."""
        return self._inf

    @property
    def zero_count(self) -> int:
        return self._zeros

    @property
    def min(self) -> float | None:
        """The smallest finite value seen (None before any)."""
        return self._min

    @property
    def max(self) -> float | None:
        """The largest finite value seen (None before any)."""
        return self._max

    @property
    def bin_width(self) -> float | None:
        """The histogram's bin width, a power of two (None while no nonzero finite value was seen)."""
        return self._width

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(counts, edges) over the window from the bin of min(min, 0) to the bin of max(max, 0), as
        np.histogram returns them (edges[k] = (first + k) * bin_width). Only zeros seen: one
        zero-width bin [0, 0]; nothing finite seen: empty counts and edges [0]."""
        if self._width is None:
            return self._counts.copy(), np.zeros(len(self._counts) + 1)
        edges = (self._lo + np.arange(len(self._counts) + 1)) * self._width
        return self._counts.copy(), edges

    # -- streaming ----------------------------------------------------------------------------------

    def update(self, x) -> None:
        """Add one sample's (or batch's) values, any shape; NaN and +-inf are only counted."""
        a = np.asarray(x)
        if a.dtype.kind == "c":
            raise TypeError("Observer.update: complex values have no quantization range")
        # float32 holds float16/bfloat16 values exactly; float64 the rest (integers, float64).
        small = a.dtype == np.float32 or (a.dtype.kind in "fV" and a.dtype.itemsize <= 2)
        flat = a.reshape(-1)
        # A chunk at a time, each read from memory once: its summary, then its counts, come from the cache.
        for start in range(0, flat.size, _CHUNK):
            self._add(flat[start:start + _CHUNK].astype(np.float32 if small else np.float64, copy=False))

    def _add(self, flat: np.ndarray) -> None:
        if self._width is not None and flat.size:
            # The usual case once a few samples are in: every value finite and inside the window.
            seen = calibration_stats.observe_in_window(flat, self._width, self._lo, self._counts, self._min, self._max)
            if seen is not None:
                self._count += flat.size
                self._zeros += seen[0]
                self._min, self._max = seen[1], seen[2]
                return
        finite, nan, inf, zeros, low, high = calibration_stats.summary(flat)
        self._nan += nan
        self._inf += inf
        if not finite:
            return
        self._count += finite
        self._zeros += zeros
        self._min = low if self._min is None else min(self._min, low)
        self._max = high if self._max is None else max(self._max, high)
        # The width is a function of the overall min and max alone, so binning chunk by chunk gives what
        # binning all the data at once would.
        self._regrid(self._width)
        if self._width is None:  # still all zeros: they sit in bin 0 whatever the width
            self._counts[0] = self._count
            return
        calibration_stats.add_bins(flat, self._width, self._lo, self._counts, all_finite=not (nan or inf))

    def _regrid(self, width: float | None) -> None:
        """Re-bin the counts at the finest power-of-two width >= ``width`` at which the window of the
        current min and max fits, and extend them to that window."""
        low, high = min(self._min, 0.0), max(self._max, 0.0)
        if low == high:
            self._lo, self._counts = 0, _resized(self._counts, 1)
            return
        width = _finest_width(low, high, self.max_bins) if width is None else width
        while _window_size(low, high, width) > self.max_bins:
            width *= 2.0
        lo, counts = self._counts_at(width)
        new_lo = math.floor(low / width)
        new_counts = np.zeros(math.floor(high / width) - new_lo + 1, np.int64)
        new_counts[lo - new_lo:lo - new_lo + len(counts)] = counts
        self._width, self._lo, self._counts = width, new_lo, new_counts

    def _counts_at(self, width: float) -> tuple[int, np.ndarray]:
        """(first index, counts) of this histogram re-binned at ``width`` (self's width times 2**k)."""
        if self._width is None or width == self._width:
            return self._lo, self._counts
        factor = round(width / self._width)  # a power of two, as both widths are
        indices = np.arange(self._lo, self._lo + len(self._counts))
        if factor > 1 << 62:  # past int64; the indices (at most max_bins from 0) all fall in bin -1 or 0
            indices = np.where(indices < 0, -1, 0)
        else:
            indices //= factor
        new_lo = int(indices[0])
        merged = np.zeros(int(indices[-1]) - new_lo + 1, np.int64)
        np.add.at(merged, indices - new_lo, self._counts)
        return new_lo, merged

    def merge(self, other: "Observer") -> "Observer":
        """Add ``other``'s statistics to this observer (in place; returns self). Exact: the result is the
        observer that would have seen both observers' values."""
        if other.max_bins != self.max_bins:
            raise ValueError(f"cannot merge observers with max_bins {self.max_bins} and {other.max_bins}")
        self._nan += other._nan
        self._inf += other._inf
        if other._count == 0:
            return self
        if self._count == 0:
            self._count, self._zeros = other._count, other._zeros
            self._min, self._max = other._min, other._max
            self._width, self._lo, self._counts = other._width, other._lo, other._counts.copy()
            return self
        widths = [w for w in (self._width, other._width) if w is not None]
        self._count += other._count
        self._zeros += other._zeros
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)
        # Both widths are the finest for their own data, so the finest for the union is >= each.
        self._regrid(max(widths) if widths else None)
        lo, counts = other._counts_at(self._width) if self._width is not None else (0, other._counts)
        self._counts[lo - self._lo:lo - self._lo + len(counts)] += counts
        return self

    # -- ranges -------------------------------------------------------------------------------------

    def range(self, method: str, **options) -> tuple[float, float]:
        """The calibrated [low, high] by ``method`` ("minmax", "percentile", "entropy", "mse"; options in
        the module's docstring), with low <= 0 <= high."""
        allowed = {"minmax": (), "percentile": ("percentile",), "entropy": ("quantized_bins",), "mse": ("levels",)}
        if method not in allowed:
            raise ValueError(f"unknown calibration method {method!r} (expected one of {', '.join(allowed)})")
        unknown = sorted(set(options) - set(allowed[method]))
        if unknown:
            raise TypeError(f"calibration method {method!r} takes no option {', '.join(unknown)}")
        if self._count == 0:
            seen = f" (it held {self._nan} NaN and {self._inf} infinite values)" if self._nan or self._inf else ""
            raise ValueError(f"no finite value was observed{seen}: the tensor has no range")
        low, high = min(self._min, 0.0), max(self._max, 0.0)
        if low == high or method == "minmax":
            pass
        elif method == "percentile":
            low, high = self._percentile_range(float(options.get("percentile", 99.999)))
        elif method == "entropy":
            low, high = self._entropy_range(int(options.get("quantized_bins", 128)))
        else:
            low, high = self._mse_range(int(options.get("levels", 256)))
        return float(low) + 0.0, float(high) + 0.0  # + 0.0: no -0.0

    def _pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distribution as sorted, disjoint pieces (start, stop, count), each uniform: the occupied
        bins, the outermost cut at min and max, with the exact zeros as a point piece at 0 before bin 0."""
        u = (self._lo + np.arange(len(self._counts))) * self._width
        with np.errstate(over="ignore"):  # the last edge of a histogram reaching float64's max: cut below
            v = u + self._width
        c = self._counts.astype(np.float64)
        occupied = np.flatnonzero(self._counts)
        first, last = occupied[0], occupied[-1]
        u, v, c = u[first:last + 1], v[first:last + 1], c[first:last + 1]
        u[0] = max(u[0], self._min)
        v[-1] = min(v[-1], self._max)
        if self._zeros:
            k = -self._lo - first  # the bin [0, w): holds the zeros, so it is occupied
            c[k] -= self._zeros
            u = np.insert(u, k, 0.0)
            v = np.insert(v, k, 0.0)
            c = np.insert(c, k, float(self._zeros))
        return u, v, c

    def _quantile(self, rank: float) -> float:
        """The value with ``rank`` values below it, the pieces' counts spread uniformly over them."""
        if rank <= 0:
            return self._min
        if rank >= self._count:
            return self._max
        u, v, c = self._pieces()
        ends = np.cumsum(c)
        j = int(np.searchsorted(ends, rank, side="left"))  # the first piece reaching the rank (c[j] > 0)
        inside = (rank - (ends[j] - c[j])) / c[j]
        return float(min(max(u[j] + inside * (v[j] - u[j]), self._min), self._max))

    def _percentile_range(self, percentile: float) -> tuple[float, float]:
        if not 0.0 <= percentile <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], not {percentile}")
        outside = self._count * (100.0 - percentile) / 100.0
        if self._min >= 0:
            return 0.0, max(self._quantile(self._count - outside), 0.0)
        if self._max <= 0:
            return min(self._quantile(outside), 0.0), 0.0
        return min(self._quantile(outside / 2), 0.0), max(self._quantile(self._count - outside / 2), 0.0)

    def _entropy_range(self, quantized_bins: int) -> tuple[float, float]:
        if quantized_bins < 2:
            raise ValueError(f"quantized_bins must be >= 2, not {quantized_bins}")
        one_signed = self._min >= 0 or self._max <= 0
        levels = 2 * quantized_bins if one_signed else quantized_bins
        # |x|: bin k >= 0 stays, bin k < 0 ([k w, (k+1) w)) folds onto -k-1; the half-open side flips for
        # negative values, which only matters for values exactly on an edge.
        hi = self._lo + len(self._counts) - 1
        folded = np.zeros(max(hi + 1, -self._lo), np.int64)
        folded[:hi + 1] += self._counts[-self._lo:]
        folded[:-self._lo] += self._counts[:-self._lo][::-1]
        # Exact zeros are exact in every candidate range; left in, a ReLU's spike at 0 decides the search
        # (through how the first level's bins are grouped), which is why TensorRT's own calibrator flattens
        # its first bin (bins[0] = bins[1]).
        folded[0] -= self._zeros
        absmax = max(-self._min, self._max)
        if len(folded) <= levels or not folded.any():  # no finer histogram than the quantizer: keep it all
            return _signed_range(self._min, self._max, absmax)
        # TensorRT's search assumes data that start near zero (a ReLU's): for data far from it (a HardSigmoid's
        # [0.13, 0.69]) its narrowest windows fold every value into their last bin, a divergence of zero, and win
        # with a threshold below every value. So a window must reach past the median |x|: it keeps at least half
        # of the values unclipped.
        median = int(np.searchsorted(np.cumsum(folded), folded.sum() / 2.0))
        stops = np.arange(max(levels, median + 1), len(folded) + 1)
        if len(stops) == 0:
            return _signed_range(self._min, self._max, absmax)
        divergence = kl_divergences(folded, np.zeros_like(stops), stops, levels)
        # The first (narrowest) of the windows within rounding noise of the minimum.
        best = divergence.min()
        chosen = int(np.flatnonzero(divergence <= best + 1e-9 * abs(best))[0])
        return _signed_range(self._min, self._max, min(float(stops[chosen]) * self._width, absmax))

    def _mse_range(self, levels: int) -> tuple[float, float]:
        if levels < 2:
            raise ValueError(f"levels must be >= 2, not {levels}")
        # In units of a power of two near max |x| (exact), so that squares cannot overflow.
        unit = math.ldexp(1.0, math.frexp(max(-self._min, self._max))[1] - 1)
        low, high = min(self._min, 0.0) / unit, max(self._max, 0.0) / unit
        full = (high - low) / (levels - 1)
        u, v, c = self._pieces()
        pieces = (u / unit, v / unit, c)
        sums = calibration_stats.squared_error_sums(*pieces)
        # Steps full * 2**(-e/32): e = 0 is minmax's step. The search stops where the range is ~2 bins
        # wide (the histogram knows nothing finer); it visits every 4th e, then the 7 around the best.
        last = int(math.log2(max((high - low) / (2 * self._width / unit), 1.0)) * 32)
        tried: dict[int, tuple[float, int]] = {}

        def visit(e: int) -> None:
            if 0 <= e <= last and e not in tried:
                errors = calibration_stats.squared_errors(pieces, sums, full * 2.0 ** (-e / 32), levels)
                z = int(np.argmin(errors))
                tried[e] = (float(errors[z]), z)

        for e in [*range(0, last + 1, 4), last]:
            visit(e)
        coarse = min(tried, key=lambda e: (tried[e][0], e))  # ties: the widest range
        for e in range(coarse - 3, coarse + 4):
            visit(e)
        e = min(tried, key=lambda e: (tried[e][0], e))
        s, z = full * 2.0 ** (-e / 32), tried[e][1]
        return -z * s * unit, (levels - 1 - z) * s * unit


def _signed_range(low: float, high: float, t: float) -> tuple[float, float]:
    """[-t, t] within the observed [low, high] (so [0, t] or [-t, 0] when the data have one sign): a side
    the data do not reach is not widened to t, which would cost an asymmetric quantizer half its codes (a
    tensor of [-0.38, 22.6] took [-6.0, 6.0])."""
    return max(min(low, 0.0), -t), min(max(high, 0.0), t)


def merged(observers) -> Observer:
    """A new observer holding the statistics of all ``observers`` (which are left unchanged)."""
    observers = list(observers)
    if not observers:
        raise ValueError("merged() needs at least one observer")
    result = Observer(max_bins=observers[0].max_bins)
    for observer in observers:
        result.merge(observer)
    return result


def kl_divergences(hist, starts, stops, levels: int, flavor: str = "tensorrt") -> np.ndarray:
    """KL(P || Q) of each candidate window [starts[i], stops[i]) of the histogram ``hist``: the
    entropy calibration's criterion (the best threshold is the window of least divergence).

    P is the histogram clipped to the window: the counts left of it are added to its first bin, those
    right of it to its last bin. Q is the window quantized to ``levels`` levels: its bins are cut into
    ``levels`` groups of ``(stop - start) // levels`` bins (the last group also takes the remainder),
    and each group's count (without the clipped counts) is spread evenly over the group's bins where P is
    nonzero. Both are normalized; terms with P = 0 are 0, and a window where Q = 0 < P is infinitely
    far. That is TensorRT's search as MXNet's ``_get_optimal_threshold`` wrote it (``flavor="tensorrt"``),
    computed for all windows at once from prefix sums: Q is constant over a group's nonzero bins, so
    sum P log Q is a sum over groups of (P's mass in the group) * log Q_group. Windows need at least
    ``levels`` bins.

    ``flavor="onnxruntime"`` reproduces onnxruntime 1.32's copy of it (``HistogramCollector.
    get_entropy_threshold``), which departs from it four ways: Q is built in an int64 array (each share
    is truncated to an integer), the remainder bins of the last group get no share (Q = 0 there though
    their counts went into the group), the shares go to every bin of a group, P = 0 or not; then P and Q
    are smoothed (1e-4 added to zero bins, taken evenly from the others) and the divergence is computed
    in float32. It serves to check parity with onnxruntime, not to calibrate.
    """
    starts = np.asarray(starts, np.int64)
    stops = np.asarray(stops, np.int64)
    sizes = stops - starts
    if np.any(sizes < levels):
        raise ValueError(f"kl_divergences: every window needs at least levels={levels} bins")
    if flavor == "onnxruntime":
        return _onnxruntime_divergences(np.asarray(hist, np.int64), starts, stops, levels)
    if flavor != "tensorrt":
        raise ValueError(f"kl_divergences: unknown flavor {flavor!r} (tensorrt or onnxruntime)")
    if len(starts) > 256:  # windows x levels temporaries: a few MB at a time
        return np.concatenate([kl_divergences(hist, starts[i:i + 256], stops[i:i + 256], levels)
                               for i in range(0, len(starts), 256)])
    h = np.asarray(hist, np.float64)
    total = h.sum()
    cum = np.concatenate(([0.0], np.cumsum(h)))
    cum_nonzero = np.concatenate(([0], np.cumsum(h > 0)))
    cum_xlogx = np.concatenate(([0.0], np.cumsum(_xlogx(h))))

    left = cum[starts]  # clipped below the window, added to its first bin
    right = total - cum[stops]  # clipped above, added to its last bin
    first, last = h[starts], h[stops - 1]

    per = (sizes // levels)[:, None]
    group_start = starts[:, None] + per * np.arange(levels)
    group_stop = group_start + per
    group_stop[:, -1] = stops
    q_mass = cum[group_stop] - cum[group_start]
    p_mass = q_mass.copy()
    p_mass[:, 0] += left
    p_mass[:, -1] += right
    nonzero = (cum_nonzero[group_stop] - cum_nonzero[group_start]).astype(np.float64)
    nonzero[:, 0] += (first == 0) & (left > 0)
    nonzero[:, -1] += (last == 0) & (right > 0)

    # sum over the window of p log p, with the two end bins holding the clipped counts
    p_log_p = cum_xlogx[stops] - cum_xlogx[starts] - _xlogx(first) - _xlogx(last) \
        + _xlogx(first + left) + _xlogx(last + right)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_level = q_mass / nonzero
        p_log_q = np.where(p_mass > 0, p_mass * np.log(q_level), 0.0).sum(axis=1)
        q_total = cum[stops] - cum[starts]
        divergence = (p_log_p - p_log_q) / total - math.log(total) + np.log(q_total)
    starved = np.any((p_mass > 0) & (q_mass == 0), axis=1)
    return np.where(starved | (q_total == 0), np.inf, divergence)


def _onnxruntime_divergences(h: np.ndarray, starts, stops, levels: int) -> np.ndarray:
    """`kl_divergences` as onnxruntime computes it (see there), window by window."""
    out = np.empty(len(starts))
    for i, (start, stop) in enumerate(zip(starts, stops)):
        window = h[start:stop]
        p = window.copy()
        p[0] += h[:start].sum()
        p[-1] += h[stop:].sum()
        per = len(window) // levels
        whole = levels * per  # bins [whole, len) are the remainder
        mass = window[:whole].reshape(levels, per).sum(axis=1)
        mass[-1] += window[whole:].sum()
        nonzero = (p[:whole] != 0).reshape(levels, per).sum(axis=1)
        share = np.where(nonzero > 0, mass / np.maximum(nonzero, 1), 0.0)
        q = np.zeros(len(window), np.int64)
        q[:whole] = np.repeat(share, per)  # truncated to integers by the int64 array
        p32, q32 = _onnxruntime_smoothed(p), _onnxruntime_smoothed(q)
        if p32 is None or q32 is None:
            out[i] = np.inf
            continue
        p32 = p32 / p32.sum(keepdims=True)
        q32 = q32 / q32.sum(keepdims=True)
        out[i] = float((p32 * np.log(p32 / q32)).sum())
    return out


def _onnxruntime_smoothed(counts: np.ndarray) -> np.ndarray | None:
    """Zero bins raised to 1e-4, the others lowered evenly to compensate, in float32 (None: all zero)."""
    zeros = (counts == 0).astype(np.float32)
    nonzeros = (counts != 0).astype(np.float32)
    n_zeros = float(zeros.sum())
    n_nonzeros = counts.size - n_zeros
    if not n_nonzeros:
        return None
    eps = 1e-4
    shift = eps * n_zeros / n_nonzeros
    smoothed = counts.astype(np.float32)
    smoothed += np.float32(eps) * zeros + np.float32(-shift) * nonzeros
    return smoothed


def _xlogx(x):
    x = np.asarray(x, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _window_size(low: float, high: float, width: float) -> float:
    top, bottom = high / width, low / width
    if math.isinf(top) or math.isinf(bottom):
        return math.inf
    return math.floor(top) - math.floor(bottom) + 1


def _finest_width(low: float, high: float, max_bins: int) -> float:
    """The smallest power of two w with floor(high/w) - floor(low/w) + 1 <= max_bins (low <= 0 <= high)."""
    span = high / max_bins - low / max_bins  # divided first: high - low may overflow
    exponent = max(math.frexp(span)[1] - 2, -1074)  # 2**exponent < span: too fine to fit
    while _window_size(low, high, math.ldexp(1.0, exponent)) > max_bins:
        exponent += 1
    return math.ldexp(1.0, exponent)


def _resized(counts: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, np.int64)
    out[:min(size, len(counts))] = counts[:size]
    return out
