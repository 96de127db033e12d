"""GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers", Algorithm 1): the columns of each weight matrix are rounded one after
another, and each column's rounding error is pushed onto the columns not yet rounded, weighted by the
inverse of the layer's input Hessian ``H = 2 X Xᵀ``, so the layer's output on the calibration data moves as
little as the grid allows.

As in the paper: the Hessian is dampened by ``damp`` times its mean diagonal; its inverse is taken once,
through the upper Cholesky factor of ``H⁻¹``; updates are applied lazily, a batch of columns at a time.
Inputs that never carried a value (a zero diagonal) get a unit diagonal: their weights are rounded to
nearest and pass no error on. Blocks along the input features have their parameters chosen from the
block's current (error-updated) values when the rounding reaches the block, as the paper's
``groupsize`` does; other granularities keep the parameters round-to-nearest chooses.

`qlinear.reference.gptq` transcribes the paper's per-column update (an explicit inverse, a column removed
at a time); the tests demand the same codes from both.
"""

from __future__ import annotations

import numpy as np

from .codec import Codec, Groups, Parameters

DAMP = 0.01  # the paper's and its code's default: 1% of the mean diagonal
BATCH = 128  # columns updated lazily together (the paper's B)


def inverse_cholesky(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """The upper Cholesky factor of the dampened Hessian's inverse (float64), after a unit diagonal for
    the dead inputs. A Hessian that is not positive definite even dampened gets 10x more damping."""
    h = np.array(h, np.float64)
    dead = np.diag(h) == 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    mean = float(np.mean(np.diag(h)))
    diagonal = np.diag_indices(len(h))
    undamped = h[diagonal].copy()
    for attempt in range(6):
        # in place where the arithmetic allows (an 8192-input layer's Hessian is 512 MB a copy): the same bits as
        # h + I * d and (inverse + inverse.T) / 2; h's own diagonal is restored for a stronger damping
        h[diagonal] = undamped + (damp * 10.0 ** attempt) * mean
        try:
            inverse = np.linalg.inv(h)  # a Hessian that is not positive definite fails the factor below
            np.add(inverse, inverse.T, out=inverse)  # numpy buffers the overlapping transpose
            inverse *= 0.5
            return np.linalg.cholesky(inverse).T
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("gptq: the Hessian is not positive definite even with 10^5 times the damping")


def gptq(matrices: np.ndarray, hessians: np.ndarray, groups: Groups, codec: Codec, params: Parameters,
         damp: float = DAMP, batch: int = BATCH, act_order: bool = False, progress=None, factors: dict | None = None):
    """Round ``matrices`` [G, R, K] (float64) given ``hessians`` [G, K, K]; returns (codes [G, R, K],
    values [G, R, K] float64). ``params`` holds the groups' parameters: chosen already, or (blocks
    along the columns, without ``act_order``) chosen here as the rounding reaches each block.
    ``act_order``: the columns in order of decreasing Hessian diagonal (the inputs that carry most first,
    the paper's code's ``act_order``); the parameters must be chosen already. ``factors``: a dict that keeps
    each Hessian's factor for the next weight read by the same input (q, k and v), while the caller holds them."""
    count, rows, columns = matrices.shape
    codes = None
    values = np.empty((count, rows, columns), np.float64)
    if act_order and not params.known.all():
        raise ValueError("gptq: act_order needs every group's parameters chosen first")
    for g in range(count):
        order = np.argsort(-np.diag(hessians[g]), kind="stable") if act_order else np.arange(columns)
        key = (id(hessians), g, damp, act_order)
        u = factors.get(key) if factors is not None else None
        if u is None:
            whole = not act_order and hessians.shape[-1] == columns  # no reordered copy of a 512 MB Hessian
            u = inverse_cholesky(hessians[g] if whole else hessians[g][np.ix_(order, order)], damp)
            if factors is not None:
                factors[key] = u
        # the working copy after the factor, whose inversion is the largest moment of the rounding
        w = np.asarray(matrices[g][:, order], np.float64) if act_order else np.array(matrices[g], np.float64)
        starts = groups.starts[g] if groups.starts is not None and not act_order else None
        for first, last in _batches(columns, starts, batch):
            block = w[:, first:last].copy()
            errors = np.zeros_like(block)
            for i in range(last - first):
                j = first + i
                if starts is not None and _starts_at(starts, j):
                    end = _run_end(starts, j, columns)
                    w[:, first:last] = block
                    params.choose_run(g, j, end, w)
                effective, zero = params.column(g, order[j])
                q, value = codec.round(block[:, i], effective, zero)
                if codes is None:
                    codes = np.empty((count, rows, columns), q.dtype)
                codes[g, :, order[j]] = q
                values[g, :, order[j]] = value
                error = (block[:, i] - value) / u[j, j]
                block[:, i:] -= np.outer(error, u[j, j:last])
                errors[:, i] = error
            w[:, first:last] = block
            w[:, last:] -= errors @ u[first:last, last:]
            if progress is not None:
                progress(last - first)
    return codes, values


def _batches(columns: int, starts, batch: int):
    """Column ranges of about ``batch`` columns, each ending where a block of parameters ends (a block's
    parameters are chosen from values that all its columns' updates have reached)."""
    ends = list(starts[1:]) + [columns] if starts is not None else list(range(batch, columns, batch)) + [columns]
    first = 0
    for end in ends:
        if end - first >= batch or end == columns:
            yield first, end
            first = end


def _starts_at(starts, j: int) -> bool:
    k = np.searchsorted(starts, j)
    return k < len(starts) and starts[k] == j


def _run_end(starts, j: int, columns: int) -> int:
    k = int(np.searchsorted(starts, j))
    return starts[k + 1] if k + 1 < len(starts) else columns
