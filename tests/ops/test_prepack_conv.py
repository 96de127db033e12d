"""qlinear.prepack_conv: packed weights reused across calls give the bits of unpacked weights, which equal
the int64 reference; mismatched zero point or group is an error."""

import numpy as np
import pytest

import qlinear
from qlinear.reference.conv import conv_accumulate
from suite import kernel_paths


def test_prepacked_weights_equal_the_reference_on_repeated_calls():
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, size=(8, 2, 3, 3), dtype=np.int8)
    w_zp = rng.integers(-5, 5, size=8).astype(np.int8)
    packed = qlinear.prepack_conv(w, w_zp, group=2)
    for shape in [(1, 4, 9, 9), (2, 4, 6, 11), (1, 4, 9, 9)]:
        x = rng.integers(0, 256, size=shape, dtype=np.uint8)
        expected = conv_accumulate(x, np.uint8(3), w, w_zp, None, group=2, strides=(1, 2), dilations=(1, 1),
                                   pads_begin=(1, 0), pads_end=(1, 2))
        got = qlinear.conv_integer(x, packed, np.uint8(3), w_zp, group=2, strides=[1, 2], pads=[1, 0, 1, 2])
        np.testing.assert_array_equal(got, expected)
        y = qlinear.qlinear_conv(x, np.float32(0.02), np.uint8(3), packed, np.float32(0.01), w_zp,
                                 np.float32(0.5), np.int8(-3), group=2, strides=[1, 2], pads=[1, 0, 1, 2])
        y_plain = qlinear.qlinear_conv(x, np.float32(0.02), np.uint8(3), w, np.float32(0.01), w_zp,
                                       np.float32(0.5), np.int8(-3), group=2, strides=[1, 2], pads=[1, 0, 1, 2])
        np.testing.assert_array_equal(y, y_plain)


def test_prepacked_weights_must_be_used_with_their_zero_point_and_group():
    w = np.ones((4, 2, 3, 3), np.int8)
    packed = qlinear.prepack_conv(w, np.int8(1))
    x = np.zeros((1, 2, 5, 5), np.uint8)
    with pytest.raises(ValueError, match="w_zero_point differs from the one the weights were packed with"):
        qlinear.conv_integer(x, packed, np.uint8(0), np.int8(2))
    with pytest.raises(ValueError, match=r"group=2 but the weights were packed with group=1"):
        qlinear.conv_integer(np.zeros((1, 4, 5, 5), np.uint8), packed, np.uint8(0), np.int8(1), group=2)
    with pytest.raises(ValueError, match=r"prepack_conv: group must be a positive divisor of M=4, got 3"):
        qlinear.prepack_conv(w, np.int8(1), group=3)
    with pytest.raises(TypeError, match=r"prepack_conv: w must"):
        qlinear.prepack_conv(w.astype(np.int16), 0)


def _reference_qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias, pads, strides, group):
    from qlinear.reference.requantize import requantize, requantize_multiplier

    acc = conv_accumulate(x, x_zp, w, w_zp, bias, group=group, strides=tuple(strides), dilations=(1, 1),
                          pads_begin=tuple(pads[:2]), pads_end=tuple(pads[2:]))
    w_scale = np.asarray(w_scale)
    multiplier = requantize_multiplier(x_scale, w_scale.reshape(1, -1, 1, 1) if w_scale.ndim else w_scale, y_scale,
                                       "float64", x.dtype)
    return requantize(acc, multiplier, y_zp, "float64")


def test_a_repeated_call_reuses_its_launch_and_never_a_stale_one():
    """A call on prepacked weights with the arguments of an earlier one runs that call's prepared launch
    (packed.calls): the result is the reference's every time, including after the caller changes a scale, the
    bias or a zero point in place, switches the kernel path, or passes arguments that must still be refused."""
    from qlinear.kernels import integer_gemm

    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, size=(16, 8, 3, 3), dtype=np.int8)
    packed = qlinear.prepack_conv(w, np.int8(0))
    w_scale = np.linspace(0.01, 0.02, 16).astype(np.float32)
    bias = rng.integers(-5000, 5000, size=16).astype(np.int32)
    x_scale, x_zp, y_zp = np.float32(0.02), np.uint8(7), np.int8(-3)

    def call(x, y_scale=np.float32(0.5)):
        return qlinear.qlinear_conv(x, x_scale, x_zp, packed, w_scale, np.int8(0), y_scale, y_zp, bias,
                                    pads=[1, 1, 1, 1], strides=[2, 2])

    def expected(x, y_scale=np.float32(0.5)):
        return _reference_qlinear_conv(x, x_scale, x_zp, w, w_scale, np.int8(0), y_scale, y_zp, bias,
                                       [1, 1, 1, 1], [2, 2], 1)

    for _ in range(3):  # new data each call, one launch
        x = rng.integers(0, 256, size=(1, 8, 12, 12), dtype=np.uint8)
        np.testing.assert_array_equal(call(x), expected(x))
    assert len(packed.calls) == 1
    w_scale[3] *= 2  # in place: a new key, a new launch
    bias[0] += 1000
    np.testing.assert_array_equal(call(x), expected(x))
    np.testing.assert_array_equal(call(x, np.float32(0.25)), expected(x, np.float32(0.25)))
    assert len(packed.calls) == 3
    for path in kernel_paths(integer_gemm.available_paths()):  # each path compiles its kernels cold: suite
        with integer_gemm.force_path(path):
            np.testing.assert_array_equal(call(x), expected(x))
    with pytest.raises(TypeError, match="qlinear_conv: x must have dtype"):
        call(x.astype(np.int16))
    with pytest.raises(ValueError, match="y_scale must be positive and finite"):
        call(x, np.float32(np.nan))
    with pytest.raises(TypeError, match="pads must be a sequence of integers"):
        qlinear.qlinear_conv(x, x_scale, x_zp, packed, w_scale, np.int8(0), np.float32(0.5), y_zp, bias,
                             pads=[1.0, 1, 1, 1], strides=[2, 2])
    acc = qlinear.conv_integer(x, packed, x_zp, np.int8(0), pads=[1, 1, 1, 1], strides=[2, 2])
    np.testing.assert_array_equal(qlinear.conv_integer(x, packed, x_zp, np.int8(0), pads=[1, 1, 1, 1], strides=[2, 2]),
                                  acc)
    np.testing.assert_array_equal(acc, conv_accumulate(x, x_zp, w, np.int8(0), None, group=1, strides=(2, 2),
                                                       dilations=(1, 1), pads_begin=(1, 1), pads_end=(1, 1)))


def test_the_last_call_is_reused_only_for_the_same_objects_with_the_same_contents():
    """Calls that pass the very same argument objects take the last call's launch without building a key
    (`_quant_args.LastCall`); arrays and lists changed in place, a dtype or shape changed on the array itself,
    ints turned into floats and another kernel path still give the reference's result or its error."""
    from qlinear.kernels import integer_gemm

    rng = np.random.default_rng(12)
    w = rng.integers(-128, 128, size=(16, 8, 3, 3), dtype=np.int8)
    packed = qlinear.prepack_conv(w, np.int8(0))
    w_scale = np.linspace(0.01, 0.02, 16).astype(np.float32)
    bias = rng.integers(-5000, 5000, size=16).astype(np.int32)
    x_scale, x_zp, w_zp, y_scale, y_zp = np.float32(0.02), np.uint8(7), np.int8(0), np.float32(0.5), np.int8(-3)
    pads, strides = [1, 1, 1, 1], [2, 2]
    x = rng.integers(0, 256, size=(1, 8, 12, 12), dtype=np.uint8)

    def call():
        return qlinear.qlinear_conv(x, x_scale, x_zp, packed, w_scale, w_zp, y_scale, y_zp, bias, pads=pads,
                                    strides=strides)

    def expected():
        return _reference_qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias, list(pads),
                                       list(strides), 1)

    for _ in range(3):
        np.testing.assert_array_equal(call(), expected())
    assert packed.last_call is not None and packed.last_call.value is next(iter(packed.calls.values()))
    w_scale[5] *= 3
    np.testing.assert_array_equal(call(), expected())
    bias[2] -= 777
    np.testing.assert_array_equal(call(), expected())
    pads[0] = 0
    np.testing.assert_array_equal(call(), expected())
    x = rng.integers(0, 256, size=(1, 8, 13, 11), dtype=np.uint8)  # another input shape
    np.testing.assert_array_equal(call(), expected())
    for path in kernel_paths(integer_gemm.available_paths()):  # each path compiles its kernels cold: suite
        with integer_gemm.force_path(path):
            np.testing.assert_array_equal(call(), expected())
    pads[1] = 1.0
    with pytest.raises(TypeError, match="pads must be a sequence of integers"):
        call()
    pads[1] = 1
    np.testing.assert_array_equal(call(), expected())
    bias.shape = (16, 1)
    with pytest.raises(ValueError, match="B must be a 1-D tensor"):
        call()
    bias.shape = (16,)
    w_scale.dtype = np.int32
    with pytest.raises(TypeError, match="w_scale"):
        call()
    w_scale.dtype = np.float32
    np.testing.assert_array_equal(call(), expected())


def test_the_last_call_is_reused_for_new_lists_with_the_same_ints(monkeypatch):
    """A caller that writes ``pads=[1, 1, 1, 1]`` in each call passes a new list each time: the last call's launch
    still serves it, without building a key; a new list with other ints, or with a float, does not."""
    from qlinear.ops import _quant_args

    rng = np.random.default_rng(13)
    w = rng.integers(-128, 128, size=(8, 4, 3, 3), dtype=np.int8)
    packed = qlinear.prepack_conv(w, np.int8(0))
    w_scale, bias = np.float32(0.01), rng.integers(-500, 500, size=8).astype(np.int32)
    x_scale, x_zp, y_scale, y_zp = np.float32(0.02), np.uint8(7), np.float32(0.5), np.uint8(3)
    x = rng.integers(0, 256, size=(1, 4, 9, 9), dtype=np.uint8)

    def call(pads):
        return qlinear.qlinear_conv(x, x_scale, x_zp, packed, w_scale, np.int8(0), y_scale, y_zp, bias, pads=pads,
                                    strides=[1, 1])

    def expected(pads):
        return _reference_qlinear_conv(x, x_scale, x_zp, w, w_scale, np.int8(0), y_scale, y_zp, bias, pads, [1, 1], 1)

    for _ in range(2):  # the first call prepares the launch, the second keeps it as the last call
        np.testing.assert_array_equal(call([1, 1, 1, 1]), expected([1, 1, 1, 1]))
    keys = []
    original = _quant_args.call_key
    monkeypatch.setattr(_quant_args, "call_key", lambda *a: keys.append(a) or original(*a))
    for _ in range(3):
        np.testing.assert_array_equal(call([1, 1, 1, 1]), expected([1, 1, 1, 1]))
    assert keys == []
    np.testing.assert_array_equal(call([0, 1, 0, 1]), expected([0, 1, 0, 1]))
    assert len(keys) == 1
    with pytest.raises(TypeError, match="pads must be a sequence of integers"):
        call([1, 1.0, 1, 1])


def _against_a_guard_page(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose last byte is the last one before a page that may not be read: a kernel that reads
    past the array's end takes a segmentation fault instead of passing by luck."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    pages = -(-a.nbytes // page) + 1
    mapping = mmap.mmap(-1, pages * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    whole = np.frombuffer(mapping, np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    guard = ctypes.c_void_p(whole.ctypes.data + (pages - 1) * page)
    if libc.mprotect(guard, ctypes.c_size_t(page), 0) != 0:  # PROT_NONE
        pytest.skip(f"mprotect failed (errno {ctypes.get_errno()})")
    end = (pages - 1) * page
    out = whole[end - a.nbytes:end].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.skipif(not hasattr(__import__("mmap"), "PROT_READ"), reason="needs POSIX mmap and mprotect")
@pytest.mark.parametrize("kernel, strides, width", [(1, 2, 56), (1, 2, 13), (1, 2, 7), (1, 3, 20), (3, 2, 15),
                                                    (1, 1, 14)])
def test_an_unpadded_input_is_read_in_place_and_never_past_its_end(kernel, strides, width):
    """Without padding (uint8, contiguous), the packers read the caller's array itself (ConvLaunch._padded):
    their vector runs stop at its end. The input ends where a page that may not be read begins; the result is
    the reference's on every thread count the machine has."""
    rng = np.random.default_rng(kernel * 100 + strides * 10 + width)
    w = rng.integers(-64, 64, size=(40, 24, kernel, kernel), dtype=np.int8)
    packed = qlinear.prepack_conv(w, np.int8(0))
    x = _against_a_guard_page(rng.integers(0, 256, size=(1, 24, width + 3, width), dtype=np.uint8))
    expected = conv_accumulate(x, np.uint8(7), w, np.int8(0), None, group=1, strides=(strides, strides),
                               dilations=(1, 1), pads_begin=(0, 0), pads_end=(0, 0))
    before = qlinear.get_num_threads()
    try:
        for n_threads in sorted({1, min(2, before)}):
            qlinear.set_num_threads(n_threads)
            got = qlinear.conv_integer(x, packed, np.uint8(7), np.int8(0), strides=[strides, strides])
            np.testing.assert_array_equal(got, expected)
    finally:
        qlinear.set_num_threads(before)
