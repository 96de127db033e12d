"""AdaRound (Nagel, Amjad, van Baalen, Louizos, Blankevoort 2020, "Up or Down? Adaptive Rounding for
Post-Training Quantization"): each weight is rounded down or up on a grid fixed beforehand, the choice
learned by gradient descent on the layer's output error.

Per weight a continuous ``V``; the soft-rounded code is ``floor(W / s) + h(V)`` with the rectified sigmoid
``h(V) = clip(sigmoid(V) (ζ − γ) + γ, 0, 1)``, ζ = 1.1, γ = −0.1, and the soft weight
``W̃ = s (clip(floor(W / s) + z + h(V), qmin, qmax) − z)``. The loss (the paper's eq. 25) is the layer's
output error on the calibration data, taken through the Hessian ``H = Σ x xᵀ`` of its ``rows`` input
feature vectors instead of a minibatch of them, plus the regulariser that drives h(V) to 0 or 1:

    L(V) = c tr(E H Eᵀ) + λ Σ (1 − |2 h(V) − 1|^β),      E = W̃ − W

β annealed linearly from 20 to 2 after a warm-up (the first 20% of the iterations) without the
regulariser; Adam, learning rate 1e-2; V started where h(V) is the fractional part of W / s (the
paper's init); λ = 0.01. The grid (each group's scale and zero point) is the one round-to-nearest
chooses, fixed first, as in the paper. Final codes: ``floor(W / s) + z + [h(V) ≥ 0.5]`` clipped to the
type's range; the codes and values returned are `Codec.round`'s of weights placed on those grid points.

The weight ``c`` of the output error: the paper's is ``1 / rows`` (a mean over the calibration vectors),
which makes λ's weight depend on the layer's scales: a layer whose inputs are 100x larger has its
regulariser ignored, its soft rounding never made hard, and ends far above round-to-nearest (seen on
test layers). Here ``c`` makes the mean ``c s² H_kk`` over the rounded weights ``SCALE`` = 3e-4, the middle
of the range where the paper's λ works (1e-5 to 1e-2 gave output errors within a few percent of each other
on test layers);
`Objective` takes ``normalize=False`` for the paper's ``1 / rows``.

The paper runs 10k iterations on minibatches. Here each iteration costs one [R, K] x [K, K] product on the
full Hessian: ``ITERATIONS`` = 700 keeps a 480 x 480 layer at about 6.5 s on one core (float32 NumPy;
twice the iterations gain about 1% of output error). As a safeguard, each output row keeps the rounding to
nearest where that has the lower output error (the error is a sum over rows, and with the grid fixed the
rows are independent). Integer grids only. There are no random draws (the full Hessian replaces the
paper's sampled minibatches): the result is a function of the inputs alone.

`qlinear.reference.adaround` transcribes the loss with the calibration inputs themselves; the tests check
this module's gradient against its finite differences.
"""

from __future__ import annotations

import numpy as np

from .codec import Codec, Groups, Parameters, row_errors

ZETA, GAMMA = 1.1, -0.1
LAMBDA = 0.01  # the paper's regulariser weight
ITERATIONS = 700  # the paper: 10k (see the module's docstring)
WARMUP = 0.2  # the fraction of the iterations without the regulariser
BETA_START, BETA_END = 20.0, 2.0
LEARNING_RATE = 1e-2
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
SCALE = 3e-4  # the mean s² H_kk the output error is normalised to (see the module's docstring)


def rectified_sigmoid(v: np.ndarray):
    """(h(V), dh/dV), in V's float type."""
    sig = np.tanh(v * v.dtype.type(0.5))  # sigmoid(v) = (1 + tanh(v / 2)) / 2, without overflow
    sig += 1.0
    sig *= 0.5
    raw = sig * v.dtype.type(ZETA - GAMMA)
    raw += v.dtype.type(GAMMA)
    hv = np.clip(raw, 0.0, 1.0)
    dh = 1.0 - sig
    dh *= sig
    dh *= v.dtype.type(ZETA - GAMMA)
    dh *= raw == hv  # zero where the clip holds h (a boundary hit exactly has measure zero)
    return hv, dh


def initial(fraction: np.ndarray) -> np.ndarray:
    """V with h(V) = ``fraction`` (in [0, 1))."""
    p = (np.asarray(fraction, np.float64) - GAMMA) / (ZETA - GAMMA)
    return np.log(p) - np.log1p(-p)


def beta_at(t: int, iterations: int) -> float:
    """β at iteration ``t``: 20 through the warm-up, then down linearly to 2 at the end."""
    start = WARMUP * iterations
    if t < start:
        return BETA_START
    rel = (t - start) / max(iterations - start, 1)
    return BETA_END + (BETA_START - BETA_END) * max(0.0, 1.0 - rel)


class Objective:
    """The loss of ``w`` [G, R, K] under per-element ``scale`` and ``zero`` (float64) on the type's
    range [qmin, qmax], given ``hessians`` [G, K, K] over ``rows`` vectors, as a function of V; computed
    in ``dtype`` (the optimisation runs in float32, the checks in float64)."""

    def __init__(self, w, hessians, scale, zero, qmin: int, qmax: int, rows: int, dtype=np.float64,
                 normalize: bool = False):
        w = np.asarray(w, np.float64)
        scale = np.asarray(scale, np.float64)
        zero = np.asarray(zero, np.float64)
        self.dtype = np.dtype(dtype)
        quotient = w / scale
        down = np.floor(quotient)
        self.fraction = quotient - down
        down += zero  # the code of rounding down
        # Where down and up are both in range the rounding is free; elsewhere the clip fixes the code.
        self.free = (down >= qmin) & (down <= qmax - 1)
        self.offset = np.where(self.free, down, np.clip(down, qmin, qmax))  # the code: offset + free * h(V)
        # E = slope * h(V) + base
        self.slope = (self.free * scale).astype(self.dtype)
        self.base = ((self.offset - zero) * scale - w).astype(self.dtype)
        h = np.asarray(hessians, np.float64)
        self.weight = 1.0 / max(rows, 1)  # the output error's weight in the loss: H / rows, or normalised
        if normalize:
            diagonal = np.diagonal(h, axis1=1, axis2=2)[:, None, :]  # [G, 1, K]
            norm = float(np.mean((scale ** 2 * diagonal)[self.free])) if self.free.any() else 0.0
            if norm > 0:
                self.weight = SCALE / norm
        self.h = (h * self.weight).astype(self.dtype)
        self.count = float(np.count_nonzero(self.free))

    def codes(self, v):
        """The final codes, floor + z + [h(V) ≥ 0.5] clipped (float64)."""
        hv, _ = rectified_sigmoid(v)
        return self.offset + (self.free & (hv >= 0.5))

    def __call__(self, v, beta: float, lam: float, value: bool = True):
        """(loss or None, dloss/dV)."""
        hv, dh = rectified_sigmoid(np.asarray(v, self.dtype))
        error = hv * self.slope
        error += self.base
        weighted = np.matmul(error, self.h)  # E H per matrix
        loss = float(np.sum(weighted * error, dtype=np.float64)) if value else None
        grad = weighted
        grad *= 2.0 * self.slope
        if lam:
            t = 2.0 * hv - 1.0
            a = np.abs(t)
            power = a ** self.dtype.type(beta - 1.0)
            if value:
                loss += lam * (self.count - float(np.sum(power[self.free] * a[self.free], dtype=np.float64)))
            power *= np.sign(t)
            power *= self.dtype.type(lam * 2.0 * beta)
            grad -= power
        grad *= dh
        grad *= self.free  # V of a weight the clip holds does nothing
        return loss, grad


def optimize(objective: Objective, iterations: int = ITERATIONS, lam: float = LAMBDA, lr: float = LEARNING_RATE,
             progress=None, units: int = 0) -> np.ndarray:
    """V after ``iterations`` Adam steps from the paper's init (in the objective's float type);
    ``progress(n)`` gets ``units`` in all."""
    v = initial(objective.fraction).astype(objective.dtype)
    m = np.zeros_like(v)
    s = np.zeros_like(v)
    b1, b2 = ADAM_BETAS
    reported = 0
    for t in range(iterations):
        warm = t < WARMUP * iterations
        _, grad = objective(v, beta_at(t, iterations), 0.0 if warm else lam, value=False)
        m *= b1
        m += (1.0 - b1) * grad
        grad *= grad
        s *= b2
        s += (1.0 - b2) * grad
        denominator = s * objective.dtype.type(1.0 / (1.0 - b2 ** (t + 1)))
        np.sqrt(denominator, out=denominator)
        denominator += ADAM_EPS
        step = m * objective.dtype.type(lr / (1.0 - b1 ** (t + 1)))
        step /= denominator
        v -= step
        if progress is not None:
            due = units * (t + 1) // iterations
            if due > reported:
                progress(due - reported)
                reported = due
    return v


def on_grid(codec: Codec, q: np.ndarray, effective: np.ndarray, zero) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) of `Codec.round` on weights placed on grid points ``q`` (float64 integers): the
    weight ``(q − z) s``; a point that QuantizeLinear would put elsewhere takes its code directly (the
    codes and values `Codec.round` gives any weight that rounds to it)."""
    z = np.zeros_like(q) if zero is None else np.asarray(zero, np.float64)
    placed = (q - z) * np.asarray(effective, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # a point beyond the weight type's range: taken directly
        codes, values = codec.round(placed, effective, zero)
    wrong = codes.astype(np.float64) != q
    if wrong.any():
        codes = codes.copy()
        codes[wrong] = q[wrong].astype(np.int64).astype(codes.dtype)
        values = codec.values(codes, effective, zero)
    return codes, values


def adaround(matrices: np.ndarray, hessians: np.ndarray, groups: Groups, codec: Codec, params: Parameters,
             rows: int, iterations: int = ITERATIONS, seed: int = 0, progress=None, lam: float = LAMBDA):
    """Round ``matrices`` [G, R, K] (float64) given ``hessians`` [G, K, K] summed over ``rows`` feature
    vectors; returns (codes [G, R, K], values [G, R, K] float64). ``params``: the groups' parameters,
    chosen here from ``matrices`` (round-to-nearest's) unless chosen already. ``seed`` is kept for the
    interface: nothing is drawn at random. ``progress(n)`` is told of the columns done, G·K in all."""
    del seed
    if not codec.integer:
        name = codec.fmt.name if codec.fmt is not None else codec.qtype.onnx_name
        raise ValueError(f"adaround needs an integer grid (rounds up or down between integer codes); {name} has "
                         f"none (use gptq, awq or rtn)")
    w = np.asarray(matrices, np.float64)
    if not params.known.all():
        params.choose_all(w)
    effective, zero = params.per_element()
    scale = np.asarray(effective, np.float64)
    zero64 = np.zeros_like(scale) if zero is None else np.asarray(zero, np.float64)
    h = np.asarray(hessians, np.float64)
    objective = Objective(w, h, scale, zero64, codec.qtype.qmin, codec.qtype.qmax, rows, np.float32, normalize=True)
    v = optimize(objective, iterations, lam, progress=progress, units=w.shape[0] * w.shape[2])
    codes, values = on_grid(codec, objective.codes(v), effective, zero)
    # The safeguard: a row keeps round-to-nearest where that is better on the calibration data.
    near_codes, near_values = codec.round(w, effective, zero)
    worse = row_errors(values - w, h) > row_errors(near_values - w, h)
    codes[worse] = near_codes[worse]
    values[worse] = near_values[worse]
    return codes, values
