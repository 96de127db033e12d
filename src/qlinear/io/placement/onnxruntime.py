"""``--target onnxruntime``: the pairs where onnxruntime's CPU provider turns them into its int8 kernels, and
nowhere else.

onnxruntime (1.32, `qdq_selector_action_transformer.cc`) replaces ``DequantizeLinear -> op -> QuantizeLinear``
by an int8 kernel only for some operators, and only when every data input comes from a DequantizeLinear and the
output goes to one QuantizeLinear (``../shared/notes/ort-qdq-fusion.md``). Around any other operator a pair is
a conversion to float and back, so a pair per operator makes a model slower than the float one. This target:

1. runs in int8 the convolutions and matrix products (QLinearConv, QLinearMatMul, QGemm) and, where their
   neighbours are int8 too, the operators with int8 kernels: Add and Mul (QLinearAdd, QLinearMul; a constant
   operand is quantized per tensor so that it comes from a DequantizeLinear too), Concat, GlobalAveragePool,
   AveragePool, Sigmoid, LeakyRelu, Softmax, and the operators that only move values (MaxPool, Reshape,
   Transpose, Squeeze, Unsqueeze, Flatten, Resize, Slice), whose pairs share one scale and zero point so that
   onnxruntime runs them on the codes;
2. leaves every other operator float, with one DequantizeLinear where a float island starts and one
   QuantizeLinear where it ends (not a pair per node): an operator with an int8 kernel stays float too when
   running it in int8 would need more conversions than running it in float, or as many but some (counting the
   QuantizeLinear and DequantizeLinear nodes it alone needs): a pair inside a chain that onnxruntime fuses in
   float (LayerNormalization) would break the chain;
   an Add or Mul with a constant operand runs in int8 only on a value an int8 operator writes;
3. folds a Relu or a Clip from 0 read alone from an int8 operator into that operator's QuantizeLinear
   (onnxruntime's Relu/Clip-Q fusion), and a Mul or Div by a positive scalar constant read from a pair into
   the pair's DequantizeLinear scale (Paddle's hard swish ``x * Clip(x + 3, 0, 6) / 6`` becomes QLinearAdd and
   QLinearMul).

4. keeps float a convolution that reads a model input of at most `FEW_CHANNELS` channels (an image's first
   layer, `float_first_layers`): onnxruntime's float convolution reads such an input directly in its NCHWc
   kernel, while its int8 one first needs the input quantized and transposed to NHWC and then multiplies
   through an im2col of 27 columns. The convolution's weights stay float (a DequantizeLinear in front of a
   float Conv would run on every call), and its output is quantized for the int8 layers after it
   (benchmarks/placement_rules.py, AMD EPYC without VNNI: classifier 1.05x -> 1.03x float on 1 thread, 1.22x
   -> 1.15x on 2; detector 0.64x -> 0.62x and 0.70x -> 0.69x; recogniser 0.52x either way).
5. keeps float, for accuracy, a depthwise convolution that reads such an input convolution's output through
   operators that compute no product (a batch norm, an activation, a constant scale; `graph.image_stem`), as
   MobileNet-like stems have it. Quantization noise that enters there, at the first layers' full resolution,
   is amplified by every layer after it, and a depthwise filter mixes no channels that would average it out:
   in the PP-OCR recogniser's int8 model the activation SQNR falls from 33 dB at the input of its first one (16
   channels, 3x3) to 24 dB at its output. With it in int8 the recogniser's exact match swung with the calibration
   set (8 sets of 64-200 lines: 85.3-98.0% on the corpus lines, float 93.3%; 72.7-86.3% on held-out lines,
   float 81.3%); float, 97.3-98.7% and 83.0-87.3%, at the same latency (BENCHMARKS.md). Its output is
   quantized for the int8 layers after it.

The rewrites that make more of a graph fusable before it is calibrated (HardSigmoid after a Conv folded into
its weights as a Clip) are in `onnx_folding`; this module only places the pairs.
"""

from __future__ import annotations

import numpy as np

from ..formats.onnx_constants import stored_constants
from .graph import GraphView, image_stem, kept_nodes, kept_reasons, node_key, node_label
from .pairs import Activation, Operand, Placement, ScaleFold, Skipped

ANCHORS = frozenset({"Conv", "MatMul", "Gemm"})
FEW_CHANNELS = 4  # a model input's channels up to which its convolution stays float (rule 4: images, spectrograms)
DEPTHWISE_AFTER_INPUT = True  # rule 5 (benchmarks/placement_rules.py switches it off to measure it)
BINARY = frozenset({"Add", "Mul"})  # QLinearAdd, QLinearMul
KERNELS = frozenset({"Concat", "GlobalAveragePool", "AveragePool", "Sigmoid", "LeakyRelu", "Softmax"})
MOVES = frozenset({"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Resize", "Slice"})
FOLDED = frozenset({"Relu", "Clip"})  # into the QuantizeLinear after an int8 operator
SCALES = frozenset({"Mul", "Div"})  # by a positive scalar constant: into the DequantizeLinear before
# Which inputs are activations (None: every input that is not constant); the rest are weights or parameters.
DATA_INPUTS = {"Conv": (0,), "Gemm": (0, 1), "MatMul": (0, 1), "Resize": (0,), "Reshape": (0,), "Slice": (0,),
               "Squeeze": (0,), "Unsqueeze": (0,), "Clip": (0,)}


def _scalar(view: GraphView, arrays, name: str) -> float | None:
    value = arrays(name) if name in view.constant else None
    if value is None or np.asarray(value).size != 1:
        return None
    return float(np.asarray(value, np.float64).reshape(-1)[0])


class _Graph:
    """The decisions of one placement: which nodes run in int8, and what that makes of each tensor."""

    def __init__(self, view: GraphView, keep_float: tuple[str, ...], float_weights: set[str], arrays):
        self.view, self.given_float, self.arrays = view, float_weights, arrays
        self.folded_ids: set[int] = set()
        self.inside: dict[str, object] = {}
        self.kept = kept_reasons(view.model, keep_float)
        self.kept_nodes = {id(n) for n in kept_nodes(view.model, keep_float)}
        self.kind: dict[int, str] = {}  # id(node) -> anchor, binary, kernel, move, scale, fold
        self.operands: dict[int, list[str]] = {}  # id(binary node) -> its constant operands
        self.factor: dict[int, float] = {}  # id(scale node) -> what its DequantizeLinear's scale is multiplied by
        for node in view.nodes:
            if node.domain in ("", "ai.onnx") and id(node) not in self.kept_nodes:
                kind = self._kind(node)
                if kind:
                    self.kind[id(node)] = kind
        self.int8 = {key for key, kind in self.kind.items() if kind != "fold"}

    # ------------------------------------------------------------------------------------------ kinds

    def data_inputs(self, node) -> list[str]:
        positions = DATA_INPUTS.get(node.op_type)
        return [name for position, name in enumerate(node.input)
                if name and (positions is None or position in positions) and name not in self.view.constant]

    def _kind(self, node) -> str | None:
        view, op = self.view, node.op_type
        if op in ANCHORS:
            if any(n in self.given_float for n in node.input[:2]) or not self.data_inputs(node):
                return None  # a float weight (excluded, or not a weight we quantize): the product stays float
            return "anchor"
        if op in SCALES and len(node.input) == 2 and (op == "Mul" or node.input[1] in view.constant):
            constants = [n for n in node.input if n in view.constant]
            value = _scalar(view, self.arrays, constants[0]) if len(constants) == 1 else None
            if value is not None and value > 0 and np.isfinite(value):
                self.factor[id(node)] = value if op == "Mul" else 1.0 / value
                return "scale"
        if op in BINARY and len(node.input) == 2:
            constants = [n for n in node.input if n in view.constant]
            if len(constants) == 2 or any(view.types.get(n) != 1 for n in constants):
                return None
            self.operands[id(node)] = constants
            return "binary"
        if op in KERNELS:
            return "kernel" if op != "Softmax" or self._softmax_on_last_axis(node) else None
        if op in MOVES:
            return "move"
        if op in FOLDED:
            low = 0.0  # Relu
            if op == "Clip":  # its lower bound: an input from opset 11, an attribute before (none: -inf)
                low_name = node.input[1] if len(node.input) > 1 else ""
                low = (_scalar(view, self.arrays, low_name) if low_name
                       else next((a.f for a in node.attribute if a.name == "min"), float("-inf")))
            return "fold" if low is not None and low <= 0.0 else None
        return None

    def _softmax_on_last_axis(self, node) -> bool:
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        shape = self.view.shapes.get(node.input[0])
        return axis == -1 or (shape is not None and axis == len(shape) - 1)

    # -------------------------------------------------------------------------------------- tensors

    def int8_output(self, node) -> bool:
        return id(node) in self.int8 or id(node) in self.folded_ids

    def can_quantize(self, name: str) -> bool:
        view = self.view
        return view.is_float_activation(name) and name not in view.outputs and name not in self.kept

    def produced_int8(self, name: str) -> bool:
        producer = self.view.producers.get(name)
        return producer is not None and name not in self.inside and self.int8_output(producer)

    def read_int8(self, name: str, besides=None) -> bool:
        return any(id(r) in self.int8 and r is not besides for r in self.view.readers.get(name, []))

    def output_of(self, node) -> str:
        """The tensor an int8 node's QuantizeLinear quantizes: its output, or its folded activation's."""
        name = node.output[0]
        while name in self.inside:
            name = self.inside[name].output[0]
        return name

    # ------------------------------------------------------------------------------------ decisions

    def settle(self) -> None:
        """Starting from every candidate in int8, drop the ones `_drop` refuses (every operator that reads a
        tensor that cannot be quantized; the others that gain nothing or cost conversions), until none is."""
        while True:
            self.folded_ids = set()
            self.inside = {}
            # Folds chain (Conv -> Relu -> Clip): resolve them in graph order.
            for node in self.view.nodes:
                if self.kind.get(id(node)) != "fold":
                    continue
                source = node.input[0]
                producer = self.view.producers.get(source)
                if producer is not None and len(self.view.readers.get(source, [])) == 1 \
                        and source not in self.view.outputs and source not in self.kept \
                        and (id(producer) in self.int8 or id(producer) in self.folded_ids):
                    self.folded_ids.add(id(node))
                    self.inside[source] = node
            dropped = [node for node in self.view.nodes if id(node) in self.int8 and self._drop(node)]
            if not dropped:
                return
            for node in dropped:
                self.int8.discard(id(node))

    def _drop(self, node) -> bool:
        kind = self.kind[id(node)]
        inputs = self.data_inputs(node)
        if not inputs or any(not self.can_quantize(name) for name in inputs):
            return True
        if kind == "scale":
            # Only a pair's DequantizeLinear can take the factor: the input must be quantized anyway.
            source = inputs[0]
            return not (self.produced_int8(source) or self.read_int8(source, besides=node))
        output = self.output_of(node)
        if kind == "anchor":
            return False
        if not self.can_quantize(output):
            return True
        if not (self.read_int8(output) or any(self.produced_int8(name) for name in inputs)):
            return True  # no int8 neighbour: nothing to gain, and a pair may break a chain onnxruntime fuses in float
        if self.operands.get(id(node)) and not self.produced_int8(inputs[0]):
            return True  # a constant applied to what a float island computes (a LayerNorm's gamma) is the island's
        # On a tie the operator stays float when conversions are at stake: onnxruntime fuses float chains (a
        # LayerNorm's ReduceMean ... Mul, Add) that a pair inside would break.
        in_int8, in_float = (self.conversions(node, inputs, output, side) for side in (True, False))
        return in_int8 > in_float or in_int8 == in_float > 0

    def conversions(self, node, inputs: list[str], output: str, in_int8: bool) -> int:
        """The QuantizeLinear/DequantizeLinear nodes ``node`` needs that nothing else does, in int8 or in float."""
        count = 0
        for name in dict.fromkeys(inputs):
            quantized_anyway = self.produced_int8(name) or self.read_int8(name, besides=node)
            if quantized_anyway != in_int8:
                count += 1  # int8: a QuantizeLinear for it alone; float: a DequantizeLinear of a quantized input
        read_in_int8 = self.read_int8(output)
        if read_in_int8 != in_int8:
            count += 1  # int8: a DequantizeLinear for the float readers alone; float: a QuantizeLinear for int8 ones
        return count

    def quantized(self, name: str) -> bool:
        return self.can_quantize(name) and name not in self.inside and (self.produced_int8(name) or self.read_int8(name))


def float_first_layers(model) -> dict[str, str]:
    """Weight name -> why it stays float, for the convolutions rules 4 and 5 keep float: an image's first
    convolution (a model input of at most `FEW_CHANNELS` channels, `graph.image_stem`) and, while
    `DEPTHWISE_AFTER_INPUT`, the depthwise convolutions that read its output."""
    kept = {}
    for node, channels, followers in image_stem(model, FEW_CHANNELS):
        kept[node.input[1]] = (f"reads the model input {node.input[0]} ({channels} channels): onnxruntime's "
                               f"float convolution is faster there than its int8 one")
        for follower in followers if DEPTHWISE_AFTER_INPUT else ():
            kept.setdefault(follower.input[1], f"a depthwise convolution reading the output of the float input "
                                               f"convolution {node.name or node.output[0]!r}: quantization noise "
                                               f"this early is amplified by every layer after it")
    return kept


def place(model, keep_float: tuple[str, ...] = (), float_weights: set[str] | None = None, arrays=None) -> Placement:
    """The pairs of ``model`` (a ModelProto) for onnxruntime. ``float_weights``: weights that stay float (their
    Conv/MatMul/Gemm stays float); ``arrays(name)``: a main-graph constant's values, or None (for the scalar
    operands of Mul/Div and Clip's bounds)."""
    view = GraphView(model)
    arrays = arrays or (lambda name: None)
    state = _Graph(view, keep_float, set(float_weights or ()), arrays)
    state.settle()
    chosen: dict[str, Activation] = {}
    skipped: dict[str, Skipped] = {}

    def activation(name: str) -> Activation:
        producer = view.producers.get(name)
        return chosen.setdefault(name, Activation(name, "" if producer is None else node_label(producer),
                                                  "" if producer is None else node_key(producer)))

    scale_nodes = []
    for node in view.nodes:
        if node.op_type == "Constant":
            continue
        in_int8 = state.int8_output(node)
        if id(node) in state.int8 and state.kind[id(node)] == "scale":
            scale_nodes.append(node)
            continue
        for name in list(node.input) + list(node.output[:1]):
            if not name or name in chosen:
                if name in chosen and name in node.input:
                    chosen[name].readers.append(node_label(node))
                    chosen[name].ops.add(node.op_type)
                continue
            if state.quantized(name):
                entry = activation(name)
                entry.ops.add(node.op_type)
                if name in node.input:
                    entry.readers.append(node_label(node))
            elif view.is_float_activation(name) and (name in node.input and id(node) in state.int8
                                                      or name in node.output and in_int8):
                reason = (state.kept.get(name) or ("a model output (stays float)" if name in view.outputs else None)
                          or (f"inside the fused chain of {node_label(view.producers[name])} (read by "
                              f"{state.inside[name].op_type} alone)" if name in state.inside else None))
                if reason:
                    skipped.setdefault(name, Skipped(name, reason))
    # Scale folds: the node goes, its input's pair gets a second DequantizeLinear that writes its output (a fold of
    # a fold's output reads the first pair's codes, the factors multiplied).
    folds = []
    folded: dict[str, tuple[str, float]] = {}  # a folded node's output -> (the pair's activation, factor)
    for node in scale_nodes:
        source, factor = state.data_inputs(node)[0], state.factor[id(node)]
        read = source
        if source in folded:
            source, before = folded[source]
            factor *= before
        folds.append(ScaleFold(source, node, factor))
        folded[node.output[0]] = (source, factor)
        chosen.pop(node.output[0], None)
        if not chosen[source].readers and chosen[source].shown_as in (None, read):
            chosen[source].shown_as = node.output[0]
    # Ties: what a value-moving operator writes takes the scale and zero point of what it reads.
    for node in view.nodes:
        if id(node) in state.int8 and state.kind[id(node)] == "move":
            output = state.output_of(node)
            if output in chosen and node.input[0] in chosen:
                root = node.input[0]
                while chosen[root].tie is not None:
                    root = chosen[root].tie
                chosen[output].tie = root
    operands = [Operand(name, node_label(node), node) for node in view.nodes if id(node) in state.int8
                and state.kind[id(node)] == "binary" for name in state.operands[id(node)]]
    anchors = {node_key(node) for node in view.nodes if id(node) in state.int8 and state.kind[id(node)] == "anchor"}
    return Placement("onnxruntime", list(chosen.values()), [s for name, s in skipped.items() if name not in chosen],
                     operands, folds, anchors)


# Operators onnxruntime runs on a float weight only: a DequantizeLinear of a constant in front of one stays in its
# optimized graph when the activations are float (weights only), and runs on every call. (MatMul and Gemm weights
# in blocks become MatMulNBits, Gather tables GatherBlockQuantized.)
_FLOAT_ONLY_READERS = frozenset({"Conv", "ConvTranspose", "LSTM", "GRU", "RNN"})


def dequantized_per_run(model) -> int:
    """How many main-graph DequantizeLinear nodes of constants feed an operator in `_FLOAT_ONLY_READERS` with a
    float data input (weights only: no activation pair in front). Onnxruntime keeps them: its constant folding
    skips DequantizeLinear to keep QDQ groups whole unless the session sets ``session.disable_quant_qdq=1``, and
    the convolutions then also lose its NCHWc layout (OCR models at int4: 1.3-1.7x float's time; with the option,
    float's time and float's memory: BENCHMARKS.md)."""
    graph = model.graph
    constants = stored_constants(graph)
    produced_by = {o: n for n in graph.node for o in n.output}
    count = 0
    for node in graph.node:
        if node.op_type not in _FLOAT_ONLY_READERS or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        data = produced_by.get(node.input[0])
        if data is not None and data.op_type == "DequantizeLinear":
            continue  # an activation pair: onnxruntime's QDQ fusion takes the node
        for name in node.input[1:]:
            source = produced_by.get(name)
            if source is not None and source.op_type == "DequantizeLinear" and source.input[0] in constants:
                count += 1
    return count
