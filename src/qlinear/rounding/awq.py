"""AWQ (Lin, Tang, Tang, Yang, Dang, Gan, Han 2023, "AWQ: Activation-aware Weight Quantization for LLM
Compression and Acceleration"): the weight's input channels that meet large activations are scaled up
before rounding, so that their weights take relatively finer steps of the grid, and the layer's input is
divided by the same scales; then each group's range may be clipped.

As the authors' code (``auto_scale``, ``auto_clip``) does, with the layer's output error on the calibration
data taken through the Hessian ``H = Σ x xᵀ`` of its input feature vectors instead of re-running the layer
(the same number, exactly, for the same data):

- scales per input channel ``s = max(mean|x|^α, 1e-4) / sqrt(max(s) min(s))`` for α = 0, 1/20, ... 19/20;
  for each, the grid is chosen anew from the scaled weight ``W diag(s)``, which is rounded to nearest, and
  scored by ``tr(E H Eᵀ)`` with ``E = Q(W diag(s)) diag(s)⁻¹ − W``. The best α is kept (α = 0, s = 1, is
  round-to-nearest itself, so the result is never worse on the calibration data);
- the clipping search (off unless ``clip=True``: `CLIP`): each group's range is clamped to ``±r max|w|`` for r = 1, 0.95, ... 0.55, the grid
  chosen from the clamped weights, each group keeping the r of its lowest error in isolation,
  ``e_S H_SS e_Sᵀ`` over its own elements (the authors' per-group output error). The authors round the
  clamped weights; here the weights themselves are rounded on the clamped grid: the same codes, except
  where the grid reaches past the clamp (a symmetric type's extra negative code, a rounded zero point),
  where a weight beyond it gets the nearer point. It runs where every group lies in one output row
  (blocks along the input features, or per output channel); the clipped grids are kept only if the whole
  layer's error does not grow.

With the activations quantized too (static quantization), the input the layer reads is ``x / s`` rounded on a
per-tensor grid whose step follows the largest ``|x_c| / s_c``: scales that magnify a channel of small mean
and large extremes widen it for every channel. So there each candidate's loss adds the error that rounding
brings in expectation, ``rows · Σ (W diag(s))_q² · Δ(s)²/12`` (`QuantizedInput`; an extension of the paper,
which keeps activations float), with Δ from each channel's range on the calibration data.

A scale is one per input channel of the layer's input tensor (float32, what the model's Mul applies);
a convolution's kernel positions of one channel share it, and its activation statistic is the mean of
theirs. The codes and values returned are `Codec.round`'s on the scaled weight. Any codec: integer,
float, MX, NVFP4 (whose tensor scale is taken from each scaled weight, `Codec.prepare`).

`qlinear.reference.awq` runs the calibration inputs through the layer for the same searches; the tests
demand the same losses and choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from .codec import Codec, Groups, Parameters, block_runs, output_error

GRID = 20  # α = 0, 1/GRID, ..., (GRID - 1) / GRID
MIN_SCALE = 1e-4
CLIP_GRID = 20  # r = 1 - i / CLIP_GRID
MAX_SHRINK = 0.5  # ... for i < MAX_SHRINK * CLIP_GRID
# The clipping search is off by default: on the corpus it lowered each layer's error on the calibration data and
# broke the network (recogniser at int4, weights only: 1.3% exact match with it, 93.3% without; BENCHMARKS.md).
CLIP = False


def channel_means(magnitudes: np.ndarray, channels: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean |x| per input channel id, whether the id occurs) from the feature columns' ``magnitudes``
    [G, K] (Σ|x| over ``rows`` vectors) and their ``channels`` [G, K]."""
    ids = np.asarray(channels, np.int64).reshape(-1)
    n = int(ids.max()) + 1 if ids.size else 0
    sums = np.bincount(ids, weights=np.asarray(magnitudes, np.float64).reshape(-1), minlength=n)
    counts = np.bincount(ids, minlength=n)
    present = counts > 0
    return np.where(present, sums / (max(rows, 1) * np.maximum(counts, 1)), 0.0), present


def channel_scales(means: np.ndarray, present: np.ndarray, alpha: float) -> np.ndarray:
    """The authors' scales for ``alpha``: ``max(means^α, 1e-4)`` over the square root of their largest
    times their smallest, as float32 (1 for ids that do not occur)."""
    s = np.maximum(np.asarray(means, np.float64) ** alpha, MIN_SCALE)
    if present.any():
        s = s / np.sqrt(s[present].max() * s[present].min())
    s[~present] = 1.0
    return s.astype(np.float32)


def quantize(scaled: np.ndarray, groups: Groups, codec: Codec, params: Parameters, chosen_from=None):
    """(codes, values) of ``scaled`` [G, R, K] on the grid ``params`` chooses from ``chosen_from``
    (default: ``scaled`` itself)."""
    params.choose_all(scaled if chosen_from is None else chosen_from)
    return codec.round(scaled, *params.per_element())


def _column_scales(scales: np.ndarray, channels: np.ndarray) -> np.ndarray:
    """[G, 1, K] float64: each feature column's scale."""
    return scales.astype(np.float64)[np.asarray(channels, np.int64)][:, None, :]


@dataclass(frozen=True)
class QuantizedInput:
    """The layer's input as the model will quantize it: per input channel id its ``lows`` and ``highs`` on the
    calibration data, onto one grid of ``levels`` steps (a per-tensor uint8 or int8 activation: 255)."""

    lows: np.ndarray
    highs: np.ndarray
    levels: int

    def step(self, scales: np.ndarray) -> float:
        """The grid's step once the input is divided by ``scales`` (its range then includes 0, as a
        calibrated activation's does)."""
        s = np.asarray(scales, np.float64)
        high = max(0.0, float(np.max(self.highs / s, initial=0.0)))
        low = min(0.0, float(np.min(self.lows / s, initial=0.0)))
        return (high - low) / self.levels

    def noise(self, values: np.ndarray, scales: np.ndarray, rows: int) -> float:
        """The output error the input's rounding adds over ``rows`` feature vectors, in expectation:
        ``rows · Σ w'² · Δ²/12`` for the weight ``values`` the layer computes with (the scaled one), each
        feature rounded independently and uniformly within half a step Δ."""
        return rows * float(np.sum(np.square(values))) * self.step(scales) ** 2 / 12.0

    @classmethod
    def of(cls, lows: np.ndarray, highs: np.ndarray, channels: np.ndarray, levels: int) -> QuantizedInput:
        """From the feature columns' ``lows`` and ``highs`` [G, K] and their ``channels`` [G, K]."""
        ids = np.asarray(channels, np.int64).reshape(-1)
        n = int(ids.max()) + 1 if ids.size else 0
        low, high = np.zeros(n), np.zeros(n)
        np.minimum.at(low, ids, np.asarray(lows, np.float64).reshape(-1))
        np.maximum.at(high, ids, np.asarray(highs, np.float64).reshape(-1))
        return cls(low, high, levels)


def search_scales(matrices, hessians, means, present, channels, groups: Groups, codec: Codec, make_params,
                  grid: int = GRID, progress=None, quantized_input: QuantizedInput | None = None, rows: int = 0):
    """The α search: (alphas, losses), one per candidate; with a ``quantized_input`` each loss adds the error
    its rounding brings (`QuantizedInput.noise`), which the scales change."""
    alphas = [i / grid for i in range(grid)]
    losses = []
    for alpha in alphas:
        scales = channel_scales(means, present, alpha)
        columns = _column_scales(scales, channels)
        scaled = matrices * columns
        codec.prepare(scaled)
        _, values = quantize(scaled, groups, codec, make_params())
        loss = output_error(values / columns - matrices, hessians)
        if quantized_input is not None:
            loss += quantized_input.noise(values, scales, rows)
        losses.append(loss)
        if progress is not None:
            progress()
    return alphas, losses


def _group_maxima(scaled: np.ndarray, groups: Groups) -> np.ndarray:
    """max |w| of each group."""
    maxima = np.zeros(groups.count, np.float64)
    np.maximum.at(maxima, groups.of.reshape(-1), np.abs(scaled).reshape(-1))
    return maxima


def group_errors(matrices, hessians, restored, groups: Groups, runs) -> np.ndarray:
    """Each group's output error in isolation, ``e_S H_SS e_Sᵀ`` over its elements ([count]); ``runs``: per
    matrix the first column of each run of columns (every group one row of one run)."""
    error = np.asarray(restored, np.float64) - matrices
    out = np.zeros(groups.count, np.float64)
    for g, starts in enumerate(runs):
        bounds = list(starts) + [error.shape[2]]
        for a, b in pairwise(bounds):
            e = error[g, :, a:b]
            out[groups.of[g, :, a]] = np.sum((e @ hessians[g, a:b, a:b]) * e, axis=1)
    return out


def search_clip(matrices, hessians, scaled, columns, groups: Groups, codec: Codec, make_params, runs,
                grid: int = CLIP_GRID, max_shrink: float = MAX_SHRINK, progress=None):
    """The clipping search on the ``scaled`` weight (``columns``: its column scales [G, 1, K]): each
    group's best ratio r of its max |w| ([count]; 1: not clipped)."""
    maxima = _group_maxima(scaled, groups)
    best = np.full(groups.count, np.inf)
    ratios = np.ones(groups.count)
    for i in range(int(max_shrink * grid)):
        r = 1.0 - i / grid
        bound = (r * maxima)[groups.of]
        _, values = quantize(scaled, groups, codec, make_params(), np.clip(scaled, -bound, bound))
        errors = group_errors(matrices, hessians, values / columns, groups, runs)
        better = errors < best
        best[better] = errors[better]
        ratios[better] = r
        if progress is not None:
            progress()
    return ratios, maxima


def awq(matrices: np.ndarray, hessians: np.ndarray, magnitudes: np.ndarray, channels: np.ndarray, groups: Groups,
        codec: Codec, make_params, rows: int, progress=None, clip: bool = CLIP,
        quantized_input: QuantizedInput | None = None):
    """Round ``matrices`` [G, R, K] (float64) given ``hessians`` [G, K, K] and the feature columns' summed
    ``magnitudes`` [G, K] over ``rows`` vectors and input ``channels`` [G, K]; returns (codes [G, R, K],
    values [G, R, K] float64, channel scales float32 [number of channel ids]): the codes and values are
    those of the scaled weight ``W s[channels]``; the layer's input is to be divided by the scales.
    ``make_params()`` gives a fresh `Parameters`; the last one made holds the grid of the codes returned.
    ``progress(n)`` is told of the columns done, G·K in all. ``quantized_input``: the layer's input will be
    quantized (static quantization), and every loss counts its rounding too."""
    w = np.asarray(matrices, np.float64)
    h = np.asarray(hessians, np.float64)
    runs = groups.starts if groups.starts is not None else block_runs(groups.of)
    clip = clip and runs is not None
    steps = GRID + (int(MAX_SHRINK * CLIP_GRID) if clip else 0) + 1
    units, done = w.shape[0] * w.shape[2], [0, 0]

    def step():
        if progress is not None:
            done[0] += 1
            due = units * done[0] // steps
            if due > done[1]:
                progress(due - done[1])
                done[1] = due

    means, present = channel_means(magnitudes, channels, rows)
    alphas, losses = search_scales(w, h, means, present, channels, groups, codec, make_params, progress=step,
                                   quantized_input=quantized_input, rows=rows)
    scales = channel_scales(means, present, alphas[int(np.argmin(losses))])
    columns = _column_scales(scales, channels)
    scaled = w * columns
    codec.prepare(scaled)
    chosen_from = None
    if clip:
        ratios, maxima = search_clip(w, h, scaled, columns, groups, codec, make_params, runs, progress=step)
        if (ratios < 1).any():
            bound = (ratios * maxima)[groups.of]
            clamped = np.clip(scaled, -bound, bound)
            _, values = quantize(scaled, groups, codec, make_params(), clamped)
            loss = output_error(values / columns - w, h)
            if quantized_input is not None:
                loss += quantized_input.noise(values, scales, rows)
            if loss <= min(losses):
                chosen_from = clamped
    codes, values = quantize(scaled, groups, codec, make_params(), chosen_from)
    step()
    return codes, values, scales
