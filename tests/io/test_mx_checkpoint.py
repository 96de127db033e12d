"""MXFP4 checkpoints in gpt-oss's layout (qlinear.io.formats.mx_checkpoint): read, decode, re-quantize, write back.

The oracle is an independent NumPy transcription of gpt-oss's own decoder (openai/gpt-oss
``gpt_oss/torch/weights.py``, ``_get_mxfp4_tensor``), and the files are written and read with the
`safetensors` package itself, as gpt-oss and Hugging Face store them: uint8 blocks and scales, bf16
for everything else.
"""

from __future__ import annotations

import doctest
import math
import re

import ml_dtypes
import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

import qlinear.mx as mx  # noqa: E402
from qlinear.io.formats import mx_checkpoint  # noqa: E402
from qlinear.io.formats.mx_checkpoint import (  # noqa: E402
    MXFP4Tensor, from_gpt_oss, read_mxfp4_checkpoint, to_gpt_oss, write_mxfp4_checkpoint)

# gpt-oss's FP4_VALUES: the e2m1 value of each 4-bit code, sign in bit 3
LUT = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def gpt_oss_decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``_get_mxfp4_tensor`` in NumPy (float32 instead of its bf16 output, which rounds these values exactly)."""
    scales = scales.astype(np.int32) - 127
    assert blocks.shape[:-1] == scales.shape, f"{blocks.shape=} does not match {scales.shape=}"
    *prefix_shape, g, b = blocks.shape
    rows_total = math.prod(prefix_shape) * g
    blocks = blocks.reshape(rows_total, b)
    scales = scales.reshape(rows_total, 1)
    out = np.empty((rows_total, b * 2), np.float32)
    out[:, 0::2] = LUT[blocks & 0x0F]
    out[:, 1::2] = LUT[blocks >> 4]
    out = np.ldexp(out, scales)
    return out.reshape(*prefix_shape, g * b * 2)


def _bf16(rng, shape):
    return (rng.standard_normal(shape) * 0.05).astype(ml_dtypes.bfloat16)


def _random_pair(rng, shape_blocks, low=110, high=135):
    """gpt-oss-shaped blocks and scale bytes: every nibble value, scale bytes around 2^0 (real weights).

    Every block's largest code is 4 or 6 in magnitude, as the OCP floor rule quantizes (and as 32 random
    codes almost always are): byte 0 of a block whose codes all stay below 4 gets a 6 in its low nibble."""
    blocks = rng.integers(0, 256, shape_blocks, dtype=np.uint8)
    scales = rng.integers(low, high, shape_blocks[:-1], dtype=np.uint8)
    small = ~_canonical(blocks, scales)
    blocks[small, 0] = (blocks[small, 0] & 0xF0) | 0x07
    assert _canonical(blocks, scales).all()
    return blocks, scales


E, I, H = 2, 64, 64  # experts, intermediate, hidden: gpt-oss's [E, 2I, H] and [E, H, I] weights, small


def gpt_oss_checkpoint(rng) -> dict[str, np.ndarray]:
    """A layer of gpt-oss's original checkpoint (``block.N.mlp.mlp1_weight.blocks`` names)."""
    t = {}
    p = "block.0.mlp."
    t[p + "mlp1_weight.blocks"], t[p + "mlp1_weight.scales"] = _random_pair(rng, (E, 2 * I, H // 32, 16))
    t["block.0.mlp.mlp2_weight.blocks"], t["block.0.mlp.mlp2_weight.scales"] = _random_pair(rng, (E, H, I // 32, 16))
    t["block.0.mlp.mlp1_bias"] = _bf16(rng, (E, 2 * I))
    t["block.0.mlp.gate.weight"] = _bf16(rng, (E, H))
    t["block.0.attn.qkv.weight"] = _bf16(rng, (3 * H, H))
    t["embedding.weight"] = _bf16(rng, (100, H))
    return t


def hf_checkpoint(rng) -> dict[str, np.ndarray]:
    """A layer as Hugging Face stores openai/gpt-oss-20b (``..._blocks``/``..._scales``)."""
    p = "model.layers.0.mlp.experts."
    t = {}
    t[p + "gate_up_proj_blocks"], t[p + "gate_up_proj_scales"] = _random_pair(rng, (E, 2 * I, H // 32, 16))
    t[p + "down_proj_blocks"], t[p + "down_proj_scales"] = _random_pair(rng, (E, H, I // 32, 16))
    t[p + "gate_up_proj_bias"] = _bf16(rng, (E, 2 * I))
    t[p + "down_proj_bias"] = _bf16(rng, (E, H))
    t["model.layers.0.self_attn.q_proj.weight"] = _bf16(rng, (H, H))
    t["model.layers.0.input_layernorm.weight"] = _bf16(rng, (H,))
    return t


CHECKPOINTS = {
    "gpt-oss": (gpt_oss_checkpoint, ".", ["block.0.mlp.mlp1_weight", "block.0.mlp.mlp2_weight"]),
    "hf": (hf_checkpoint, "_", ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"]),
}


def _save(tmp_path, tensors, name="model.safetensors", metadata=None):
    path = tmp_path / name
    safetensors_numpy.save_file(tensors, str(path), metadata=metadata)
    return path


def _canonical(blocks: np.ndarray, scale_bytes: np.ndarray) -> np.ndarray:
    """Per block: True where re-quantizing its values with the OCP floor rule must give back its bytes.

    A block's values are c_i * 2^e (e = byte - 127). The floor rule takes X = 2^(floor(log2(amax)) - 2),
    amax = max|c_i| * 2^e. When max|c_i| is 4 or 6 (the top binade of e2m1), floor(log2 amax) = e + 2, so
    X = 2^e: the same scale, and every V_i / X = c_i is an e2m1 value, which round-to-nearest-even returns
    unchanged (signed zeros included: -0.0 / X is -0.0). The float32 values must also be finite (bytes up
    to 252: 6 * 2^126 already overflows float32) and amax must be a normal float32 (always, here: amax >=
    4 * 2^-127 = 2^-125). A block whose largest code is 3 or less (or all zeros) decodes to values that a
    smaller scale also represents exactly, and the floor rule picks that smaller scale: same values, other
    bytes (see test_requantize_non_canonical_block)."""
    codes, _ = from_gpt_oss(blocks, scale_bytes)
    magnitude = np.abs(codes.astype(np.float32)).reshape(scale_bytes.shape + (32,)).max(axis=-1)
    return (magnitude >= 4) & (scale_bytes <= 252)


# ----------------------------------------------------------------------------------------------------
# to_gpt_oss / from_gpt_oss


def test_every_byte_decodes_as_gpt_oss_does():
    blocks = np.arange(256, dtype=np.uint8).reshape(16, 16)
    scale_bytes = np.arange(100, 116, dtype=np.uint8)
    codes, scales = from_gpt_oss(blocks, scale_bytes)
    assert codes.dtype == ml_dtypes.float4_e2m1fn and scales.dtype == ml_dtypes.float8_e8m0fnu
    assert codes.shape == (512,) and scales.shape == (16,)
    expected = gpt_oss_decode(blocks, scale_bytes)
    got = mx.dequantize(codes, scales, axis=-1)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))  # signed zeros too
    # and back, byte for byte
    again_blocks, again_scales = to_gpt_oss(codes, scales)
    np.testing.assert_array_equal(again_blocks, blocks)
    np.testing.assert_array_equal(again_scales, scale_bytes)


def test_nibble_order():
    codes = np.zeros((1, 32), ml_dtypes.float4_e2m1fn)
    codes[0, 0], codes[0, 1], codes[0, 31] = 0.5, -6.0, 3.0  # e2m1 codes 0x1, 0xF, 0x5
    blocks, scale_bytes = to_gpt_oss(codes, np.array([[2.0]], ml_dtypes.float8_e8m0fnu))
    assert blocks.shape == (1, 1, 16) and blocks.dtype == np.uint8
    assert blocks[0, 0, 0] == 0xF1  # element 0 in the low nibble, element 1 in the high one
    assert blocks[0, 0, 15] == 0x50
    assert scale_bytes.tolist() == [[128]]


def test_shapes_of_gpt_oss_weights():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    codes, scales = mx.quantize(x, "mxfp4", axis=-1)
    blocks, scale_bytes = to_gpt_oss(codes, scales)
    assert blocks.shape == (E, 2 * I, H // 32, 16) and scale_bytes.shape == (E, 2 * I, H // 32)
    np.testing.assert_array_equal(gpt_oss_decode(blocks, scale_bytes), mx.dequantize(codes, scales))


@pytest.mark.parametrize("codes, scales, error, words", [
    (np.zeros(32, np.float32), np.zeros(1, ml_dtypes.float8_e8m0fnu), TypeError, "codes must be float4_e2m1fn"),
    (np.zeros(32, ml_dtypes.float4_e2m1fn), np.zeros(1, np.uint8), TypeError, "scales must be float8_e8m0fnu"),
    (np.zeros((2, 48), ml_dtypes.float4_e2m1fn), np.zeros((2, 2), ml_dtypes.float8_e8m0fnu), ValueError,
     "whole number of 32-element blocks"),
    (np.zeros((2, 64), ml_dtypes.float4_e2m1fn), np.zeros((2, 1), ml_dtypes.float8_e8m0fnu), ValueError,
     "scales must have codes' shape with the last axis divided by 32, (2, 2)"),
    (np.zeros((), ml_dtypes.float4_e2m1fn), np.zeros((), ml_dtypes.float8_e8m0fnu), ValueError, "at least one axis"),
])
def test_to_gpt_oss_refuses(codes, scales, error, words):
    with pytest.raises(error, match=rf"^to_gpt_oss: .*{re.escape(words)}"):
        to_gpt_oss(codes, scales)


@pytest.mark.parametrize("blocks, scale_bytes, error, words", [
    (np.zeros((2, 16), np.int8), np.zeros(2, np.uint8), TypeError, "blocks must be uint8"),
    (np.zeros((2, 16), np.uint8), np.zeros(2, np.float32), TypeError, "scale_bytes must be uint8"),
    (np.zeros((2, 32), np.uint8), np.zeros(2, np.uint8), ValueError, "last axis of 16 bytes"),
    (np.zeros(16, np.uint8), np.zeros((), np.uint8), ValueError, "last axis of 16 bytes"),
    (np.zeros((3, 2, 16), np.uint8), np.zeros((3, 3), np.uint8), ValueError,
     "scale_bytes must have blocks' shape without its last axis"),
])
def test_from_gpt_oss_refuses(blocks, scale_bytes, error, words):
    with pytest.raises(error, match=rf"^from_gpt_oss: .*{re.escape(words)}"):
        from_gpt_oss(blocks, scale_bytes)


def test_nan_scale_byte():
    """Byte 255 is e8m0's NaN: qlinear (the OCP rule) gives NaN for the whole block; gpt-oss's decoder, which
    computes ldexp(value, 255 - 127), gives 0 and +-inf (never NaN). No real checkpoint has it; the difference
    is noted."""
    blocks = np.full((1, 16), 0x65, np.uint8)  # 3.0, 4.0
    blocks[0, 0] = 0x80  # -0.0, +0.0
    codes, scales = from_gpt_oss(blocks, np.array([255], np.uint8))
    assert np.isnan(mx.dequantize(codes, scales)).all()
    with np.errstate(over="ignore"):
        decoded = gpt_oss_decode(blocks, np.array([255], np.uint8))
    assert decoded[0] == 0 and decoded[1] == 0 and np.isinf(decoded[2:]).all()


def test_module_doctests():
    assert doctest.testmod(mx_checkpoint, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE).failed == 0


# ----------------------------------------------------------------------------------------------------
# Files


@pytest.mark.parametrize("layout", CHECKPOINTS)
def test_read_decode_requantize_write(tmp_path, layout):
    """An MXFP4 checkpoint is read, decoded as gpt-oss decodes it, re-quantized to the same bytes, and
    written back to the same tensors; the file itself comes back byte for byte."""
    make, separator, names = CHECKPOINTS[layout]
    original = make(np.random.default_rng(2))
    source = _save(tmp_path, original, metadata={"format": "pt"})

    checkpoint = read_mxfp4_checkpoint(source)
    assert checkpoint.metadata == {"format": "pt"}
    assert set(checkpoint) == set(names) | {n for n in original if not n.endswith(("blocks", "scales"))}
    for name in names:
        tensor = checkpoint[name]
        assert isinstance(tensor, MXFP4Tensor) and tensor.separator == separator
        blocks, scale_bytes = original[name + separator + "blocks"], original[name + separator + "scales"]
        assert tensor.shape == scale_bytes.shape[:-1] + (scale_bytes.shape[-1] * 32,)
        codes, scales = tensor
        values = mx.dequantize(codes, scales, axis=-1)
        np.testing.assert_array_equal(values.view(np.uint32), gpt_oss_decode(blocks, scale_bytes).view(np.uint32))
        # bf16, gpt-oss's own output type, holds every one of these values exactly
        np.testing.assert_array_equal(tensor.dequantize(ml_dtypes.bfloat16).astype(np.float32), values)

        # re-quantized with the OCP floor rule: the same bytes (every block is canonical, see _canonical)
        again_codes, again_scales = mx.quantize(values, "mxfp4", axis=-1, scale_rule=None)
        again_blocks, again_bytes = to_gpt_oss(again_codes, again_scales)
        np.testing.assert_array_equal(again_bytes, scale_bytes)
        np.testing.assert_array_equal(again_blocks, blocks)
        # and the values come back in every block
        np.testing.assert_array_equal(mx.dequantize(again_codes, again_scales), values)
    for name, array in original.items():
        if not name.endswith(("blocks", "scales")):
            assert checkpoint[name].dtype == array.dtype
            np.testing.assert_array_equal(checkpoint[name].view(np.uint16), array.view(np.uint16))

    # written back as read: the same file, byte for byte (names, order, metadata, alignment)
    copy = tmp_path / "copy.safetensors"
    write_mxfp4_checkpoint(copy, checkpoint)
    assert copy.read_bytes() == source.read_bytes()

    # written back from re-quantized (codes, scales) pairs: the same tensors, compared by safetensors
    requantized = {name: mx.quantize(value.dequantize(), "mxfp4", axis=-1) if isinstance(value, MXFP4Tensor)
                   else value for name, value in checkpoint.items()}
    assert all(isinstance(requantized[name], tuple) for name in names)
    rewritten = tmp_path / "requantized.safetensors"
    write_mxfp4_checkpoint(rewritten, requantized, separator=separator)
    back = safetensors_numpy.load_file(str(rewritten))
    assert set(back) == set(original)
    for name, array in original.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape, name
        np.testing.assert_array_equal(back[name].view(np.uint8), array.view(np.uint8), err_msg=name)


def test_requantize_non_canonical_block():
    """The counterexample: a block whose largest code is 3. Its values 3 * 2^e ... are also 6 * 2^(e-1) ...,
    and the floor rule (floor(log2(3 * 2^e)) - 2 = e - 1) picks that smaller scale: every code doubles
    (0.5 -> 1, 1.5 -> 3, 3 -> 6, all e2m1 values), the scale byte drops by one, the values stay. The ceil
    rule does the same (ceil_pow2(3 * 2^e / 6) = 2^(e-1)). An all-zero block gets byte 0 from either rule.
    So only canonical blocks (largest code 4 or 6) keep their bytes; re-quantizing a checkpoint quantized
    with the ceil rule (Hugging Face's `quantize_to_mxfp4`, triton's ROUND_UP), where a block maximum
    between 3 and 3.5 times the scale rounds to code 3, changes those blocks' bytes, not their values."""
    codes = np.zeros((2, 32), ml_dtypes.float4_e2m1fn)
    codes[0, :4] = [3.0, -1.5, 0.5, -0.0]
    blocks, _ = to_gpt_oss(codes, np.ones((2, 1), ml_dtypes.float8_e8m0fnu))
    scale_bytes = np.array([[130], [140]], np.uint8)
    values = gpt_oss_decode(blocks, scale_bytes)
    for rule in ("floor", "ceil"):
        again_codes, again_scales = mx.quantize(values, "mxfp4", axis=-1, scale_rule=rule)
        assert again_scales.view(np.uint8).tolist() == [[129], [0]]
        assert again_codes[0, :4].astype(np.float32).tolist() == [6.0, -3.0, 1.0, -0.0]
        np.testing.assert_array_equal(mx.dequantize(again_codes, again_scales), values)
    assert not _canonical(blocks, scale_bytes).any()


def test_requantize_every_scale_byte():
    """Canonical blocks come back byte for byte at every scale byte 0..252: at byte 0 the small elements
    are float32 subnormals (0.5 * 2^-127) and the floor rule still finds 2^-127 from the block maximum (a
    normal 4 or 6 * 2^-127); from byte 253 the largest values overflow float32, which no decoder to
    float32 or bf16 (gpt-oss's) can represent."""
    rng = np.random.default_rng(6)
    scale_bytes = np.repeat(np.arange(253, dtype=np.uint8), 4)
    blocks, _ = _random_pair(rng, (scale_bytes.size, 16))
    blocks = blocks.reshape(scale_bytes.size, 16)
    blocks[:, 0] = (blocks[:, 0] & 0xF0) | 0x07  # a 6 in every block, so the fixed bytes cover every case
    blocks[1::4, 0] = 0x5E  # ... or a -4 as the largest (then 3.0)
    blocks[1::4, 1:] &= 0x55  # (codes 0..5 and 8..13 below it: magnitudes up to 3)
    blocks[1::4, 1:] |= 0x88 * (rng.integers(0, 2, (blocks[1::4].shape[0], 15), dtype=np.uint8))
    assert _canonical(blocks, scale_bytes).all()
    values = gpt_oss_decode(blocks, scale_bytes)
    assert np.isfinite(values).all()
    codes, scales = mx.quantize(values, "mxfp4", axis=-1)
    again_blocks, again_bytes = to_gpt_oss(codes, scales)
    np.testing.assert_array_equal(again_bytes, scale_bytes)
    np.testing.assert_array_equal(again_blocks, blocks)
    with np.errstate(over="ignore"):
        assert np.isinf(gpt_oss_decode(blocks[:1], np.array([253], np.uint8))).any()


def test_write_codes_and_scales_from_quantize(tmp_path):
    """A float checkpoint quantized with qlinear.mx and written as gpt-oss's layout: gpt-oss's decoder
    reads back what qlinear.mx.dequantize gives, and the other tensors pass through."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    bias = _bf16(rng, (E, 2 * I))
    codes, scales = mx.quantize(w, "mxfp4")
    path = tmp_path / "out.safetensors"
    write_mxfp4_checkpoint(path, {"block.0.mlp.mlp1_weight": (codes, scales), "block.0.mlp.mlp1_bias": bias},
                           metadata={"format": "pt"})
    back = safetensors_numpy.load_file(str(path))
    assert set(back) == {"block.0.mlp.mlp1_weight.blocks", "block.0.mlp.mlp1_weight.scales", "block.0.mlp.mlp1_bias"}
    assert back["block.0.mlp.mlp1_weight.blocks"].dtype == np.uint8
    np.testing.assert_array_equal(gpt_oss_decode(back["block.0.mlp.mlp1_weight.blocks"],
                                                 back["block.0.mlp.mlp1_weight.scales"]), mx.dequantize(codes, scales))
    np.testing.assert_array_equal(back["block.0.mlp.mlp1_bias"].view(np.uint16), bias.view(np.uint16))
    write_mxfp4_checkpoint(tmp_path / "hf.safetensors", {"w": (codes, scales)}, separator="_")
    assert set(safetensors_numpy.load_file(str(tmp_path / "hf.safetensors"))) == {"w_blocks", "w_scales"}


def test_write_in_chunks(tmp_path, monkeypatch):
    """Large tensors are packed and copied a band of rows at a time; the file is the same."""
    rng = np.random.default_rng(4)
    codes, scales = mx.quantize(rng.standard_normal((7, 5, 64)).astype(np.float32), "mxfp4")
    whole = tmp_path / "whole.safetensors"
    write_mxfp4_checkpoint(whole, {"w": (codes, scales), "x": rng.standard_normal((9, 3)).astype(np.float32)})
    monkeypatch.setattr(mx_checkpoint, "_CHUNK_BYTES", 40)
    banded = tmp_path / "banded.safetensors"
    write_mxfp4_checkpoint(banded, {"w": (codes, scales), "x": read_mxfp4_checkpoint(whole)["x"]})
    assert banded.read_bytes() == whole.read_bytes()
    again = tmp_path / "again.safetensors"
    write_mxfp4_checkpoint(again, read_mxfp4_checkpoint(banded))
    assert again.read_bytes() == whole.read_bytes()


def test_lone_and_mismatched_pairs(tmp_path):
    rng = np.random.default_rng(5)
    lone = _save(tmp_path, {"a.blocks": rng.integers(0, 255, (4, 1, 16), dtype=np.uint8),
                            "b_scales": np.ones((4,), np.uint8)}, "lone.safetensors")
    checkpoint = read_mxfp4_checkpoint(lone)
    assert set(checkpoint) == {"a.blocks", "b_scales"}  # no partner: ordinary tensors
    bad_shape = _save(tmp_path, {"a.blocks": np.zeros((4, 2, 16), np.uint8), "a.scales": np.zeros((4, 3), np.uint8)},
                      "shape.safetensors")
    with pytest.raises(ValueError, match=r"MXFP4 tensor 'a': 'a.blocks' must have shape S \+ \(G, 16\)"):
        read_mxfp4_checkpoint(bad_shape)
    bad_type = _save(tmp_path, {"a_blocks": np.zeros((4, 2, 16), np.uint8), "a_scales": np.zeros((4, 2), np.float32)},
                     "type.safetensors")
    with pytest.raises(ValueError, match="'a_blocks' and 'a_scales' must both be U8"):
        read_mxfp4_checkpoint(bad_type)
    not_safetensors = tmp_path / "x.safetensors"
    not_safetensors.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_mxfp4_checkpoint(not_safetensors)


def test_write_refuses(tmp_path):
    codes = np.zeros((2, 32), ml_dtypes.float4_e2m1fn)
    scales = np.ones((2, 1), ml_dtypes.float8_e8m0fnu)
    with pytest.raises(ValueError, match="two tensors would both be written as 'w.blocks'"):
        write_mxfp4_checkpoint(tmp_path / "a.safetensors", {"w": (codes, scales), "w.blocks": np.zeros(3)})
    with pytest.raises(ValueError, match="tensor 'w': the last axis of codes must be a whole number"):
        write_mxfp4_checkpoint(tmp_path / "a.safetensors", {"w": (codes[:, :16], scales)})
    with pytest.raises(TypeError, match="tensor 'w' has dtype object"):
        write_mxfp4_checkpoint(tmp_path / "a.safetensors", {"w": np.array([None])})
    with pytest.raises(ValueError, match="separator must be"):
        write_mxfp4_checkpoint(tmp_path / "a.safetensors", {}, separator="/")
    assert not (tmp_path / "a.safetensors").exists()


# ----------------------------------------------------------------------------------------------------
# The command: qlinear quantize CKPT.safetensors --dtype mxfp4, qlinear dequantize


def _qlinear(capsys, *args) -> tuple[int, str]:
    from qlinear.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _qlinear_fails(capsys, *args) -> str:
    from qlinear.cli import main

    assert main([str(a) for a in args]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("rule", [None, "ceil"])
def test_command_quantize_writes_gpt_oss_layout(tmp_path, capsys, rule):
    import json

    from safetensors import safe_open

    rng = np.random.default_rng(7)
    weights = {"block.0.mlp.mlp1_weight": _bf16(rng, (E, 2 * I, H)), "block.0.mlp.mlp1_bias": _bf16(rng, (2 * I,)),
               "proj.weight": rng.standard_normal((48, 96)).astype(np.float32),
               "odd.weight": rng.standard_normal((4, 40)).astype(np.float32)}
    source = _save(tmp_path, weights, metadata={"format": "pt"})
    output = tmp_path / "out.safetensors"
    code, out = _qlinear(capsys, "quantize", source, "--dtype", "mxfp4", "-o", output, "--json",
                         *(["--scale-rule", rule] if rule else []))
    assert code == 0, out
    rows = {row["name"]: row for row in json.loads(out)["tensors"]}
    assert rows["block.0.mlp.mlp1_weight"]["to"] == "mxfp4" and rows["proj.weight"]["quantized"]
    assert not rows["odd.weight"]["quantized"] and "32-element blocks" in rows["odd.weight"]["note"]
    assert not rows["block.0.mlp.mlp1_bias"]["quantized"]
    back = safetensors_numpy.load_file(str(output))
    assert set(back) == {"block.0.mlp.mlp1_weight.blocks", "block.0.mlp.mlp1_weight.scales", "proj.weight.blocks",
                         "proj.weight.scales", "block.0.mlp.mlp1_bias", "odd.weight"}
    for name in ("block.0.mlp.mlp1_weight", "proj.weight"):
        codes, scales = mx.quantize(weights[name].astype(np.float32), "mxfp4", axis=-1, scale_rule=rule)
        blocks, scale_bytes = back[name + ".blocks"], back[name + ".scales"]
        assert blocks.dtype == np.uint8 and blocks.shape == scales.shape + (16,)
        np.testing.assert_array_equal(gpt_oss_decode(blocks, scale_bytes), mx.dequantize(codes, scales))
        np.testing.assert_array_equal(scale_bytes, scales.view(np.uint8))
        x = weights[name].astype(np.float64)
        noise = np.sum((x - gpt_oss_decode(blocks, scale_bytes)) ** 2)
        assert rows[name]["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(x * x) / noise))
        assert rows[name]["bytes_after"] == blocks.nbytes + scale_bytes.nbytes
    for name in ("block.0.mlp.mlp1_bias", "odd.weight"):
        np.testing.assert_array_equal(back[name].view(np.uint8), weights[name].view(np.uint8))
    with safe_open(str(output), framework="np") as f:
        metadata = f.metadata()
    assert metadata["format"] == "pt"
    recorded = json.loads(metadata["qlinear_mx"])
    assert recorded["scale_rule"] == (rule or "floor")
    assert recorded["tensors"]["proj.weight"]["source_dtype"] == "float32"

    # and back: the dtype each tensor had, gpt-oss's decoded values
    restored = tmp_path / "restored.safetensors"
    code, out = _qlinear(capsys, "dequantize", output, "-o", restored)
    assert code == 0, out
    again = safetensors_numpy.load_file(str(restored))
    assert set(again) == set(weights)
    for name in ("block.0.mlp.mlp1_weight", "proj.weight"):
        assert again[name].dtype == weights[name].dtype
        expected = gpt_oss_decode(back[name + ".blocks"], back[name + ".scales"]).astype(weights[name].dtype)
        np.testing.assert_array_equal(again[name], expected)
    with safe_open(str(restored), framework="np") as f:
        assert f.metadata() == {"format": "pt"}


@pytest.mark.parametrize("layout", CHECKPOINTS)
def test_command_dequantize_gpt_oss_checkpoint(tmp_path, capsys, layout):
    """gpt-oss's own checkpoints (qlinear did not write them): each pair becomes NAME in bfloat16, what
    gpt-oss's loader makes of it; the rest is copied."""
    make, separator, names = CHECKPOINTS[layout]
    original = make(np.random.default_rng(8))
    source = _save(tmp_path, original, metadata={"format": "pt"})
    output = tmp_path / "bf16.safetensors"
    code, out = _qlinear(capsys, "dequantize", source, "-o", output)
    assert code == 0, out
    back = safetensors_numpy.load_file(str(output))
    plain = {n for n in original if not n.endswith(("blocks", "scales"))}
    assert set(back) == set(names) | plain
    for name in names:
        expected = gpt_oss_decode(original[name + separator + "blocks"], original[name + separator + "scales"])
        assert back[name].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(back[name].astype(np.float32), expected)  # exact: bf16 holds them all
    for name in plain:
        np.testing.assert_array_equal(back[name].view(np.uint8), original[name].view(np.uint8))

    # quantizing the MXFP4 checkpoint again: its pairs (uint8) are copied, its bf16 weights quantized
    again = tmp_path / "again.safetensors"
    code, out = _qlinear(capsys, "quantize", source, "--dtype", "mxfp4", "-o", again, "--exclude", "*embedding*")
    assert code == 0, out
    requantized = safetensors_numpy.load_file(str(again))
    for name in names:
        for suffix in ("blocks", "scales"):
            np.testing.assert_array_equal(requantized[name + separator + suffix], original[name + separator + suffix])


def test_command_refusals(tmp_path, capsys):
    rng = np.random.default_rng(9)
    source = _save(tmp_path, {"w": rng.standard_normal((8, 64)).astype(np.float32)})
    err = _qlinear_fails(capsys, "quantize", source, "--dtype", "mxfp8_e4m3", "-o", tmp_path / "o.safetensors")
    assert "and MXFP4 and NVFP4 into .safetensors checkpoints, in gpt-oss's and Model Optimizer's layouts" in err
    np.savez(tmp_path / "w.npz", w=rng.standard_normal((8, 64)).astype(np.float32))
    err = _qlinear_fails(capsys, "quantize", tmp_path / "w.npz", "--dtype", "mxfp4", "-o", tmp_path / "o.npz")
    assert "the MX formats are written into ONNX models only" in err
    err = _qlinear_fails(capsys, "quantize", source, "--dtype", "mxfp4", "--axis", "0",
                         "-o", tmp_path / "o.safetensors")
    assert "gpt-oss's (NAME.blocks, NAME.scales) layout blocks the last axis (1), not axis 0" in err
    clash = _save(tmp_path, {"w": rng.standard_normal((8, 64)).astype(np.float32), "w.blocks": np.zeros(3, np.uint8)},
                  "clash.safetensors")
    err = _qlinear_fails(capsys, "quantize", clash, "--dtype", "mxfp4", "-o", tmp_path / "o.safetensors")
    assert "already has a tensor named 'w.blocks'" in err
    bad = _save(tmp_path, {"a.blocks": np.zeros((4, 2, 16), np.uint8), "a.scales": np.zeros((4, 3), np.uint8)},
                "bad.safetensors")
    err = _qlinear_fails(capsys, "dequantize", bad, "-o", tmp_path / "o.safetensors")
    assert "MXFP4 tensor 'a'" in err
    assert not (tmp_path / "o.safetensors").exists() and not (tmp_path / "o.npz").exists()


def test_command_in_bands(tmp_path, capsys, monkeypatch):
    """The command quantizes and dequantizes a band of rows at a time; the files are the same."""
    rng = np.random.default_rng(10)
    source = _save(tmp_path, {"w": _bf16(rng, (E, 2 * I, H)), "v": rng.standard_normal((33, 64)).astype(np.float32)})
    outputs = {}
    for chunk in (None, 1000):
        if chunk is not None:
            monkeypatch.setattr(mx_checkpoint, "_CHUNK_BYTES", chunk)
        q, d = tmp_path / f"q{chunk}.safetensors", tmp_path / f"d{chunk}.safetensors"
        assert _qlinear(capsys, "quantize", source, "--dtype", "mxfp4", "-o", q)[0] == 0
        assert _qlinear(capsys, "dequantize", q, "-o", d)[0] == 0
        outputs[chunk] = (q.read_bytes(), d.read_bytes())
    assert outputs[None] == outputs[1000]
