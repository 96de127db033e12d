"""The exact integer convolution (fused im2col + integer GEMM, direct depthwise) on every kernel path, against an
int64 direct convolution written plainly here (a loop over taps and channels; no im2col)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.kernels import im2col
from qlinear.kernels import integer_gemm as ig
from suite import examples, kernel_paths, other_paths

PATHS = kernel_paths(ig.available_paths())
I8, U8 = np.int8, np.uint8


def lim(dt):
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def rand(rng, shape, dt):
    lo, hi = lim(dt)
    return rng.integers(lo, hi + 1, shape).astype(dt)


def direct_conv(x, za, w, zw, bias, group, strides, dilations, pads_begin, pads_end):
    """int64 sum over taps and input channels of (x - za) * (w - zw), padding counted as za."""
    n_sp = x.ndim - 2
    xc = np.pad(x.astype(np.int64) - int(za), [(0, 0), (0, 0)] + list(zip(pads_begin, pads_end)))
    wc = w.astype(np.int64) - np.broadcast_to(np.asarray(zw, np.int64).reshape(-1), (w.shape[0],)).reshape(
        (-1,) + (1,) * (w.ndim - 1))
    m_total, cg = w.shape[:2]
    kern = w.shape[2:]
    out_sp = tuple((xc.shape[2 + i] - dilations[i] * (kern[i] - 1) - 1) // strides[i] + 1 for i in range(n_sp))
    out = np.zeros((x.shape[0], m_total) + out_sp, np.int64)
    m_g = m_total // group
    for o in range(m_total):
        g = o // m_g
        for tap in itertools.product(*[range(k) for k in kern]):
            window = tuple(slice(tap[i] * dilations[i], tap[i] * dilations[i] + strides[i] * (out_sp[i] - 1) + 1,
                                 strides[i]) for i in range(n_sp))
            for c in range(cg):
                out[:, o] += xc[(slice(None), g * cg + c) + window] * wc[(o, c) + tap]
    if bias is not None:
        out += bias.astype(np.int64).reshape((1, m_total) + (1,) * n_sp)
    return out


def geo(strides, dilations, pads_begin, pads_end):
    return dict(strides=strides, dilations=dilations, pads_begin=pads_begin, pads_end=pads_end)


@pytest.fixture(params=PATHS)
def path(request):
    return request.param


# x shape, w shape, group, strides, dilations, pads_begin, pads_end
CASES = [
    ((2, 8, 9, 10), (6, 8, 3, 3), 1, (1, 1), (1, 1), (1, 1), (1, 1)),
    ((1, 6, 11, 7), (4, 3, 3, 2), 2, (2, 1), (1, 2), (0, 1), (2, 0)),
    ((2, 5, 13), (7, 5, 4), 1, (2,), (2,), (1,), (3,)),
    ((1, 4, 5, 6, 7), (3, 4, 2, 3, 2), 1, (1, 2, 1), (1, 1, 2), (1, 0, 1), (0, 1, 1)),
    ((2, 8, 10, 9), (8, 1, 3, 3), 8, (2, 2), (1, 1), (1, 1), (1, 1)),  # depthwise, stride 2
    ((1, 4, 10, 9), (8, 1, 3, 3), 4, (1, 1), (2, 1), (2, 1), (1, 0)),  # depthwise, multiplier 2, dilated
    ((1, 3, 3, 5), (6, 1, 3, 3), 3, (3, 1), (1, 1), (1, 1), (1, 1)),  # depthwise, multiplier 2, stride 3
    ((1, 4, 12, 21), (8, 1, 5, 5), 4, (2, 1), (1, 1), (2, 2), (2, 2)),  # depthwise 5x5, rows of stride 1 as runs
    ((1, 3, 14, 17), (6, 1, 5, 5), 3, (2, 2), (1, 1), (2, 2), (2, 2)),  # depthwise 5x5, stride 2: the virtual plane
    ((2, 3, 11, 12), (3, 1, 5, 5), 3, (1, 1), (2, 1), (3, 2), (4, 1)),  # depthwise 5x5, dilated rows, uneven pads
    ((1, 3, 30, 31), (64, 3, 7, 7), 1, (2, 2), (1, 1), (3, 3), (3, 3)),  # ResNet stem shape, smaller
    ((5, 37, 3, 3), (70, 37, 1, 1), 1, (1, 1), (1, 1), (0, 0), (0, 0)),  # pixel panels span images
    ((3, 16, 7, 7), (40, 16, 3, 3), 1, (1, 1), (1, 1), (1, 1), (1, 1)),
    ((1, 2, 4, 4), (3, 2, 4, 4), 1, (1, 1), (1, 1), (0, 0), (0, 0)),  # a single output pixel
    ((2, 3, 6, 30), (4, 3, 3, 3), 1, (1, 1), (2, 2), (2, 2), (2, 2)),  # stride 1, wide: virtual columns, dilated
    ((2, 6, 40, 33), (5, 6, 1, 1), 1, (1, 1), (1, 1), (0, 0), (0, 0)),  # 1x1 unpadded: input used in place
    ((2, 4, 23, 19), (6, 2, 5, 5), 2, (2, 3), (2, 1), (2, 1), (3, 2)),  # strided 5x5: phase-split input
    # stride 1 with symmetric weights (the test's second half): the direct path's interleaved input
    ((2, 12, 20, 21), (8, 6, 3, 3), 2, (1, 1), (1, 1), (1, 1), (1, 1)),  # groups of 6 channels (padded to 8)
    ((3, 7, 17, 40), (9, 7, 3, 5), 1, (1, 1), (1, 2), (0, 3), (2, 1)),  # uneven pads, dilated
    ((1, 5, 4, 7, 30), (4, 5, 3, 2, 3), 1, (1, 1, 1), (1, 1, 1), (1, 0, 1), (1, 1, 1)),  # 3-D
    ((2, 9, 33, 37), (3, 9, 3, 3), 1, (1, 1), (1, 1), (0, 0), (0, 0)),  # unpadded: the last rows' short runs
    # strides (2, 2) on the polyphase input, read directly with symmetric weights
    ((2, 6, 15, 40), (5, 6, 3, 3), 1, (2, 2), (1, 1), (1, 1), (1, 1)),  # odd height, channels padded to 8
    ((1, 9, 20, 71), (4, 9, 3, 3), 1, (2, 2), (1, 1), (0, 1), (1, 0)),  # uneven pads
    ((2, 8, 36, 35), (12, 4, 3, 3), 2, (2, 2), (1, 1), (1, 1), (1, 1)),  # two groups
]


@pytest.mark.parametrize("case", CASES, ids=[str(c[1]) + f"g{c[2]}" for c in CASES])
@pytest.mark.parametrize("xdt,wdt", [(U8, I8), (I8, U8), (I8, I8)])
def test_conv_matches_direct_int64(path, case, xdt, wdt, monkeypatch):
    xs, ws, group, strides, dil, pb, pe = case
    rng = np.random.default_rng(abs(hash((xs, ws))) % 2**32)
    x, w = rand(rng, xs, xdt), rand(rng, ws, wdt)
    za = rand(rng, (), xdt)
    zw = rand(rng, (ws[0],), wdt)  # per-channel, nonzero: the zero-point corrections run
    bias = rng.integers(-(2**20), 2**20, ws[0]).astype(np.int32)
    packed = im2col.prepack_conv(w, zw, group)
    g = geo(strides, dil, pb, pe)
    got = im2col.conv(x, za, packed, bias, g, path=path)
    want = direct_conv(x, za, w, zw, bias, group, strides, dil, pb, pe)
    assert got.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # the prepacked weights serve a second input, with a symmetric zero point and no bias: read through im2col
    # panels and, where the direct path takes it (stride 1 or 2, more than one tap), in place
    x2 = rand(rng, xs, xdt)
    want = direct_conv(x2, za, w, 0 if wdt == I8 else 128, None, group, strides, dil, pb, pe)
    for direct in (False, True):
        monkeypatch.setattr(im2col, "_DIRECT", direct)
        packed0 = im2col.prepack_conv(w, wdt(0) if wdt == I8 else wdt(128), group)
        np.testing.assert_array_equal(im2col.conv(x2, za, packed0, None, g, path=path), want)


@pytest.mark.parametrize("zw, taps, stride, direct", [(0, 3, 1, True), (0, 3, 2, True), (3, 3, 1, False),
                                                      (0, 1, 1, False)])
def test_direct_path_only_for_replicated_taps_and_weight_zero_points_0(path, monkeypatch, zw, taps, stride,
                                                                        direct):
    """Stride 1 or 2, symmetric weights and more than one tap: the call may read the interleaved input in place
    (an alternative launch of kind direct_gemm, timed against the packed one on the first calls), with the bits
    of the packed im2col path; forced (_DIRECT True) it is the launch."""
    monkeypatch.setattr(im2col, "_PLANS", {})  # no decision of an earlier test's calls of the same shape
    rng = np.random.default_rng(7)
    x = rand(rng, (2, 10, 30, 31), U8)
    w = rng.integers(-20, 21, (12, 10, taps, taps)).astype(np.int8)  # byte pairs fit avx2ub
    pads = (taps // 2,) * 2
    g = geo((stride, stride), (1, 1), pads, pads)
    want = direct_conv(x, 5, w, zw, None, 1, (stride, stride), (1, 1), pads, pads)
    launch = im2col.prepare(x.shape, x.dtype, 5, im2col.prepack_conv(w, np.int8(zw), 1), None, g, path=path)
    eligible = direct and path != "blas"
    assert launch.kind != "direct_gemm" and (launch.alt is not None) == eligible
    if eligible:
        assert launch.alt.kind == "direct_gemm"
        for _ in range(2 * (ig.threads.FasterOf.SKIPPED + ig.threads.FasterOf.TRIALS) + 1):  # both, then the choice
            np.testing.assert_array_equal(launch.run(x), want)
        assert launch.alt_choices[ig.threads.get_num_threads()].choice in (0, 1)
        before = ig.threads.get_num_threads()
        other = 1 if before > 1 else min(2, ig.threads._max_threads())
        if other != before:  # decided per thread count: the other count measures its own
            ig.threads.set_num_threads(other)
            try:
                np.testing.assert_array_equal(launch.run(x), want)
            finally:
                ig.threads.set_num_threads(before)
            assert set(launch.alt_choices) == {before, other} and launch.alt_choices[other].choice is None
    monkeypatch.setattr(im2col, "_DIRECT", True)
    forced = im2col.prepare(x.shape, x.dtype, 5, im2col.prepack_conv(w, np.int8(zw), 1), None, g, path=path)
    assert (forced.kind == "direct_gemm") == eligible and forced.alt is None
    np.testing.assert_array_equal(forced.run(x), want)
    # the interleaving in tasks of several channel groups, the last task short (at stride 1: 6 groups, 4 a task)
    monkeypatch.setattr(im2col, "_FILL_TASK_GROUPS", 4300)
    forced = im2col.prepare(x.shape, x.dtype, 5, im2col.prepack_conv(w, np.int8(zw), 1), None, g, path=path)
    np.testing.assert_array_equal(forced.run(x), want)
    monkeypatch.setattr(im2col, "_FILL_TASK_GROUPS", 1)  # a task per channel group
    forced = im2col.prepare(x.shape, x.dtype, 5, im2col.prepack_conv(w, np.int8(zw), 1), None, g, path=path)
    np.testing.assert_array_equal(forced.run(x), want)
    monkeypatch.setattr(im2col, "_DIRECT", False)
    off = im2col.prepare(x.shape, x.dtype, 5, im2col.prepack_conv(w, np.int8(zw), 1), None, g, path=path)
    assert off.kind != "direct_gemm" and off.alt is None
    np.testing.assert_array_equal(off.run(x), want)


def test_new_weights_of_a_decided_shape_build_the_chosen_kernel_alone(path, monkeypatch):
    """The calls of a layer shape decide between packed panels and the direct path once per thread count, for
    every packing of weights of that shape (a raw-weights call packs anew each time): once the panels won, a
    new packing builds no direct launch (nor packs its weights); once the direct path won, it does. Same bits."""
    if path == "blas":
        pytest.skip("no direct path")
    monkeypatch.setattr(im2col, "_PLANS", {})
    rng = np.random.default_rng(8)
    x = rand(rng, (2, 10, 30, 31), U8)  # the direct path's test's shapes: eligible on every kernel path
    g = geo((1, 1), (1, 1), (1, 1), (1, 1))

    def launched():
        w = rng.integers(-20, 21, (12, 10, 3, 3)).astype(np.int8)  # byte pairs fit avx2ub
        launch = im2col.prepare(x.shape, x.dtype, 5, im2col.prepack_conv(w, np.int8(0), 1), None, g, path=path)
        return launch, direct_conv(x, 5, w, 0, None, 1, (1, 1), (1, 1), (1, 1), (1, 1))

    first, want = launched()
    assert first.alt is not None
    choice = first.alt_choices.setdefault(ig.threads.get_num_threads(), ig.threads.FasterOf())
    choice.choice = 0  # the panels won
    second, want = launched()
    assert second.alt is None and second.packed._direct == {}
    np.testing.assert_array_equal(second.run(x), want)
    choice.choice = 1  # the direct path won
    third, want = launched()
    assert third.alt is not None and third.alt_choices is first.alt_choices
    np.testing.assert_array_equal(third.run(x), want)


def test_every_width_of_the_last_pixel_panel(path):
    # 1x1 convolutions of 1..65 output pixels: the last pixel panel's width at most half of NR (the half-width
    # microkernel: a 7x7 output is 3 x 16 + 1 pixels) and above it
    rng = np.random.default_rng(12)
    w = rand(rng, (13, 20, 1, 1), I8)
    zw = rand(rng, (13,), I8)
    packed = im2col.prepack_conv(w, zw)
    g = geo((1, 1), (1, 1), (0, 0), (0, 0))
    for n in range(1, 66):
        x = rand(rng, (1, 20, 1, n), U8)
        want = direct_conv(x, U8(7), w, zw, None, 1, (1, 1), (1, 1), (0, 0), (0, 0))
        np.testing.assert_array_equal(im2col.conv(x, U8(7), packed, None, g, path=path), want, err_msg=f"n={n}")


@pytest.mark.parametrize("x_val,za,w_val,zw", [(255, 0, -128, 127), (0, 255, 127, -128), (255, 0, 127, -128)])
def test_conv_worst_case_with_padding(path, x_val, za, w_val, zw):
    x = np.full((2, 64, 6, 5), x_val, U8)
    w = np.full((33, 64, 3, 3), w_val, I8)
    packed = im2col.prepack_conv(w, np.int8(zw))
    g = geo((1, 1), (1, 1), (2, 1), (1, 2))
    np.testing.assert_array_equal(im2col.conv(x, U8(za), packed, None, g, path=path),
                                  direct_conv(x, za, w, zw, None, 1, (1, 1), (1, 1), (2, 1), (1, 2)))


def test_conv_depthwise_worst_case(path):
    x = np.full((1, 16, 9, 9), 255, U8)
    w = np.full((16, 1, 3, 3), -128, I8)
    packed = im2col.prepack_conv(w, np.int8(127), 16)
    g = geo((2, 2), (1, 1), (1, 1), (1, 1))
    np.testing.assert_array_equal(im2col.conv(x, U8(0), packed, None, g, path=path),
                                  direct_conv(x, 0, w, 127, None, 16, (2, 2), (1, 1), (1, 1), (1, 1)))


def test_conv_sum_leaving_int32_raises(path):
    # K = 4100 * 9 = 36900 taps of 255 * 255 cannot fit in int32
    x = np.full((1, 4100, 3, 3), 255, U8)
    w = np.full((2, 4100, 3, 3), 127, I8)
    packed = im2col.prepack_conv(w, np.int8(-128))
    with pytest.raises(ValueError, match=r"conv: the exact accumulator leaves int32"):
        im2col.conv(x, U8(0), packed, None, geo((1, 1), (1, 1), (0, 0), (0, 0)), path=path)


@pytest.mark.parametrize("mode", ["float64", "float32"])
@pytest.mark.parametrize("ydt", [U8, I8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_requantization_fused(path, mode, ydt, per_channel):
    rng = np.random.default_rng(11)
    # padded 3x3 (output rows with gaps in the GEMM's columns), 1x1 (contiguous), stride 2, depthwise
    for xs, ws, group, s, p in [((2, 6, 9, 8), (10, 6, 3, 3), 1, 1, 1), ((2, 6, 9, 8), (6, 1, 3, 3), 6, 1, 1),
                                ((2, 6, 9, 8), (40, 6, 1, 1), 1, 1, 0), ((1, 5, 11, 12), (9, 5, 3, 3), 1, 2, 1)]:
        x, w = rand(rng, xs, U8), rand(rng, ws, I8)
        bias = rng.integers(-3000, 3000, ws[0]).astype(np.int32)
        mult = (rng.random(ws[0] if per_channel else ()) * 4e-3).astype(np.float32)
        yzp = rand(rng, (), ydt)
        g = geo((s, s), (1, 1), (p, p), (p, p))
        got = im2col.conv(x, U8(77), im2col.prepack_conv(w, np.int8(0), group), bias, g, (mult, yzp, ydt, mode),
                          path=path)
        acc = direct_conv(x, 77, w, 0, bias, group, (s, s), (1, 1), (p, p), (p, p))
        m = np.asarray(mult).reshape((1, -1, 1, 1)) if per_channel else mult
        qmin, qmax = lim(ydt)
        if mode == "float64":
            want = np.rint(np.clip(acc * m.astype(np.float64) + float(yzp), qmin, qmax)).astype(ydt)
        else:
            y = np.clip(acc.astype(np.float32) * m, np.float32(qmin - int(yzp)), np.float32(qmax - int(yzp)))
            want = (np.rint(y) + np.float32(yzp)).astype(ydt)
        np.testing.assert_array_equal(got, want)


def test_repeated_calls_with_one_prepacked_weight_set(path):
    """The per-plan epilogue cache (bias, x zero point, per-channel multipliers) never serves stale values:
    every call of a sequence that changes one of them at a time equals the direct int64 result."""
    rng = np.random.default_rng(12)
    x, w = rand(rng, (1, 8, 7, 9), U8), rand(rng, (12, 8, 3, 3), I8)
    packed = im2col.prepack_conv(w, np.int8(0), 1)
    g = geo((1, 1), (1, 1), (1, 1), (1, 1))
    bias_a = rng.integers(-3000, 3000, 12).astype(np.int32)
    bias_b = bias_a + 1
    mult_a = (rng.random(12) * 4e-3).astype(np.float32)
    mult_b = mult_a * np.float32(1.5)
    for za, bias, mult in [(77, bias_a, mult_a), (77, bias_b, mult_a), (78, bias_b, mult_a), (78, bias_b, mult_b),
                           (77, bias_a, mult_a), (77, bias_a, np.float32(2e-3)), (77, bias_a, np.float32(3e-3))]:
        acc = direct_conv(x, za, w, 0, bias, 1, (1, 1), (1, 1), (1, 1), (1, 1))
        np.testing.assert_array_equal(im2col.conv(x, U8(za), packed, bias, g, None, path=path), acc)
        got = im2col.conv(x, U8(za), packed, bias, g, (mult, U8(5), U8, "float64"), path=path)
        m = np.asarray(mult, np.float64).reshape((1, -1, 1, 1)) if np.ndim(mult) else np.float64(mult)
        want = np.rint(np.clip(acc * m + 5.0, 0, 255)).astype(U8)
        np.testing.assert_array_equal(got, want)


@settings(max_examples=examples(30))
@given(data=st.data())
def test_property_random_geometry(data):
    path = data.draw(st.sampled_from(PATHS))
    n_sp = data.draw(st.integers(1, 3))
    group = data.draw(st.integers(1, 3))
    cg = data.draw(st.integers(1, 4))
    m_g = data.draw(st.integers(1, 5))
    kern = tuple(data.draw(st.integers(1, 3)) for _ in range(n_sp))
    dil = tuple(data.draw(st.integers(1, 2)) for _ in range(n_sp))
    strides = tuple(data.draw(st.integers(1, 3)) for _ in range(n_sp))
    pb = tuple(data.draw(st.integers(0, 2)) for _ in range(n_sp))
    pe = tuple(data.draw(st.integers(0, 2)) for _ in range(n_sp))
    sizes = tuple(max(data.draw(st.integers(1, 7)), dil[i] * (kern[i] - 1) + 1 - pb[i] - pe[i]) for i in range(n_sp))
    batch = data.draw(st.integers(1, 3))
    xdt = data.draw(st.sampled_from([U8, I8]))
    wdt = data.draw(st.sampled_from([U8, I8]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rand(rng, (batch, group * cg) + sizes, xdt)
    w = rand(rng, (group * m_g, cg) + kern, wdt)
    za = rand(rng, (), xdt)
    zw = rand(rng, (group * m_g,), wdt)
    got = im2col.conv(x, za, im2col.prepack_conv(w, zw, group), None, geo(strides, dil, pb, pe), path=path)
    np.testing.assert_array_equal(got, direct_conv(x, za, w, zw, None, group, strides, dil, pb, pe))


def test_concurrent_conv_calls():
    rng = np.random.default_rng(5)
    w = rand(rng, (24, 8, 3, 3), I8)
    packed = im2col.prepack_conv(w, np.int8(0))
    dw = im2col.prepack_conv(rand(rng, (8, 1, 3, 3), I8), np.int8(0), 8)
    g = geo((1, 1), (1, 1), (1, 1), (1, 1))
    xs = [rand(rng, (2, 8, 20, 20), U8) for _ in range(6)]
    want = [direct_conv(x, 3, w, 0, None, 1, (1, 1), (1, 1), (1, 1), (1, 1)) for x in xs]
    want_dw = [direct_conv(x, 3, dw.w, 0, None, 8, (1, 1), (1, 1), (1, 1), (1, 1)) for x in xs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda x: (im2col.conv(x, U8(3), packed, None, g), im2col.conv(x, U8(3), dw, None, g)),
                            xs * 2))
    for i, (a, b) in enumerate(got):
        np.testing.assert_array_equal(a, want[i % len(xs)])
        np.testing.assert_array_equal(b, want_dw[i % len(xs)])


def test_conv_bad_arguments_raise_named_errors():
    w = np.zeros((4, 2, 3, 3), I8)
    packed = im2col.prepack_conv(w, np.int8(0))
    g = geo((1, 1), (1, 1), (0, 0), (0, 0))
    with pytest.raises(ValueError, match=r"conv: x has C=3 channels; the weights expect 2"):
        im2col.conv(np.zeros((1, 3, 5, 5), U8), U8(0), packed, None, g)
    with pytest.raises(ValueError, match=r"conv: geometry.strides must have 2 entries"):
        im2col.conv(np.zeros((1, 2, 5, 5), U8), U8(0), packed, None, geo((1,), (1, 1), (0, 0), (0, 0)))
    # the same values as lists (not hashable: parsed on every call) and as tuples (parsed once), and a 1-D
    # geometry whose values were seen before for a 2-D call
    rng = np.random.default_rng(2)
    x = rand(rng, (1, 2, 5, 5), U8)
    wr = rand(rng, (4, 2, 3, 3), I8)
    packed_r = im2col.prepack_conv(wr, np.int8(0))
    want = direct_conv(x, 3, wr, 0, np.zeros(4, np.int32), 1, (1, 1), (1, 1), (0, 0), (0, 0))
    as_lists = dict(strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0])
    np.testing.assert_array_equal(im2col.conv(x, U8(3), packed_r, None, as_lists), want)
    np.testing.assert_array_equal(im2col.conv(x, U8(3), packed_r, None, g), want)
    packed_1d = im2col.prepack_conv(np.zeros((4, 2, 3), I8), np.int8(0))
    with pytest.raises(ValueError, match=r"conv: geometry.strides must have 1 entries"):
        im2col.conv(np.zeros((1, 2, 5), U8), U8(0), packed_1d, None, g)
    with pytest.raises(ValueError, match=r"conv: the dilated kernel \(3, 3\) is larger than the padded input"):
        im2col.conv(np.zeros((1, 2, 2, 5), U8), U8(0), packed, None, g)
    with pytest.raises(ValueError, match=r"conv: geometry.group=2 but the weights were packed with group=1"):
        im2col.conv(np.zeros((1, 2, 5, 5), U8), U8(0), packed, None, dict(g, group=2))
    with pytest.raises(ValueError, match=r"prepack_conv: group must be a positive divisor of M=4"):
        im2col.prepack_conv(w, np.int8(0), 3)
    with pytest.raises(ValueError, match=r"prepack_conv: w_zero_point must be a scalar or have M=4 elements"):
        im2col.prepack_conv(w, np.zeros(3, I8))


# The 3x3 depthwise kernels: _depthwise3x3_cl (across channels, generic and vpdpbusd forms; channel multiplier 1
# only, the others fall through), _depthwise3x3 (in-kernel padding and phase split), _depthwise with its fused
# 9-tap loop, and _depthwise's general tap-by-tap loop, each forced in turn.
CL_ALL = dict(_DW_CL_MAX_OUT=1 << 62, _DW_CL_MAX_OUT_S2=1 << 62)
CL_NONE = dict(_DW_CL_MAX_OUT=0, _DW_CL_MAX_OUT_S2=0)
PERM_NONE = dict(_DW_PERM=False)
PERM_ALL = dict(_DW_PERM=True)
DW3X3_KERNELS = {"channels_last": dict(CL_ALL, **PERM_NONE, _DW_VNNI=False, _DW_PAIRS=False,
                                       _FORCE_SERIAL=False),  # on every thread
                 "channels_last_vnni": dict(CL_ALL, **PERM_NONE, _DW_VNNI=True),  # its vpdpbusd form when weights allow
                 "perm": dict(PERM_ALL),  # channel by channel with vpermb, when the CPU and the weights allow
                 "split": dict(CL_NONE, **PERM_NONE, _DW_SPLIT_MIN_PLANE=0, _DW_SPLIT_STRIDE1=True, _FUSE_DW3X3=True),
                 "fused": dict(CL_NONE, **PERM_NONE, _DW_SPLIT_MIN_PLANE=1 << 62, _FUSE_DW3X3=True),
                 "general": dict(CL_NONE, **PERM_NONE, _DW_SPLIT_MIN_PLANE=1 << 62, _FUSE_DW3X3=False)}


@pytest.fixture(params=list(DW3X3_KERNELS))
def dw3x3_kernel(request, monkeypatch):
    for name, value in DW3X3_KERNELS[request.param].items():
        monkeypatch.setattr(im2col, name, value)
    return request.param


# x shape, channel multiplier, stride, dilation, pads_begin, pads_end: odd and even widths and pad parities
DW3X3_CASES = [((2, 5, 12, 11), 1, 1, 1, (1, 1), (1, 1)), ((1, 4, 13, 12), 2, 2, 1, (1, 1), (1, 1)),
               ((1, 3, 12, 13), 1, 2, 1, (0, 1), (1, 0)), ((1, 3, 11, 9), 1, 2, 2, (2, 1), (0, 2)),
               ((2, 3, 9, 10), 2, 1, 2, (2, 0), (1, 3)), ((1, 6, 3, 3), 1, 2, 1, (0, 0), (0, 0)),
               ((1, 4, 1, 1), 1, 2, 1, (1, 1), (1, 1)), ((1, 2, 20, 21), 1, 2, 1, (1, 1), (1, 1)),
               # 16 channels and more, for the channels-last kernel's vector transposes: channel counts off
               # the 16 grid, rows of 16 to 32 and past 32 bytes, dilation, a last partial tile of pixels or
               # none, and tiles at the very end of x (which would read past it: moved byte by byte)
               ((2, 37, 9, 30), 1, 1, 1, (1, 1), (1, 1)), ((1, 48, 14, 14), 1, 2, 1, (1, 1), (1, 1)),
               ((1, 32, 8, 40), 1, 1, 2, (2, 1), (2, 3)), ((1, 16, 4, 4), 1, 1, 1, (1, 1), (1, 1)),
               ((2, 33, 7, 7), 1, 2, 1, (0, 1), (1, 0))]


@pytest.mark.parametrize("case", DW3X3_CASES)
@pytest.mark.parametrize("xdt", [U8, I8])
def test_depthwise3x3_kernels_match_direct_int64(dw3x3_kernel, case, xdt):
    xs, mult, s, d, pb, pe = case
    rng = np.random.default_rng(len(xs) * 31 + s * 7 + d)
    c = xs[1]
    x = rand(rng, xs, xdt)
    w = rand(rng, (c * mult, 1, 3, 3), I8)
    zw = rand(rng, (c * mult,), I8)
    za = rand(rng, (), xdt)
    bias = rng.integers(-2**24, 2**24, c * mult).astype(np.int32)
    g = geo((s, s), (d, d), pb, pe)
    got = im2col.conv(x, za, im2col.prepack_conv(w, zw, c), bias, g)
    np.testing.assert_array_equal(got, direct_conv(x, za, w, zw, bias, c, (s, s), (d, d), pb, pe))
    # requantized output, per-channel multipliers, against the same accumulator requantized by the fallback
    m = rng.uniform(1e-6, 1e-4, c * mult).astype(np.float32)
    y = im2col.conv(x, za, im2col.prepack_conv(w, zw, c), bias, g, (m, U8(128), U8, "float64"))
    want = np.clip(np.rint(got.astype(np.float64) * m.astype(np.float64).reshape(1, -1, 1, 1) + 128), 0, 255)
    np.testing.assert_array_equal(y, want.astype(U8))


VNNI_PATHS = [p for p in ("avx512vnni", "avxvnni") if p in PATHS]


def int8_centred_case(rng, xs, xdt, k=3):
    """x, k x k depthwise weights and zero points whose centred values fit int8 (the vpdpbusd kernels' condition;
    channel 0 holds the extremes -128 and 127), x's zero point and a bias."""
    c = xs[1]
    x = rand(rng, xs, xdt)
    zw = rng.integers(-64, 64, c).astype(I8)
    w = (rng.integers(-128, 128, (c, 1, k, k)) // 2 + zw.reshape(-1, 1, 1, 1)).astype(I8)
    zw[0] = 0
    w[0] = 0
    w.reshape(c, k * k)[0, :2] = (-128, 127)
    w.reshape(c, k * k)[0, -1] = -128  # the last tap (5x5: alone in its row's second group of 4)
    return x, w, zw, rand(rng, (), xdt), rng.integers(-2**24, 2**24, c).astype(np.int32)


@pytest.mark.skipif(not VNNI_PATHS, reason="no VNNI on this CPU")
@pytest.mark.parametrize("path", VNNI_PATHS)
@pytest.mark.parametrize("case", [c for c in DW3X3_CASES if c[1] == 1])
@pytest.mark.parametrize("xdt", [U8, I8])
def test_depthwise3x3_vnni_kernel_matches_direct_int64(monkeypatch, path, case, xdt):
    # centred weights that fit int8 (the vpdpbusd kernel's condition), their extremes -128 and 127 included
    for name, value in dict(CL_ALL, **PERM_NONE, _FORCE_SERIAL=path != "avxvnni").items():
        monkeypatch.setattr(im2col, name, value)
    xs, _mult, s, d, pb, pe = case
    c = xs[1]
    rng = np.random.default_rng(len(xs) * 37 + s * 5 + d)
    x, w, zw, za, bias = int8_centred_case(rng, xs, xdt)
    packed = im2col.prepack_conv(w, zw, c)
    assert packed.depthwise_vnni_rows() is not None
    g = geo((s, s), (d, d), pb, pe)
    calls = []
    real = im2col._depthwise3x3_cl_vnni
    monkeypatch.setattr(im2col, "_depthwise3x3_cl_vnni",
                        lambda *a: (calls.append("zmm" if a[4] else "ymm"), real(*a))[1])
    got = im2col.conv(x, za, packed, bias, g, path=path)
    want = direct_conv(x, za, w, zw, bias, c, (s, s), (d, d), pb, pe)
    np.testing.assert_array_equal(got, want)
    m = rng.uniform(1e-6, 1e-4, c).astype(np.float32)
    y = im2col.conv(x, za, packed, bias, g, (m, U8(128), U8, "float64"), path=path)
    ref = np.clip(np.rint(want.astype(np.float64) * m.astype(np.float64).reshape(1, -1, 1, 1) + 128), 0, 255)
    np.testing.assert_array_equal(y, ref.astype(U8))
    assert calls == ["zmm" if path == "avx512vnni" else "ymm"] * 2


PAIR_PATHS = [p for p in ("avx2ub", "avx2") if p in PATHS]


def pair_taps_case(rng, xs, xdt, w_dtype):
    """Like int8_centred_case, but centred weights whose pairs of taps (0, 1), (2, 3), (4, 5), (6, 7) have
    |w_a| + |w_b| <= 128 (the vpmaddubsw kernel's condition), channels 0-2 at its edges (-128 and 0, 127 and 1,
    64 and -64) with tap 8 at the extremes of the weights' type, x at both ends of its range."""
    c = xs[1]
    x = rand(rng, xs, xdt)
    x.reshape(-1)[:2] = (np.iinfo(xdt).min, np.iinfo(xdt).max)
    a = rng.integers(-64, 65, (c, 4))
    b = np.sign(rng.integers(-1, 2, (c, 4))) * rng.integers(0, 129 - np.abs(a))
    taps = np.empty((c, 9), np.int64)
    taps[:, 0:8:2], taps[:, 1:8:2] = a, b
    lo, hi = (-128, 127) if w_dtype == I8 else (0, 255)
    zw = rng.integers(-20, 21, c) if w_dtype == I8 else rng.integers(100, 157, c)
    # every centred tap a signed byte and a weight of w's type once the zero point is added back
    taps[:, :8] = np.clip(taps[:, :8], np.maximum(-128, lo - zw)[:, None], np.minimum(127, hi - zw)[:, None])
    taps[:, 8] = rng.integers(lo, hi + 1, c) - zw
    edges = [(-128, 0), (127, 1), (64, -64)]
    for ch in range(min(3, c)):
        zw[ch] = 0 if w_dtype == I8 else 128
        taps[ch, :8] = np.tile(edges[ch], 4)
        taps[ch, 8] = (lo if ch % 2 else hi) - zw[ch]
    w = (taps + zw.reshape(-1, 1)).astype(w_dtype).reshape(c, 1, 3, 3)
    return x, w, zw.astype(w_dtype), rand(rng, (), xdt), rng.integers(-2**24, 2**24, c).astype(np.int32)


@pytest.mark.skipif(not PAIR_PATHS, reason="no AVX2 on this CPU")
@pytest.mark.parametrize("path", PAIR_PATHS)
@pytest.mark.parametrize("case", [c for c in DW3X3_CASES if c[1] == 1])
@pytest.mark.parametrize("xdt", [U8, I8])
def test_depthwise3x3_pairs_kernel_matches_direct_int64(monkeypatch, path, case, xdt):
    for name, value in dict(CL_ALL, **PERM_NONE, _FORCE_SERIAL=xdt == U8).items():
        monkeypatch.setattr(im2col, name, value)
    xs, _mult, s, d, pb, pe = case
    c = xs[1]
    rng = np.random.default_rng(len(xs) * 43 + s * 5 + d + xs[-1])
    w_dtype = I8 if xs[-1] % 2 else U8
    x, w, zw, za, bias = pair_taps_case(rng, xs, xdt, w_dtype)
    packed = im2col.prepack_conv(w, zw, c)
    assert packed.depthwise_pair_taps() is not None
    g = geo((s, s), (d, d), pb, pe)
    calls = []
    real = im2col._depthwise3x3_cl_pairs
    monkeypatch.setattr(im2col, "_depthwise3x3_cl_pairs", lambda *a: (calls.append(1), real(*a))[1])
    got = im2col.conv(x, za, packed, bias, g, path=path)
    want = direct_conv(x, za, w, zw, bias, c, (s, s), (d, d), pb, pe)
    np.testing.assert_array_equal(got, want)
    m = rng.uniform(1e-6, 1e-4, c).astype(np.float32)
    y = im2col.conv(x, za, packed, bias, g, (m, U8(128), U8, "float64"), path=path)
    ref = np.clip(np.rint(want.astype(np.float64) * m.astype(np.float64).reshape(1, -1, 1, 1) + 128), 0, 255)
    np.testing.assert_array_equal(y, ref.astype(U8))
    assert calls == [1, 1]


def test_depthwise_pair_taps_refuses_pairs_past_128():
    w = np.zeros((2, 1, 3, 3), I8)
    assert im2col.prepack_conv(w, I8(0), 2).depthwise_pair_taps() is not None
    w[1, 0, 1, 0], w[1, 0, 1, 1] = 100, -29  # taps 3 and 4: different pairs, fine
    assert im2col.prepack_conv(w, I8(0), 2).depthwise_pair_taps() is not None
    w[1, 0, 0, 2], w[1, 0, 1, 0] = -100, 29  # taps 2 and 3: one pair, 129
    assert im2col.prepack_conv(w, I8(0), 2).depthwise_pair_taps() is None
    wu = np.full((2, 1, 3, 3), 128, U8)
    wu[0, 0, 0, 0] = 0  # centred -128 beside 0: fits; 255 - 0 in tap 8 of a uint8 kernel: fits
    assert im2col.prepack_conv(wu, U8(128), 2).depthwise_pair_taps() is not None
    wu[0, 0, 0, 0] = 0
    wu[1, 0, 0, 0] = 255  # centred 127 and 0
    assert im2col.prepack_conv(wu, U8(128), 2).depthwise_pair_taps() is not None
    assert im2col.prepack_conv(wu, U8(127), 2).depthwise_pair_taps() is None  # centred 128: not a signed byte
    assert im2col.prepack_conv(np.zeros((2, 1, 3, 5), I8), I8(0), 2).depthwise_pair_taps() is None  # not 3x3


# kernel size, x shape, strides, dilations, pads begin, pads end
PERM_CASES = [(3, xs, (st, st), (d, d), pb, pe) for xs, mult, st, d, pb, pe in DW3X3_CASES if mult == 1] + [
    # a plane too wide for 128-byte windows across rows (16 pixels that cross rows need bytes 2 x 120 apart):
    # groups of a row each, 60 outputs a row in 4 groups (the last repeating its last pixel); and 56 of 112
    (3, (1, 3, 6, 120), (2, 2), (1, 1), (1, 1), (1, 1)), (3, (2, 5, 7, 112), (2, 2), (1, 1), (1, 1), (1, 1)),
    (3, (1, 20, 9, 70), (2, 2), (1, 1), (1, 1), (1, 1)),  # 20 channels: two blocks of 16
    # a kernel row dilated past 128 bytes: another kernel serves it
    (3, (1, 2, 131, 140), (1, 1), (64, 64), (0, 0), (0, 0)),
    # windows past the end of x for several channels (a 1x1 plane), and two channels
    (3, (2, 20, 1, 1), (1, 1), (1, 1), (1, 1), (1, 1)), (3, (1, 2, 5, 5), (1, 1), (1, 1), (1, 1), (1, 1)),
    # 5x5: two vpdpbusd groups a kernel row (taps 0-3, and tap 4 beside three of weight 0)
    (5, (2, 5, 12, 11), (1, 1), (1, 1), (2, 2), (2, 2)),
    (5, (1, 20, 6, 96), (1, 1), (1, 1), (2, 2), (2, 2)),  # the OCR classifier's planes; two blocks of 16 channels
    (5, (1, 17, 6, 96), (2, 1), (1, 1), (2, 2), (2, 2)),  # stride (2, 1): pixels crossing rows are 192 bytes apart
    (5, (1, 3, 9, 70), (2, 2), (1, 1), (2, 2), (2, 2)),
    (5, (1, 4, 11, 13), (1, 1), (2, 2), (4, 3), (3, 4)),  # dilated, uneven padding
    (5, (2, 20, 1, 1), (1, 1), (1, 1), (2, 2), (2, 2))]  # windows past the end of x


@pytest.mark.skipif(not ("avx512vnni" in PATHS and im2col._has_vbmi()), reason="no AVX-512 VBMI and VNNI")
@pytest.mark.parametrize("case", PERM_CASES)
@pytest.mark.parametrize("xdt", [U8, I8])
@pytest.mark.parametrize("threads_serial", [False, True])
def test_depthwise_perm_kernel_matches_direct_int64(monkeypatch, case, xdt, threads_serial):
    # the vpermb kernel, with centred weights at the extremes of int8, on one thread and on all of them
    for name, value in dict(PERM_ALL, _FORCE_SERIAL=threads_serial).items():
        monkeypatch.setattr(im2col, name, value)
    k, xs, s, d, pb, pe = case
    c = xs[1]
    rng = np.random.default_rng(len(xs) * 41 + s[0] * 3 + s[1] + d[0] + xs[-1] + k)
    x, w, zw, za, bias = int8_centred_case(rng, xs, xdt, k)
    packed = im2col.prepack_conv(w, zw, c)
    g = geo(s, d, pb, pe)
    calls = []
    real = im2col._depthwise_perm
    monkeypatch.setattr(im2col, "_depthwise_perm", lambda *a: (calls.append(1), real(*a))[1])
    got = im2col.conv(x, za, packed, bias, g, path="avx512vnni")
    want = direct_conv(x, za, w, zw, bias, c, s, d, pb, pe)
    np.testing.assert_array_equal(got, want)
    m = rng.uniform(1e-6, 1e-4, c).astype(np.float32)
    for mode in ("float64", "float32"):
        y = im2col.conv(x, za, packed, bias, g, (m, U8(128), U8, mode), path="avx512vnni")
        if mode == "float64":
            ref = np.rint(want.astype(np.float64) * m.astype(np.float64).reshape(1, -1, 1, 1) + 128)
        else:
            ref = np.rint(want.astype(np.float32) * m.reshape(1, -1, 1, 1)) + 128
        np.testing.assert_array_equal(y, np.clip(ref, 0, 255).astype(U8))
    one = m[:1].reshape(())  # one multiplier for every channel: the store's other form
    y = im2col.conv(x, za, packed, bias, g, (one, U8(128), U8, "float64"), path="avx512vnni")
    ref = np.rint(want.astype(np.float64) * np.float64(one) + 128)
    np.testing.assert_array_equal(y, np.clip(ref, 0, 255).astype(U8))
    dilated = d[0] == 64
    assert calls == ([] if dilated else [1] * 4)


def test_depthwise_vnni_rows_of_a_5x5_kernel():
    # per kernel row, taps 0-3 as one int32 of signed bytes and tap 4 with three zero bytes
    w = np.arange(-60, 40, dtype=I8).reshape(4, 1, 5, 5)
    rows = im2col.prepack_conv(w, I8(0), 4).depthwise_vnni_rows()
    assert rows.shape == (10, 16)
    b = rows.view(I8).reshape(10, 16, 4)
    for ch in range(4):
        for r in range(5):
            assert list(b[2 * r, ch]) == list(w[ch, 0, r, :4]) and list(b[2 * r + 1, ch]) == [w[ch, 0, r, 4], 0, 0, 0]
    assert not b[:, 4:].any()


def test_depthwise_perm_tables():
    # 7x7 plane, stride 1, pad 1: pixel 0's row-0 taps lie in the padding; pixel 8 (row 1, col 1) reads input
    # (0..2, 0..2) around its centre (1, 1)
    tab, pads, wins, win_end, row_pitch = im2col._dw_perm_tables(7, 7, 7, 7, 1, 1, 1, 1, 1, 1)
    tab = tab.reshape(4, 3, 16, 4)
    assert wins.shape == (4, 3) and win_end == wins.max() + 128 and row_pitch == 0  # 16 consecutive pixels a group
    assert pads[0] & 0b0111 == 0b0111  # group 0, kernel row 0, pixel 0: all three taps padded
    for r in range(3):
        assert list(tab[0, r, 8, :3] + wins[0, r]) == [r * 7 + 0, r * 7 + 1, r * 7 + 2]
        assert (int(pads[r]) >> 32) & 0b0111 == 0  # pixel 8: no tap padded
    # 6x120 at stride 2, pad 1: 3x60 outputs; 16 consecutive pixels would cross rows 240 bytes apart, so each row
    # takes 4 groups of its own (60 = 3 x 16 + 12: the 4th repeats pixel 59 in its last 4 lanes)
    tab, pads, wins, win_end, row_pitch = im2col._dw_perm_tables(6, 120, 3, 60, 2, 2, 1, 1, 1, 1)
    assert row_pitch == 64 and wins.shape == (12, 3)
    tab = tab.reshape(12, 3, 16, 4)
    # group 5: row 1, pixels 16..31; kernel row 1 reads input row 2, columns 2 * 16 - 1 ..
    assert wins[5, 1] == 2 * 120 + 31 and list(tab[5, 1, 0, :3]) == [0, 1, 2]
    assert list(tab[7, 1, 15, :3]) == list(tab[7, 1, 11, :3])  # row 1's tail: pixel 59 again
    assert im2col._dw_perm_tables(131, 140, 3, 12, 1, 1, 64, 64, 0, 0) is None  # a row's taps 128 bytes apart


def test_prepack_conv_checks_zero_points_and_packs_gemm_weights_only_when_used():
    with pytest.raises(ValueError, match=r"prepack_conv: w_zero_point must lie in \[-128, 127\] for int8"):
        im2col.prepack_conv(np.zeros((2, 1, 3, 3), I8), np.array([0, 200]), 2)
    with pytest.raises(ValueError, match=r"prepack_conv: w_zero_point must lie in \[0, 255\] for uint8"):
        im2col.prepack_conv(np.zeros((2, 1, 3, 3), U8), np.array([-1, 0]), 1)
    rng = np.random.default_rng(5)
    w = rand(rng, (6, 2, 3, 3), I8)
    zw = rand(rng, (6,), I8)
    packed = im2col.prepack_conv(w, zw, 3)
    assert packed._groups is None  # nothing packed for the GEMM yet
    centred = w.reshape(6, 18).astype(np.int64) - zw.reshape(-1, 1)
    np.testing.assert_array_equal(packed.abs_colsum, np.abs(centred).sum(axis=1))
    x = rand(rng, (1, 6, 5, 5), U8)
    g = geo((1, 1), (1, 1), (1, 1), (1, 1))
    got = im2col.conv(x, U8(3), packed, None, g)
    assert len(packed._groups) == 3
    np.testing.assert_array_equal(got, direct_conv(x, 3, w, zw, np.zeros(6, np.int32), 3, (1, 1), (1, 1), (1, 1), (1, 1)))


def test_depthwise_vnni_rows_refuse_wide_weights():
    # a centred weight of 128 does not fit int8: the vpdpbusd kernel must not be used
    w = np.zeros((2, 1, 3, 3), I8)
    w[1, 0, 2, 2] = 127
    assert im2col.prepack_conv(w, np.int8(0), 2).depthwise_vnni_rows() is not None
    assert im2col.prepack_conv(w, np.array([0, -1], I8), 2).depthwise_vnni_rows() is None
    assert im2col.prepack_conv(w, np.array([1, 0], I8), 2).depthwise_vnni_rows() is not None
    w[0, 0, 0, 0] = -128
    assert im2col.prepack_conv(w, np.array([1, 0], I8), 2).depthwise_vnni_rows() is None


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("x_val,za,w_val,zw,bias_val", [(255, 0, -128, 127, -2**31 + 255 * 255 * 9),
                                                        (0, 255, 127, -128, 2**31 - 1 - 255 * 255 * 9),
                                                        (255, 0, 127, -128, 2**31 - 1 - 255 * 255 * 9)])
def test_depthwise3x3_kernels_worst_case(dw3x3_kernel, stride, x_val, za, w_val, zw, bias_val):
    # every product at its extreme, and a bias that takes the sum to the edge of int32
    x = np.full((1, 4, 10, 9), x_val, U8)
    w = np.full((4, 1, 3, 3), w_val, I8)
    bias = np.full(4, bias_val, np.int32)
    g = geo((stride, stride), (1, 1), (1, 1), (1, 1))
    got = im2col.conv(x, U8(za), im2col.prepack_conv(w, np.int8(zw), 4), bias, g)
    want = direct_conv(x, za, w, zw, bias, 4, (stride, stride), (1, 1), (1, 1), (1, 1))
    assert want.min() >= -2**31 and want.max() <= 2**31 - 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif("avxvnni" not in PATHS, reason="no AVX-VNNI on this CPU")
def test_depthwise_vnni_kernel_compiles_without_avx512(tmp_path):
    # On a CPU with AVX-VNNI but no AVX-512 the one depthwise vpdpbusd kernel must still compile: its zmm
    # branch becomes a trap there. Simulated in a subprocess (its own numba cache) by hiding the feature; the
    # result is checked against the direct int64 convolution computed here.
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (1, 20, 6, 7)).astype(U8)
    w = rng.integers(-60, 60, (20, 1, 3, 3)).astype(I8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "want.npy", direct_conv(x, 7, w, 0, None, 20, (1, 1), (1, 1), (1, 1), (1, 1)))
    code = f"""if True:
        import numpy as np
        from qlinear.kernels import _microkernel, im2col
        _microkernel._host_has = lambda feature: False
        x, w, want = (np.load({str(tmp_path)!r} + f"/{{n}}.npy") for n in ("x", "w", "want"))
        g = dict(strides=(1, 1), dilations=(1, 1), pads_begin=(1, 1), pads_end=(1, 1))
        got = im2col.conv(x, np.uint8(7), im2col.prepack_conv(w, np.int8(0), 20), None, g, path="avxvnni")
        assert np.array_equal(got, want)
        ir = "".join(im2col._depthwise3x3_cl_vnni.inspect_llvm().values())
        assert "llvm.trap" in ir and "vpdpbusd.512" not in ir and "vpdpbusd.256" in ir
        print("ok")
    """
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("seed", range(4))
def test_pad_input_matches_numpy_pad(seed):
    """_pad_input against np.pad: rows copied as 32-byte vectors that spill past the row (then overwritten),
    the element path for planes whose vectors would leave x or xp (x and xp sized exactly, no slack), the int8
    flip, and every pad from 0 to 3 on each side of D, H and W."""
    rng = np.random.default_rng(seed)
    for trial in range(150):
        planes, d, h = (int(v) for v in rng.integers(1, 5, 3))
        w = int(rng.choice([1, 7, 28, 31, 32, 33, 56, 70]))
        pads = [int(v) for v in rng.integers(0, 4, 6)] if trial % 7 else [0] * 6
        dp, hp, wp = d + pads[0] + pads[3], h + pads[1] + pads[4], w + pads[2] + pads[5]
        x = rng.integers(0, 256, planes * d * h * w, dtype=np.uint8)
        flip, zau = int(rng.choice([0, 0x80])), int(rng.integers(0, 256))
        slack = int(rng.choice([0, 3, 256]))
        expected = np.full(planes * dp * hp * wp + slack, zau, np.uint8)
        expected[:planes * dp * hp * wp] = np.pad(x.reshape(planes, d, h, w) ^ np.uint8(flip),
                                                  [(0, 0)] + list(zip(pads[:3], pads[3:])),
                                                  constant_values=zau).reshape(-1)
        xp = np.full(expected.size, 0x5A, np.uint8)  # not zau: every byte must be written
        im2col._pad_input(x, np.uint8(flip), np.uint8(zau), xp, planes, d, h, w, dp, hp, wp, *pads[:3])
        np.testing.assert_array_equal(xp, expected, err_msg=f"seed {seed} trial {trial}: {planes=} {d=} {h=} {w=} "
                                                            f"{pads=} {flip=} {zau=} {slack=}")


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("case", [
    # (C, M, HW, kernel, stride, group, images): the stride-1 virtual packer, the strided one, the phase split
    # (7x7/2); few column blocks with many weight rows (the GEMM blocks wait for panels packed by others) and
    # many column blocks (a task packs and multiplies one block)
    (64, 256, 14, 3, 2, 1, 1), (32, 64, 12, 3, 1, 1, 2), (3, 16, 30, 7, 2, 1, 1), (16, 96, 20, 3, 1, 2, 3),
    (8, 40, 33, 1, 1, 1, 2),
])
def test_fused_pack_gemm_workers_match_direct_int64(monkeypatch, case, workers, direct):
    """The convolution's one parallel region (each worker's share of the tasks first, then the others'; see
    _drivers.CONV_TEMPLATE and, with ``direct`` and weight zero points 0, DIRECT_TEMPLATE where the layer
    allows it) with 1-3 workers (more workers than threads: a thread runs several in turn), blocks chosen for
    that many, against the direct int64 convolution. Repeated, since a missed wait for a panel would show only
    in some runs."""
    c_in, m_total, hw, k, s, group, n_img = case
    rng = np.random.default_rng(sum(case) + workers)
    monkeypatch.setattr(im2col.ig.threads, "get_num_threads", lambda: workers)
    monkeypatch.setattr(im2col, "_DIRECT", direct)
    for xdt in (U8, I8):
        x = rand(rng, (n_img, c_in, hw, hw), xdt)
        w = rand(rng, (m_total, c_in // group, k, k), I8)
        zw = np.zeros(m_total, I8) if direct else rng.integers(-128, 128, m_total).astype(I8)
        bias = rng.integers(-2**20, 2**20, m_total).astype(np.int32)
        za = xdt(rng.integers(*lim(xdt)))
        packed = im2col.prepack_conv(w, zw, group)
        g = geo((s, s), (1, 1), (k // 2, k // 2), (k // 2, k // 2))
        expected = direct_conv(x, za, w, zw, bias, group, (s, s), (1, 1), (k // 2, k // 2), (k // 2, k // 2))
        for path in PATHS:
            if path == "blas":
                continue
            for _ in range(3):
                got = im2col.conv(x, za, packed, bias, g, None, path=path)
                np.testing.assert_array_equal(got, expected, err_msg=f"{path} {xdt.__name__}")


@pytest.mark.parametrize("seed", range(3))
def test_pad_phases2_matches_numpy_slicing(seed):
    """_pad_phases2 (the input of strided (2, 2) convolutions, padded into its four stride-2 phases) against the
    padded input built with np.pad and sliced [rh::2, rw::2]: rows split by masked vector moves of up to 64 bytes
    (widths around 64 and 128), odd and even left pads, the int8 flip, and the slack set to the zero point."""
    rng = np.random.default_rng(seed)
    for trial in range(200):
        planes, h = int(rng.integers(1, 4)), int(rng.integers(1, 12))
        w = int(rng.choice([1, 2, 3, 13, 14, 28, 31, 56, 63, 64, 65, 127, 130]))
        pt, pl, pb, pr = (int(v) for v in rng.integers(0, 4, 4))
        hq, wq = -(-(h + pt + pb) // 2), -(-(w + pl + pr) // 2)
        x = rng.integers(0, 256, planes * h * w, dtype=np.uint8)
        flip, zau, slack = int(rng.choice([0, 0x80])), int(rng.integers(0, 256)), int(rng.choice([0, 7]))
        padded = np.pad(x.reshape(planes, h, w) ^ np.uint8(flip), [(0, 0), (pt, 2 * hq - h - pt), (pl, 2 * wq - w - pl)],
                        constant_values=zau)
        phases = np.stack([padded[:, rh::2, rw::2] for rh in range(2) for rw in range(2)], 1)
        expected = np.concatenate([phases.reshape(-1), np.full(slack, zau, np.uint8)])
        xp = np.full(expected.size, 0x5A, np.uint8)
        im2col._pad_phases2(x, np.uint8(flip), np.uint8(zau), xp, planes, h, w, hq, wq, pt, pl)
        np.testing.assert_array_equal(xp, expected, err_msg=f"seed {seed} trial {trial}: {planes=} {h=} {w=} "
                                                            f"{pt=} {pl=} {pb=} {pr=} {flip=}")


def test_polyphase_plan_only_where_all_four_phases_are_read():
    """Strides (2, 2) with taps of both parities along H and W take the polyphase input; a 1x1/2 convolution
    (one phase) and a 2x2/2 one with dilation 2 (even taps only) do not."""
    for kernel, dil, poly in [((3, 3), (1, 1), True), ((7, 7), (1, 1), True), ((1, 1), (1, 1), False),
                              ((2, 2), (2, 2), False), ((3, 1), (1, 1), False)]:
        packed = im2col.prepack_conv(np.ones((8, 4) + kernel, I8), I8(0), 1)
        pads = (kernel[0] // 2, kernel[1] // 2)
        plan = im2col._Plan(packed, (1, 4, 56, 56), (2, 2), dil, pads, pads, ig.default_path())
        assert plan.poly == poly, (kernel, dil)


@pytest.mark.parametrize("kernel, pads_begin, pads_end", [((1, 3, 3), (0, 1, 1), (0, 1, 1)),
                                                          ((1, 2, 2), (0, 0, 0), (0, 1, 0))])
def test_polyphase_input_of_a_3d_convolution_with_depth_1(kernel, pads_begin, pads_end):
    """A 3-D convolution over a depth-1 input with strides (1, 2, 2) takes the polyphase input too: its planes
    are H x W, not D x H (found by hypothesis against onnxruntime: the split read rows of the wrong width)."""
    rng = np.random.default_rng(5)
    took_polyphase = 0
    for shape in [(2, 3, 1, 9, 11), (1, 1, 1, 1, 2), (1, 4, 1, 6, 70), (1, 2, 1, 30, 30)]:
        x, w = rand(rng, shape, U8), rand(rng, (5, shape[1]) + kernel, I8)
        packed = im2col.prepack_conv(w, I8(3), 1)
        g = geo((1, 2, 2), (1, 1, 1), pads_begin, pads_end)
        got = im2col.conv(x, U8(77), packed, None, g, None)
        took_polyphase += any(weight_plan.plan.poly for weight_plan in packed.plans.values())
        expected = direct_conv(x, 77, w, 3, None, 1, (1, 2, 2), (1, 1, 1), pads_begin, pads_end)
        np.testing.assert_array_equal(got, expected, err_msg=str(shape))
    assert took_polyphase >= 2


def test_weights_of_one_shape_share_a_plan_but_not_their_zero_points_or_row_terms():
    """Plans are shared by every packing of the same geometry; what depends on the weights (the zero points
    padded to panels, the epilogue's row terms) stays with each packing: two weight sets of one shape, with
    different per-channel zero points, called in turn with the same bias and x zero point."""
    rng = np.random.default_rng(11)
    x = rand(rng, (1, 6, 9, 9), U8)
    bias = rng.integers(-500, 500, 10).astype(np.int32)
    g = geo((1, 1), (1, 1), (1, 1), (1, 1))
    sets = []
    for seed in range(3):
        w = rand(rng, (10, 6, 3, 3), I8)
        zw = rng.integers(-4, 5, 10).astype(I8) if seed else I8(0)
        sets.append((w, zw, im2col.prepack_conv(w, zw, 1)))
    for _ in range(2):
        for w, zw, packed in sets:
            got = im2col.conv(x, U8(77), packed, bias, g, None)
            expected = direct_conv(x, 77, w, zw, bias, 1, (1, 1), (1, 1), (1, 1), (1, 1))
            np.testing.assert_array_equal(got, expected)
    plans = {id(weight_plan.plan) for _, _, packed in sets for weight_plan in packed.plans.values()}
    assert len(plans) == 1


@pytest.mark.parametrize("other", other_paths(ig.available_paths()))
def test_other_paths_convolve_like_direct_int64(other, monkeypatch):
    """AVX2, which the default run otherwise leaves to --full, on the direct path's interleaved input (int16
    pairs on this path), symmetric weights at strides 1 and 2, against the int64 direct convolution (see
    suite.other_paths). Its packed-panel drivers (37 s of compiling cold, 10 s more for the depthwise kernel)
    run every case with --full, and on CPUs without VNNI, where AVX2 is the default path; its GEMM microkernels
    are checked by default in test_integer_gemm's test_other_paths."""
    rng = np.random.default_rng(4)
    monkeypatch.setattr(im2col, "_DIRECT", True)
    for case in (CASES[0], CASES[14], CASES[17], CASES[18], CASES[20]):
        xs, ws, group, strides, dil, pb, pe = case
        x, w, za = rand(rng, xs, I8), rand(rng, ws, I8), rand(rng, (), I8)
        got = im2col.conv(x, za, im2col.prepack_conv(w, np.int8(0), group), None, geo(strides, dil, pb, pe),
                          path=other)
        np.testing.assert_array_equal(got, direct_conv(x, za, w, 0, None, group, strides, dil, pb, pe))


def _byte_pair_weights(rng, shape, wdt, zw):
    """Weights whose signed bytes (w, or w ^ 0x80 for uint8) lie in [-64, 64]: every pair fits vpmaddubsw."""
    ws = rng.integers(-64, 65, shape)
    return (ws if wdt == I8 else ws + 128).astype(wdt)


@pytest.mark.skipif("avx2ub" not in PATHS, reason="avx2ub is not this CPU's path: --full runs it (suite.kernel_paths)")
@pytest.mark.parametrize("xdt,wdt", [(U8, I8), (I8, U8)])
def test_byte_pair_path_convolves_like_direct_int64(xdt, wdt):
    """avx2ub (vpmaddubsw) on weights whose byte pairs keep it exact, on the shapes that take different packers
    and grouped convolutions, with zero points, bias and both requantizations; weights with one pair past
    |a| + |b| = 128 run the avx2 kernels instead, and give the same exact sums."""
    rng = np.random.default_rng(6)
    for case in (CASES[0], CASES[1], CASES[2], CASES[3], CASES[7], CASES[8], CASES[12], CASES[13]):
        xs, ws, group, strides, dil, pb, pe = case
        x = rand(rng, xs, xdt)
        za = rand(rng, (), xdt)
        zw = rng.integers(-3, 4, ws[0]) + (128 if wdt == U8 else 0)
        w = _byte_pair_weights(rng, ws, wdt, zw)
        zw = zw.astype(wdt)
        bias = rng.integers(-(2**20), 2**20, ws[0]).astype(np.int32)
        packed = im2col.prepack_conv(w, zw, group)
        expected = direct_conv(x, za, w, zw, bias, group, strides, dil, pb, pe)
        np.testing.assert_array_equal(im2col.conv(x, za, packed, bias, geo(strides, dil, pb, pe), path="avx2ub"),
                                      expected)
        assert all(pw.fits_byte_pairs() for pw in packed.groups) and all("avx2ub" in pw._packed for pw in packed.groups)
    # the boundary: |-64| + |64| = 128 fits; one pair of 64 and 65 does not
    w = np.full((16, 8, 1, 1), 64, np.int8)
    w[:, 1::2] = -64
    x = rand(rng, (1, 8, 5, 5), U8)
    packed = im2col.prepack_conv(w, np.int8(0), 1)
    got = im2col.conv(x, U8(0), packed, None, geo((1, 1), (1, 1), (0, 0), (0, 0)), path="avx2ub")
    np.testing.assert_array_equal(got, direct_conv(x, 0, w, 0, None, 1, (1, 1), (1, 1), (0, 0), (0, 0)))
    assert packed.groups[0].fits_byte_pairs()
    w[3, 1] = 65
    packed = im2col.prepack_conv(w, np.int8(0), 1)
    x[:] = 255  # where vpmaddubsw would saturate: 255 * 64 + 255 * 65 = 32895
    got = im2col.conv(x, U8(0), packed, None, geo((1, 1), (1, 1), (0, 0), (0, 0)), path="avx2ub")
    np.testing.assert_array_equal(got, direct_conv(x, 0, w, 0, None, 1, (1, 1), (1, 1), (0, 0), (0, 0)))
    assert not packed.groups[0].fits_byte_pairs() and "avx2" in packed.groups[0]._packed


def test_a_layer_runs_on_one_thread_or_on_all_as_measured(monkeypatch):
    """threads.SerialOrParallel: a layer's first calls run on one thread, then on all of them, the faster best time
    decides, and the decision is measured again later; both ways give the same bits, and one thread never asks."""
    from qlinear.kernels import threads

    assert 0 < threads.launch_cost() < 0.1 and threads.launch_cost() == threads.launch_cost()  # measured once
    monkeypatch.setattr(threads, "_launch_cost", 1.0)  # waking the workers costs a second: times decide
    choice = threads.SerialOrParallel()
    ways = []
    each = threads.SerialOrParallel.TRIALS + threads.SerialOrParallel.SKIPPED
    for index in range(2 * each):  # serial ones, then parallel ones: faster but for the first
        serial = choice.next_is_serial()
        ways.append(serial)
        choice.record(serial, 1.0 if serial else (100.0 if index == each else 0.5))
    assert ways == [True] * each + [False] * each
    assert choice.serial is False and not choice.next_is_serial()
    # measured again after RETRY_AFTER calls (then four times as many): a trial the machine's load spoiled, where
    # one thread looked faster, does not decide for good
    for _ in range(threads.SerialOrParallel.RETRY_AFTER - 2):  # the assertion above asked once
        assert choice.next_is_serial() is False
    ways = []
    for _ in range(2 * each):
        serial = choice.next_is_serial()
        ways.append(serial)
        choice.record(serial, 1.0 if serial else 2.0)
    assert ways == [True] * each + [False] * each and choice.serial is True
    assert choice.retry_at == 4 * threads.SerialOrParallel.RETRY_AFTER
    assert [choice.next_is_serial() for _ in range(choice.retry_at - 1)] == [True] * (choice.retry_at - 1)
    assert choice.next_is_serial() is True and choice.serial is None  # the third trial begins
    monkeypatch.setattr(threads, "_launch_cost", 0.1)  # a call of 1 s: all threads, without timing them
    choice = threads.SerialOrParallel()
    for _ in range(each):
        choice.record(choice.next_is_serial(), 1.0)
    assert choice.serial is False and not choice.parallel_times
    # decided(): the decision without a closure, counted as next_is_serial counts it; None when a trial is due
    assert threads.SerialOrParallel().decided() is None
    assert [choice.decided() for _ in range(choice.retry_at - 1)] == [False] * (choice.retry_at - 1)
    assert choice.decided() is None and choice.serial is False  # the retry is next_is_serial's to start
    assert choice.next_is_serial() is True and choice.serial is None

    rng = np.random.default_rng(12)
    x, w = rand(rng, (1, 16, 14, 14), U8), rand(rng, (16, 1, 3, 3), I8)
    packed = im2col.prepack_conv(w, I8(0), 16)
    launch = im2col.prepare(x.shape, x.dtype, U8(3), packed, None, geo((1, 1), (1, 1), (1, 1), (1, 1)))
    want = direct_conv(x, 3, w, 0, None, 16, (1, 1), (1, 1), (1, 1), (1, 1))
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(min(2, threads._max_threads()))
        for _ in range(2 * (threads.SerialOrParallel.TRIALS + threads.SerialOrParallel.SKIPPED) + 2):
            np.testing.assert_array_equal(launch.run(x), want)
        if threads.get_num_threads() > 1:
            (decided,) = launch.thread_choices.values()
            assert decided.serial is not None and len(decided.serial_times) == threads.SerialOrParallel.TRIALS + threads.SerialOrParallel.SKIPPED
    finally:
        threads.set_num_threads(before)


@pytest.mark.parametrize("seed", range(6))
def test_polyphase_split_of_any_row_width_matches_its_transcription(seed):
    """im2col._pad_phases2 (whole 64-byte vectors where they stay inside the phase plane, their spill set back to
    the zero point; byte-masked moves at rows' and planes' ends) against the definition: each phase plane p = 2 rh
    + rw holds padded[2i + rh, 2j + rw], where padded is x ^ flip with pt rows and pl columns of zau before it and
    zau after; zau in the slack past the planes. Widths from 1 to 150 bytes (one to three vectors per row)."""
    rng = np.random.default_rng(seed)
    for _ in range(8):
        planes, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 151))
        pt, pl = int(rng.integers(0, 4)), int(rng.integers(0, 4))
        hq = (pt + h + int(rng.integers(0, 4)) + 1) // 2
        wq = (pl + w + int(rng.integers(0, 4)) + 1) // 2
        flip, zau = U8(rng.integers(0, 2) * 128), U8(rng.integers(0, 256))
        x = rng.integers(0, 256, planes * h * w).astype(np.uint8)
        slack = 64
        xp = np.full(planes * 4 * hq * wq + slack, 7, np.uint8)
        im2col._pad_phases2(x, flip, zau, xp, planes, h, w, hq, wq, pt, pl)
        padded = np.full((planes, 2 * hq, 2 * wq), zau, np.uint8)
        padded[:, pt:pt + h, pl:pl + w] = x.reshape(planes, h, w) ^ flip
        want = np.stack([padded[:, rh::2, rw::2] for rh in (0, 1) for rw in (0, 1)], axis=1).reshape(-1)
        np.testing.assert_array_equal(xp[:want.size], want, err_msg=f"{(planes, h, w, pt, pl, hq, wq)}")
        assert (xp[want.size:] == zau).all()


def test_faster_of_alternates_then_keeps_the_faster_and_measures_again(monkeypatch):
    """threads.FasterOf on a fake clock: the first calls alternate, the first SKIPPED of each not counted; the
    smaller best time of the rest decides; after RETRY_AFTER calls both are timed again."""
    from qlinear.kernels import threads

    clock = [0.0]
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock[0])
    cost = {"a": 5.0, "b": 3.0}
    ran = []

    def way(name):
        def run():
            ran.append(name)
            clock[0] += cost[name]
            return name
        return run

    chooser = threads.FasterOf()
    counted = threads.FasterOf.SKIPPED + threads.FasterOf.TRIALS
    for _ in range(2 * counted):
        chooser.call(way("a"), way("b"))
    assert ran == ["a", "b"] * counted and chooser.choice == 1
    ran.clear()
    for _ in range(threads.FasterOf.RETRY_AFTER - 1):
        assert chooser.call(way("a"), way("b")) == "b"
    assert set(ran) == {"b"}
    cost["a"] = 1.0  # the first way got faster: the next measurement finds it
    for _ in range(2 * counted):
        chooser.call(way("a"), way("b"))
    assert chooser.choice == 0 and chooser.call(way("a"), way("b")) == "a"
    # a skipped call's time does not count: b's first call is the fastest of all, yet a wins on the others
    chooser = threads.FasterOf()
    calls = iter([4.0, 0.5] + [4.0, 6.0] * threads.FasterOf.TRIALS)

    def timed(name):
        def run():
            clock[0] += next(calls)
            return name
        return run

    for _ in range(2 * counted):
        chooser.call(timed("a"), timed("b"))
    assert chooser.choice == 0


@pytest.mark.skipif(not ig.amx_available(), reason="no AMX int8 tiles on this CPU (or Linux refused the tile state)")
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("case", [
    # (C, M, HW, kernel, stride, group, images): the poly split (3x3/2), the phase split, the 7x7/2 stem, groups,
    # 1x1 in place, an unpadded strided 1x1, M and K past whole tiles (5 channels x 9 taps, 33 outputs)
    (64, 256, 14, 3, 2, 1, 1), (32, 64, 12, 3, 1, 1, 2), (3, 16, 30, 7, 2, 1, 1), (16, 96, 20, 3, 1, 2, 3),
    (8, 40, 33, 1, 1, 1, 2), (256, 64, 14, 1, 2, 1, 1), (5, 33, 9, 3, 1, 1, 1),
])
def test_amx_conv_matches_direct_int64(monkeypatch, case, workers):
    """The packed path's GEMM on AMX tiles (kernels._amx.conv_tiles, forced): int8 and uint8 inputs and
    weights, per-channel weight zero points, bias, 1-3 workers, against the direct int64 convolution; the same
    region pads and packs as the VNNI one. Repeated, since a missed wait for a panel would show only in some
    runs."""
    c_in, m_total, hw, k, s, group, n_img = case
    rng = np.random.default_rng(sum(case) + workers)
    monkeypatch.setattr(im2col.ig.threads, "get_num_threads", lambda: workers)
    monkeypatch.setattr(im2col, "_AMX", True)
    monkeypatch.setattr(im2col, "_DIRECT", False)
    g = geo((s, s), (1, 1), (k // 2, k // 2), (k // 2, k // 2))
    for xdt in (U8, I8):
        for wdt in (I8, U8):
            x = rand(rng, (n_img, c_in, hw, hw), xdt)
            w = rand(rng, (m_total, c_in // group, k, k), wdt)
            zw = rand(rng, (m_total,), wdt)
            bias = rng.integers(-2**20, 2**20, m_total).astype(np.int32)
            za = xdt(rng.integers(*lim(xdt)))
            packed = im2col.prepack_conv(w, zw, group)
            assert im2col.prepare(x.shape, x.dtype, za, packed, bias, g, None).kind == "amx_gemm"
            expected = direct_conv(x, za, w, zw, bias, group, (s, s), (1, 1), (k // 2, k // 2), (k // 2, k // 2))
            for _ in range(2):
                got = im2col.conv(x, za, packed, bias, g, None)
                np.testing.assert_array_equal(got, expected, err_msg=f"{xdt.__name__} {wdt.__name__}")
