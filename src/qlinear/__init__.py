"""qlinear: the quantization operators of ONNX and TensorFlow, bit-exact and fast.

The public API. ONNX operators are functions named after the operator, taking its inputs in order
and its attributes as keywords with the ONNX defaults; `qlinear.tf` holds TensorFlow's QuantizeV2 and
Dequantize, `qlinear.tflite` TensorFlow Lite's arithmetic in each of its kernel families, `qlinear.torch`
PyTorch's quantize and fake-quantize operators, and `qlinear.mx` the microscaling formats.
"""

from . import mx, tf, tflite, torch
from .ops.dynamic import dynamic_quantize_linear
from .errors import AccumulatorOverflowError
from .kernels.output_pool import get_output_pool_limit, set_output_pool_limit
from .kernels.threads import get_num_threads, set_num_threads
from .ops.qlinear_conv import conv_integer, prepack_conv, qlinear_conv
from .ops.qlinear_matmul import PackedMatMul, matmul_integer, prepack_matmul, qlinear_matmul
from .ops.quantize_linear import dequantize_linear, quantize_linear
from .packing import pack, unpack

__all__ = [
    "quantize_linear",
    "dequantize_linear",
    "pack",
    "unpack",
    "qlinear_conv",
    "conv_integer",
    "prepack_conv",
    "qlinear_matmul",
    "prepack_matmul",
    "PackedMatMul",
    "matmul_integer",
    "dynamic_quantize_linear",
    "AccumulatorOverflowError",
    "set_num_threads",
    "get_num_threads",
    "set_output_pool_limit",
    "get_output_pool_limit",
    "tf",
    "tflite",
    "torch",
    "mx",
]
__version__ = "0.1.0"


def __getattr__(name):
    # qlinear.onnx needs the onnx package; it is imported on first use, never by `import qlinear`.
    if name == "onnx":
        import importlib

        return importlib.import_module("qlinear.onnx")
    raise AttributeError(f"module 'qlinear' has no attribute {name!r}")
