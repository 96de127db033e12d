"""GPTQ's rounding, transcribed from the paper's equations (Frantar et al. 2022, section 3, after OBQ):
one column at a time, with the inverse Hessian kept explicitly and the rounded column removed from it.

    for each column j, in order:
        q_j  = quant(w_j)                                   (the grid's nearest point)
        δ    = (w_j − q_j) / [H⁻¹]_jj
        w_j: ← w_j: − δ · [H⁻¹]_j,j:                        (eq. 3: the columns not yet rounded)
        H⁻¹  ← H⁻¹ − [H⁻¹]_:,j [H⁻¹]_j,: / [H⁻¹]_jj          (eq. 4: column j removed)

No Cholesky factor and no lazy batches: the slow form that `qlinear.rounding.gptq` must agree with. The
Hessian is dampened and its dead inputs given a unit diagonal as there.
"""

from __future__ import annotations

import numpy as np


def gptq(w: np.ndarray, h: np.ndarray, quant, damp: float = 0.01) -> np.ndarray:
    """The rounded values of ``w`` [R, K] (float64). ``quant(j, w)`` returns column ``j``'s rounded values
    given the current weights ``w`` (so that a grid chosen from a block's current values can be)."""
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    dead = np.diag(h) == 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    h += np.eye(len(h)) * damp * np.mean(np.diag(h))
    hinv = np.linalg.inv(h)
    rounded = np.empty_like(w)
    for j in range(w.shape[1]):
        q = quant(j, w)
        delta = (w[:, j] - q) / hinv[j, j]
        w[:, j:] -= np.outer(delta, hinv[j, j:])
        rounded[:, j] = q
        hinv = hinv - np.outer(hinv[:, j], hinv[j, :]) / hinv[j, j]
    return rounded
