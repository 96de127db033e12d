"""Inputs for the MX tests: random rows at every magnitude, and each format's hazards (amax 1 ulp below a
power of two, exact ties, zeros and -0, float32 subnormals, block maxima at and beside max * 2^k, both
ends of E8M0's exponent range). Shared by the three tests of this folder."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

from . import _mx_exact as ex

F32 = np.float32
TINY = np.finfo(F32).smallest_subnormal
FLT_MAX = np.finfo(F32).max


def below(v) -> np.float32:
    return np.nextafter(F32(v), F32(0))


def above(v) -> np.float32:
    return np.nextafter(F32(v), F32(np.inf))


def random_rows(rng, n_rows: int, k: int) -> np.ndarray:
    """Gaussian, Student-t(3) and uniform rows, bf16-rounded rows (many exact ties), each row at its own
    power-of-two magnitude between 2^-140 and 2^120."""
    kinds = [
        lambda: rng.standard_normal(k),
        lambda: rng.standard_t(3, k),
        lambda: rng.uniform(-1, 1, k),
        lambda: rng.standard_normal(k).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64),
    ]
    rows = []
    for i in range(n_rows):
        v = kinds[i % len(kinds)]()
        rows.append(np.ldexp(v, int(rng.integers(-140, 121))))
    return np.asarray(rows).astype(F32)


def edge_cases(name: str, rng) -> list[np.ndarray]:
    """Arrays built around the format's own boundaries. The exponent sweeps use rows of 3 (one partial
    block each: the maximum and two smaller values); ties, zeros, subnormals and huge values full blocks."""
    spec = ex.SPECS[name]
    mx_max = float(spec.max)
    sign = lambda: F32(rng.choice([-1.0, 1.0]))  # noqa: E731

    def short(head):
        """[head, two random values below it]: a partial block whose maximum is |head|."""
        return [head, F32(head * rng.uniform(-1, 1)), F32(head * rng.uniform(-0.5, 0.5))]

    sweeps = []
    # amax 1 ulp below, at and 1 ulp above every second power of two across float32's range, and every one
    # in [-128, -110] (where amax / 2^emax is a float32 subnormal for some format).
    for k in sorted(set(range(-149, 128, 2)) | set(range(-128, -109)) | {0, 126}):
        p = F32(np.ldexp(1.0, k))
        for a in (below(p), p, above(p)):
            if 0 < a < np.inf:
                sweeps.append(short(sign() * a))
    # "even" rule boundary: amax with significand exactly 2 - 2^-(mantissa_bits+1) (rounds up) and 1 ulp
    # either side.
    for k in (-140, -127, -126, -20, 0, 20, 127):
        edge = F32(np.ldexp(2.0 - 2.0 ** -(spec.mantissa_bits + 1), k))
        for a in (below(edge), edge, above(edge)):
            if 0 < a < np.inf:
                sweeps.append(short(sign() * a))
    # "ceil" rule boundary: amax at and 1-2 ulp beside max * 2^k; where amax / max is a float32 subnormal
    # (k <= -127) the float32 quotient rounds back to 2^k.
    top = int(np.floor(np.log2(float(FLT_MAX) / mx_max)))
    for k in sorted(set(range(-150, -119)) | set(range(-110, top + 1, 10)) | {top}):
        m = F32(np.ldexp(mx_max, k))
        for a in (below(m), m, above(m), above(above(m))):
            if 0 < a < np.inf:
                sweeps.append(short(a))
    cases = [np.asarray(sweeps, F32)]

    # Block maximum at, 1 ulp below and 1 ulp above max * 2^k (every rule gives e = k at max * 2^k), the
    # other 31 elements on exact midpoints of the element grid times 2^k (ties under every rule).
    if spec.element is not None:
        vals = [v for v, _ in spec.element.grid]
        mids = [(a + b) / 2 for a, b in zip(vals, vals[1:])]
    else:
        mids = [Fraction(2 * n + 1, 128) for n in range(127)]
    ties = []
    for k in [-135, -127, -126, -60, 0, 1, 60, top]:
        m = F32(np.ldexp(mx_max, k))
        tie_vals = [F32(float(mids[i]) * 2.0**k) * sign() for i in rng.choice(len(mids), 31)]
        for head in (m, below(m), above(m)):
            if 0 < head < np.inf:
                ties.append([head] + tie_vals)
    cases.append(np.asarray(ties, F32))

    # Zeros, -0, float32 subnormals (alone and inside normal blocks), float32's largest values (the top
    # clamp of "ceil"/"even" for MXINT8 and the E8M0 top).
    sub_bits = rng.integers(1, 1 << 23, 32).astype(np.uint32) | (rng.integers(0, 2, 32).astype(np.uint32) << 31)
    normal = np.finfo(F32).smallest_normal
    cases.append(np.asarray([
        np.zeros(32, F32),
        np.full(32, -0.0, F32),
        [0.0, -0.0] * 15 + [TINY, -TINY],
        sub_bits.view(F32),
        [normal, below(normal)] + [-TINY] * 30,
        [1.0] + [TINY * i for i in range(31)],
        [FLT_MAX, -FLT_MAX, below(FLT_MAX)] + [2.0**127] * 29,
        [FLT_MAX] + [1.0] * 31,
        np.ldexp(rng.uniform(-1, 1, 32), 127),
    ], F32))
    return cases


def pad_to_blocks(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x with zeros appended along the last axis up to a whole number of blocks (no block maximum changes)."""
    k = x.shape[-1]
    extra = -k % block
    return np.concatenate([x, np.zeros(x.shape[:-1] + (extra,), x.dtype)], axis=-1) if extra else x


def nvfp4_tie_tensor(rng, j: int) -> np.ndarray:
    """g = 2^j exactly (the tensor maximum is 2688 * 2^j); blocks whose amax / 6 / g is an E4M3 value or an
    exact E4M3 midpoint (block-scale ties), with their other elements on exact E2M1 midpoints times
    d = s8 * g (element ties)."""
    rows = [np.full(16, F32(2688.0 * 2.0**j))]
    e4 = [v for v, _ in ex.E4M3.grid if v > 0]
    e2 = [v for v, _ in ex.E2M1.grid]
    e2_mids = [(a + b) / 2 for a, b in zip(e2, e2[1:])]
    for i in rng.choice(len(e4) - 1, 40):
        for s in (e4[i], (e4[i] + e4[i + 1]) / 2):
            amax = F32(float(6 * s) * 2.0**j)
            row = [amax]
            d = float(ex.E4M3.value(ex.E4M3.round_code(s, False))) * 2.0**j
            for m in rng.choice(len(e2_mids), 15):
                row.append(F32(float(e2_mids[m]) * d * rng.choice([-1.0, 1.0])))
            rows.append(np.asarray(row, F32))
    return np.asarray(rows, F32)
