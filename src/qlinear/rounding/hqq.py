"""HQQ (Badri and Shaji 2023, "Half-Quadratic Quantization of Large Machine Learning Models"): the zero point
of each group chosen by a half-quadratic solver of the lp-norm (p < 1) weight error, which lets a few
outliers keep a large error so that the rest fit the grid. No calibration data.

The paper's solver alternates, per group, with the scale fixed:

    W_q = clip(round(W / s + z))              (the codes)
    W_e = shrink_p(W − s (W_q − z), β)        (the error the outliers keep)
    z   = mean(W_q − (W − W_e) / s)           (the zero point the rest call for)
    β  ← κ β

with the defaults of its code (p = 0.7, β = 10, κ = 1.01, 20 iterations, stopped when the mean absolute
error grows). ONNX stores an integer zero point of the codes' type, where the paper keeps a float one:
here the solver's zero point is rounded to the type's grid, and the scale is then refit by least squares
to the codes that zero point gives (two alternations, each kept only if it lowers the squared error).
Integer types only.
"""

from __future__ import annotations

import numpy as np

LP_NORM = 0.7
BETA = 10.0
KAPPA = 1.01
ITERATIONS = 20


def _shrink(x: np.ndarray, beta: float, p: float) -> np.ndarray:
    magnitude = np.abs(x)
    with np.errstate(divide="ignore"):
        push = np.where(magnitude > 0, magnitude ** (p - 1.0), 0.0) / beta
    return np.sign(x) * np.maximum(magnitude - push, 0.0)


def solve(values: np.ndarray, scale: np.ndarray, zero: np.ndarray, qmin: int, qmax: int,
          iterations: int = ITERATIONS, p: float = LP_NORM, beta: float = BETA, kappa: float = KAPPA):
    """The paper's zero-point solver on groups ``values`` [n, m] with scales ``scale`` [n] and starting zero
    points ``zero`` [n] (float64); returns the real-valued zero points [n]."""
    w = np.asarray(values, np.float64)
    s = np.asarray(scale, np.float64)[:, None]
    z = np.asarray(zero, np.float64)[:, None].copy()
    best = np.full(len(w), np.inf)
    done = np.zeros(len(w), bool)
    for _ in range(iterations):
        q = np.clip(np.round(w / s + z), qmin, qmax)
        restored = s * (q - z)
        error = np.abs(w - restored).mean(axis=1)
        done |= error >= best  # this group's error grew: it keeps its last zero point
        best = np.where(done, best, error)
        shrunk = _shrink(w - restored, beta, p)
        z = np.where(done[:, None], z, np.mean(q - (w - shrunk) / s, axis=1, keepdims=True))
        beta *= kappa
        if done.all():
            break
    return z[:, 0]


CHUNK = 8192  # groups solved together: every group is solved on its own, so the chunks change no result


def parameters(values: np.ndarray, codec, iterations: int = ITERATIONS):
    """(stored scales, stored zero points, effective scales) of groups ``values`` [n, m], as `Codec.choose`
    returns them: round-to-nearest's min/max parameters, the solver's zero point on the type's grid, then the
    scale refit. The groups go in chunks of `CHUNK`: a whole embedding table's temporaries at once (366,000
    groups of 32, 94 MB each, a dozen per iteration) spent two thirds of the time mapping fresh memory."""
    if not codec.integer:
        raise ValueError(f"hqq solves for an integer zero point; {codec.fmt.name if codec.fmt else codec.qtype.onnx_name} "
                         f"has none (use gptq, awq or rtn)")
    values = np.asarray(values, np.float64)
    if len(values) <= CHUNK:
        return _parameters(values, codec, iterations)
    parts = [_parameters(values[i:i + CHUNK], codec, iterations) for i in range(0, len(values), CHUNK)]
    return tuple(np.concatenate([part[k] for part in parts]) for k in range(3))


def _parameters(values: np.ndarray, codec, iterations: int):
    from .. import calibrate

    qtype = codec.qtype
    w = np.asarray(values, np.float64)
    scale, zero, _ = codec.choose(w)
    s = np.asarray(scale, np.float64)
    z = np.asarray(zero, np.float64)
    if not codec.symmetric:
        solved = solve(w, s, z, qtype.qmin, qtype.qmax, iterations)
        z = np.clip(np.round(solved), qtype.qmin, qtype.qmax)
    best = _squared_error(w, s, z, qtype)
    for _ in range(2):  # the scale refit to the codes the (integer) zero point gives
        q = np.clip(np.round(w / s[:, None] + z[:, None]), qtype.qmin, qtype.qmax) - z[:, None]
        denominator = (q * q).sum(axis=1)
        fitted = np.where(denominator > 0, (w * q).sum(axis=1) / np.where(denominator > 0, denominator, 1.0), s)
        fitted = np.where(fitted > 0, fitted, s)
        candidate = calibrate.storable_scale(fitted, codec.scale_dtype).astype(np.float64)
        error = _squared_error(w, candidate, z, qtype)
        better = error < best
        s = np.where(better, candidate, s)
        best = np.minimum(error, best)
    stored = s.astype(codec.scale_dtype)
    return stored, z.astype(np.int64).astype(qtype.dtype), stored


def _squared_error(w, s, z, qtype) -> np.ndarray:
    q = np.clip(np.round(w / s[:, None] + z[:, None]), qtype.qmin, qtype.qmax)
    return ((w - s[:, None] * (q - z[:, None])) ** 2).sum(axis=1)
