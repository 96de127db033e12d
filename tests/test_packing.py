"""qlinear.pack / unpack against onnx's own serialisation of 2/4/6-bit tensors (numpy_helper.from_array
writes the packed raw_data; to_array reads it back)."""

import ml_dtypes
import numpy as np
import pytest

import qlinear

numpy_helper = pytest.importorskip("onnx.numpy_helper")

PACKED = ["int2", "uint2", "int4", "uint4", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"]


def every_code(dtype, count, rng):
    """Random elements covering every encoding of the type."""
    bits = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4}.get(dtype.name, 4 if "float4" in dtype.name else 6)
    codes = rng.integers(0, 1 << bits, size=count, dtype=np.uint8)
    codes[: 1 << bits] = np.arange(1 << bits, dtype=np.uint8)[: count]
    return codes.view(dtype)


@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("shape", [(0,), (1,), (3,), (4,), (5,), (2, 3), (7, 5), (2, 3, 4, 5)])
def test_pack_matches_onnx_raw_data(name, shape):
    dtype = np.dtype(getattr(ml_dtypes, name))
    rng = np.random.default_rng(abs(hash((name, shape))) % 2**32)
    count = int(np.prod(shape))
    array = every_code(dtype, max(count, 1), rng)[:count].reshape(shape)
    expected = numpy_helper.from_array(array).raw_data
    packed = qlinear.pack(array)
    assert packed.dtype == np.uint8
    assert packed.tobytes() == expected
    back = qlinear.unpack(packed, dtype, shape)
    assert back.dtype == dtype and back.shape == shape
    np.testing.assert_array_equal(back.view(np.uint8), array.view(np.uint8))


@pytest.mark.parametrize("name", PACKED)
def test_unpack_reads_what_onnx_writes(name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    array = every_code(dtype, 64, np.random.default_rng(7)).reshape(8, 8)
    tensor = numpy_helper.from_array(array)
    data = np.frombuffer(tensor.raw_data, dtype=np.uint8)
    np.testing.assert_array_equal(
        qlinear.unpack(data, name, (8, 8)).view(np.uint8), numpy_helper.to_array(tensor).view(np.uint8)
    )


def test_dtype_spellings():
    data = np.array([0x21], np.uint8)
    for spelling in ("int4", "INT4", 22, ml_dtypes.int4, np.dtype(ml_dtypes.int4)):
        np.testing.assert_array_equal(qlinear.unpack(data, spelling, (2,)).astype(int), [1, 2])
