"""AdaRound's objective transcribed from the paper (Nagel et al. 2020, eqs. 21-25, with a zero point), the
layer run on its calibration inputs ``x`` [N, K] rather than through their Hessian:

    h(V)  = clip(sigmoid(V) (ζ − γ) + γ, 0, 1)                       (eq. 23, ζ = 1.1, γ = −0.1)
    W̃     = s (clip(floor(W / s) + z + h(V), qmin, qmax) − z)         (eq. 22)
    L(V)  = weight ‖W x − W̃ x‖²_F + λ Σ (1 − |2 h(V) − 1|^β)          (eqs. 24, 25)

The slow form whose derivatives `qlinear.rounding.adaround` must give (the tests compare them with finite
differences of this loss).
"""

from __future__ import annotations

import numpy as np

ZETA, GAMMA = 1.1, -0.1


def rectified_sigmoid(v):
    return np.clip(1.0 / (1.0 + np.exp(-np.asarray(v, np.float64))) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def soft_weight(v, w, scale, zero, qmin: int, qmax: int):
    return scale * (np.clip(np.floor(w / scale) + zero + rectified_sigmoid(v), qmin, qmax) - zero)


def loss(v, w, x, scale, zero, qmin: int, qmax: int, beta: float, lam: float, weight: float = 1.0) -> float:
    """``w``, ``scale``, ``zero``, ``v`` [R, K]; ``x`` [N, K]."""
    reconstruction = weight * np.sum((x @ w.T - x @ soft_weight(v, w, scale, zero, qmin, qmax).T) ** 2)
    regulariser = lam * np.sum(1.0 - np.abs(2.0 * rectified_sigmoid(v) - 1.0) ** beta)
    return float(reconstruction + regulariser)
