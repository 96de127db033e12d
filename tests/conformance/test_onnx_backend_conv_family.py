"""The official ONNX backend node tests of QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and
DynamicQuantizeLinear (onnx.backend.test.case.node.collect_testcases()), run through qlinear bit-exactly."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from qlinear.ops.dynamic import dynamic_quantize_linear
from qlinear.ops.qlinear_conv import conv_integer, qlinear_conv
from qlinear.ops.qlinear_matmul import matmul_integer, qlinear_matmul

OPS = {
    "QLinearConv": qlinear_conv,
    "QLinearMatMul": qlinear_matmul,
    "ConvInteger": conv_integer,
    "MatMulInteger": matmul_integer,
    "DynamicQuantizeLinear": dynamic_quantize_linear,
}
# How many official cases each operator has in onnx 1.23.2 (the *_expanded DynamicQuantizeLinear models
# compute the same function from primitive ops; their inputs and outputs are the same).
EXPECTED_COUNTS = {"QLinearConv": 1, "QLinearMatMul": 8, "DynamicQuantizeLinear": 6, "ConvInteger": 2, "MatMulInteger": 1}


def _collect():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    selected = []
    for case in cases:
        if case.name.startswith("test_dynamicquantizelinear"):
            selected.append(("DynamicQuantizeLinear", case))
            continue
        ops = {node.op_type for node in case.model.graph.node}
        if len(case.model.graph.node) == 1 and ops <= set(OPS):
            selected.append((ops.pop(), case))
    return selected


CASES = _collect()


def test_every_official_case_is_collected():
    counts = {op: 0 for op in OPS}
    for op, _ in CASES:
        counts[op] += 1
    assert counts == EXPECTED_COUNTS


def _call(op: str, case, inputs: list[np.ndarray]):
    model = case.model
    feeds = dict(zip([i.name for i in model.graph.input], inputs))
    if op == "DynamicQuantizeLinear":
        return list(dynamic_quantize_linear(inputs[0]))
    node = model.graph.node[0]
    args = [feeds[name] if name else None for name in node.input]
    kwargs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
    if op == "QLinearMatMul":
        kwargs["opset"] = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return [OPS[op](*args, **kwargs)]


@pytest.mark.parametrize(("op", "case"), CASES, ids=[case.name for _, case in CASES])
def test_official_case_bit_exact(op, case):
    assert case.data_sets, case.name
    for inputs, expected_outputs in case.data_sets:
        outputs = _call(op, case, inputs)
        assert len(outputs) == len(expected_outputs)
        for got, expected in zip(outputs, expected_outputs):
            expected = np.asarray(expected)
            got = np.asarray(got)
            assert got.dtype == expected.dtype
            assert got.shape == expected.shape or (got.size == expected.size == 1 and got.ndim <= 1 and expected.ndim <= 1)
            np.testing.assert_array_equal(got.reshape(expected.shape), expected, strict=True)
