"""What a placement decides: which activations get a QuantizeLinear -> DequantizeLinear pair (and how the pair
is written), which constant operands of element-wise operators are quantized so that a runtime can fuse the
operator, and what is left float and why. The writer (`formats.onnx_activations`) reads nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Activation:
    """One activation tensor to quantize: who makes it, who reads it, and why it was chosen."""

    name: str
    producer: str  # the producing node ("Conv 'conv1'"), or "" for a graph input
    node: str = ""  # the producing node's name (its first output's where it has none): what --keep-float takes
    readers: list[str] = field(default_factory=list)  # "Conv conv1", ...
    ops: set[str] = field(default_factory=set)  # the operator types whose inputs or outputs it is
    # Take the scale and zero point of this other activation instead of calibrating one: the operator between
    # them only moves values (MaxPool, Reshape, Transpose, ...), and a runtime runs it on the codes when the
    # pairs around it agree.
    tie: str | None = None
    # Where the quantized model shows this activation's codes when a scale fold took its only reader: that
    # node's output (the per-layer report compares it there).
    shown_as: str | None = None

    @property
    def compared(self) -> str:
        return self.shown_as or self.name


@dataclass
class Operand:
    """A float constant read by an element-wise operator that a runtime fuses only when every input comes
    from a DequantizeLinear (Add, Mul): quantized per tensor to the activation type."""

    name: str
    reader: str  # "Add 'add_3'"
    node: object = None  # the NodeProto that reads it


@dataclass
class ScaleFold:
    """A Mul or Div by a positive scalar constant that reads a quantized activation, folded into its pair: a
    second DequantizeLinear of the pair's codes, with the scale times ``factor``, writes the node's output, and
    the node is removed (a runtime then fuses the operators on either side)."""

    source: str  # the quantized activation
    node: object  # the NodeProto removed
    factor: float


@dataclass
class Skipped:
    name: str
    reason: str


@dataclass
class Placement:
    """A target's placement of the pairs on one model."""

    target: str
    activations: list[Activation]
    skipped: list[Skipped]
    operands: list[Operand] = field(default_factory=list)
    scale_folds: list[ScaleFold] = field(default_factory=list)
    anchors: set[str] = field(default_factory=set)  # the Conv/MatMul/Gemm nodes (`graph.node_key`) placed in int8
