"""HQQ's solver in chunks of groups (`hqq.CHUNK`, which keeps a large table's temporaries small) gives the
parameters of every group solved at once: each group is solved on its own."""

from __future__ import annotations

import numpy as np
import pytest

from qlinear import dtypes
from qlinear.rounding import hqq
from qlinear.rounding.codec import Codec


@pytest.mark.parametrize("dtype, symmetric", [("int4", False), ("uint4", False), ("int4", True), ("int2", False)])
def test_chunked_groups_give_the_parameters_of_one_solve(monkeypatch, dtype, symmetric):
    rng = np.random.default_rng(11)
    values = rng.standard_t(3, (203, 32)) * rng.uniform(0.01, 1.0, (203, 1))
    codec = Codec(dtypes.get(dtype), symmetric, np.float32)
    monkeypatch.setattr(hqq, "CHUNK", 10**9)
    whole = hqq.parameters(values, codec)
    monkeypatch.setattr(hqq, "CHUNK", 16)
    chunked = hqq.parameters(values, codec)
    for a, b in zip(whole, chunked):
        assert a.dtype == b.dtype and a.shape == b.shape == (203,)
        np.testing.assert_array_equal(a, b)
