"""The exact integer GEMM core: every kernel path this machine can run, bit-identical to an int64 NumPy product.

Oracle: ``(a.astype(int64) - a_zp) @ (w.astype(int64) - w_zp) + bias`` and, for requantization, the arithmetic
written out here in NumPy (onnx reference: float64 product + zp, clip, round half to even; onnxruntime:
float32 product, clip to [qmin - zp, qmax - zp], round half to even, + zp).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.kernels import integer_gemm as ig
from suite import examples, kernel_paths, other_paths

PATHS = kernel_paths(ig.available_paths())
I8, U8 = np.int8, np.uint8


def lim(dt):
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def oracle(a, za, w, zw, bias=None):
    za = np.asarray(za, dtype=np.int64).reshape(-1, 1)
    zw = np.asarray(zw, dtype=np.int64).reshape(1, -1)
    acc = (a.astype(np.int64) - za) @ (w.astype(np.int64) - zw)
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape(1, -1)
    return acc


def requant_oracle(acc, mult, yzp, ydt, mode):
    qmin, qmax = lim(ydt)
    if mode == "float64":
        y = acc.astype(np.float64) * np.asarray(mult).astype(np.float64) + np.float64(yzp)
        return np.rint(np.clip(y, qmin, qmax)).astype(ydt)
    y = acc.astype(np.float32) * np.asarray(mult, dtype=np.float32)
    y = np.clip(y, np.float32(qmin - yzp), np.float32(qmax - yzp))
    return (np.rint(y) + np.float32(yzp)).astype(ydt)


def rand(rng, shape, dt):
    lo, hi = lim(dt)
    return rng.integers(lo, hi + 1, shape).astype(dt)


@pytest.fixture(autouse=True)
def every_thread(monkeypatch):
    """The GEMMs here run on every thread, unmeasured (a call's first runs would be serial trials otherwise:
    threads.SerialOrParallel); `test_one_thread_or_all_is_measured_per_weight_and_rows` covers the choice."""
    monkeypatch.setattr(ig, "_FORCE_SERIAL", False)


@pytest.fixture(params=PATHS)
def path(request):
    return request.param


def test_this_machine_offers_several_paths():
    # blas always; on x86 with AVX2 at least one intrinsic path. Every one available is tested below.
    assert PATHS[-1] == "blas"
    assert ig.default_path() == PATHS[0]


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 7, 3), (37, 129, 45), (8, 4, 32), (13, 1001, 70), (100, 3, 200)])
@pytest.mark.parametrize("adt,wdt", [(U8, I8), (I8, I8), (U8, U8), (I8, U8)])
def test_random_matches_int64(path, m, k, n, adt, wdt):
    rng = np.random.default_rng(m * 1000 + k + n)
    a, w = rand(rng, (m, k), adt), rand(rng, (k, n), wdt)
    za = rand(rng, (), adt)
    zw = rand(rng, (n,), wdt)
    bias = rng.integers(-(2**20), 2**20, n).astype(np.int32)
    pw = ig.pack_weights(w, zw)
    got = ig.gemm(a, za, pw, bias, path=path)
    assert got.dtype == np.int32 and got.shape == (m, n)
    np.testing.assert_array_equal(got, oracle(a, za, w, zw, bias))
    # the same packed weights serve again, without bias and with a per-row a zero point
    za_rows = rand(rng, (m,), adt)
    np.testing.assert_array_equal(ig.gemm(a, za_rows, pw, path=path), oracle(a, za_rows, w, zw))


def test_out_receives_the_product(path):
    # a batched matmul's slices are written in place: the same bits as a new array, int32 and requantized
    rng = np.random.default_rng(5)
    a, w = rand(rng, (37, 129), U8), rand(rng, (129, 45), I8)
    pw = ig.pack_weights(w, I8(0))
    out = np.full((2, 37, 45), -1, np.int32)
    got = ig.gemm(a, U8(7), pw, path=path, out=out[1])
    assert got is not None and np.shares_memory(got, out[1])
    np.testing.assert_array_equal(out[1], oracle(a, U8(7), w, 0))
    assert (out[0] == -1).all()
    rq = (np.float32(0.01), 3, U8, "float64")
    out8 = np.empty((37, 45), U8)
    ig.gemm(a, U8(7), pw, None, rq, path=path, out=out8)
    np.testing.assert_array_equal(out8, ig.gemm(a, U8(7), pw, None, rq, path=path))
    np.testing.assert_array_equal(out8, requant_oracle(oracle(a, U8(7), w, 0), np.float32(0.01), 3, U8, "float64"))
    for bad in (np.empty((37, 45), np.int64), np.empty((45, 37), np.int32), np.empty((37, 90), np.int32)[:, ::2]):
        with pytest.raises(ValueError, match=r"gemm: out must be a writeable C-contiguous int32 array of shape \(37, 45\)"):
            ig.gemm(a, U8(7), pw, path=path, out=bad)


def test_every_width_of_the_last_panel(path):
    # the last column panel holds 1..NR columns: at most half of NR runs the half-width microkernel, the rest the
    # full one (NR = 16 on the AVX2 paths, 32 on the AVX-512 ones)
    rng = np.random.default_rng(11)
    k, m = 37, 6
    a = rand(rng, (m, k), U8)
    for n in range(1, 66):
        w = rand(rng, (k, n), I8)
        zw = rand(rng, (n,), I8)
        got = ig.gemm(a, U8(3), ig.pack_weights(w, zw), path=path)
        np.testing.assert_array_equal(got, oracle(a, U8(3), w, zw), err_msg=f"n={n}")


@pytest.mark.parametrize("a_val,za,w_val,zw", [(255, 0, -128, 127), (0, 255, 127, -128), (255, 0, 127, -128),
                                               (0, 0, -128, 0), (255, 255, 127, 127)])
@pytest.mark.parametrize("k", [1, 3, 258, 1027])
def test_worst_case_uint8_x_int8(path, a_val, za, w_val, zw, k):
    a = np.full((7, k), a_val, U8)
    w = np.full((k, 19), w_val, I8)
    w[:, 3] = -w_val - 1 if w_val >= 0 else 127  # one column at the other extreme
    pw = ig.pack_weights(w, np.int8(zw))
    np.testing.assert_array_equal(ig.gemm(a, U8(za), pw, path=path), oracle(a, za, w, zw))


@pytest.mark.parametrize("adt,wdt", [(I8, I8), (I8, U8), (U8, U8)])
def test_worst_case_other_types(path, adt, wdt):
    (alo, ahi), (wlo, whi) = lim(adt), lim(wdt)
    k = 515
    for a_val, za, w_val, zw in [(ahi, alo, wlo, whi), (alo, ahi, whi, wlo), (ahi, alo, whi, wlo)]:
        a = np.full((9, k), a_val, adt)
        w = np.full((k, 33), w_val, wdt)
        pw = ig.pack_weights(w, wdt(zw))
        np.testing.assert_array_equal(ig.gemm(a, adt(za), pw, path=path), oracle(a, za, w, zw))


def test_largest_k_that_fits_int32_is_exact(path):
    # 255 * 255 * 33025 = 2_147_450_625 <= 2**31 - 1: the int32 kernels must run and be exact at the limit.
    k = 33025
    a = np.full((2, k), 255, U8)
    w = np.full((k, 3), 127, I8)
    pw = ig.pack_weights(w, np.int8(-128))
    got = ig.gemm(a, U8(0), pw, path=path)
    assert int(got[0, 0]) == 255 * 255 * k
    np.testing.assert_array_equal(got, oracle(a, 0, w, -128))
    got = ig.gemm(a, U8(0), pw, np.full(3, 2**31 - 1 - 255 * 255 * k, np.int32), path=path)
    assert int(got.max()) == 2**31 - 1


def test_sum_leaving_int32_raises(path):
    k = 33026
    a = np.full((2, k), 255, U8)
    w = np.full((k, 3), 127, I8)
    pw = ig.pack_weights(w, np.int8(-128))
    with pytest.raises(ValueError, match=r"gemm: the exact accumulator leaves int32"):
        ig.gemm(a, U8(0), pw, path=path)
    # the bias alone can push it out too
    pw = ig.pack_weights(w[:33025], np.int8(-128))
    with pytest.raises(ValueError, match=r"gemm: the exact accumulator leaves int32"):
        ig.gemm(a[:, :33025], U8(0), pw, np.full(3, 2**31 - 1 - 255 * 255 * 33025 + 1, np.int32), path=path)


def test_large_bound_but_small_sum_is_exact(path):
    # the worst-case bound exceeds int32 (so the float64-accumulating path runs) but the sum itself fits
    k = 40000
    a = np.full((3, k), 255, U8)
    w = np.where(np.arange(k)[:, None] % 2 == 0, np.int8(127), np.int8(-128)).repeat(2, axis=1).astype(I8)
    pw = ig.pack_weights(w, np.int8(0))
    np.testing.assert_array_equal(ig.gemm(a, U8(0), pw, path=path), oracle(a, 0, w, 0))


@pytest.mark.parametrize("mode", ["float64", "float32"])
@pytest.mark.parametrize("ydt", [U8, I8])
@pytest.mark.parametrize("mult_shape", ["scalar", "cols", "rows", "full"])
def test_requantization_fused(path, mode, ydt, mult_shape):
    rng = np.random.default_rng(7)
    m, k, n = 45, 77, 50
    a, w = rand(rng, (m, k), U8), rand(rng, (k, n), I8)
    za, zw = U8(131), rand(rng, (n,), I8)
    bias = rng.integers(-5000, 5000, n).astype(np.int32)
    shape = {"scalar": (), "cols": (n,), "rows": (m, 1), "full": (m, n)}[mult_shape]
    mult = (rng.random(shape) * 2e-3).astype(np.float32)
    yzp = rand(rng, (), ydt)
    pw = ig.pack_weights(w, zw)
    got = ig.gemm(a, za, pw, bias, (mult, yzp, ydt, mode), path=path)
    assert got.dtype == ydt
    np.testing.assert_array_equal(got, requant_oracle(oracle(a, za, w, zw, bias), mult, int(yzp), ydt, mode))


@pytest.mark.parametrize("mode", ["float64", "float32"])
def test_requantization_ties_round_half_to_even(path, mode):
    # acc * 0.5 hits every .5 tie; saturation at the top. An even zero point keeps the ties where they are
    # in both arithmetics (float64 adds the zero point before rounding, float32 after).
    a = np.arange(256, dtype=U8).reshape(-1, 1)
    w = np.ones((1, 1), I8)
    pw = ig.pack_weights(w, np.int8(0))
    mult = np.float32(0.5)
    got = ig.gemm(a, U8(0), pw, None, (mult, np.int8(-4), I8, mode), path=path)
    np.testing.assert_array_equal(got, requant_oracle(oracle(a, 0, w, 0), mult, -4, I8, mode))
    assert got[5, 0] == 2 - 4 and got[7, 0] == 4 - 4 and got[255, 0] == 124  # 2.5->2, 3.5->4, 127.5->128


@settings(max_examples=examples(40))
@given(data=st.data())
def test_property_random_shapes_and_zero_points(data):
    path = data.draw(st.sampled_from(PATHS))
    m = data.draw(st.integers(1, 40))
    k = data.draw(st.integers(1, 70))
    n = data.draw(st.integers(1, 70))
    adt = data.draw(st.sampled_from([U8, I8]))
    wdt = data.draw(st.sampled_from([U8, I8]))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    a, w = rand(rng, (m, k), adt), rand(rng, (k, n), wdt)
    za = rand(rng, (), adt)
    zw = rand(rng, (n,), wdt) if data.draw(st.booleans()) else rand(rng, (), wdt)
    bias = rng.integers(-(2**24), 2**24, n).astype(np.int32) if data.draw(st.booleans()) else None
    got = ig.gemm(a, za, ig.pack_weights(w, zw), bias, path=path)
    np.testing.assert_array_equal(got, oracle(a, za, w, zw, bias))


@pytest.mark.parametrize("amx", [None, True])
def test_concurrent_calls_from_python_threads(monkeypatch, amx):
    """Four Python threads multiplying at once (with ``amx``, on the AMX tiles, where the CPU has them: each
    worker thread loads its own tile configuration): every product has the oracle's bits."""
    if amx and not ig.amx_available():
        pytest.skip("no AMX int8 tiles on this CPU (or Linux refused the tile state)")
    monkeypatch.setattr(ig, "_AMX", amx)
    rng = np.random.default_rng(3)
    w = rand(rng, (300, 130), I8)
    pw = ig.pack_weights(w, np.int8(1))
    inputs = [rand(rng, (97, 300), U8) for _ in range(8)]
    want = [oracle(a, 5, w, 1) for a in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda a: ig.gemm(a, U8(5), pw), inputs * 3))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, want[i % len(inputs)])


def test_thread_count_does_not_change_bits():
    from qlinear.kernels import threads

    rng = np.random.default_rng(4)
    a, w = rand(rng, (300, 150), U8), rand(rng, (150, 200), I8)
    pw = ig.pack_weights(w, np.int8(0))
    old = threads.get_num_threads()
    try:
        results = []
        for t in range(1, threads._max_threads() + 1):
            threads.set_num_threads(t)
            results.append(ig.gemm(a, U8(9), pw))
    finally:
        threads.set_num_threads(old)
    for r in results:
        np.testing.assert_array_equal(r, oracle(a, 9, w, 0))


@pytest.mark.parametrize("n_threads", [1, 2, 3, 4])
def test_block_sizes_give_each_thread_an_even_share(n_threads):
    """Tasks of equal size, at least 4 a thread, and a last round that leaves threads idle for at most a tenth
    of the work, wherever the panels allow it (ResNet-50's 3x3 128 @28, 864 virtual columns: 1 thread's
    blocks made 3 tasks, which a 2-thread call once ran)."""
    for m_total in (8, 64, 100, 128, 512, 2048):
        for n_total in (32, 196, 784, 864, 3136, 12768):
            mb, nb = ig.block_sizes(m_total, n_total, 8, 32, n_threads)
            mp, npn = -(-m_total // 8), -(-n_total // 32)
            m_blocks, n_blocks = -(-mp // mb), -(-npn // nb)
            assert -(-mp // m_blocks) == mb and -(-npn // n_blocks) == nb  # no short remainder block
            tasks = m_blocks * n_blocks
            if n_threads == 1:
                assert mb * 8 >= min(mp * 8, 96) and nb * 32 >= min(npn * 32, 192)  # blocks stay large
            elif (mb, nb) != (1, 1):
                assert tasks >= 4 * n_threads, (m_total, n_total)
                assert -(-tasks // n_threads) * n_threads <= 1.1 * tasks, (m_total, n_total, tasks)
    assert ig.block_sizes(128, 864, 8, 32, 2) != ig.block_sizes(128, 864, 8, 32, 1)


@pytest.mark.parametrize("path_name", [p for p in PATHS if p != "blas"])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("m, k, n", [(200, 68, 40), (64, 256, 768), (37, 30, 100), (9, 1024, 520)])
def test_gemm_region_workers_match_int64(monkeypatch, path_name, workers, m, k, n):
    """The GEMM's one parallel region (activation panels packed by its own tasks, claimed from a shared counter;
    see _drivers.GEMM_TEMPLATE) with 1-3 workers (more workers than threads: a thread runs several in turn):
    many row blocks (a task packs and multiplies one) and few (the GEMM blocks wait for panels packed by
    others), K a multiple of 4 (word packer) or not, int8 activations, zero points, bias. Repeated, since a
    missed wait for a panel would show only in some runs."""
    monkeypatch.setattr(ig.threads, "get_num_threads", lambda: workers)
    rng = np.random.default_rng(m + k + n + workers)
    for adt in (U8, I8):
        a, w = rand(rng, (m, k), adt), rand(rng, (k, n), I8)
        za, zw = adt(rng.integers(*lim(adt))), rng.integers(-128, 128, n).astype(I8)
        bias = rng.integers(-2**20, 2**20, n).astype(np.int32)
        pw = ig.pack_weights(w, zw)
        expected = oracle(a, za, w, zw, bias)
        for _ in range(3):
            np.testing.assert_array_equal(ig.gemm(a, za, pw, bias, path=path_name), expected, err_msg=adt.__name__)


def test_force_path_context_and_errors():
    with ig.force_path("blas"):
        assert ig.current_path() == "blas"
    assert ig.current_path() == ig.default_path()
    with pytest.raises(ValueError, match=r"integer_gemm: unknown path 'sse9'"):
        ig.current_path("sse9")


def test_bad_arguments_raise_named_errors():
    w = np.zeros((4, 3), I8)
    pw = ig.pack_weights(w, np.int8(0))
    with pytest.raises(ValueError, match=r"gemm: a has K=5 columns but the packed weights have K=4 rows"):
        ig.gemm(np.zeros((2, 5), U8), U8(0), pw)
    with pytest.raises(ValueError, match=r"gemm: bias must be int32 with 3 elements"):
        ig.gemm(np.zeros((2, 4), U8), U8(0), pw, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"gemm: requant y_dtype must be int8 or uint8"):
        ig.gemm(np.zeros((2, 4), U8), U8(0), pw, None, (np.float32(1), 0, np.int16, "float64"))
    with pytest.raises(ValueError, match=r"gemm: requant mode must be 'float64' or 'float32'"):
        ig.gemm(np.zeros((2, 4), U8), U8(0), pw, None, (np.float32(1), 0, np.uint8, "float16"))
    with pytest.raises(ValueError, match=r"gemm: a must be a 2-D int8/uint8 array"):
        ig.gemm(np.zeros((2, 4), np.int16), 0, pw)
    with pytest.raises(ValueError, match=r"pack_weights: w_zero_point must be a scalar or have 3 elements"):
        ig.pack_weights(w, np.zeros(2, I8))
    with pytest.raises(ValueError, match=r"pack_weights: w_zero_point must lie in \[-128, 127\]"):
        ig.pack_weights(w, np.array(200))


def test_import_compiles_nothing_and_fallback_without_numba():
    code = (
        "import sys\n"
        "import qlinear.kernels.integer_gemm as ig, qlinear.kernels.im2col as ic\n"
        "assert not ic._pad_input.signatures and 'qlinear.kernels._drivers' not in sys.modules\n"
        "assert 'onnx' not in sys.modules and 'onnxruntime' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    # Without numba only the exact BLAS path remains, and it still works.
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np\n"
        "import qlinear.kernels.integer_gemm as ig, qlinear.kernels.im2col as ic\n"
        "assert ig.available_paths() == ('blas',), ig.available_paths()\n"
        "a = np.arange(12, dtype=np.uint8).reshape(3, 4); w = np.arange(-4, 4, dtype=np.int8).reshape(4, 2)\n"
        "got = ig.gemm(a, np.uint8(1), ig.pack_weights(w, np.int8(2)))\n"
        "assert (got == (a.astype(int) - 1) @ (w.astype(int) - 2)).all()\n"
        "x = np.arange(18, dtype=np.uint8).reshape(1, 2, 3, 3)\n"
        "y = ic.conv(x, np.uint8(0), ic.prepack_conv(np.ones((1, 2, 1, 1), np.int8), 0), None,\n"
        "            dict(strides=(1, 1), dilations=(1, 1), pads_begin=(0, 0), pads_end=(0, 0)))\n"
        "assert (y[0, 0] == x[0, 0].astype(int) + x[0, 1]).all()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- the fused form of the "float64" requantization (Requant.fuse, kernel mode 3)
def test_requant_fuse_takes_the_fused_form_only_where_it_is_exact():
    def mode_after(mult, bound, arithmetic="float64", yzp=U8(0)):
        rq = ig.Requant("t", (mult, yzp, U8, arithmetic), 4, 4, weights_on_rows=True)
        rq.fuse(bound)
        return rq.mode

    assert mode_after(np.float32(1e-3), 2**29 - 1) == 3
    assert mode_after(np.float32(1e-3), 2**29) == 1  # fl(acc * m) may need 54 bits
    assert mode_after(np.float64(0.1), 1000) == 1  # a 53-bit significand: acc * m is not exact
    assert mode_after(np.float64(np.float32(0.1)), 1000) == 3  # float64 holding a float32 value
    assert mode_after(np.float32(8.0), 2**29 - 1) == 1  # acc * m could leave int32 before the clip
    assert mode_after(np.float32(4.0), 2**29 - 1) == 3
    assert mode_after(np.float32(4.0), 2**29 - 1, yzp=U8(255)) == 1  # ... with the zero point added
    assert mode_after(np.float32(1e-3), 100, "float32") == 2
    assert mode_after(np.array([1e-3, 8.0, 0.5, 3.0], np.float32), 2**28) == 1  # the largest multiplier counts
    assert mode_after(np.array([1e-3, 7.0, 0.5, 3.0], np.float32), 2**28) == 3


if ig.HAVE_NUMBA:
    from numba import njit

    @njit(cache=False)
    def _store_row_modes(acc, rt, m_row, mult, mult_cs, mode, yzp, qmin, qmax, out8):
        ig._store_row_plus(acc, rt, acc.size, 0, m_row, mult, 0, mult_cs, mode, yzp, qmin, qmax,
                           np.empty(1, np.int32), out8)


@pytest.mark.skipif(not ig.HAVE_NUMBA, reason="numba kernels")
@pytest.mark.parametrize("ydt,yzp", [(U8, 0), (U8, 255), (U8, 131), (I8, -128), (I8, 127), (I8, -3)])
def test_fused_float64_form_equals_two_roundings(ydt, yzp):
    # mode 3 (one fma, integer clip) against mode 1 and the test's own NumPy two-step oracle, for |acc| up to
    # 2**29 - 1: random multipliers, powers of two (every .5 tie), and the bound's edges
    rng = np.random.default_rng(yzp + 1000)
    qmin, qmax = (0, 255) if ydt == U8 else (-128, 127)
    lim = 2**29 - 1
    acc = np.concatenate([rng.integers(-lim, lim + 1, 3000), rng.integers(-2**12, 2**12, 3000),
                          [lim, -lim, lim - 1, -lim + 1, 0, 1, -1]]).astype(np.int32)
    mults = [np.float32(2.0**-k) for k in (1, 2, 3, 10, 21, 22)] + list(
        (rng.random(6) * 10.0 ** rng.integers(-9, -2, 6)).astype(np.float32))
    for m in mults:
        if lim * float(m) + abs(yzp) >= 2**31 - 2:
            continue
        rt = np.int32(rng.integers(-100, 100))
        want = requant_oracle((acc.astype(np.int64) + rt).astype(np.int32).reshape(1, -1), m, yzp, ydt, "float64")
        per_col = np.full(acc.size, m, np.float64)
        for mult_cs, mult in ((0, per_col[:1]), (1, per_col)):
            got = {}
            for mode in (1, 3):
                out = np.empty(acc.size, np.uint8)
                _store_row_modes(acc, rt, np.float64(m), mult, mult_cs, mode, yzp, qmin, qmax, out)
                got[mode] = out.view(ydt)
            np.testing.assert_array_equal(got[3], got[1])
            np.testing.assert_array_equal(got[3], want.reshape(-1))


if ig.HAVE_NUMBA:
    from numba import njit

    @njit
    def pack_row_panels(a, xor, a32, xorword, words, rowsum_bytes, need_sum):
        """Every row panel (MR = 8, groups of 4 bytes) of the GEMM's activation packers, byte or word form."""
        npan, ks = -(-a.shape[0] // 8), -(-a.shape[1] // 4)
        packed = np.empty(npan * ks * 8, np.int32)
        rowsum = np.empty(npan * 8, np.int32)
        for pan in range(npan):
            if words:
                ig._pack_row_panel_words(packed, rowsum, pan, a32, xorword, 8, need_sum, rowsum_bytes)
            else:
                ig._pack_row_panel(packed, rowsum, pan, a, xor, 4, 8, need_sum)
        return packed, rowsum


@pytest.mark.skipif(not ig.HAVE_NUMBA, reason="numba kernels only")
@pytest.mark.parametrize("m", [1, 7, 8, 17])
@pytest.mark.parametrize("k", [4, 12, 64])
@pytest.mark.parametrize("xor", [0, 0x80])
@pytest.mark.parametrize("need_sum", [False, True])
def test_word_packer_matches_byte_packer(m, k, xor, need_sum):
    # the activation packer for groups of 4 bytes reads each group as one 32-bit word: same panels and row sums
    a = np.random.default_rng(m * 100 + k).integers(0, 256, (m, k)).astype(np.uint8)
    want_p, want_s = pack_row_panels(a, np.uint8(xor), np.empty((0, 0), np.int32), 0, False, a, need_sum)
    ub = a ^ np.uint8(xor)
    got_p, got_s = pack_row_panels(a, np.uint8(0), a.view(np.int32), np.int32(-0x7F7F7F80 if xor else 0), True, ub,
                                   need_sum)
    np.testing.assert_array_equal(got_p, want_p)
    if need_sum:
        np.testing.assert_array_equal(got_s, want_s)
    # and both against the layout written out here: panel p, K step s, row r holds the 4 bytes a[8p + r, 4s:4s + 4]
    # (^ xor) as a little-endian int32, 0 past the last row; row sums of the flipped bytes
    npan, ks = -(-m // 8), k // 4
    words = np.zeros((npan * 8, ks), np.int64)
    flipped = (a ^ np.uint8(xor)).astype(np.int64)
    words[:m] = sum(flipped[:, j::4] << (8 * j) for j in range(4))
    layout = words.reshape(npan, 8, ks).transpose(0, 2, 1).reshape(-1)
    np.testing.assert_array_equal(got_p, np.where(layout >= 2**31, layout - 2**32, layout).astype(np.int32))
    if need_sum:
        np.testing.assert_array_equal(got_s[:m], flipped.sum(axis=1).astype(np.int32))


@pytest.mark.parametrize("other", other_paths(ig.available_paths()))
def test_other_paths_match_int64(other):
    """AVX2, which the default run otherwise leaves to --full (what CPUs without VNNI run), on a few products and
    both requantizations, against the int64 oracle (see suite.other_paths)."""
    rng = np.random.default_rng(3)
    for (m, k, n), (adt, wdt) in [((5, 7, 3), (U8, I8)), ((37, 129, 45), (I8, U8)), ((13, 1001, 70), (U8, U8)),
                                  ((8, 4, 32), (I8, I8))]:
        a, w = rand(rng, (m, k), adt), rand(rng, (k, n), wdt)
        za, zw = rand(rng, (m,), adt), rand(rng, (n,), wdt)
        bias = rng.integers(-(2**20), 2**20, n).astype(np.int32)
        pw = ig.pack_weights(w, zw)
        np.testing.assert_array_equal(ig.gemm(a, za, pw, bias, path=other), oracle(a, za, w, zw, bias))
        acc = oracle(a, za[0], w, zw)
        mult = (rng.random(n) * 1e-3).astype(np.float32)
        for mode in ("float64", "float32"):
            got = ig.gemm(a, za[0], pw, requant=(mult, U8(7), U8, mode), path=other)
            np.testing.assert_array_equal(got, requant_oracle(acc, mult, 7, U8, mode))


@pytest.mark.skipif("avx2ub" not in PATHS, reason="avx2ub is not this CPU's path: --full runs it (suite.kernel_paths)")
def test_byte_pair_path_matches_int64():
    """avx2ub (vpmaddubsw) on weights whose signed byte pairs have |a| + |b| <= 128, every activation type, per
    row activation zero points, bias and both requantizations; other weights run avx2, exactly as well."""
    rng = np.random.default_rng(8)
    for (m, k, n), (adt, wdt) in [((5, 7, 3), (U8, I8)), ((37, 129, 45), (I8, U8)), ((13, 1001, 70), (U8, U8)),
                                  ((8, 4, 32), (I8, I8)), ((64, 256, 17), (U8, I8))]:
        a = rand(rng, (m, k), adt)
        ws = rng.integers(-64, 65, (k, n))
        w = (ws if wdt == I8 else ws + 128).astype(wdt)
        za, zw = rand(rng, (m,), adt), (rng.integers(-3, 4, n) + (128 if wdt == U8 else 0)).astype(wdt)
        bias = rng.integers(-(2**20), 2**20, n).astype(np.int32)
        pw = ig.pack_weights(w, zw)
        np.testing.assert_array_equal(ig.gemm(a, za, pw, bias, path="avx2ub"), oracle(a, za, w, zw, bias))
        assert pw.fits_byte_pairs()
        acc = oracle(a, za[0], w, zw)
        mult = (rng.random(n) * 1e-3).astype(np.float32)
        for mode in ("float64", "float32"):
            got = ig.gemm(a, za[0], pw, requant=(mult, U8(7), U8, mode), path="avx2ub")
            np.testing.assert_array_equal(got, requant_oracle(acc, mult, 7, U8, mode))
    a = np.full((4, 64), 255, U8)
    w = np.full((64, 16), 127, I8)  # every pair saturates vpmaddubsw: the avx2 kernels take them
    pw = ig.pack_weights(w, I8(0))
    np.testing.assert_array_equal(ig.gemm(a, U8(0), pw, path="avx2ub"), oracle(a, 0, w, 0))
    assert not pw.fits_byte_pairs()


@pytest.mark.parametrize("m,k,n", [(1, 384, 384), (37, 129, 45), (200, 64, 300)])
def test_one_thread_or_all_is_measured_per_shape(monkeypatch, m, k, n):
    """Without _FORCE_SERIAL, each shape (and thread count) runs its first calls on one thread and the next on
    all (threads.SerialOrParallel), then the faster way; every call gives the oracle's bits, and another
    weight of the same shape (an activation B, packed anew per call) takes the same choice. One kernel (the
    AMX tiles, where the CPU has them, keep a choice of their own: test_amx_or_vnni_is_measured_per_shape)."""
    monkeypatch.setattr(ig, "_FORCE_SERIAL", None)
    monkeypatch.setattr(ig, "_AMX", False)
    monkeypatch.setattr(ig, "THREAD_CHOICES", {})
    monkeypatch.setattr(ig.threads, "launch_cost", lambda: float("inf"))  # no shortcut past the trials
    rng = np.random.default_rng(m + k + n)
    a, w = rand(rng, (m, k), U8), rand(rng, (k, n), I8)
    za, zw = U8(7), np.zeros(n, I8)
    pw = ig.pack_weights(w, zw)
    want = oracle(a, za, w, zw)
    workers = ig.threads.get_num_threads()
    trials = 2 * (ig.threads.SerialOrParallel.SKIPPED + ig.threads.SerialOrParallel.TRIALS)
    for _ in range(trials + 3):
        np.testing.assert_array_equal(ig.gemm(a, za, pw), want)
    if workers > 1:
        (key, choice), = ig.THREAD_CHOICES.items()
        assert key[1:] == (m, k, n, workers)
        assert choice.serial is not None  # decided after the trials, by the times measured
        assert len(choice.serial_times) == len(choice.parallel_times) == trials // 2
        w2 = rand(rng, (k, n), I8)  # another weight of the shape: the same choice, no new trials
        np.testing.assert_array_equal(ig.gemm(a, za, ig.pack_weights(w2, zw)), oracle(a, za, w2, zw))
        assert len(ig.THREAD_CHOICES) == 1 and len(choice.serial_times) == trials // 2
        a2 = rand(rng, (m + 1, k), U8)  # another row count: a choice of its own
        np.testing.assert_array_equal(ig.gemm(a2, za, pw), oracle(a2, za, w, zw))
        assert len(ig.THREAD_CHOICES) == 2


needs_amx = pytest.mark.skipif(not ig.amx_available(),
                               reason="no AMX int8 tiles on this CPU (or Linux refused the tile state)")


@needs_amx
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("m, k, n", [(1, 4, 1), (32, 64, 32), (33, 65, 33), (7, 100, 50), (5, 3, 70),
                                     (100, 300, 200), (70, 1030, 40), (200, 68, 400)])
def test_amx_tiles_match_int64(monkeypatch, workers, m, k, n):
    """The AMX path (kernels._amx, forced): row and column tails past whole 32 x 32 blocks, K past whole
    64-byte tiles, int8 and uint8 on both sides, per-tensor and per-row activation zero points, per-column
    weight zero points, bias, the int32 sums and both requantizations, 1-3 workers (blocks chosen for that
    many; more workers than threads run in turn). Repeated, since a missed wait for a copied row group would
    show only in some runs."""
    monkeypatch.setattr(ig, "_AMX", True)
    monkeypatch.setattr(ig.threads, "get_num_threads", lambda: workers)
    rng = np.random.default_rng(m * 7 + k * 3 + n + workers)
    for adt in (U8, I8):
        for wdt in (I8, U8):
            a, w = rand(rng, (m, k), adt), rand(rng, (k, n), wdt)
            za = rand(rng, (m,), adt) if adt == I8 else adt(rng.integers(*lim(adt)))
            zw = rand(rng, (n,), wdt)
            bias = rng.integers(-2**20, 2**20, n).astype(np.int32)
            pw = ig.pack_weights(w, zw)
            expected = oracle(a, za, w, zw, bias)
            for _ in range(2):
                np.testing.assert_array_equal(ig.gemm(a, za, pw, bias), expected, err_msg=f"{adt} {wdt}")
            mult = (rng.random((n,)) * 2e-3).astype(np.float32)
            for mode in ("float64", "float32"):
                got = ig.gemm(a, za, pw, bias, (mult, U8(3), U8, mode))
                np.testing.assert_array_equal(got, requant_oracle(expected, mult, 3, U8, mode), err_msg=mode)


@needs_amx
def test_amx_or_vnni_is_measured_per_shape_and_gives_the_same_bits(monkeypatch):
    """Unforced, the first calls of a shape alternate between the VNNI and the AMX kernels (threads.FasterOf)
    and the faster serves the rest; every call has the oracle's bits."""
    monkeypatch.setattr(ig, "_AMX", None)
    monkeypatch.setattr(ig, "AMX_CHOICES", {})
    rng = np.random.default_rng(11)
    a, w = rand(rng, (96, 200), U8), rand(rng, (200, 72), I8)
    pw = ig.pack_weights(w, I8(0))
    expected = oracle(a, 5, w, 0)
    for _ in range(2 * (ig.threads.FasterOf.SKIPPED + ig.threads.FasterOf.TRIALS) + 3):
        np.testing.assert_array_equal(ig.gemm(a, U8(5), pw, path="avx512vnni"), expected)
    (choice,) = ig.AMX_CHOICES.values()
    assert choice.choice in (0, 1) and all(len(t) >= ig.threads.FasterOf.TRIALS for t in choice.times)


@needs_amx
def test_amx_under_the_workqueue_layer():
    """numba's workqueue layer runs a region's workers on its own threads: each loads the tile configuration
    before its first tile instruction, and concurrent calls are serialised (threads.call_parallel)."""
    from processes import under_workqueue

    printed = under_workqueue(
        """
        import numpy as np, numba
        from concurrent.futures import ThreadPoolExecutor
        from qlinear.kernels import integer_gemm as ig
        ig._AMX = True
        rng = np.random.default_rng(0)
        a = rng.integers(0, 256, (70, 200)).astype(np.uint8)
        w = rng.integers(-128, 128, (200, 90)).astype(np.int8)
        want = (a.astype(np.int64) - 3) @ w.astype(np.int64)
        pw = ig.pack_weights(w, np.int8(0))
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: ig.gemm(a, np.uint8(3), pw), range(8)))
        assert all(np.array_equal(o, want) for o in outs)
        print("ok", numba.config.THREADING_LAYER)
        """
    )
    assert printed == "ok workqueue"


def test_qlinear_amx_environment_variable():
    """QLINEAR_AMX=0 keeps the products off the AMX tiles; a value other than 0 or 1 is refused by name."""
    import os

    code = "from qlinear.kernels import integer_gemm as ig; print(ig.amx_available())"
    env = dict(os.environ, QLINEAR_AMX="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    env["QLINEAR_AMX"] = "yes"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "QLINEAR_AMX must be 0 or 1, got 'yes'" in out.stderr
