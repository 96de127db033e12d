"""NVFP4 checkpoints in TensorRT Model Optimizer's layout (its unified Hugging Face export, which vLLM, SGLang
and TensorRT-LLM load): safetensors files in which a quantized weight ``MODULE.weight`` is stored as

- ``MODULE.weight``: uint8 of shape ``S + (K/2,)``, two float4 e2m1 codes a byte, element 2i in the low
  nibble and element 2i+1 in the high nibble of byte i (``NVFP4QTensor.quantize``'s ``_quantized_data``);
- ``MODULE.weight_scale``: float8_e4m3fn (safetensors ``F8_E4M3``) of shape ``S + (K/16,)``, the block scales;
- ``MODULE.weight_scale_2``: float32, the tensor scale: one value (shape ``()`` or ``(1,)``), or one per
  expert for a weight ``(E, N, K/2)`` of mixture-of-experts layers (shape ``(E,)``);
- optionally ``MODULE.input_scale``: float32, the activations' tensor scale (an ordinary tensor here).

A weight decodes to ``code * float32(block scale) * weight_scale_2``, which is `qlinear.mx.dequantize` of
``(codes, block scales)`` with ``global_scale=weight_scale_2``. (Model Optimizer 0.47.0,
modelopt/torch/export/unified_export_hf.py and qtensor/nvfp4_tensor.py; the names and the packing are read
there and checked against its quantizer in tests/io/test_nvfp4_checkpoint.py.) Its quantizer is
`qlinear.mx.quantize(w, "nvfp4", scale_rule="modelopt", global_scale=weight_scale_2)` bit for bit, so a
checkpoint's codes can be checked against the float weights they came from (docs/mx.md).

The safetensors bytes are read by `tensor_files` (memory-mapped; no `safetensors` package).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import mx
from ...kernels import bfloat16
from .mx_checkpoint import Checkpoint, _code, read_grouped

BLOCK = 16  # values per NVFP4 block
CODES = np.dtype(ml_dtypes.float4_e2m1fn)
SCALES = np.dtype(ml_dtypes.float8_e4m3fn)
SUFFIXES = (".weight", ".weight_scale", ".weight_scale_2")


def to_modelopt(codes, block_scales, global_scale) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pack NVFP4 ``(codes, block_scales, global_scale)`` (`qlinear.mx.quantize`'s output, blocks along the last
    axis, which must hold whole blocks) into Model Optimizer's ``(weight, weight_scale, weight_scale_2)``.

    >>> import numpy as np, ml_dtypes
    >>> codes = np.array([[0.5, -6.0] + [0.0] * 14], ml_dtypes.float4_e2m1fn)
    >>> weight, weight_scale, weight_scale_2 = to_modelopt(codes, np.array([[2.0]], ml_dtypes.float8_e4m3fn),
    ...                                                    np.float32(0.25))
    >>> hex(weight[0, 0]), weight.shape, weight_scale.dtype.name, weight_scale_2
    ('0xf1', (1, 8), 'float8_e4m3fn', array(0.25, dtype=float32))
    """
    codes, block_scales = np.asarray(codes), np.asarray(block_scales)
    g = np.asarray(global_scale)
    _check_codes(codes, block_scales, g, "to_modelopt")
    bits = np.ascontiguousarray(codes).view(np.uint8)
    weight = (bits[..., 0::2] & np.uint8(0x0F)) | ((bits[..., 1::2] & np.uint8(0x0F)) << np.uint8(4))
    return weight, np.ascontiguousarray(block_scales).copy(), np.asarray(g, np.float32).copy()


def from_modelopt(weight, weight_scale, weight_scale_2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unpack Model Optimizer's ``(weight, weight_scale, weight_scale_2)`` into NVFP4 ``(codes, block_scales,
    global_scale)``, the inverse of `to_modelopt`: codes float4_e2m1fn of shape ``S + (2 * weight.shape[-1],)``,
    the block scales as float8_e4m3fn, the tensor scale(s) as float32 (0-d when one value).

    >>> import numpy as np, ml_dtypes
    >>> codes, scales, g = from_modelopt(np.full((1, 8), 0xF1, np.uint8), np.array([[2.0]], ml_dtypes.float8_e4m3fn),
    ...                                  np.array([0.25], np.float32))
    >>> codes[0, :4].astype(np.float32), g
    (array([ 0.5, -6. ,  0.5, -6. ], dtype=float32), array(0.25, dtype=float32))
    """
    weight, weight_scale, g = (np.asarray(a) for a in (weight, weight_scale, weight_scale_2))
    if weight_scale.dtype == np.uint8:  # the bytes, as a file without float8 support may hand them over
        weight_scale = weight_scale.view(SCALES)
    _check_packed(weight, weight_scale, g, "from_modelopt")
    codes = np.empty(weight.shape[:-1] + (weight.shape[-1], 2), np.uint8)
    codes[..., 0] = weight & np.uint8(0x0F)
    codes[..., 1] = weight >> np.uint8(4)
    codes = codes.reshape(weight.shape[:-1] + (2 * weight.shape[-1],)).view(CODES)
    g = g.astype(np.float32).reshape(()) if g.size == 1 else g.astype(np.float32)
    return codes, np.ascontiguousarray(weight_scale).copy(), g


def _check_global(g: np.ndarray, leading: tuple, where: str) -> None:
    if g.dtype != np.float32:
        raise TypeError(f"{where}: weight_scale_2 must be float32, got {g.dtype}")
    if g.size != 1 and tuple(g.shape) != tuple(leading[: g.ndim]):
        raise ValueError(f"{where}: weight_scale_2 must be one value or one per leading index of the weight "
                         f"(shape {tuple(leading[:1])} for experts), got shape {g.shape}")


def _check_codes(codes: np.ndarray, scales: np.ndarray, g: np.ndarray, where: str) -> None:
    if codes.dtype != CODES:
        raise TypeError(f"{where}: codes must be float4_e2m1fn (ml_dtypes), got {codes.dtype}")
    if scales.dtype != SCALES:
        raise TypeError(f"{where}: block_scales must be float8_e4m3fn (ml_dtypes), got {scales.dtype}")
    if codes.ndim == 0 or codes.shape[-1] % BLOCK:
        raise ValueError(f"{where}: the last axis of codes must be a whole number of {BLOCK}-element blocks "
                         f"(Model Optimizer's layout has no partial block), got shape {codes.shape}")
    if scales.shape != codes.shape[:-1] + (codes.shape[-1] // BLOCK,):
        raise ValueError(f"{where}: block_scales must have codes' shape with the last axis divided by {BLOCK}, "
                         f"{codes.shape[:-1] + (codes.shape[-1] // BLOCK,)}, got {scales.shape}")
    _check_global(g, codes.shape[:-1], where)


def _check_packed(weight: np.ndarray, scales: np.ndarray, g: np.ndarray, where: str) -> None:
    if weight.dtype != np.uint8:
        raise TypeError(f"{where}: weight must be uint8 (two float4 codes a byte), got {weight.dtype}")
    if scales.dtype != SCALES:
        raise TypeError(f"{where}: weight_scale must be float8_e4m3fn, got {scales.dtype}")
    if weight.ndim == 0 or weight.shape[-1] % (BLOCK // 2):
        raise ValueError(f"{where}: the last axis of weight must hold whole blocks of {BLOCK // 2} bytes, got "
                         f"shape {weight.shape}")
    if scales.shape != weight.shape[:-1] + (weight.shape[-1] * 2 // BLOCK,):
        raise ValueError(f"{where}: weight_scale must have shape {weight.shape[:-1] + (weight.shape[-1] * 2 // BLOCK,)}"
                         f" (one scale per {BLOCK} values), got {scales.shape}")
    _check_global(g, weight.shape[:-1], where)


class NVFP4Tensor:
    """An NVFP4 weight in Model Optimizer's layout: the stored ``weight``, ``weight_scale`` and ``weight_scale_2``;
    ``codes, block_scales, global_scale = tensor`` unpacks it (`from_modelopt`) and `dequantize` decodes it.
    Read from a file, the arrays are memory maps and nothing is cached."""

    def __init__(self, weight, weight_scale, weight_scale_2):
        weight, weight_scale, g = (np.asarray(a) for a in (weight, weight_scale, weight_scale_2))
        if weight_scale.dtype == np.uint8:
            weight_scale = weight_scale.view(SCALES)
        _check_packed(weight, weight_scale, g, "NVFP4Tensor")
        self.weight, self.weight_scale, self.weight_scale_2 = weight, weight_scale, g

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[:-1]) + (2 * self.weight.shape[-1],)

    def __iter__(self):
        return iter(from_modelopt(self.weight, self.weight_scale, self.weight_scale_2))

    def dequantize(self, dtype=ml_dtypes.bfloat16) -> np.ndarray:
        """The values, code * float32(block scale) * tensor scale in float32 (`qlinear.mx.dequantize`), then in
        ``dtype`` (bfloat16, the type Model Optimizer's checkpoints decode to, by default)."""
        codes, scales, g = from_modelopt(self.weight, self.weight_scale, self.weight_scale_2)
        if g.ndim == 0:
            return bfloat16.cast(mx.dequantize(codes, scales, global_scale=g), dtype)
        out = np.empty(codes.shape, dtype)
        for index in np.ndindex(g.shape):  # one tensor scale per expert
            out[index] = bfloat16.cast(mx.dequantize(codes[index], scales[index], global_scale=g[index]), dtype)
        return out

    def __repr__(self) -> str:
        return f"NVFP4Tensor(shape={self.shape}, block_scales={tuple(self.weight_scale.shape)})"


def nvfp4_names(name: str) -> tuple[str, str, str]:
    """The names of an NVFP4 tensor's three parts in a file: ``NAME`` (packed codes), ``NAME_scale`` and
    ``NAME_scale_2``, which for Model Optimizer's ``MODULE.weight`` are ``.weight_scale`` and ``.weight_scale_2``."""
    return name, name + "_scale", name + "_scale_2"


def nvfp4_triples(entries) -> dict[str, tuple[str, str, str]]:
    """The NVFP4 tensors among a file's tensors: ``{NAME: (NAME, NAME_scale, NAME_scale_2)}`` for each U8
    ``NAME`` with an F8_E4M3 ``NAME_scale`` and an F32 ``NAME_scale_2`` (`nvfp4_names`); shapes or types that
    do not fit the layout are a ValueError naming the tensor."""
    return _triples(entries, nvfp4_names, "NVFP4 tensor {!r}", "it, its _scale and its _scale_2", "it")


def _triples(entries, names_of, what: str, parts: str, codes_are: str) -> dict[str, tuple[str, str, str]]:
    """The NVFP4 triples of one layout among a file's tensors: ``{NAME: names_of(NAME)}`` wherever all three of
    ``names_of(NAME)`` (packed codes, block scales, tensor scale; NAME found from the tensor scale's name) are
    present; types other than U8, F8_E4M3 and F32, or shapes other than S + (K/2,) and S + (K/16,), are a
    ValueError. Messages: ``what`` (formatted with NAME), then ``parts`` (the three, for the types) or
    ``codes_are`` (the packed codes, for the shapes)."""
    by_name = {entry.name: entry for entry in entries}
    probe = names_of("")
    triples = {}
    for name, entry in by_name.items():
        if not name.endswith(probe[2]):
            continue
        base = name[: len(name) - len(probe[2])]
        names = names_of(base)
        packed, scale = by_name.get(names[0]), by_name.get(names[1])
        if packed is None or scale is None or not base:
            continue
        label = what.format(base)
        codes = (_code(packed), _code(scale), _code(entry))
        if codes != ("U8", "F8_E4M3", "F32"):
            raise ValueError(f"{label}: {parts} must be U8, F8_E4M3 and F32, got {', '.join(map(str, codes))}")
        shape, scale_shape = tuple(packed.shape), tuple(scale.shape)
        if not shape or shape[-1] % (BLOCK // 2) or scale_shape != shape[:-1] + (shape[-1] * 2 // BLOCK,):
            raise ValueError(f"{label}: {codes_are.format(names[0])} must have shape S + (K/2,) and {names[1]!r} "
                             f"S + (K/16,), got {list(shape)} and {list(scale_shape)}")
        triples[base] = names
    return triples


# llm-compressor's NVFP4 (compressed-tensors' "nvfp4-pack-quantized" format, which vLLM loads too): a quantized
# MODULE.weight is stored as MODULE.weight_packed (uint8, the same packing as Model Optimizer's),
# MODULE.weight_scale (float8_e4m3fn block scales) and MODULE.weight_global_scale (float32, shape (1,)), by which
# the block scales are divided: its decoder computes code * float32(float32(block scale) / global scale), then
# casts to bfloat16 (compressed-tensors 0.20.1, NVFP4PackedCompressor.decompress: forward_helpers._dequantize;
# checked against it in tests/io/test_nvfp4_compressed_tensors.py).
COMPRESSED_SUFFIXES = ("_packed", "_scale", "_global_scale")


def compressed_names(name: str) -> tuple[str, str, str]:
    """compressed-tensors' names of an NVFP4 weight's three parts: ``NAME_packed``, ``NAME_scale``,
    ``NAME_global_scale`` (``MODULE.weight_packed``, ... for ``MODULE.weight``)."""
    return tuple(name + suffix for suffix in COMPRESSED_SUFFIXES)


def compressed_triples(entries) -> dict[str, tuple[str, str, str]]:
    """The NVFP4 weights in compressed-tensors' layout among a file's tensors: ``{NAME: compressed_names(NAME)}``
    for each U8 ``NAME_packed`` with an F8_E4M3 ``NAME_scale`` and an F32 ``NAME_global_scale``; shapes or types
    that do not fit are a ValueError naming the weight."""
    return _triples(entries, compressed_names, "NVFP4 weight {!r} (compressed-tensors)",
                    "its _packed, _scale and _global_scale", "{!r}")


class CompressedNVFP4Tensor:
    """One NVFP4 weight as compressed-tensors stores it: ``(weight_packed, weight_scale, weight_global_scale)``
    (the global scale one value of shape (1,) or (), or one per leading index, e.g. per expert).

    >>> import numpy as np, ml_dtypes
    >>> packed = np.array([[0x21] + [0] * 7], np.uint8)          # codes 1 (0.5) and 2 (1.0), then zeros
    >>> t = CompressedNVFP4Tensor(packed, np.array([[3.0]], ml_dtypes.float8_e4m3fn), np.array([4.0], np.float32))
    >>> t.dequantize()[0, :3].astype(np.float32)                # code * float32(3 / 4), then bfloat16
    array([0.375, 0.75 , 0.   ], dtype=float32)
    """

    def __init__(self, weight_packed, weight_scale, weight_global_scale):
        weight_packed, weight_scale = np.asarray(weight_packed), np.asarray(weight_scale)
        g = np.asarray(weight_global_scale)
        if weight_scale.dtype == np.uint8:
            weight_scale = weight_scale.view(SCALES)
        _check_packed(weight_packed, weight_scale, g, "CompressedNVFP4Tensor")
        self.weight_packed, self.weight_scale, self.weight_global_scale = weight_packed, weight_scale, g

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight_packed.shape[:-1]) + (2 * self.weight_packed.shape[-1],)

    def dequantize(self, dtype=ml_dtypes.bfloat16) -> np.ndarray:
        """code * float32(float32(block scale) / global scale), in float32, then in ``dtype`` (bfloat16,
        compressed-tensors' own, by default): its decoder's values, bit for bit."""
        codes, scales, g = from_modelopt(self.weight_packed, self.weight_scale, self.weight_global_scale)
        divisor = np.asarray(g, np.float32).reshape(g.shape + (1,) * (scales.ndim - g.ndim))
        d = (scales.astype(np.float32) / divisor).astype(np.float32)
        values = codes.astype(np.float32).reshape(scales.shape + (BLOCK,)) * d[..., None]
        return bfloat16.cast(values.reshape(codes.shape), dtype)


# Linear layers that inference engines fuse into one GEMM (they share an input), by the names Hugging Face models
# give them. vLLM keeps one weight_scale_2 for such a fused weight: the largest of the shards' for q/k/v and
# gate/up (`ModelOptNvFp4LinearMethod`), the gate's for a mixture-of-experts w13 (`ModelOptNvFp4FusedMoE`, which
# warns "w1_weight_scale_2 must match w3_weight_scale_2"), so a shard quantized against another tensor scale
# decodes wrongly there. Model Optimizer's export gives them one (the largest amax: `preprocess_linear_fusion`).
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"))


def fused_groups(names) -> list[tuple[str, ...]]:
    """The groups of two or more weights among ``names`` that are siblings of one `FUSED_SIBLINGS` family under
    one module (``P.q_proj.weight``, ``P.k_proj.weight``, ``P.v_proj.weight``: P the same), in the family's order.

    >>> for group in fused_groups(["m.attn.q_proj.weight", "m.attn.k_proj.weight", "m.attn.v_proj.weight",
    ...                            "m.attn.o_proj.weight", "m.mlp.gate_proj.weight", "m.mlp.up_proj.weight",
    ...                            "n.mlp.up_proj.weight"]):
    ...     print(group)
    ('m.attn.q_proj.weight', 'm.attn.k_proj.weight', 'm.attn.v_proj.weight')
    ('m.mlp.gate_proj.weight', 'm.mlp.up_proj.weight')
    """
    present = set(names)
    groups, seen = [], set()
    for name in names:
        parts = name.rsplit(".", 2)
        if len(parts) != 3 or parts[2] != "weight":
            continue
        prefix, leaf, _ = parts
        for family in FUSED_SIBLINGS:
            if leaf in family:
                members = tuple(f"{prefix}.{sibling}.weight" for sibling in family
                                if f"{prefix}.{sibling}.weight" in present)
                if len(members) > 1 and members not in seen:
                    seen.add(members)
                    groups.append(members)
    return groups


def read_nvfp4_checkpoint(path) -> Checkpoint:
    """Read a safetensors checkpoint in Model Optimizer's NVFP4 layout, or compressed-tensors' (llm-compressor's):
    ``{NAME: NVFP4Tensor | CompressedNVFP4Tensor | np.ndarray}``.

    Each quantized ``MODULE.weight`` becomes one `NVFP4Tensor` under its own name (its ``weight_scale`` and
    ``weight_scale_2`` are folded in); every other tensor (``input_scale`` included) is a read-only
    memory-mapped array. Tensors keep the file's order; ``.metadata`` holds the file's metadata. A file that
    is not safetensors, or a tensor of a type NumPy cannot hold, raises ValueError."""
    def groups_of(entries):
        return {**nvfp4_triples(entries), **compressed_triples(entries)}

    def build(weight, names, arrays):
        return CompressedNVFP4Tensor(*arrays) if names[0].endswith("_packed") else NVFP4Tensor(*arrays)

    return read_grouped(path, groups_of, build)


__all__ = ["NVFP4Tensor", "to_modelopt", "from_modelopt", "nvfp4_names", "nvfp4_triples", "read_nvfp4_checkpoint",
           "FUSED_SIBLINGS", "fused_groups", "CompressedNVFP4Tensor", "compressed_names", "compressed_triples"]
