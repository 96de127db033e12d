"""When does onnxruntime turn a weight DequantizeLinear -> MatMul into its com.microsoft MatMulNBits kernel?

Builds one-MatMul models with onnx.helper: ``Y = X @ DequantizeLinear(W, scale[, zero_point])``, X float [M, K],
W a constant initializer [K, N] of the given type, blocked along K (``axis=0, block_size=B``: scale [ceil(K/B), N]),
per channel (``axis=1``: scale [N]), per tensor (scalar scale) or blocked along N (``axis=1, block_size``); each
saved, loaded by an onnxruntime CPU session at a given graph optimization level with
``SessionOptions.optimized_model_filepath``, and the optimized graph's op types read back. Also checks that the
optimized session computes what the unoptimized one does (max |difference| relative to max |Y|).

    uv run python benchmarks/matmulnbits_fusion.py            # the table, as Markdown
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

K, N, M = 384, 384, 8


def build(*, dtype: str = "int4", axis: int = 0, block: int | None = 32, zero_point: str = "none",
          opset: int = 21, k: int = K, n: int = N, scale_type: str = "float", shared: bool = False,
          granularity: str = "block"):
    """The model (onnx.ModelProto). ``zero_point``: "none" (input absent), "zero" (explicit zeros), "random".
    ``granularity``: "block" (``axis``, ``block``), "channel" (axis=1, scale [N]), "tensor" (scalar scale).
    ``shared``: the DequantizeLinear output feeds two MatMuls."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    types = {"int4": (TensorProto.INT4, -8, 7), "uint4": (TensorProto.UINT4, 0, 15),
             "int8": (TensorProto.INT8, -128, 127), "uint8": (TensorProto.UINT8, 0, 255),
             "int2": (TensorProto.INT2, -2, 1), "uint2": (TensorProto.UINT2, 0, 3)}
    elem, low, high = types[dtype]
    weight = rng.integers(low, high + 1, size=(k, n))
    if granularity == "tensor":
        scale_shape, attrs = [], {}
    elif granularity == "channel":
        scale_shape, attrs = [n], {"axis": 1}
    else:
        length = k if axis == 0 else n
        blocks = -(-length // block)
        scale_shape = [blocks, n] if axis == 0 else [k, blocks]
        attrs = {"axis": axis, "block_size": block}
    scale = (rng.random(scale_shape) * 0.01 + 0.001).astype(np.float32)
    scale_elem = TensorProto.FLOAT if scale_type == "float" else TensorProto.FLOAT16
    initializers = [
        helper.make_tensor("W", elem, [k, n], weight.ravel().tolist()),
        helper.make_tensor("scale", scale_elem, scale_shape, scale.ravel().tolist()),
    ]
    dq_inputs = ["W", "scale"]
    if zero_point != "none":
        zp = (np.zeros(scale_shape, np.int64) if zero_point == "zero" else
              rng.integers(low, high + 1, size=scale_shape))
        initializers.append(helper.make_tensor("zero_point", elem, scale_shape, np.ravel(zp).tolist()))
        dq_inputs.append("zero_point")
    x_elem = scale_elem
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["W_dq"], **attrs),
             helper.make_node("MatMul", ["X", "W_dq"], ["Y"])]
    outputs = [helper.make_tensor_value_info("Y", x_elem, [M, n])]
    if shared:
        nodes.append(helper.make_node("MatMul", ["X", "W_dq"], ["Y2"]))
        outputs.append(helper.make_tensor_value_info("Y2", x_elem, [M, n]))
    graph = helper.make_graph(nodes, "dq_matmul", [helper.make_tensor_value_info("X", x_elem, [M, k])], outputs,
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset <= 21 else 11
    onnx.checker.check_model(model)
    return model


def optimized_ops(model, level: str = "all", config: dict | None = None) -> tuple[dict, float]:
    """(op type -> count in onnxruntime's optimized graph, max |optimized - unoptimized| / max |unoptimized|)."""
    import onnx
    import onnxruntime as ort

    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "layout": ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    with tempfile.TemporaryDirectory() as folder:
        source, written = Path(folder) / "m.onnx", Path(folder) / "opt.onnx"
        onnx.save(model, source)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        options.graph_optimization_level = levels[level]
        options.optimized_model_filepath = str(written)
        for key, value in (config or {}).items():
            options.add_session_config_entry(key, value)
        session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        plain_options = ort.SessionOptions()
        plain_options.log_severity_level = 3
        plain_options.graph_optimization_level = levels["disable"]
        plain = ort.InferenceSession(str(source), plain_options, providers=["CPUExecutionProvider"])
        x_type = np.float32 if model.graph.input[0].type.tensor_type.elem_type == 1 else np.float16
        x = np.random.default_rng(1).standard_normal(
            [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(x_type)
        got, want = session.run(None, {"X": x})[0], plain.run(None, {"X": x})[0]
        error = float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())
        ops: dict[str, int] = {}
        for node in onnx.load(str(written)).graph.node:
            name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            ops[name] = ops.get(name, 0) + 1
    return ops, error


CASES: list[tuple[str, dict, str, dict | None]] = [
    # (what, build arguments, optimization level, session config)
    ("int4, axis 0, block 32, no zero point, opset 21", {}, "all", None),
    ("same, ORT_ENABLE_EXTENDED", {}, "extended", None),
    ("same, ORT_ENABLE_BASIC", {}, "basic", None),
    ("same, session.qdq_matmulnbits_accuracy_level=4", {}, "all", {"session.qdq_matmulnbits_accuracy_level": "4"}),
    ("same, session.qdq_matmulnbits_accuracy_level=1", {}, "all", {"session.qdq_matmulnbits_accuracy_level": "1"}),
    ("same, session.qdq_matmulnbits_accuracy_level=0", {}, "all", {"session.qdq_matmulnbits_accuracy_level": "0"}),
    ("same, session.enable_dq_matmulnbits_fusion=1", {}, "all", {"session.enable_dq_matmulnbits_fusion": "1"}),
    ("int4, zero point of zeros", {"zero_point": "zero"}, "all", None),
    ("int4, random zero point", {"zero_point": "random"}, "all", None),
    ("uint4, no zero point", {"dtype": "uint4"}, "all", None),
    ("uint4, random zero point", {"dtype": "uint4", "zero_point": "random"}, "all", None),
    ("int8, block 32", {"dtype": "int8"}, "all", None),
    ("uint8, block 32, random zero point", {"dtype": "uint8", "zero_point": "random"}, "all", None),
    ("int2, block 32", {"dtype": "int2", "opset": 25}, "all", None),
    ("int4, block 16", {"block": 16}, "all", None),
    ("int4, block 64", {"block": 64}, "all", None),
    ("int4, block 128", {"block": 128}, "all", None),
    ("int4, block 256 (K = 384: last block partial)", {"block": 256}, "all", None),
    ("int4, block 8 (< 16)", {"block": 8}, "all", None),
    ("int4, block 24 (not a power of 2)", {"block": 24}, "all", None),
    ("int4, block 32, K = 100 (last block partial)", {"k": 100}, "all", None),
    ("int4, block 32, N = 100", {"n": 100}, "all", None),
    ("int4, axis 1, block 32 (blocks along N)", {"axis": 1}, "all", None),
    ("int4, per channel (axis 1, scale [N])", {"granularity": "channel"}, "all", None),
    ("int4, per tensor (scalar scale)", {"granularity": "tensor"}, "all", None),
    ("int4, float16 scale and activations", {"scale_type": "float16"}, "all", None),
    ("int4, DequantizeLinear output shared by two MatMuls", {"shared": True}, "all", None),
    ("int4, opset 23", {"opset": 23}, "all", None),
    ("int4, opset 25", {"opset": 25}, "all", None),
]


def main() -> None:
    import onnxruntime as ort

    print(f"onnxruntime {ort.__version__}; X [{M}, K] @ DequantizeLinear(W [K, N]), K = N = {K} unless said\n")
    print("| case | level | optimized graph | rel. error vs unoptimized |")
    print("|---|---|---|---|")
    for what, arguments, level, config in CASES:
        try:
            ops, error = optimized_ops(build(**arguments), level, config)
            shown = ", ".join(f"{op} {count}" for op, count in sorted(ops.items()))
            print(f"| {what} | {level} | {shown} | {error:.1e} |")
        except Exception as exc:  # noqa: BLE001 (a case onnx or onnxruntime refuses: say so)
            print(f"| {what} | {level} | failed: {str(exc).splitlines()[0][:120]} | |")


if __name__ == "__main__":
    main()
