"""The microscaling kernels (`qlinear.kernels.mx`) against the NumPy reference (`qlinear.reference.mx`), bit for
bit: codes and scales (as bytes), dequantized values (as float32 bits), for every format and scale rule.

Inputs: random normal, Laplace and Cauchy rows at every power-of-two magnitude from 2^-140 to 2^127, and every
special a block can hold (zeros, -0, subnormals, +-Inf, NaN, blocks of exactly the format's maximum and of
max * 2^k, maxima 1 ulp below and above powers of two, the float-log2 trap), partial last blocks, rows shorter
than a block, 1-D and 3-D arrays, a blocking axis that is not the last (through `qlinear.mx`). Dequantize sees
every code byte under every scale byte. All 2^32 float32 patterns: `benchmarks/sweep_mx.py`, offline.

Each kernel compiles once for every format (the formats' constants are arguments), so the whole file compiles
seven kernels; the cases are batched into a few large calls."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx
from qlinear.kernels import mx as km
from qlinear.kernels import threads
from qlinear.kernels.quantize_linear import use_kernels
from qlinear.reference import mx as ref

pytestmark = pytest.mark.skipif(not km.HAVE_NUMBA, reason="numba is not installed")

F32 = np.float32
MX_NAMES = [name for name in ref.FORMATS if name != "nvfp4"]
CASES = [(name, rule) for name in MX_NAMES for rule in ref.SCALE_RULES]
TINY = np.finfo(F32).smallest_subnormal
FLT_MAX = np.finfo(F32).max


def _bytes(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _assert_same(kernel, reference, what: str, x=None):
    kernel, reference = np.asarray(kernel), np.asarray(reference)
    assert kernel.shape == reference.shape and kernel.dtype == reference.dtype, what
    kb = kernel.view(np.uint32) if kernel.dtype == np.float32 else _bytes(kernel)
    rb = reference.view(np.uint32) if reference.dtype == np.float32 else _bytes(reference)
    bad = np.argwhere(kb != rb)
    if bad.size:
        at = tuple(bad[0])
        context = "" if x is None or x.shape != kernel.shape else f", x={x[at]!r} (bits {_bits(x[at])!r})"
        raise AssertionError(f"{what}: {len(bad)} mismatches, first at {at}: kernel {kb[at]:#x}, reference "
                             f"{rb[at]:#x}{context}")


# ----------------------------------------------------------------------------------------------- inputs
def _random_rows(k: int) -> np.ndarray:
    """Normal, Laplace and Cauchy rows, row i at magnitude 2^(i - 140) for i in 0..267 (2^-140 .. 2^127); the
    row's scale overflows to Inf in a few Cauchy rows at the top, which is a case too."""
    rng = np.random.default_rng(20)
    makers = (rng.standard_normal, lambda n: rng.laplace(size=n), rng.standard_cauchy)
    rows = [np.ldexp(makers[i % 3](k), i - 140) for i in range(268)]
    with np.errstate(over="ignore"):
        return np.asarray(rows).astype(F32)


def _powers_of_two_block(fmt) -> np.ndarray:
    """Rows of 32 whose maximum is 1 ulp below, at and 1 ulp above 2^j (j over float32's range) or the element's
    maximum times 2^j: the float-log2 trap and the clipping boundary, with a spread of smaller elements."""
    rng = np.random.default_rng(21)
    tops = []
    with np.errstate(over="ignore"):
        bases = [(F32(np.ldexp(1.0, j)), F32(np.ldexp(fmt.max_value, j))) for j in range(-149, 128)]
    for pair in bases:
        for base in pair:
            if not np.isfinite(base) or base == 0:
                continue
            tops += [np.nextafter(base, F32(0)), base, np.nextafter(base, F32(np.inf))]
    tops = np.asarray(tops, F32)
    rows = np.empty((tops.size, 32), F32)
    rows[:, 0] = tops
    frac = rng.uniform(-1, 1, (tops.size, 31))
    rows[:, 1:] = (frac * tops[:, None]).astype(F32)
    rows[1::2, 5] = -tops[1::2]  # the maximum as a negative value too
    return rows


def _special_rows() -> np.ndarray:
    """Blocks of specials, 32 wide (some rows cut short by the caller's K)."""
    z = np.zeros(32, F32)
    rows = []
    rows.append(z.copy())                                 # all zero: scale 2^-127
    r = z.copy(); r[3] = -0.0; rows.append(r)             # -0 among zeros
    rows.append(np.full(32, -0.0, F32))
    r = z.copy(); r[:] = TINY; r[::2] = -TINY; rows.append(r)   # smallest subnormals
    rows.append(np.arange(32, dtype=np.uint32).view(F32) * 1)   # subnormals 0..31 ulps
    # up to the normal edge
    r = (np.arange(32, dtype=np.uint32) + np.uint32(0x007FFFE0)).view(F32).copy(); rows.append(r)
    r = (np.arange(32, dtype=np.uint32) + np.uint32(0x00400000)).view(F32).copy(); rows.append(r)  # around 2^-127
    for special in (np.inf, -np.inf, np.nan, -np.nan):
        r = np.linspace(-3, 3, 32).astype(F32); r[7] = special; rows.append(r)
    r = np.full(32, np.nan, F32); rows.append(r)
    r = np.linspace(-1, 1, 32).astype(F32); r[0] = FLT_MAX; rows.append(r)
    r = np.full(32, -FLT_MAX, F32); rows.append(r)
    r = np.full(32, FLT_MAX, F32); r[1] = TINY; rows.append(r)
    nan_payload = np.array([0x7FC00001, 0xFFC00000, 0x7F800001, 0xFF812345], np.uint32).view(F32)
    r = np.ones(32, F32); r[:4] = nan_payload; rows.append(r)
    return np.asarray(rows, F32)


def _format_rows(fmt) -> np.ndarray:
    """Blocks of exactly the format's maximum, of its representable values and of the midpoints between them
    (ties), at scales 2^-127, 2^-60, 2^0 and 2^100."""
    rows = []
    if fmt.is_int:
        grid = np.arange(-127, 128, dtype=np.float64) / 64
    else:
        grid = np.unique(np.arange(256, dtype=np.uint8).view(fmt.element.dtype).astype(np.float64))
        grid = grid[np.isfinite(grid)]
    mids = (grid[:-1] + grid[1:]) / 2
    values = np.concatenate([grid, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    values = values[: values.size // 31 * 31].reshape(-1, 31)
    for shift in (-127, -60, 0, 100):
        block = np.empty((values.shape[0], 32))
        block[:, 0] = fmt.max_value
        block[:, 1:] = values
        rows.append(np.ldexp(block, shift).astype(F32))
    rows.append(np.full((2, 32), fmt.max_value, F32))
    rows.append(-np.full((2, 32), fmt.max_value, F32))
    return np.concatenate(rows)


def _inputs(fmt) -> list[np.ndarray]:
    """The arrays each format and rule is checked on: full blocks, partial last blocks, K below the block size,
    1-D and 3-D."""
    bs = fmt.block_size
    wide = np.concatenate([_random_rows(96), _random_rows(96)[:, ::-1]], axis=0)
    rows = np.concatenate([_powers_of_two_block(fmt), _special_rows(), _format_rows(fmt)])
    if bs == 16:  # NVFP4: the same rows as two blocks of 16
        rows = rows.reshape(-1, 16)
    # 64 blocks a row when the blocks fill the rows (kernels/mx._rows): the kernels' groups of 16 whole blocks
    grouped = rows[: rows.shape[0] // (2048 // rows.shape[1]) * (2048 // rows.shape[1])]
    return [
        wide,                                     # whole blocks
        _random_rows(512),                        # whole blocks, in groups of 16
        grouped,                                  # specials, in groups of 16
        wide[:, :83],                             # a partial last block
        rows,                                     # specials, exact maxima, powers of two
        rows[:, :bs - 5].copy(),                  # K < block size
        np.concatenate([rows, rows[:, :7]], axis=1),  # partial block of specials
        wide[:4].reshape(-1),                     # 1-D
        wide[:, :90].reshape(4, 134, 90)[:, :, :45],  # 3-D, not contiguous
        np.zeros((0, 40), F32),
        np.ones((3, 0), F32),
    ]


# ----------------------------------------------------------------------------------------------- MX
@pytest.mark.parametrize("name,rule", CASES)
def test_quantize_mx_equals_reference(name, rule):
    fmt = ref.FORMATS[name]
    for x in _inputs(fmt):
        codes, scales = km.quantize_mx(x, fmt, rule)
        with np.errstate(all="ignore"):
            rcodes, rscales = ref.quantize_mx(x, fmt, rule)
        shape = f"{name}/{rule}, x {x.shape}"
        _assert_same(scales, rscales, f"scales, {shape}")
        _assert_same(codes, rcodes, f"codes, {shape}", x)


@pytest.mark.parametrize("name", MX_NAMES)
def test_dequantize_mx_equals_reference(name):
    """Every code byte under every scale byte (NaN 0xFF included), in whole and partial blocks."""
    fmt = ref.FORMATS[name]
    codes = np.tile(np.arange(256, dtype=np.uint8), (256, 1)).view(fmt.element.dtype)  # (256 scales, 256 codes)
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 8, axis=1).view(ml_dtypes.float8_e8m0fnu)
    for c, s in ((codes, scales), (codes[:, :250], scales), (codes[:, :7], scales[:, :1]),
                 (codes.reshape(-1), scales.reshape(-1)), (codes.reshape(8, 32, 256), scales.reshape(8, 32, 8))):
        y = km.dequantize_mx(c, s, fmt)
        with np.errstate(all="ignore"):
            r = ref.dequantize_mx(c, s, fmt)
        _assert_same(y, r, f"{name} dequantize, codes {c.shape}")


# ----------------------------------------------------------------------------------------------- NVFP4
def _nvfp4_ties(j: int) -> np.ndarray:
    """A tensor with the tensor scale g = 2^j exactly (its maximum is 2688 * 2^j) and blocks whose d is an E4M3
    value s times g: each holds 6 * d (so that its block scale is s) and E2M1 midpoints times d (exact ties),
    E2M1 values times d, and their float32 neighbours."""
    e4m3 = np.arange(1, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    mids = (grid[:-1] + grid[1:]) / 2
    values = np.concatenate([mids, -mids, grid[1:-1], -grid[1:-1]])  # 26 values
    rows = [np.full(16, 2688.0 * 2.0**j, F32)]
    for s in e4m3[::2]:
        d = s * 2.0**j
        for part in (values[:15], values[11:]):
            exact = (part * d).astype(F32)  # exact: a few significant bits
            for v in (exact, np.nextafter(exact, F32(0)), np.nextafter(exact, F32(np.inf))):
                rows.append(np.concatenate([[F32(6 * d)], v]).astype(F32))
    return np.asarray(rows, F32)


def test_quantize_nvfp4_equals_reference():
    fmt = ref.FORMATS["nvfp4"]
    inputs = _inputs(fmt)
    # The tensor scale comes from the whole tensor: each row set also alone, and rows at one magnitude (the
    # random rows together span 2^267, which leaves most block scales 0)
    inputs += [r[None] for r in _random_rows(48)[::7]]
    inputs += [np.full((2, 16), v, F32) for v in (0.0, -0.0, TINY, np.inf, np.nan)]
    inputs += [np.array([[np.inf, 1.0, 2.0, 0.5] * 4, [3.0] * 16], F32), np.array([[np.nan] * 16, [TINY] * 16], F32)]
    inputs += [_nvfp4_ties(j) for j in (-100, -20, 0, 20, 100)]
    for x in inputs:
        codes, scales, g = km.quantize_nvfp4(x)
        with np.errstate(all="ignore"):
            rcodes, rscales, rg = ref.quantize_nvfp4(x)
        what = f"nvfp4, x {x.shape}"
        assert _bits(g) == _bits(rg), f"tensor scale, {what}"
        _assert_same(scales, rscales, f"block scales, {what}")
        _assert_same(codes, rcodes, f"codes, {what}", x)


@pytest.mark.parametrize("factor", [1.0, 0.125, 8.0])
def test_quantize_nvfp4_given_tensor_scale_equals_reference(factor):
    """The tensor scale given (no first pass) on every input set, with x's own tensor scale (then also equal
    to the result with the tensor scale from x) and with others: smaller (block scales saturate at 448) and
    larger."""
    fmt = ref.FORMATS["nvfp4"]
    for x in _inputs(fmt) + [_nvfp4_ties(j) for j in (-100, 0, 100)]:
        with np.errstate(all="ignore"):
            g = np.float32(ref.nvfp4_global_scale(x) * np.float32(factor))
            rcodes, rscales, rg = ref.quantize_nvfp4(x, g)
        codes, scales, kg = km.quantize_nvfp4(x, g)
        what = f"nvfp4 with g = {g!r}, x {x.shape}"
        assert _bits(kg) == _bits(g), what
        _assert_same(scales, rscales, f"block scales, {what}")
        _assert_same(codes, rcodes, f"codes, {what}", x)
        if factor == 1.0:
            two_pass = km.quantize_nvfp4(x)
            _assert_same(codes, two_pass[0], f"codes, one pass vs two, {what}", x)
            _assert_same(scales, two_pass[1], f"block scales, one pass vs two, {what}")


@pytest.mark.parametrize("k", [1030, 2000, 1040])
def test_nvfp4_rows_longer_than_a_group_with_a_short_last_block(k):
    """Rows of more than `NV_GROUP` blocks whose last block is short (and, 1040, exactly 65 whole blocks): the
    group after the first 64 blocks holds that block alone, in both kernels (tensor scale own and given)."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((9, k)) * np.exp2(rng.integers(-20, 20, (9, 1)))).astype(F32)
    x[2, k - 1] = np.inf
    x[5, 70] = np.nan
    for g in (None, F32(0.01), F32(1e-30)):
        codes, scales, kg = km.quantize_nvfp4(x, g)
        with np.errstate(all="ignore"):
            rcodes, rscales, rg = ref.quantize_nvfp4(x, g)
        assert _bits(kg) == _bits(rg)
        _assert_same(scales, rscales, f"block scales, k {k}, g {g}")
        _assert_same(codes, rcodes, f"codes, k {k}, g {g}", x)


def test_nvfp4_block_scales_at_every_e4m3_rounding_boundary():
    """Block maxima whose (amax / 6) / g lands on and around every E4M3 value and every midpoint between two
    (the kernel rounds the block scale with a magic-number addition and takes its value as the sum minus
    the magic number, not by decoding the byte)."""
    values = np.arange(0, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # 0 .. 448
    targets = np.concatenate([values, (values[:-1] + values[1:]) / 2])
    g = F32(F32(448.0) / F32(2688.0))  # the tensor scale: x's maximum is 448 (row 0 below)
    amax = (targets * 6.0 * np.float64(g)).astype(F32)
    near = [amax]
    down, up = amax, amax
    for _ in range(3):  # three float32 steps to either side
        down, up = np.nextafter(down, F32(0)), np.nextafter(up, F32(np.inf))
        near += [down, up]
    maxima = np.unique(np.concatenate(near))
    maxima = maxima[maxima <= F32(448.0 * 6.0) * g]
    x = np.zeros((maxima.size + 1, 16), F32)
    x[0, 0] = F32(448.0)  # the tensor maximum: g = float32(448 / 2688)
    x[1:, 0] = maxima
    x[1:, 1:] = maxima[:, None] * np.linspace(-1, 1, 15, dtype=F32)
    codes, scales, g_k = km.quantize_nvfp4(x)
    rcodes, rscales, rg = ref.quantize_nvfp4(x)
    assert _bits(g_k) == _bits(rg)
    _assert_same(scales, rscales, "block scales at E4M3 boundaries")
    _assert_same(codes, rcodes, "codes at E4M3 boundaries", x)


@pytest.mark.parametrize("g", [None, 1.0, 0.125, 8.0, "tiny", "huge"])
def test_quantize_nvfp4_modelopt_equals_reference(g):
    """Model Optimizer's NVFP4 (`scale_rule="modelopt"`): the kernel == `reference.mx.quantize_nvfp4_modelopt`
    on every input set, with x's own tensor scale and given ones (x's times a factor; 1e-38, whose 6 g
    leaves block scales at 2^-9 and quotients beyond 6; 3e38, whose 6 g overflows, so that an Inf block
    maximum gives inf / inf, the CPU's default NaN with its sign bit set, 0xFF). An x holding an Inf or a
    NaN, or all zeros, gives Model Optimizer an Inf, NaN or 0 tensor scale: the kernel leaves it to the
    reference (None), and the public function gives the reference's result."""
    fmt = ref.FORMATS["nvfp4"]
    inputs = _inputs(fmt) + [_nvfp4_ties(j) for j in (-100, -20, 0, 20, 100)]
    inputs += [r[None] for r in _random_rows(48)[::7]]
    inputs += [np.full((2, 16), v, F32) for v in (0.0, -0.0, TINY, np.inf, np.nan)]
    inputs += [np.array([[np.inf, 1.0, 2.0, 0.5] * 4, [3.0] * 16, [-0.0] * 16], F32),
               np.array([[np.nan] * 16, [TINY] * 16, [-np.nan, 1.0] * 8], F32)]
    ran = 0
    for x in inputs:
        with np.errstate(all="ignore"):
            if g is None:
                tensor_scale = None
            elif g == "tiny":
                tensor_scale = F32(1e-38)
            elif g == "huge":
                tensor_scale = F32(3e38)
            else:
                tensor_scale = F32(ref.nvfp4_global_scale(x) * F32(g))
            rcodes, rscales, rg = ref.quantize_nvfp4(x, tensor_scale, "modelopt")
        result = km.quantize_nvfp4(x, tensor_scale, "modelopt")
        what = f"nvfp4 modelopt, g {tensor_scale!r}, x {x.shape}"
        finite = np.isfinite(x).all() and np.abs(x).max(initial=0) > 0
        if result is None:
            assert tensor_scale is None and not (finite and np.isfinite(rg) and rg > 0), what
            codes, scales, kg = mx.quantize(x, "nvfp4", scale_rule="modelopt")
        else:
            codes, scales, kg = result
            ran += 1
        assert _bits(kg) == _bits(rg), f"tensor scale, {what}"
        _assert_same(scales, rscales, f"block scales, {what}")
        _assert_same(codes, rcodes, f"codes, {what}", x)
    assert ran > len(inputs) // 2  # each fallback above is an x Model Optimizer gives an Inf, NaN or 0 tensor scale


def test_nvfp4_amax_equals_reference():
    """`kernels.mx.nvfp4_amax` (the first pass alone, which the checkpoint writer takes a tensor's maximum from)
    == `reference.mx.nvfp4_amax` under both rules on every input set, bit for bit; under "modelopt" an x
    holding an Inf or a NaN is the reference's (None)."""
    fmt = ref.FORMATS["nvfp4"]
    inputs = _inputs(fmt) + [np.full((2, 16), v, F32) for v in (0.0, -0.0, TINY, np.inf, -np.inf, np.nan)]
    inputs += [np.array([7.0, -8.0, 3.0], F32), np.arange(-300, 301, dtype=F32)]
    for x in inputs:
        for rule in (None, "modelopt"):
            kernel = km.nvfp4_amax(x, rule)
            with np.errstate(all="ignore"):
                reference = ref.nvfp4_amax(x, rule)
            if kernel is None:
                assert x.size == 0 or (rule == "modelopt" and not np.isfinite(x).all()), (x.shape, rule)
            else:
                assert _bits(kernel) == _bits(reference), (x.shape, rule)


def test_nvfp4_thresholds_derived_by_exponent_equal_the_float64_form():
    """`_nv_limits` computes three of a block's seven thresholds and moves the exponent of those for the rest
    (0.25 d, 2.5 d, 3.5 d, 5 d); `_nv_threshold` computes each in float64. Equal for d at both ends of every
    binade of [2^-100, 2^100] and 300 random significands in each, and for d <= 0 and NaN (every float32 d
    in the range: offline, see `_nv_limits`)."""
    from numba import njit

    from qlinear.kernels import _mx_numba as nb

    @njit(cache=False)
    def mismatches(ds, midpoints):
        bad = 0
        for d in ds:
            got = nb._nv_limits(d)
            for k in range(7):
                bad += got[k] != nb._nv_threshold(midpoints[k], d, k % 2 == 1)
        return bad

    rng = np.random.default_rng(7)
    lo, hi = F32(2.0**-100).view(np.int32), F32(2.0**100).view(np.int32)
    exponents = np.arange(lo, hi + 1, 1 << 23, dtype=np.int64)
    significands = rng.integers(0, 1 << 23, (exponents.size, 300))
    bits = np.concatenate([exponents, exponents + (1 << 23) - 1, (exponents[:, None] + significands).ravel()])
    ds = bits[bits <= hi].astype(np.int32).view(F32)
    assert mismatches(ds, np.array(nb._MIDPOINTS)) == 0
    for d in (F32(0), F32(-0.0), F32(-1), F32(np.nan)):
        assert nb._nv_limits(d) == (nb._NEVER,) * 7


def test_dequantize_nvfp4_equals_reference():
    """Every float4 byte (the unused high bits too) under every E4M3 byte, for a few tensor scales."""
    codes = np.tile(np.arange(256, dtype=np.uint8), (256, 1)).view(ml_dtypes.float4_e2m1fn)
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 16, axis=1).view(ml_dtypes.float8_e4m3fn)
    for g in (F32(1), F32(3.3e-5), F32(TINY), F32(1e38), F32(0.7)):
        for c, s in ((codes, scales), (codes[:, :250], scales), (codes[:, :9], scales[:, :1])):
            y = km.dequantize_nvfp4(c, s, g)
            with np.errstate(all="ignore"):
                r = ref.dequantize_nvfp4(c, s, g)
            _assert_same(y, r, f"nvfp4 dequantize, g={g}, codes {c.shape}")


# ----------------------------------------------------------------------------------------------- the public API
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxint8", "nvfp4"])
def test_public_functions_use_the_kernels_along_any_axis(name):
    """qlinear.mx moves the axis and runs the kernel: equal to its reference path (use_kernels(False)) along
    axis 0 and 1 of a 3-D array, in float16 and float64 input too."""
    rng = np.random.default_rng(22)
    x = (rng.standard_normal((70, 5, 40)) * 2.0 ** rng.integers(-20, 20, (70, 5, 1))).astype(F32)
    x[3, 2, 7] = np.nan
    for axis in (0, 1, -1):
        with np.errstate(over="ignore"):
            inputs = (x, x.astype(np.float16), x.astype(np.float64))
        for xin in inputs:
            got = mx.quantize(xin, name, axis=axis)
            with use_kernels(False), np.errstate(all="ignore"):
                want = mx.quantize(xin, name, axis=axis)
            for a, b in zip(got, want):
                _assert_same(a, b, f"{name} axis {axis} {xin.dtype}")
            extra = {"global_scale": got[2]} if name == "nvfp4" else {}
            y = mx.dequantize(got[0], got[1], axis=axis, **extra)
            with use_kernels(False):
                yr = mx.dequantize(got[0], got[1], axis=axis, **extra)
            _assert_same(y, yr, f"{name} dequantize axis {axis}")


def test_threads_split_large_inputs_alike(monkeypatch):
    """Rows split between threads give the same bytes as one thread."""
    monkeypatch.setattr(threads, "SPLIT_ALWAYS", True)
    n = 1 << 21
    x = np.random.default_rng(23).standard_normal((n // 96, 96)).astype(F32)
    x[::1000, 5] = np.inf
    finite = np.where(np.isinf(x), F32(7), x)  # Model Optimizer's tensor scale from an Inf is Inf: the reference's
    runs = {"mxfp4": lambda: km.quantize_mx(x, ref.FORMATS["mxfp4"], "floor"), "nvfp4": lambda: km.quantize_nvfp4(x),
            "nvfp4, tensor scale given": lambda: km.quantize_nvfp4(x, np.float32(0.01)),
            "nvfp4 modelopt": lambda: km.quantize_nvfp4(finite, None, "modelopt"),
            "nvfp4 modelopt, tensor scale given": lambda: km.quantize_nvfp4(x, np.float32(0.01), "modelopt")}
    for name, run in runs.items():
        parallel = run()
        before = threads.get_num_threads()
        threads.set_num_threads(1)
        try:
            serial = run()
        finally:
            threads.set_num_threads(before)
        assert parallel is not None, name
        for a, b in zip(parallel, serial):
            _assert_same(a, b, f"{name}: 2 threads vs 1")


def test_concurrent_calls_from_python_threads(monkeypatch):
    """Calls from several Python threads at once (dask does this) give each caller its own bytes: the kernels run
    through threads.run_chunked (nogil serial kernels, no numba threading layer), each split between threads."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(threads, "SPLIT_ALWAYS", True)
    rng = np.random.default_rng(24)
    xs = [rng.standard_normal(((1 << 20) // 256 + 3, 256)).astype(F32) * F32(2.0 ** (8 * i))
          for i in range(4)]
    fmt = ref.FORMATS["mxfp8_e4m3"]
    alone = [km.quantize_mx(x, fmt, "ceil") for x in xs] + [km.quantize_nvfp4(x) for x in xs]

    def work(i):
        return km.quantize_mx(xs[i], fmt, "ceil") if i < 4 else km.quantize_nvfp4(xs[i - 4])

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(work, range(8)))
    for a, b in zip(together, alone):
        for u, v in zip(a, b):
            _assert_same(u, v, "concurrent call")


def test_switched_off_kernels_return_none():
    with use_kernels(False):
        x = np.ones((2, 32), F32)
        assert km.quantize_mx(x, ref.FORMATS["mxfp4"], "floor") is None
        assert km.quantize_nvfp4(x) is None
