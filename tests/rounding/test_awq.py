"""AWQ (`qlinear.rounding.awq`): its Hessian-based searches against the authors' searches run on the
calibration inputs (`qlinear.reference.awq`), its codes against QuantizeLinear's rule on the scaled weight,
its output error against round-to-nearest's, and its determinism."""

from __future__ import annotations

import numpy as np
import pytest

from qlinear.reference import awq as reference
from qlinear.rounding import input_channels
from qlinear.rounding import awq as fast
from qlinear.rounding.codec import Groups, Layout, Parameters

from ._helpers import codec as _codec
from ._helpers import granularity, output_error

SEED = 20261206


def _inputs(rng, samples, columns):
    """Correlated input features whose columns' magnitudes differ (some channels salient)."""
    mix = np.eye(columns) + 0.3 * rng.standard_normal((columns, columns)) / np.sqrt(columns)
    return (rng.standard_normal((samples, columns)) * np.exp(rng.standard_normal(columns))) @ mix


def _gemm(rng, rows=16, columns=40, samples=500):
    w = (rng.standard_normal((rows, columns)) * 0.05).astype(np.float32)
    return w, _inputs(rng, samples, columns), "Gemm.T"


def _conv(rng, samples=400):
    """A Conv weight [8, 5, 3, 3]: 45 feature columns, kernel positions outer, 5 channels inner."""
    w = (rng.standard_normal((8, 5, 3, 3)) * 0.1).astype(np.float32)
    channel_scale = np.exp(rng.standard_normal(5) * 1.5)
    x = rng.standard_normal((samples, 45)) * np.tile(channel_scale, 9)
    return w, x, "Conv"


def _setup(w, x, op, dtype="int4", kind="block", block=8, symmetric=False):
    layout = Layout.of(op, w.shape)
    groups = Groups.of_granularity(layout, granularity(kind, w.shape, block))
    codec = _codec(dtype, symmetric)
    codec.prepare(w)
    matrices = layout.view(w).astype(np.float64)
    channels = layout.view(input_channels(op, w.shape, 1))[:, 0, :]
    made = []

    def make_params():
        made.append(Parameters(groups, codec))
        return made[-1]

    return {"matrices": matrices, "hessians": (x.T @ x)[None], "magnitudes": np.abs(x).sum(axis=0)[None],
            "channels": channels, "groups": groups, "codec": codec, "make_params": make_params, "rows": len(x)}, made


def _quantizer(groups, codec):
    """Round to nearest on the grid chosen from the matrix given (the authors' w_quantize_func)."""
    def quantize(m):
        params = Parameters(groups, codec)
        params.choose_all(m[None])
        zero = params.zeros[groups.of] if params.zeros is not None else None
        return codec.round(m[None], params.effective[groups.of], zero)[1][0]
    return quantize


@pytest.mark.parametrize("layer,kind", [(_gemm, "block"), (_gemm, "axis"), (_conv, "block"), (_conv, "tensor")])
def test_the_scale_search_through_the_hessian_is_the_authors_on_the_inputs(layer, kind):
    rng = np.random.default_rng(SEED)
    w, x, op = layer(rng)
    a, _ = _setup(w, x, op, "int4", kind, block=8 if op != "Conv" else 5)
    means, present = fast.channel_means(a["magnitudes"], a["channels"], a["rows"])
    alphas, losses = fast.search_scales(a["matrices"], a["hessians"], means, present, a["channels"], a["groups"],
                                        a["codec"], a["make_params"])
    expected, scales = reference.search_scale(a["matrices"][0], x, a["channels"][0],
                                              _quantizer(a["groups"], a["codec"]))
    np.testing.assert_allclose(losses, expected, rtol=1e-9)
    assert alphas == [i / 20 for i in range(20)]
    np.testing.assert_array_equal(fast.channel_scales(means, present, alphas[int(np.argmin(losses))]), scales)
    assert np.argmin(losses) > 0  # the salient channels call for scaling


@pytest.mark.parametrize("layer", [_gemm, _conv])
def test_with_quantized_inputs_the_search_counts_their_rounding_as_the_transcription_does(layer):
    """Static quantization rounds the divided input x / s on a uint8 grid: the search's losses add that
    rounding's expected error, computed from the channels' ranges, as `reference.search_scale(levels=255)`
    computes it from the inputs; scales that widen the grid cost more than they did."""
    rng = np.random.default_rng(SEED + 1)
    w, x, op = layer(rng)
    # A channel of tiny mean that is not always 0: the scales magnify it most, and with it the input's grid step.
    spiky = np.isin(a_channels := _setup(w, x, op)[0]["channels"][0], [1])
    x = x.copy()
    x[:, spiky] = np.where(rng.random((len(x), 1)) < 0.004, 3.0, 0.0)
    del a_channels
    a, _ = _setup(w, x, op, "int4", "block", block=8 if op != "Conv" else 5)
    means, present = fast.channel_means(a["magnitudes"], a["channels"], a["rows"])
    quantized = fast.QuantizedInput.of(x.min(axis=0)[None], x.max(axis=0)[None], a["channels"], 255)
    _, losses = fast.search_scales(a["matrices"], a["hessians"], means, present, a["channels"], a["groups"], a["codec"],
                                   a["make_params"], quantized_input=quantized, rows=a["rows"])
    expected, scales = reference.search_scale(a["matrices"][0], x, a["channels"][0],
                                              _quantizer(a["groups"], a["codec"]), levels=255)
    np.testing.assert_allclose(losses, expected, rtol=1e-9)
    _, plain = fast.search_scales(a["matrices"], a["hessians"], means, present, a["channels"], a["groups"], a["codec"],
                                  a["make_params"])
    added = [q - p for q, p in zip(losses, plain)]
    assert min(added) > 0
    assert added[-1] > 2 * added[0]  # the strongest scaling widens the input's grid most


@pytest.mark.parametrize("dtype,kind,symmetric", [("int4", "block", False), ("int4", "axis", False),
                                                  ("int4", "block", True), ("uint8", "block", False)])
def test_the_clip_search_through_the_hessian_is_the_authors_on_the_inputs(dtype, kind, symmetric):
    rng = np.random.default_rng(SEED + 1)
    w, x, op = _gemm(rng)
    w[:, ::7] *= 4.0  # outliers worth clipping
    a, _ = _setup(w, x, op, dtype, kind, symmetric=symmetric)
    groups = a["groups"]
    scales = rng.uniform(0.5, 2.0, 40).astype(np.float32)
    columns = scales.astype(np.float64)[None, None, :]
    scaled = a["matrices"] * columns
    runs = groups.starts if groups.starts is not None else ((0,),)
    ratios, _ = fast.search_clip(a["matrices"], a["hessians"], scaled, columns, groups, a["codec"], a["make_params"],
                                 runs)
    codec = a["codec"]

    def quantize(clamped):
        """The scaled weight itself rounded on the grid chosen from the clamped one."""
        params = Parameters(groups, codec)
        params.choose_all(clamped[None])
        zero = params.zeros[groups.of] if params.zeros is not None else None
        return codec.round(scaled, params.effective[groups.of], zero)[1][0]

    expected = reference.search_clip(scaled[0], x / columns[0], runs[0], quantize)
    np.testing.assert_array_equal(ratios[groups.of[0][:, list(runs[0])]], expected)
    assert (expected == 1).any() and ((expected < 1).any() or codec.qtype.bits > 4)


CASES = [("int4", "block", False), ("int4", "axis", False), ("int4", "block", True), ("uint8", "tensor", False),
         ("float8e4m3fn", "axis", True), ("mxfp4", "block", True), ("nvfp4", "block", True), ("mxint8", "block", True)]


@pytest.mark.parametrize("dtype,kind,symmetric", CASES)
@pytest.mark.parametrize("layer", [_gemm, _conv])
@pytest.mark.parametrize("clip", [False, True])  # the clipping search: off by default (fast.CLIP), still exact
def test_awq_gives_quantize_linears_codes_and_never_a_larger_error(dtype, kind, symmetric, layer, clip):
    rng = np.random.default_rng(SEED + 2)
    w, x, op = layer(rng)
    block = {"mxfp4": 32, "mxint8": 32, "nvfp4": 16}.get(dtype, 8)
    a, made = _setup(w, x, op, dtype, kind, block, symmetric)
    codec, groups, matrices, h = a["codec"], a["groups"], a["matrices"], a["hessians"]
    # round to nearest (the unscaled weight's tensor scale for NVFP4, as `round_weight` prepares it)
    plain = Parameters(groups, codec)
    plain.choose_all(matrices)
    zero = plain.zeros[groups.of] if plain.zeros is not None else None
    _, nearest = codec.round(matrices, plain.effective[groups.of], zero)
    codes, values, scales = fast.awq(**a, clip=clip)
    assert scales.dtype == np.float32 and scales.shape == (int(a["channels"].max()) + 1,)
    columns = scales.astype(np.float64)[a["channels"]][:, None, :]
    # (a) QuantizeLinear's codes of the scaled weight on the last grid made, DequantizeLinear's values
    last = made[-1]
    zero = last.zeros[groups.of] if last.zeros is not None else None
    again, again_values = codec.round(matrices * columns, last.effective[groups.of], zero)
    assert again.dtype == codes.dtype
    np.testing.assert_array_equal(again.view(np.uint8) if again.dtype.itemsize == 1 else again,
                                  codes.view(np.uint8) if codes.dtype.itemsize == 1 else codes)
    np.testing.assert_array_equal(again_values, values)
    # (b) never above round-to-nearest's error on the calibration data, (mostly) below
    error, baseline = output_error(values / columns, matrices, h), output_error(nearest, matrices, h)
    assert error <= baseline
    if codec.integer and codec.qtype.bits <= 4:
        assert error < 0.95 * baseline


def test_awq_is_the_same_on_every_run():
    rng = np.random.default_rng(SEED + 3)
    w, x, op = _conv(rng)
    results = []
    for _ in range(2):
        a, _ = _setup(w, x, op, "int4", "block", 5)
        results.append(fast.awq(**a))
    for first, second in zip(*results):
        np.testing.assert_array_equal(first, second)


def test_dead_channels_keep_a_finite_scale():
    rng = np.random.default_rng(SEED + 4)
    w, x, op = _gemm(rng)
    x[:, 3] = 0.0
    a, _ = _setup(w, x, op)
    _, values, scales = fast.awq(**a)
    assert np.isfinite(scales).all() and (scales > 0).all() and np.isfinite(values).all()
