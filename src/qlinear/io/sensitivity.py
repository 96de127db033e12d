"""How much each quantized activation alone costs the model's outputs: the float model run with only that tensor
quantized (its calibrated scale and zero point), the outputs' SQNR against the float model's, on a few samples.

A tensor's own SQNR does not say how much the layers after it amplify its error. In the PP-OCR recogniser the
first quantized tensor (the stem's output, read by the first int8 convolution) has the best SQNR of all (39 dB)
and decides the exact match, as the rest of the network amplifies what enters there by 30-35 dB; `--max-drop`,
which keeps layers float one at a time, keeps the most costly ones first by this measure.

One model serves every tensor: each quantized tensor's readers read ``Where(flag, DequantizeLinear(
QuantizeLinear(x)), x)``, with one boolean model input per tensor, so that one onnxruntime session runs each tensor
quantized alone (flag true) or the float model (all false)."""

from __future__ import annotations

import math

import numpy as np

FLAG = "qlinear_sensitivity_flag_"


def switched_model(model, parameters: dict):
    """A copy of ``model`` (a ModelProto) where every tensor of ``parameters`` (name -> (scale, zero point)) is read
    through a QuantizeLinear -> DequantizeLinear pair that its flag input (``FLAG`` + index, a boolean scalar)
    switches on; returns (the model, the flag names by tensor)."""
    from onnx import TensorProto, helper, numpy_helper

    switched = type(model)()
    switched.CopyFrom(model)
    graph = switched.graph
    names = list(parameters)
    rename = {name: f"{name}__{FLAG}selected" for name in names}
    switches: dict[str, list] = {}
    flags = {}
    for i, name in enumerate(names):
        scale, zero_point = parameters[name]
        s, z, q, dq, flag = (f"{name}__{FLAG}{part}" for part in ("scale", "zero", "q", "dq", str(i)))
        graph.initializer.append(numpy_helper.from_array(np.asarray(scale, np.float32), s))
        inputs = [name, s]
        if zero_point is not None:
            graph.initializer.append(numpy_helper.from_array(np.asarray(zero_point), z))
            inputs.append(z)
        switches[name] = [helper.make_node("QuantizeLinear", inputs, [q]),
                          helper.make_node("DequantizeLinear", [q, *inputs[1:]], [dq]),
                          helper.make_node("Where", [flag, dq, name], [rename[name]])]
        graph.input.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
        flags[name] = flag
    nodes = list(graph.node)
    written = {output for node in nodes for output in node.output}
    # the switches of tensors no node writes (model inputs) first, then each right after the node that writes
    # its tensor: the graph stays sorted
    ordered = [switch for name in names if name not in written for switch in switches[name]]
    for node in nodes:
        node.input[:] = [rename.get(name, name) for name in node.input]
        ordered.append(node)
        ordered.extend(switch for output in node.output for switch in switches.get(output, ()))
    del graph.node[:]
    graph.node.extend(ordered)
    return switched, flags


def output_sqnr(model, parameters: dict, feeds_list: list[dict], folder=None) -> dict[str, float]:
    """Tensor name -> the outputs' SQNR in dB (all outputs' squared values and errors summed) with only that
    tensor quantized, over ``feeds_list``; -inf where the outputs lose all signal, inf where nothing changes."""
    import onnxruntime

    switched, flags = switched_model(model, parameters)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    session = onnxruntime.InferenceSession(switched.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    off = {flag: np.array(False) for flag in flags.values()}
    references = [session.run(None, {**feeds, **off}) for feeds in feeds_list]
    signal = sum(float(np.sum(np.square(np.asarray(o, np.float64)))) for outs in references for o in outs
                 if np.issubdtype(np.asarray(o).dtype, np.floating))
    found = {}
    for name, flag in flags.items():
        noise = 0.0
        for feeds, reference in zip(feeds_list, references):
            outs = session.run(None, {**feeds, **off, flag: np.array(True)})
            noise += sum(float(np.sum(np.square(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                         for a, b in zip(outs, reference) if np.issubdtype(np.asarray(a).dtype, np.floating))
        found[name] = math.inf if noise == 0.0 else (-math.inf if signal == 0.0 else 10 * math.log10(signal / noise))
    return found
