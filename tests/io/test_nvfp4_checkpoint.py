"""NVFP4 checkpoints in TensorRT Model Optimizer's layout (qlinear.io.formats.nvfp4_checkpoint).

The checkpoints here are made the way Model Optimizer's export makes them: ``NVFP4QTensor.quantize`` (run on
the CPU) gives the packed weight, the E4M3 block scales and the tensor scale, saved with the ``safetensors``
package from torch tensors under its export's names (``MODULE.weight``, ``.weight_scale``, ``.weight_scale_2``,
``.input_scale``). qlinear reads them back to the same codes, decodes them to Model Optimizer's own
``NVFP4QTensor.dequantize`` values, and re-quantizing the float weights with ``scale_rule="modelopt"`` and the
file's tensor scale gives the file's bytes: the check a user runs on a published checkpoint."""

from __future__ import annotations

import doctest
import warnings

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx
from qlinear.io.formats import nvfp4_checkpoint
from qlinear.io.formats.nvfp4_checkpoint import NVFP4Tensor, from_modelopt, read_nvfp4_checkpoint, to_modelopt

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")

F32 = np.float32


def test_module_examples():
    assert doctest.testmod(nvfp4_checkpoint, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE).failed == 0


def load(path) -> dict[str, np.ndarray]:
    """A safetensors file as torch (what the runtimes that load these checkpoints use) reads it, in NumPy."""
    out = {}
    for name, t in safetensors_torch.load_file(str(path)).items():
        if t.dtype == torch.float8_e4m3fn:
            out[name] = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        elif t.dtype == torch.bfloat16:
            out[name] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            out[name] = t.numpy()
    return out


def codes_of(tensor) -> np.ndarray:
    return next(iter(tensor)).view(np.uint8)


def _export(weight: torch.Tensor, per_expert: bool = False):
    """(packed weight, weight_scale, weight_scale_2) as Model Optimizer's export computes and stores them."""
    g = None
    if per_expert:  # one tensor scale per expert, as the export passes it for MoE weights
        g = weight.float().abs().amax(dim=(-2, -1)) / (6.0 * 448.0)
    q, scale, g = nvfp4_tensor.NVFP4QTensor.quantize(weight, 16, weights_scaling_factor_2=None if g is None
                                                     else g.view(-1, 1, 1))
    return q._quantized_data, scale, g.reshape(-1) if per_expert else g.squeeze()


@pytest.fixture
def checkpoint(tmp_path):
    rng = np.random.default_rng(1)
    dense = torch.from_numpy(rng.standard_normal((96, 256)).astype(F32)).to(torch.bfloat16)
    experts = torch.from_numpy((rng.standard_normal((3, 32, 64)) * [[[1.0]], [[20.0]], [[0.01]]]).astype(F32))
    experts = experts.to(torch.bfloat16)
    tensors = {"model.embed.weight": torch.ones(4, 8, dtype=torch.bfloat16)}
    for module, weight, per_expert in (("model.layers.0.mlp.down_proj", dense, False),
                                       ("model.layers.0.mlp.experts", experts, True)):
        packed, scale, g = _export(weight, per_expert)
        tensors[module + ".weight"] = packed
        tensors[module + ".weight_scale"] = scale
        tensors[module + ".weight_scale_2"] = g.float().contiguous()
        tensors[module + ".input_scale"] = torch.tensor(0.01)
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    return path, {"dense": dense, "experts": experts}, tensors


def test_read_gives_model_optimizers_codes_and_values(checkpoint):
    path, weights, stored = checkpoint
    ckpt = read_nvfp4_checkpoint(path)
    assert sorted(ckpt) == ["model.embed.weight", "model.layers.0.mlp.down_proj.input_scale",
                            "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.experts.input_scale",
                            "model.layers.0.mlp.experts.weight"]
    assert ckpt.metadata == {"format": "pt"}
    for module, weight, per_expert in (("model.layers.0.mlp.down_proj", weights["dense"], False),
                                       ("model.layers.0.mlp.experts", weights["experts"], True)):
        tensor = ckpt[module + ".weight"]
        assert isinstance(tensor, NVFP4Tensor) and tensor.shape == tuple(weight.shape)
        # the values: Model Optimizer's own dequantization, in bfloat16, bit for bit but for the sign of zero
        # (its decoding table maps code 8, E2M1's -0, to +0; qlinear and ONNX's DequantizeLinear keep -0)
        scale, g = stored[module + ".weight_scale"], stored[module + ".weight_scale_2"]
        qtensor = nvfp4_tensor.NVFP4QTensor(weight.shape, torch.bfloat16, stored[module + ".weight"])
        theirs = qtensor.dequantize(dtype=torch.bfloat16, scale=scale, double_scale=g.view(-1, 1, 1) if per_expert
                                    else g, block_sizes={-1: 16})
        ours = tensor.dequantize()
        assert ours.dtype == np.dtype(ml_dtypes.bfloat16)
        theirs = theirs.view(torch.int16).numpy().view(np.uint16)
        zero = (ours == 0) & (ours.view(np.uint16) != theirs)
        assert np.all(codes_of(tensor)[zero] == 8) and np.all(theirs[zero] == 0)
        np.testing.assert_array_equal(np.where(zero, np.uint16(0), ours.view(np.uint16)), theirs)
        # the codes: re-quantizing the float weights by Model Optimizer's rule with the file's tensor scale
        codes, block_scales, g_file = tensor
        w = weight.float().numpy()
        if per_expert:
            for e in range(w.shape[0]):
                again = mx.quantize(w[e], "nvfp4", scale_rule="modelopt", global_scale=g_file[e])
                np.testing.assert_array_equal(again[0].view(np.uint8), codes[e].view(np.uint8))
                np.testing.assert_array_equal(again[1].view(np.uint8), block_scales[e].view(np.uint8))
        else:
            again = mx.quantize(w, "nvfp4", scale_rule="modelopt", global_scale=g_file)
            np.testing.assert_array_equal(again[0].view(np.uint8), codes.view(np.uint8))
            np.testing.assert_array_equal(again[1].view(np.uint8), block_scales.view(np.uint8))
            assert g_file == again[2]  # the tensor scale is the weight's own: amax / 2688
    np.testing.assert_array_equal(ckpt["model.layers.0.mlp.experts.input_scale"], F32(0.01))


def test_pack_round_trip_and_model_optimizers_packing():
    w = np.random.default_rng(2).standard_normal((8, 48)).astype(F32)
    codes, scales, g = mx.quantize(w, "nvfp4", scale_rule="modelopt")
    weight, weight_scale, weight_scale_2 = to_modelopt(codes, scales, g)
    packed, their_scale, their_g = _export(torch.from_numpy(w.copy()))
    np.testing.assert_array_equal(weight, packed.numpy())
    np.testing.assert_array_equal(weight_scale.view(np.uint8), their_scale.view(torch.uint8).numpy())
    assert weight_scale_2 == F32(their_g.item())
    back = from_modelopt(weight, weight_scale, weight_scale_2)
    for a, b in zip(back, (codes, scales, g)):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8) if np.asarray(a).itemsize == 1 else a,
                                      np.asarray(b).view(np.uint8) if np.asarray(b).itemsize == 1 else b)


@pytest.mark.parametrize("call, error, words", [
    (lambda: to_modelopt(np.zeros((2, 20), ml_dtypes.float4_e2m1fn), np.zeros((2, 2), ml_dtypes.float8_e4m3fn),
                         F32(1)), ValueError, "whole number of 16-element blocks"),
    (lambda: to_modelopt(np.zeros((2, 16), np.uint8), np.zeros((2, 1), ml_dtypes.float8_e4m3fn), F32(1)),
     TypeError, "codes must be float4_e2m1fn"),
    (lambda: from_modelopt(np.zeros((2, 8), np.uint8), np.zeros((2, 2), ml_dtypes.float8_e4m3fn), F32(1)),
     ValueError, "weight_scale must have shape"),
    (lambda: from_modelopt(np.zeros((2, 8), np.uint8), np.zeros((2, 1), ml_dtypes.float8_e4m3fn),
                           np.ones(3, F32)), ValueError, "weight_scale_2 must be one value or one per"),
    (lambda: NVFP4Tensor(np.zeros((2, 8), np.int8), np.zeros((2, 1), ml_dtypes.float8_e4m3fn), F32(1)),
     TypeError, "weight must be uint8"),
    (lambda: NVFP4Tensor(np.zeros((2, 8), np.uint8), np.zeros((2, 1), ml_dtypes.float8_e4m3fn), np.float64(1)),
     TypeError, "weight_scale_2 must be float32"),
])
def test_errors_name_the_argument_and_the_rule(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_mistyped_triple_is_a_named_error(tmp_path):
    path = tmp_path / "bad.safetensors"
    safetensors_torch.save_file({"m.weight": torch.zeros(2, 8, dtype=torch.uint8),
                                 "m.weight_scale": torch.zeros(2, 1, dtype=torch.bfloat16),
                                 "m.weight_scale_2": torch.tensor(1.0)}, str(path))
    with pytest.raises(ValueError, match="'m.weight': it, its _scale and its _scale_2 must be U8, F8_E4M3"):
        read_nvfp4_checkpoint(path)


def test_command_dequantize_model_optimizer_checkpoint(tmp_path, capsys, checkpoint):
    """qlinear dequantize: each NVFP4 weight becomes MODULE.weight in bfloat16 (NVFP4Tensor.dequantize), its
    scales go, every other tensor (input_scale included) is copied byte for byte."""
    from qlinear.cli import main

    path, _, stored = checkpoint
    output = tmp_path / "bf16.safetensors"
    assert main(["dequantize", str(path), "-o", str(output)]) == 0, capsys.readouterr().err
    back = safetensors_numpy.load_file(str(output))
    ckpt = read_nvfp4_checkpoint(path)
    weights = [name for name, t in ckpt.items() if isinstance(t, NVFP4Tensor)]
    assert sorted(weights) == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.experts.weight"]
    assert set(back) == set(ckpt)
    for name in weights:
        assert back[name].dtype == np.dtype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(back[name].view(np.uint16), ckpt[name].dequantize().view(np.uint16))
    for name in set(ckpt) - set(weights):
        np.testing.assert_array_equal(np.asarray(back[name]).reshape(-1).view(np.uint8),
                                      np.asarray(ckpt[name]).reshape(-1).view(np.uint8))


safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _quantize_command(tmp_path, capsys, weights: dict, rule):
    """``qlinear quantize model.safetensors --dtype nvfp4 [--scale-rule rule] --json`` on ``weights``: (the report's
    rows by name, the output path)."""
    import json

    from qlinear.cli import main

    source = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(weights, str(source), metadata={"format": "pt"})
    output = tmp_path / "nvfp4.safetensors"
    args = ["quantize", str(source), "--dtype", "nvfp4", "-o", str(output), "--json"]
    assert main(args + (["--scale-rule", rule] if rule else [])) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)["tensors"]}, output


@pytest.mark.parametrize("rule", [None, "modelopt"])
def test_command_quantize_fused_weights_share_a_tensor_scale(tmp_path, capsys, rule):
    """q/k/v and gate/up projections of one module (which vLLM fuses into one weight with one weight_scale_2)
    get one tensor scale, from the largest of their maxima, as Model Optimizer's export gives them; o_proj,
    down_proj and a lone sibling keep their own. Under --scale-rule modelopt each is Model Optimizer's
    quantizer's output given that shared scale."""
    rng = np.random.default_rng(13)
    scale = {"q_proj": 1.0, "k_proj": 5.0, "v_proj": 0.2, "o_proj": 3.0, "gate_proj": 0.5, "up_proj": 2.0,
             "down_proj": 7.0}
    weights = {}
    for leaf, s in scale.items():
        module = "mlp" if leaf.endswith(("gate_proj", "up_proj", "down_proj")) else "self_attn"
        weights[f"model.layers.0.{module}.{leaf}.weight"] = (rng.standard_normal((32, 64)) * s).astype(F32)
    weights["model.layers.1.mlp.up_proj.weight"] = rng.standard_normal((32, 64)).astype(F32)  # no gate_proj beside it
    rows, output = _quantize_command(tmp_path, capsys, weights, rule)
    back = load(output)
    groups = [[f"model.layers.0.self_attn.{leaf}.weight" for leaf in ("q_proj", "k_proj", "v_proj")],
              [f"model.layers.0.mlp.{leaf}.weight" for leaf in ("gate_proj", "up_proj")]]
    alone = ["model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
             "model.layers.1.mlp.up_proj.weight"]
    for group in groups + [[name] for name in alone]:
        amax = max(float(np.abs(weights[name]).max()) for name in group)
        g = F32(F32(amax) / F32(2688))
        for name in group:
            assert back[name + "_scale_2"] == g, name
            codes, scales, _ = mx.quantize(weights[name], "nvfp4", scale_rule=rule, global_scale=g)
            weight, weight_scale, _ = to_modelopt(codes, scales, g)
            np.testing.assert_array_equal(back[name], weight)
            np.testing.assert_array_equal(back[name + "_scale"].view(np.uint8), weight_scale.view(np.uint8))
            if rule == "modelopt":  # Model Optimizer's quantizer given the shared tensor scale: the same bytes
                q, their_scale, _ = nvfp4_tensor.NVFP4QTensor.quantize(
                    torch.from_numpy(weights[name]), 16, weights_scaling_factor_2=torch.tensor(g))
                np.testing.assert_array_equal(back[name], q._quantized_data.numpy())
                np.testing.assert_array_equal(back[name + "_scale"].view(np.uint8),
                                              their_scale.view(torch.uint8).numpy())
            note = rows[name]["note"] or ""
            assert ("tensor scale shared with" in note) == (len(group) > 1), (name, note)
    assert "k_proj" in rows[groups[0][0]]["note"] and "v_proj" in rows[groups[0][0]]["note"]


@pytest.mark.parametrize("rule", [None, "modelopt"])
def test_command_quantize_writes_model_optimizers_layout(tmp_path, capsys, rule, monkeypatch):
    """qlinear quantize CKPT.safetensors --dtype nvfp4: each selected weight becomes MODULE.weight (packed),
    .weight_scale and .weight_scale_2, one tensor scale per tensor (taken over the whole tensor even when it
    is quantized a band of rows at a time); with --scale-rule modelopt they are Model Optimizer's own bytes.
    qlinear dequantize brings back the dtypes the weights had."""
    from qlinear.cli import main
    from qlinear.io.formats import mx_checkpoint

    monkeypatch.setattr(mx_checkpoint, "_CHUNK_BYTES", 4096)  # bands of a few rows: the tensor scale is global
    rng = np.random.default_rng(12)
    weights = {"model.proj.weight": rng.standard_normal((96, 256)).astype(ml_dtypes.bfloat16),
               "model.fc.weight": rng.standard_normal((64, 32)).astype(np.float32) * np.float32(3),
               "model.fc.bias": rng.standard_normal(64).astype(np.float32),
               "model.odd.weight": rng.standard_normal((4, 40)).astype(np.float32),
               "model.experts.weight": rng.standard_normal((3, 32, 64)).astype(ml_dtypes.bfloat16)}
    rows, output = _quantize_command(tmp_path, capsys, weights, rule)
    assert rows["model.proj.weight"]["to"] == "nvfp4" and not rows["model.odd.weight"]["quantized"]
    assert "16-element blocks" in rows["model.odd.weight"]["note"]
    back = load(output)
    quantized = ("model.proj.weight", "model.fc.weight", "model.experts.weight")
    assert set(back) == {part for name in quantized for part in (name, name + "_scale", name + "_scale_2")} | {
        "model.fc.bias", "model.odd.weight"}
    for name in quantized:
        w = weights[name].astype(np.float32)
        codes, scales, g = mx.quantize(w, "nvfp4", scale_rule=rule)
        weight, weight_scale, weight_scale_2 = to_modelopt(codes, scales, g)
        np.testing.assert_array_equal(back[name], weight)
        np.testing.assert_array_equal(back[name + "_scale"].view(np.uint8), weight_scale.view(np.uint8))
        assert back[name + "_scale_2"].shape == () and back[name + "_scale_2"] == weight_scale_2
        if rule == "modelopt":  # Model Optimizer's quantizer on the same weight: the same bytes
            packed, their_scale, their_g = _export(torch.from_numpy(w.copy()))
            np.testing.assert_array_equal(back[name], packed.numpy())
            np.testing.assert_array_equal(back[name + "_scale"].view(np.uint8), their_scale.view(torch.uint8).numpy())
            assert back[name + "_scale_2"] == F32(their_g.item())
        x = w.astype(np.float64)  # against the values in the weight's own type, as the report measures
        restored = mx.dequantize(codes, scales, global_scale=g).astype(weights[name].dtype).astype(np.float64)
        noise = np.sum((x - restored) ** 2)
        assert rows[name]["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(x * x) / noise))
    for name in ("model.fc.bias", "model.odd.weight"):
        np.testing.assert_array_equal(back[name], weights[name])

    restored = tmp_path / "restored.safetensors"
    assert main(["dequantize", str(output), "-o", str(restored)]) == 0
    again = load(restored)
    assert set(again) == set(weights)
    for name in quantized:
        assert again[name].dtype == weights[name].dtype  # recorded by quantize
        expected = read_nvfp4_checkpoint(output)[name].dequantize(np.float32).astype(weights[name].dtype)
        np.testing.assert_array_equal(again[name], expected)
