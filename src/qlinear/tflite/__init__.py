"""TensorFlow Lite's quantized arithmetic, bit for bit, in each of its CPU kernel families.

``kernel="reference"`` is what the LiteRT interpreter runs under ``OpResolverType.BUILTIN_REF``,
``"optimized"`` the optimized kernels of the x86-64 wheels (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``), and
``"xnnpack"`` what a default interpreter (``AUTO``) runs: XNNPACK for the nodes its delegate takes, the
optimized kernels for the rest. ``qlinear.tflite`` never imports LiteRT or TensorFlow. See docs/tflite.md.
"""

from qlinear.tflite.conv import (
    conv_2d,
    depthwise_conv_2d,
    fully_connected,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)
from qlinear.tflite.quantize import dequantize, quantize

__all__ = [
    "quantize",
    "dequantize",
    "conv_2d",
    "depthwise_conv_2d",
    "fully_connected",
    "quantize_multiplier",
    "multiply_by_quantized_multiplier",
    "saturating_rounding_doubling_high_mul",
    "rounding_divide_by_pot",
]
