"""AWQ's two searches transcribed from the authors' code (llm-awq: ``auto_scale._search_module_scale`` and
``auto_clip.auto_clip_layer``) for one weight matrix ``w`` [R, K], the layer run on its calibration inputs
``x`` [N, K] rather than through their Hessian; the slow form `qlinear.rounding.awq` must agree with.
``quantize(m)`` is the weight quantizer: the groups' grids chosen from ``m``, ``m`` rounded to nearest
(in the clipping search, the authors round the clamped weight; `qlinear.rounding.awq` rounds the weight
itself on the clamped weight's grid, and the tests pass a quantizer that does that).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np


def search_scale(w, x, channels, quantize, n_grid: int = 20, levels: int = 0):
    """(losses, best scales): for ratio = 0, 1/n_grid, ...: scales = mean|x|^ratio per input channel,
    clamped to 1e-4 and divided by sqrt(max · min), as float32; loss = Σ (x Wᵀ − x (Q(W s) / s)ᵀ)².
    ``levels`` > 0 (qlinear's extension for quantized activations): the input x / s is rounded on one grid
    of that many steps from min(0, min x/s) to max(0, max x/s), and each loss adds that rounding's expected
    error, N · Σ Q(W s)² · step² / 12 over the N inputs."""
    channels = np.asarray(channels)
    x_max = np.array([np.abs(x[:, channels == c]).mean() for c in range(int(channels.max()) + 1)])
    org_out = x @ w.T
    losses, best, best_scales = [], np.inf, None
    for ratio in range(n_grid):
        ratio = ratio * 1 / n_grid
        scales = np.maximum(x_max ** ratio, 1e-4)
        scales = scales / np.sqrt(scales.max() * scales.min())
        scales = scales.astype(np.float32)
        s = scales.astype(np.float64)[channels][None, :]
        q = quantize(w * s) / s
        out = x @ q.T
        loss = float(np.sum((org_out - out) ** 2))
        if levels:
            divided = x / s
            step = (max(0.0, divided.max()) - min(0.0, divided.min())) / levels
            loss += len(x) * float(np.sum(quantize(w * s) ** 2)) * step ** 2 / 12
        losses.append(loss)
        if loss < best:
            best, best_scales = loss, scales
    return losses, best_scales


def search_clip(w, x, starts, quantize, n_grid: int = 20, max_shrink: float = 0.5):
    """The best shrink ratio of each group's max |w| ([R, groups]), groups being the runs of columns from
    ``starts``: ``quantize(clamped weight)`` gives the quantized weight, each group scored by
    Σ_n (x_n,S · (q − w)_S)²."""
    bounds = list(starts) + [w.shape[1]]
    runs = list(pairwise(bounds))
    org_max = np.stack([np.abs(w[:, a:b]).max(axis=1) for a, b in runs], axis=1)  # [R, groups]
    best_ratio = np.ones_like(org_max)
    min_errs = np.full_like(org_max, np.inf)
    for i_s in range(int(max_shrink * n_grid)):
        max_val = org_max * (1 - i_s / n_grid)
        cur_w = w.copy()
        for g, (a, b) in enumerate(runs):
            cur_w[:, a:b] = np.clip(w[:, a:b], -max_val[:, g:g + 1], max_val[:, g:g + 1])
        q_w = quantize(cur_w)
        for g, (a, b) in enumerate(runs):
            err = np.sum((x[:, a:b] @ (q_w[:, a:b] - w[:, a:b]).T) ** 2, axis=0)  # [R]
            better = err < min_errs[:, g]
            min_errs[better, g] = err[better]
            best_ratio[better, g] = 1 - i_s / n_grid
    return best_ratio
