"""Where static quantization puts its QuantizeLinear -> DequantizeLinear pairs, one module per target runtime
(`qlinear quantize --target`): `onnxruntime` (the default) places them where onnxruntime's CPU provider fuses
them into int8 kernels and leaves float islands whole; `qdq_portable` places a pair around every operator a QDQ
runtime may fuse, as onnxruntime's own quantizer does, for runtimes that find their own fusions. A target is a
function ``place(model, keep_float, float_weights, arrays) -> Placement``. After the pairs are written,
`broadcast_gates` tiles the channel gates of squeeze-excite blocks for the `onnxruntime` target (its broadcast
QLinearMul runs on one thread); for any quantized model (weights only too), `gather_tables` rewrites what the
`onnxruntime` target reads through a contrib operator: 4-bit Gather tables."""

from __future__ import annotations

from . import onnxruntime, qdq_portable
from .graph import kept_nodes
from .pairs import Activation, Operand, Placement, ScaleFold, Skipped

TARGETS = {"onnxruntime": onnxruntime.place, "qdq-portable": qdq_portable.place}
DEFAULT_TARGET = "onnxruntime"


def place(model, target: str = DEFAULT_TARGET, keep_float: tuple[str, ...] = (), float_weights=(), arrays=None) -> Placement:
    return TARGETS[target](model, keep_float, set(float_weights), arrays)


__all__ = ["Activation", "DEFAULT_TARGET", "Operand", "Placement", "ScaleFold", "Skipped", "TARGETS", "kept_nodes",
           "place"]
