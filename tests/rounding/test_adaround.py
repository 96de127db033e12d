"""AdaRound (`qlinear.rounding.adaround`): its gradient against finite differences of the paper's loss run on
the calibration inputs (`qlinear.reference.adaround`), its codes against QuantizeLinear's rule on the grid
round-to-nearest chooses, its output error against round-to-nearest's, and its determinism."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from qlinear.granularity import Granularity
from qlinear.reference import adaround as reference
from qlinear.rounding.adaround import Objective, adaround, on_grid
from qlinear.rounding.codec import Groups, Layout, Parameters

from ._helpers import codec as _codec
from ._helpers import granularity, output_error

SEED = 20261205


def _layer(rng, rows=16, columns=40, samples=600):
    """A Gemm weight [rows, columns] and correlated input features [samples, columns]."""
    w = (rng.standard_normal((rows, columns)) * 0.05).astype(np.float32)
    mix = np.eye(columns) + 0.8 * rng.standard_normal((columns, columns)) / np.sqrt(columns)
    x = rng.standard_normal((samples, columns)) @ mix
    return w, x


def _setup(w, dtype="int4", kind="block", block=8, symmetric=False):
    layout = Layout.of("Gemm.T", w.shape)
    gran = granularity(kind, w.shape, block)
    groups = Groups.of_granularity(layout, gran)
    codec = _codec(dtype, symmetric)
    matrices = layout.view(w).astype(np.float64)
    params = Parameters(groups, codec)
    params.choose_all(matrices)
    return groups, codec, matrices, params


def test_the_gradient_is_that_of_the_papers_loss_on_the_inputs():
    rng = np.random.default_rng(SEED)
    w, x = _layer(rng, 6, 12, 50)
    groups, codec, matrices, params = _setup(w, "int4", "block", 4)
    effective, zero = params.per_element()
    scale, zero = effective.astype(np.float64), zero.astype(np.float64)
    qmin, qmax = codec.qtype.qmin, codec.qtype.qmax
    h = (x.T @ x)[None]
    objective = Objective(matrices, h, scale, zero, qmin, qmax, len(x))
    v = rng.standard_normal(matrices.shape) * 2.0
    kink = np.log(11.0)  # |V| where h(V) reaches 0 or 1: sigmoid(V) = 1/12 or 11/12
    v[np.abs(np.abs(v) - kink) < 1e-3] += 0.01
    args = (matrices[0], x, scale[0], zero[0], qmin, qmax)
    # The reconstruction term: the same number through H as through the inputs.
    value, _ = objective(v, 2.0, 0.0)
    expected = reference.loss(v[0], *args, beta=2.0, lam=0.0, weight=1 / len(x))
    assert value == pytest.approx(expected, rel=1e-9)
    for beta, lam in ((20.0, 0.0), (7.5, 0.3), (2.0, 0.01)):
        _, grad = objective(v, beta, lam)
        for r, k in zip(*np.nonzero(objective.free[0])):
            eps = 1e-6
            up, down = v[0].copy(), v[0].copy()
            up[r, k] += eps
            down[r, k] -= eps
            numeric = (reference.loss(up, *args, beta=beta, lam=lam, weight=1 / len(x))
                       - reference.loss(down, *args, beta=beta, lam=lam, weight=1 / len(x))) / (2 * eps)
            assert grad[0, r, k] == pytest.approx(numeric, rel=1e-5, abs=1e-7), (beta, lam, r, k)
    assert (~objective.free).sum() < objective.free.sum()



CASES = [("int4", "block", False), ("int4", "axis", False), ("int4", "block", True), ("uint8", "tensor", False),
         ("int2", "axis", False)]


@pytest.mark.parametrize("dtype,kind,symmetric", CASES)
def test_adaround_lowers_the_output_error_with_quantize_linears_codes(dtype, kind, symmetric):
    rng = np.random.default_rng(SEED + 1)
    w, x = _layer(rng)
    h = (x.T @ x)[None]
    groups, codec, matrices, params = _setup(w, dtype, kind, symmetric=symmetric)
    effective, zero = params.per_element()
    codes, values = adaround(matrices, h, groups, codec, params, len(x))
    # (a) QuantizeLinear's codes of weights on the chosen grid points, DequantizeLinear's values
    z = zero.astype(np.float64) if zero is not None else 0.0
    again, again_values = codec.round((codes.astype(np.float64) - z) * effective.astype(np.float64), effective, zero)
    np.testing.assert_array_equal(again, codes)
    np.testing.assert_array_equal(again_values, values)
    np.testing.assert_array_equal(codec.values(codes, effective, zero), values)
    # each weight rounded down or up (or saturated)
    position = matrices / effective.astype(np.float64) + z
    lowest = np.clip(np.floor(position), codec.qtype.qmin, codec.qtype.qmax)
    highest = np.clip(np.floor(position) + 1, codec.qtype.qmin, codec.qtype.qmax)
    assert ((codes >= lowest) & (codes <= highest)).all()
    # (b) strictly below round-to-nearest's error on the calibration data
    _, nearest = codec.round(matrices, effective, zero)
    assert output_error(values, matrices, h) < 0.9 * output_error(nearest, matrices, h)


def test_adaround_never_does_worse_than_round_to_nearest_row_by_row():
    rng = np.random.default_rng(SEED + 2)
    w, x = _layer(rng, 12, 24, 200)
    h = (x.T @ x)[None]
    groups, codec, matrices, params = _setup(w, "int4", "axis")
    effective, zero = params.per_element()
    _, values = adaround(matrices, h, groups, codec, params, len(x), iterations=3)  # barely optimised
    _, nearest = codec.round(matrices, effective, zero)
    def rows(v):
        return np.einsum("grk,gkl,grl->gr", v - matrices, h, v - matrices)

    assert (rows(values) <= rows(nearest)).all()


def test_the_grid_points_are_placed_exactly():
    """Every code of the type, under float32 and float16 weights and scales, comes back from its grid point
    (int16 codes under float16 weights: many points no float16 weight reaches, taken directly)."""
    rng = np.random.default_rng(SEED + 3)
    for dtype, weight_dtype, scale_dtype in (("int4", np.float32, np.float32), ("uint8", np.float16, np.float32),
                                             ("int8", np.float32, np.float16), ("uint4", np.float16, np.float16),
                                             ("int16", np.float16, np.float32)):
        codec = _codec(dtype, weight_dtype=weight_dtype, scale_dtype=scale_dtype)
        qtype = codec.qtype
        q = np.repeat(np.arange(qtype.qmin, qtype.qmax + 1, dtype=np.float64), 2 if qtype.bits > 8 else 20)
        scale = (np.exp(rng.uniform(-9, 2, q.size))).astype(scale_dtype)
        zero = rng.integers(qtype.qmin, qtype.qmax + 1, q.size).astype(qtype.dtype)
        codes, values = on_grid(codec, q, scale, zero)
        np.testing.assert_array_equal(codes.astype(np.float64), q)
        np.testing.assert_array_equal(values, codec.values(codes, scale, zero))


@pytest.mark.parametrize("dtype", ["mxfp4", "float4e2m1", "float8e4m3fn", "nvfp4"])
def test_adaround_needs_an_integer_grid(dtype):
    rng = np.random.default_rng(SEED + 4)
    w, x = _layer(rng, 4, 32, 40)
    layout = Layout.of("Gemm.T", w.shape)
    groups = Groups.of_granularity(layout, Granularity("block", w.shape, 1, 16))
    codec = _codec(dtype)
    with pytest.raises(ValueError, match="adaround needs an integer grid"):
        adaround(layout.view(w).astype(np.float64), (x.T @ x)[None], groups, codec, Parameters(groups, codec), len(x))


def test_adaround_is_the_same_on_every_run_and_thread_count():
    rng = np.random.default_rng(SEED + 5)
    w, x = _layer(rng)
    h = (x.T @ x)[None]
    runs = []
    for _ in range(2):
        groups, codec, matrices, params = _setup(w)
        runs.append(adaround(matrices, h, groups, codec, params, len(x))[0])
    np.testing.assert_array_equal(runs[0], runs[1])
    code = ("import numpy as np, hashlib\n"
            "from tests.rounding.test_adaround import _layer, _setup\n"
            "from qlinear.rounding.adaround import adaround\n"
            f"w, x = _layer(np.random.default_rng({SEED + 5}), 64, 256, 600)\n"
            "groups, codec, matrices, params = _setup(w)\n"
            "codes, _ = adaround(matrices, (x.T @ x)[None], groups, codec, params, len(x), iterations=50)\n"
            "print(hashlib.sha256(codes.tobytes()).hexdigest())\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digests = set()
    for threads in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                                timeout=300, check=False)
        assert result.returncode == 0, result.stderr
        digests.add(result.stdout.strip())
    assert len(digests) == 1
