"""The batch-norm fold check's yardstick (`pipeline._ulp_yardstick`): how far one ulp of noise on every weight moves
a model's outputs. A fold rounds each folded weight once more and reassociates; a deep network amplifies that
(the PP-OCR recogniser's outputs moved by 2.9e-4 on 100 held-out lines after folding, and by 9.2e-5 with one ulp
of noise on its weights), so a fold beyond the fixed tolerance is accepted within `FOLD_ULPS` yardsticks."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qlinear.io import pipeline  # noqa: E402


def _matmul_model(w: np.ndarray, extra_nodes=(), extra_inits=()) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), *extra_nodes]
    out = nodes[-1].output[0]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w.shape[0]])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), *extra_inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_one_ulp_on_the_weights_moves_a_product_by_float_rounding_only():
    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (64, 32)).astype(np.float32)
    x = rng.normal(0, 1, (8, 64)).astype(np.float32)
    moved = pipeline._ulp_yardstick(_matmul_model(w), {"x": x})
    # each product moves by at most one ulp of the weight: |x| |w| 2^-23 summed over the 64 terms, plus the
    # float32 sums' own rounding
    bound = float(np.max(np.abs(x) @ np.abs(w))) * 2.0 ** -22
    assert 0 < moved <= bound


def test_the_largest_float_and_zeros_stay_finite():
    """A weight at the float32 maximum is never moved to infinity (the product would then be infinite) and zeros
    are not moved to denormals."""
    w = np.zeros((4, 4), np.float32)
    w[0, :] = np.finfo(np.float32).max
    x = np.zeros((2, 4), np.float32)
    x[:, 0] = 0.5
    moved = pipeline._ulp_yardstick(_matmul_model(w), {"x": x})
    assert np.isfinite(moved) and moved <= 0.5 * float(np.spacing(np.finfo(np.float32).max))
    x[:, 0] = 0.0
    x[:, 1] = 1.0  # reads only zeros
    assert pipeline._ulp_yardstick(_matmul_model(w), {"x": x}) == 0.0


def test_an_amplifying_model_has_a_larger_yardstick():
    rng = np.random.default_rng(2)
    w = rng.normal(0, 1, (16, 16)).astype(np.float32)
    x = {"x": rng.normal(0, 1, (4, 16)).astype(np.float32)}
    plain = pipeline._ulp_yardstick(_matmul_model(w), x)
    gain = helper.make_node("Mul", ["m", "gain"], ["y"], name="gain")
    loud = pipeline._ulp_yardstick(_matmul_model(w, [gain], [numpy_helper.from_array(np.float32(1e4), "gain")]), x)
    assert loud > 1e3 * plain  # (the louder outputs' own rounding adds to the 1e4-fold)
