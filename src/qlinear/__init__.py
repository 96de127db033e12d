"""qlinear: the quantization operators of ONNX and TensorFlow, bit-exact and fast.

The public API; `qlinear.tf` holds the TensorFlow operators.
"""

from .ops.quantize_linear import dequantize_linear, quantize_linear
from .packing import pack, unpack

__all__ = ["quantize_linear", "dequantize_linear", "pack", "unpack"]
__version__ = "0.1.0"
