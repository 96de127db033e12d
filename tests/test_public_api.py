"""The package boundary: what `import qlinear` brings in, and the public names."""

import subprocess
import sys

import qlinear


def test_import_does_not_load_peers_or_compile():
    code = (
        "import sys, qlinear\n"
        "loaded = [m for m in ('onnx', 'onnxruntime', 'tensorflow', 'torch', 'ai_edge_litert') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names():
    for name in ("quantize_linear", "dequantize_linear", "pack", "unpack", "qlinear_conv", "conv_integer",
                 "qlinear_matmul", "matmul_integer", "prepack_conv", "prepack_matmul", "dynamic_quantize_linear", "set_num_threads", "get_num_threads",
                 "set_output_pool_limit", "get_output_pool_limit"):
        assert callable(getattr(qlinear, name)), name
    assert callable(qlinear.tf.quantize_v2) and callable(qlinear.tf.dequantize)
    assert callable(qlinear.tflite.quantize) and callable(qlinear.tflite.dequantize)
    assert callable(qlinear.torch.quantize_per_tensor) and callable(qlinear.torch.fake_quantize_per_channel_affine)


def test_qlinear_onnx_is_imported_on_first_use():
    code = (
        "import sys, qlinear\n"
        "before = 'onnx' in sys.modules\n"
        "run = qlinear.onnx.run\n"
        "print(before, 'onnx' in sys.modules, callable(run))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
