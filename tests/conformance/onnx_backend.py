"""The official ONNX backend node cases (onnx.backend.test.case.node.collect_testcases()), as
plain Python values: each case's node attributes, opset, inputs and expected outputs."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402


@dataclass
class BackendCase:
    name: str
    op_type: str
    opset: int
    input_names: list[str]
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    attributes: dict

    def __repr__(self):
        return self.name


def _to_array(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


@lru_cache(maxsize=None)
def _all_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect_testcases(None)


def backend_cases(*op_types: str) -> list[BackendCase]:
    """Every single-node official case whose node is one of ``op_types``."""
    found = []
    for case in _all_cases():
        if case.model is None or len(case.model.graph.node) != 1:
            continue
        node = case.model.graph.node[0]
        if node.op_type not in op_types:
            continue
        opset = next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for inputs, outputs in case.data_sets:
            found.append(BackendCase(
                case.name, node.op_type, opset, list(node.input),
                [_to_array(v) for v in inputs], [_to_array(v) for v in outputs], attributes,
            ))
    return found
