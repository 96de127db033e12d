"""NVFP4 checkpoints in compressed-tensors' layout (llm-compressor's "nvfp4-pack-quantized": ``MODULE.weight_packed``,
``.weight_scale``, ``.weight_global_scale``), built by compressed-tensors 0.20.1 itself
(``NVFP4PackedCompressor.compress`` with the scales its own ``generate_gparam`` and ``calculate_qparams`` give), saved
with torch's safetensors, and read back by qlinear: `read_nvfp4_checkpoint` and ``qlinear dequantize`` give
compressed-tensors' ``decompress`` values bit for bit."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from qlinear.io.formats.nvfp4_checkpoint import CompressedNVFP4Tensor, read_nvfp4_checkpoint

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    nvfp4_base = pytest.importorskip("compressed_tensors.compressors.nvfp4.base")
    from compressed_tensors.compressors.nvfp4 import helpers as nvfp4_helpers
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.lifecycle import forward
    from compressed_tensors.quantization.quant_scheme import NVFP4
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam


def _compress(weight: torch.Tensor):
    """compressed-tensors' NVFP4 state of one linear weight, and its own decompressed values."""
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    w = weight.float()
    global_scale = generate_gparam(w.min(), w.max())
    groups = w.reshape(w.shape[0], -1, 16)
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights, global_scale=global_scale)
    state = nvfp4_base.NVFP4PackedCompressor.compress(
        {"weight": weight, "weight_scale": scale, "weight_global_scale": global_scale,
         "weight_zero_point": zero_point}, scheme)
    values = nvfp4_base.NVFP4PackedCompressor.decompress(dict(state), scheme)["weight"]
    return state, values


def _bf16(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


@pytest.fixture
def checkpoint(tmp_path):
    rng = np.random.default_rng(3)
    weights = {"model.layers.0.self_attn.q_proj": rng.standard_normal((64, 256)) * 0.02,
               "model.layers.0.mlp.down_proj": rng.standard_cauchy((32, 128)) * 1e-3,  # heavy tails: tiny block scales
               "model.layers.0.mlp.up_proj": np.where(rng.random((16, 64)) < 0.5, 0.0, rng.standard_normal((16, 64)))}
    tensors, expected = {"model.embed_tokens.weight": torch.ones(8, 4, dtype=torch.bfloat16)}, {}
    for module, w in weights.items():
        state, values = _compress(torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16))
        for part, t in state.items():
            tensors[f"{module}.{part}"] = t.contiguous()
        expected[module + ".weight"] = _bf16(values)
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    return path, expected


def test_read_gives_compressed_tensors_values(checkpoint):
    path, expected = checkpoint
    read = read_nvfp4_checkpoint(path)
    assert set(read) == set(expected) | {"model.embed_tokens.weight"}
    for name, values in expected.items():
        tensor = read[name]
        assert isinstance(tensor, CompressedNVFP4Tensor) and tensor.shape == values.shape
        np.testing.assert_array_equal(tensor.dequantize().view(np.uint16), values.view(np.uint16), err_msg=name)


def test_command_dequantize(tmp_path, checkpoint, capsys):
    from safetensors.numpy import load_file

    from qlinear.cli import main

    path, expected = checkpoint
    out = tmp_path / "restored.safetensors"
    assert main(["dequantize", str(path), "-o", str(out)]) == 0
    assert "nvfp4 (compressed-tensors)" in capsys.readouterr().out
    back = load_file(str(out))
    assert set(back) == set(expected) | {"model.embed_tokens.weight"}
    for name, values in expected.items():
        assert back[name].dtype == np.dtype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(back[name].view(np.uint16), values.view(np.uint16), err_msg=name)


def test_a_malformed_triple_is_a_named_error(tmp_path, capsys):
    from safetensors.numpy import save_file

    from qlinear.cli import main

    path = tmp_path / "bad.safetensors"
    save_file({"m.weight_packed": np.zeros((2, 8), np.uint8), "m.weight_scale": np.zeros((2, 1), np.float32),
               "m.weight_global_scale": np.ones(1, np.float32)}, str(path))
    with pytest.raises(ValueError, match="must be U8, F8_E4M3 and F32"):
        read_nvfp4_checkpoint(path)
    assert main(["dequantize", str(path), "-o", str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'m.weight'" in err[0] and "compressed-tensors" in err[0]


def test_every_code_under_every_block_scale_and_global_scales():
    """Every float4 code under every finite E4M3 block scale, for global scales of several magnitudes: qlinear's
    decode == compressed-tensors' decompress. The block scale is divided by the global scale (for some of these
    a multiplication by its float32 reciprocal rounds otherwise: checked, so that the test tells them apart)."""
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    packed = np.tile(np.array([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], np.uint8), (126, 1))
    scale_bytes = np.arange(1, 127, dtype=np.uint8)[:, None]  # every finite positive E4M3 value
    told_apart = False
    for gs in np.array([13361.709, 3.7, 0.0071, 2.0**-20 * 3, 448 * 6], np.float32):
        state = {"weight_packed": torch.from_numpy(packed.copy()),
                 "weight_scale": torch.from_numpy(scale_bytes.copy()).view(torch.float8_e4m3fn),
                 "weight_global_scale": torch.tensor([gs])}
        theirs = _bf16(nvfp4_base.NVFP4PackedCompressor.decompress(dict(state), scheme)["weight"])
        tensor = CompressedNVFP4Tensor(packed, scale_bytes.view(ml_dtypes.float8_e4m3fn), np.array([gs]))
        np.testing.assert_array_equal(tensor.dequantize().view(np.uint16), theirs.view(np.uint16), err_msg=str(gs))
        # the float32 values before the bfloat16 cast: its dequantize with dtype float32 on the same codes and scales
        codes = nvfp4_helpers.unpack_fp4_from_uint8(state["weight_packed"], 126, 16, dtype=torch.float32)
        theirs32 = forward.dequantize(x_q=codes, scale=state["weight_scale"].to(torch.float32), args=scheme.weights,
                                      dtype=torch.float32, global_scale=state["weight_global_scale"]).numpy()
        np.testing.assert_array_equal(tensor.dequantize(np.float32).view(np.uint32), theirs32.view(np.uint32),
                                      err_msg=str(gs))
        s = scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        told_apart |= bool(np.any(s / gs != s * (np.float32(1) / gs)))
    assert told_apart
