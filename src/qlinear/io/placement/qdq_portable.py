"""``--target qdq-portable``: a pair around every operator that a QDQ runtime may fuse with a convolution or
matrix product, as onnxruntime's own QDQ quantizer places them, for runtimes that find their own fusions
(TensorRT, OpenVINO) and want the quantization points everywhere.

Selected: the float activations that feed Conv, ConvTranspose, MatMul and Gemm (their data inputs, not their
weights) and the inputs and outputs of those operators and of the ones runtimes fuse around them (Add, Mul,
Concat, pooling, Resize, Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish). Kept float: the model's inputs
as given (their QuantizeLinear is inside the model), its outputs, constants, non-float tensors, what
``keep_float`` names, and a product read by a Relu or Clip alone (the pair goes after the activation, which
runtimes fold into the product's QuantizeLinear).
"""

from __future__ import annotations

from .graph import FLOAT, GraphView, kept_reasons, node_key, node_label
from .pairs import Activation, Placement, Skipped

INT8_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
AROUND_OPS = frozenset({"Add", "Mul", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool", "Resize", "Relu",
                        "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish"})
# Which inputs of each operator are activations to quantize (None: every float input that is not constant).
DATA_INPUTS = {"Conv": (0,), "ConvTranspose": (0,), "MatMul": (0, 1), "Gemm": (0, 1), "Resize": (0,), "Clip": (0,),
               "MaxPool": (0,), "AveragePool": (0,), "GlobalAveragePool": (0,), "Relu": (0,), "LeakyRelu": (0,),
               "Sigmoid": (0,), "HardSigmoid": (0,), "HardSwish": (0,)}
# Activations that runtimes fold into the int8 Conv/MatMul/Gemm before them when the QuantizeLinear after them
# starts at zero (onnxruntime's Relu/Clip-Q fusion).
FOLDED_AFTER = frozenset({"Relu", "Clip"})


def _fused_chains(view: GraphView) -> dict[str, str]:
    """The tensors inside a Conv/MatMul/Gemm's fused chain (its product and the values between the folded
    operators after it), each with the label of the chain's first operator."""
    inside: dict[str, str] = {}
    head: dict[str, str] = {}
    for node in view.nodes:
        if node.op_type in INT8_OPS:
            label = node_label(node)
        else:
            feeding = [head[name] for name in node.input if name in head and name in inside]
            if not feeding:
                continue
            label = feeding[0]
        for name in node.output[:1]:
            readers = view.readers.get(name, [])
            if name and len(readers) == 1 and readers[0].op_type in FOLDED_AFTER:
                head[name] = label
                inside[name] = label
    return inside


class Chooser:
    """Collects the chosen activations and the reasons others stay float, in graph order."""

    def __init__(self, view: GraphView, keep_float: tuple[str, ...], inside: dict[str, str]):
        self.view, self.inside = view, inside
        self.kept = kept_reasons(view.model, keep_float)
        self.chosen: dict[str, Activation] = {}
        self.skipped: dict[str, Skipped] = {}

    def consider(self, name: str, node, reading: bool) -> Activation | None:
        view = self.view
        if not name or name in view.constant:
            return None
        if view.types.get(name) != FLOAT:
            if view.types.get(name) in (None, 0):
                self.skipped.setdefault(name, Skipped(name, "its type is unknown (shape inference could not tell)"))
            return None
        if name in self.kept:
            self.skipped.setdefault(name, Skipped(name, self.kept[name]))
            return None
        if name in view.outputs:
            self.skipped.setdefault(name, Skipped(name, "a model output (stays float)"))
            return None
        if name in self.inside:
            self.skipped.setdefault(name, Skipped(name, f"inside the fused chain of {self.inside[name]} "
                                                        f"(read by {view.readers[name][0].op_type} alone)"))
            return None
        producer = view.producers.get(name)
        if producer is None and name not in view.inputs:
            return None  # an outer-scope name of a subgraph: not this graph's
        activation = self.chosen.setdefault(name, Activation(name, "" if producer is None else node_label(producer),
                                                             "" if producer is None else node_key(producer)))
        activation.ops.add(node.op_type)
        if reading:
            activation.readers.append(node_label(node))
        return activation

    def result(self, target: str, **more) -> Placement:
        return Placement(target, list(self.chosen.values()),
                         [s for name, s in self.skipped.items() if name not in self.chosen], **more)


def place(model, keep_float: tuple[str, ...] = (), float_weights=(), arrays=None) -> Placement:
    """The activations of ``model`` (a ModelProto) to quantize, in graph order, and those left float with the
    reason. A node that ``keep_float`` names computes in float: no tensor it reads or writes is quantized, for
    it or for its neighbours. (``float_weights`` and ``arrays``, which the onnxruntime target reads, change
    nothing here: a pair goes around every operator a runtime may fuse.)"""
    view = GraphView(model)
    chooser = Chooser(view, keep_float, _fused_chains(view))
    for node in view.nodes:
        if node.domain not in ("", "ai.onnx") or node.op_type not in INT8_OPS | AROUND_OPS:
            continue
        positions = DATA_INPUTS.get(node.op_type)
        for position, name in enumerate(node.input):
            if positions is None or position in positions:
                chooser.consider(name, node, True)
        for name in node.output[:1]:
            chooser.consider(name, node, False)
    return chooser.result("qdq-portable")
