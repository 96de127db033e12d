"""TensorFlow's quantization operators, bit for bit: QuantizeV2 and Dequantize.

``qlinear.tf`` never imports TensorFlow; ``T`` accepts a tf.DType by its ``.name``.
"""

from qlinear.tf.quantize import TF_QUANTIZED_TYPES, dequantize, quantize_v2

__all__ = ["quantize_v2", "dequantize", "TF_QUANTIZED_TYPES"]
