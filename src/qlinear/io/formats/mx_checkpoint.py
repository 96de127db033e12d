"""MXFP4 checkpoints in gpt-oss's layout: safetensors files whose MXFP4 tensors are pairs of uint8 tensors.

gpt-oss (openai/gpt-oss ``gpt_oss/torch/weights.py``, ``_get_mxfp4_tensor``) and the Hugging Face
transformers port (``integrations/mxfp4.py``) store an MXFP4 tensor of logical shape ``S + (K,)`` as

- ``NAME.blocks`` (HF: ``NAME_blocks``): uint8 of shape ``S + (K/32, 16)``, the 32 float4 e2m1 codes of a
  block in 16 bytes, element 2i in the low nibble and element 2i+1 in the high nibble of byte i;
- ``NAME.scales`` (HF: ``NAME_scales``): uint8 of shape ``S + (K/32,)``, the block's e8m0 scale as its
  biased byte, so that a block decodes to ``ldexp(LUT[code], byte - 127)``.

Blocks run along the last axis. gpt-oss's own names are ``block.N.mlp.mlp1_weight.blocks``; HF's are
``model.layers.N.mlp.experts.gate_up_proj_blocks`` ([E, 2I, H/32, 16]) and ``..._scales`` ([E, 2I, H/32]).
Every other tensor (bf16 in gpt-oss) is an ordinary tensor.

In qlinear an MXFP4 tensor is a pair ``(codes, scales)``: codes ``ml_dtypes.float4_e2m1fn`` of the logical
shape and scales ``ml_dtypes.float8_e8m0fnu`` with the last axis divided by 32 (`qlinear.mx`'s
convention). ml_dtypes keeps one float4 code per byte in its low four bits, and the e8m0 byte is the
biased exponent, so the conversion is bit manipulation only: no value is rounded.

The safetensors bytes are read and written by `tensor_files` (memory-mapped; no `safetensors` package).
`qlinear.io.mx_files` runs `qlinear quantize --dtype mxfp4` and `qlinear dequantize` on such files;
docs/mxfp4-checkpoints.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes
import numpy as np

from ... import mx
from ...kernels import bfloat16
from ..atomic import atomic_output
from ..errors import UserError
from .tensor_files import SAFETENSORS_CODES, Planned, SafetensorsReader, SafetensorsWriter

BLOCK = 32  # values per MXFP4 block
BLOCK_BYTES = BLOCK // 2  # bytes per block in gpt-oss's layout
SEPARATORS = (".", "_")  # "NAME.blocks" (gpt-oss) and "NAME_blocks" (Hugging Face transformers)
CODES = np.dtype(ml_dtypes.float4_e2m1fn)
SCALES = np.dtype(ml_dtypes.float8_e8m0fnu)
_CHUNK_BYTES = 64 << 20  # bytes of blocks converted or copied at a time when writing


# ----------------------------------------------------------------------------------------------------
# One tensor: (codes, scales) <-> (blocks, scale bytes)


def to_gpt_oss(codes, scales) -> tuple[np.ndarray, np.ndarray]:
    """Pack MXFP4 ``(codes, scales)`` into gpt-oss's ``(blocks, scale_bytes)``, both uint8.

    ``codes``: float4_e2m1fn, shape ``S + (K,)`` with K a multiple of 32; ``scales``: float8_e8m0fnu, shape
    ``S + (K/32,)``. Returns ``blocks`` of shape ``S + (K/32, 16)`` (element 2i in the low nibble of byte i,
    element 2i+1 in the high nibble) and ``scale_bytes`` of shape ``S + (K/32,)`` (the biased e8m0 bytes).

    >>> import numpy as np, ml_dtypes
    >>> codes = np.array([[0.5, -6.0] + [0.0] * 30], ml_dtypes.float4_e2m1fn)
    >>> blocks, scale_bytes = to_gpt_oss(codes, np.array([[1.0]], ml_dtypes.float8_e8m0fnu))
    >>> hex(blocks[0, 0, 0]), scale_bytes
    ('0xf1', array([[127]], dtype=uint8))
    """
    codes, scales = np.asarray(codes), np.asarray(scales)
    _check_codes(codes, scales, "to_gpt_oss")
    k = codes.shape[-1]
    bits = np.ascontiguousarray(codes).view(np.uint8).reshape(codes.shape[:-1] + (k // BLOCK, BLOCK_BYTES, 2))
    low, high = bits[..., 0] & np.uint8(0x0F), bits[..., 1] & np.uint8(0x0F)
    blocks = low | (high << np.uint8(4))
    return blocks, np.ascontiguousarray(scales).view(np.uint8).copy()


def _check_codes(codes: np.ndarray, scales: np.ndarray, where: str) -> None:
    if codes.dtype != CODES:
        raise TypeError(f"{where}: codes must be float4_e2m1fn (ml_dtypes), got {codes.dtype}")
    if scales.dtype != SCALES:
        raise TypeError(f"{where}: scales must be float8_e8m0fnu (ml_dtypes), got {scales.dtype}")
    if codes.ndim == 0:
        raise ValueError(f"{where}: codes must have at least one axis (the blocks run along the last one)")
    k = codes.shape[-1]
    if k % BLOCK:
        raise ValueError(f"{where}: the last axis of codes must be a whole number of {BLOCK}-element blocks "
                         f"(gpt-oss's layout has no partial block), got {k} in shape {codes.shape}")
    expected = codes.shape[:-1] + (k // BLOCK,)
    if scales.shape != expected:
        raise ValueError(f"{where}: scales must have codes' shape with the last axis divided by {BLOCK}, "
                         f"{expected}, got {scales.shape}")


def from_gpt_oss(blocks, scale_bytes) -> tuple[np.ndarray, np.ndarray]:
    """Unpack gpt-oss's ``(blocks, scale_bytes)`` into MXFP4 ``(codes, scales)``, the inverse of `to_gpt_oss`.

    ``blocks``: uint8, shape ``S + (G, 16)``; ``scale_bytes``: uint8, shape ``S + (G,)``. Returns codes
    float4_e2m1fn of shape ``S + (32*G,)`` and scales float8_e8m0fnu of shape ``S + (G,)`` (byte 255 is e8m0's
    NaN, which `qlinear.mx.dequantize` turns into NaN for the whole block).

    >>> import numpy as np
    >>> codes, scales = from_gpt_oss(np.full((1, 16), 0xF1, np.uint8), np.array([128], np.uint8))
    >>> codes[:4].astype(np.float32), scales.astype(np.float32)
    (array([ 0.5, -6. ,  0.5, -6. ], dtype=float32), array([2.], dtype=float32))
    """
    blocks, scale_bytes = np.asarray(blocks), np.asarray(scale_bytes)
    _check_pair(blocks, scale_bytes, "from_gpt_oss")
    codes = np.empty(blocks.shape + (2,), np.uint8)
    codes[..., 0] = blocks & np.uint8(0x0F)
    codes[..., 1] = blocks >> np.uint8(4)
    codes = codes.reshape(blocks.shape[:-2] + (blocks.shape[-2] * BLOCK,)).view(CODES)
    return codes, np.ascontiguousarray(scale_bytes).view(SCALES).copy()


class MXFP4Tensor:
    """An MXFP4 tensor in gpt-oss's layout: the stored ``blocks`` and ``scale_bytes``, ``codes``/``scales`` on demand.

    Unpacks as a pair, ``codes, scales = tensor``. ``separator`` is how its file names it: "." for gpt-oss's
    ``NAME.blocks``/``NAME.scales``, "_" for transformers' ``NAME_blocks``/``NAME_scales``. Read from a file,
    ``blocks`` and ``scale_bytes`` are memory maps, and codes, scales and values are computed each time they
    are asked for (nothing is cached, so a checkpoint larger than memory can be walked tensor by tensor).
    """

    def __init__(self, blocks, scale_bytes, separator: str = "."):
        if separator not in SEPARATORS:
            raise ValueError(f"MXFP4Tensor: separator must be '.' (NAME.blocks) or '_' (NAME_blocks), "
                             f"got {separator!r}")
        blocks, scale_bytes = np.asarray(blocks), np.asarray(scale_bytes)
        _check_pair(blocks, scale_bytes, "MXFP4Tensor")
        self.blocks, self.scale_bytes, self.separator = blocks, scale_bytes, separator

    @classmethod
    def from_codes(cls, codes, scales, separator: str = ".") -> "MXFP4Tensor":
        """The tensor of MXFP4 ``codes`` (float4_e2m1fn) and ``scales`` (float8_e8m0fnu), packed by `to_gpt_oss`."""
        return cls(*to_gpt_oss(codes, scales), separator=separator)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape: the blocks' shape with (G, 16) replaced by 32*G."""
        return tuple(self.scale_bytes.shape[:-1]) + (self.scale_bytes.shape[-1] * BLOCK,)

    @property
    def codes(self) -> np.ndarray:
        return from_gpt_oss(self.blocks, self.scale_bytes)[0]

    @property
    def scales(self) -> np.ndarray:
        return np.ascontiguousarray(self.scale_bytes).view(SCALES)

    def names(self, name: str) -> tuple[str, str]:
        """The names of the blocks and scales tensors of the tensor ``name`` in a file."""
        return name + self.separator + "blocks", name + self.separator + "scales"

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """The values, ``ldexp(LUT[code], byte - 127)`` (`qlinear.mx.dequantize`), as ``dtype``.

        bfloat16 (gpt-oss's own choice) holds every finite MXFP4 value exactly, as float32 does: both have
        e8m0's exponent range and at least e2m1's mantissa bit."""

        values = np.asarray(mx.dequantize(self.codes, self.scales, axis=-1))
        return values if values.dtype == np.dtype(dtype) else bfloat16.cast(values, dtype)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return tuple(self.scale_bytes.shape)

    def block_chunks(self):
        return _row_chunks(self.blocks)

    def scale_bytes_array(self) -> np.ndarray:
        return self.scale_bytes

    def __iter__(self):
        return iter((self.codes, self.scales))

    def __len__(self) -> int:
        return 2

    def __repr__(self) -> str:
        return f"MXFP4Tensor(shape={self.shape}, separator={self.separator!r})"


def _check_pair(blocks: np.ndarray, scale_bytes: np.ndarray, where: str) -> None:
    for name, array in (("blocks", blocks), ("scale_bytes", scale_bytes)):
        if array.dtype != np.uint8:
            raise TypeError(f"{where}: {name} must be uint8 (gpt-oss stores both tensors as bytes), "
                            f"got {array.dtype}")
    if blocks.ndim < 2 or blocks.shape[-1] != BLOCK_BYTES:
        raise ValueError(f"{where}: blocks must have a last axis of {BLOCK_BYTES} bytes (the {BLOCK} float4 "
                         f"codes of a block) after at least one block axis, got shape {blocks.shape}")
    if scale_bytes.shape != blocks.shape[:-1]:
        raise ValueError(f"{where}: scale_bytes must have blocks' shape without its last axis (one scale per "
                         f"block), {blocks.shape[:-1]}, got {scale_bytes.shape}")


# ----------------------------------------------------------------------------------------------------
# Files


def mxfp4_pairs(entries) -> dict[str, tuple[str, str, str]]:
    """The MXFP4 tensors among a file's tensors: ``{NAME: (blocks name, scales name, separator)}``.

    ``entries`` are `tensor_files` entries (``.name``, ``.code`` or ``.dtype``, ``.shape``). A pair is a
    ``NAME.blocks``/``NAME.scales`` or ``NAME_blocks``/``NAME_scales`` couple; a couple whose types or shapes
    are not gpt-oss's (uint8 both, blocks ``S + (G, 16)``, scales ``S + (G,)``) is a ValueError naming it.
    A lone ``.blocks`` or ``.scales`` tensor is an ordinary tensor."""
    by_name = {entry.name: entry for entry in entries}
    pairs = {}
    for name, entry in by_name.items():
        for separator in SEPARATORS:
            suffix = separator + "blocks"
            if not name.endswith(suffix):
                continue
            base = name[: -len(suffix)]
            partner = by_name.get(base + separator + "scales")
            if partner is None or not base:
                continue
            codes = (_code(entry), _code(partner))
            if codes != ("U8", "U8"):
                raise ValueError(f"MXFP4 tensor {base!r}: {name!r} and {partner.name!r} must both be U8 (uint8), "
                                 f"got {codes[0]} and {codes[1]}")
            shape, scale_shape = tuple(entry.shape), tuple(partner.shape)
            if len(shape) < 2 or shape[-1] != BLOCK_BYTES or scale_shape != shape[:-1]:
                raise ValueError(f"MXFP4 tensor {base!r}: {name!r} must have shape S + (G, {BLOCK_BYTES}) and "
                                 f"{partner.name!r} shape S + (G,), got {list(shape)} and {list(scale_shape)}")
            pairs[base] = (name, partner.name, separator)
    return pairs


def _code(entry) -> str | None:
    if getattr(entry, "code", None):
        return entry.code
    return SAFETENSORS_CODES.get(np.dtype(entry.dtype)) if entry.dtype is not None else None


class Checkpoint(dict):
    """What `read_mxfp4_checkpoint` returns: a dict of tensors, in the file's order, with the file's
    safetensors ``metadata`` (the ``__metadata__`` strings) as an attribute."""

    def __init__(self, *args, metadata: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.metadata = dict(metadata or {})


def read_mxfp4_checkpoint(path) -> Checkpoint:
    """Read a safetensors checkpoint in gpt-oss's layout: ``{NAME: MXFP4Tensor | np.ndarray}``, lazily.

    Each ``NAME.blocks``/``NAME.scales`` (or ``NAME_blocks``/``NAME_scales``) pair becomes one `MXFP4Tensor`
    under ``NAME`` (``codes, scales = checkpoint[NAME]``); every other tensor is a read-only memory-mapped
    array under its own name. Tensors keep the file's order, and ``.metadata`` holds the file's metadata,
    so ``write_mxfp4_checkpoint(out, read_mxfp4_checkpoint(path))`` writes the same tensors byte for byte.
    A file that is not safetensors, or a tensor of a type NumPy cannot hold, raises ValueError."""

    def pairs(entries):
        return {base: (blocks, scales) for base, (blocks, scales, _) in mxfp4_pairs(entries).items()}

    def tensor(base, names, arrays):
        return MXFP4Tensor(*arrays, separator=names[0][len(base)])  # the character after NAME: "." or "_"

    return read_grouped(path, pairs, tensor)


def read_grouped(path, groups_of, build) -> Checkpoint:
    """A safetensors file whose tensors come partly in groups that make one tensor (an MXFP4 pair, an NVFP4
    triple): ``groups_of(entries)`` -> ``{NAME: member names}`` (a ValueError names the bad group), and
    ``build(NAME, member names, member arrays)`` makes the tensor, put where the group's first member was;
    every other tensor is a read-only memory-mapped array. A file that is not safetensors, or a tensor of a
    type NumPy cannot hold, raises ValueError."""
    path = Path(path)
    try:
        reader = SafetensorsReader(path)
    except UserError as error:
        raise ValueError(str(error)) from None
    try:
        groups = groups_of(reader.entries)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    entries = {entry.name: entry for entry in reader.entries}
    member_of = {name: key for key, names in groups.items() for name in names}
    result = Checkpoint(metadata=reader.metadata)
    for entry in reader.entries:
        key = member_of.get(entry.name)
        if key is not None:
            if key not in result:
                names = groups[key]
                result[key] = build(key, names, [reader.array(entries[name]) for name in names])
            continue
        if entry.dtype is None:
            raise ValueError(f"{path}: tensor {entry.name!r} has safetensors type {entry.code}, which NumPy "
                             f"cannot hold")
        result[entry.name] = reader.array(entry)
    return result


def write_mxfp4_checkpoint(path, tensors, metadata: dict[str, str] | None = None, separator: str = ".") -> None:
    """Write ``{NAME: MXFP4Tensor | (codes, scales) | array}`` as a safetensors checkpoint in gpt-oss's layout.

    An `MXFP4Tensor` is written under its own separator's names; a ``(codes, scales)`` pair (float4_e2m1fn,
    float8_e8m0fnu: `qlinear.mx.quantize`'s output) is packed by `to_gpt_oss` and named with ``separator``
    ("." for gpt-oss's ``NAME.blocks``, "_" for transformers' ``NAME_blocks``); any other array is written as
    it is (its dtype must be one safetensors holds). ``metadata`` defaults to ``tensors.metadata`` when
    ``tensors`` came from `read_mxfp4_checkpoint`. Tensors are written in the dict's order, a chunk at a
    time; the file is written to a temporary beside ``path`` and renamed when complete."""
    if separator not in SEPARATORS:
        raise ValueError(f"write_mxfp4_checkpoint: separator must be '.' or '_', got {separator!r}")
    if metadata is None:
        metadata = getattr(tensors, "metadata", None) or {}
    plan, jobs = [], []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"write_mxfp4_checkpoint: tensor names must be strings, got {name!r}")
        if isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"write_mxfp4_checkpoint: tensor {name!r}: a tuple must be (codes, scales), got "
                                 f"{len(value)} items")
            value = _PendingMXFP4(name, *value, separator)
        if isinstance(value, (MXFP4Tensor, _PendingMXFP4)):
            blocks_name, scales_name = value.names(name)
            scale_shape = tuple(value.scale_shape)
            plan.append(Planned(blocks_name, np.dtype(np.uint8), scale_shape + (BLOCK_BYTES,),
                                math.prod(scale_shape) * BLOCK_BYTES))
            plan.append(Planned(scales_name, np.dtype(np.uint8), scale_shape, math.prod(scale_shape)))
            jobs.append((blocks_name, lambda value=value: value.block_chunks()))
            jobs.append((scales_name, lambda value=value: iter((value.scale_bytes_array(),))))
            continue
        array = np.asarray(value)
        if array.dtype not in SAFETENSORS_CODES:
            raise TypeError(f"write_mxfp4_checkpoint: tensor {name!r} has dtype {array.dtype}, which safetensors "
                            f"cannot hold")
        plan.append(Planned(name, array.dtype, array.shape, array.nbytes))
        jobs.append((name, lambda array=array: _row_chunks(array)))
    names = [p.name for p in plan]
    if len(set(names)) != len(names):
        clash = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"write_mxfp4_checkpoint: two tensors would both be written as {clash!r}")
    try:
        with atomic_output(Path(path)) as f:
            writer = SafetensorsWriter(f, plan, metadata)
            for name, chunks in jobs:
                writer.begin(name)
                for chunk in chunks():
                    writer.write(chunk)
                writer.end()
            writer.close()
    except UserError as error:
        raise ValueError(str(error)) from None


class _PendingMXFP4:
    """A (codes, scales) pair to be written, packed a chunk of rows at a time."""

    def __init__(self, name: str, codes, scales, separator: str):
        codes, scales = np.asarray(codes), np.asarray(scales)
        _check_codes(codes, scales, f"write_mxfp4_checkpoint: tensor {name!r}")
        self.codes, self.scales, self.separator = codes, scales, separator

    names = MXFP4Tensor.names

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return tuple(self.scales.shape)

    def block_chunks(self):
        for rows in row_slices(self.codes.shape, self.codes.size // 2):
            yield to_gpt_oss(self.codes[rows], self.scales[rows])[0]

    def scale_bytes_array(self) -> np.ndarray:
        return np.ascontiguousarray(self.scales).view(np.uint8)


def row_slices(shape: tuple[int, ...], nbytes: int, fraction: int = 1):
    """Slices of the first axis whose ``nbytes`` of data come to about `_CHUNK_BYTES` / ``fraction`` (the
    whole array for a 0- or 1-row one)."""
    limit = max(1, _CHUNK_BYTES // fraction)
    if len(shape) < 2 or shape[0] <= 1 or nbytes <= limit:
        yield slice(None)
        return
    rows = max(1, limit // max(1, nbytes // shape[0]))
    for start in range(0, shape[0], rows):
        yield slice(start, min(shape[0], start + rows))


def _row_chunks(array: np.ndarray):
    for rows in row_slices(array.shape, array.nbytes):
        yield np.asarray(array[rows])


# ----------------------------------------------------------------------------------------------------
# The commands: `qlinear quantize CKPT.safetensors --dtype mxfp4` and `qlinear dequantize` of such a file
#
# `qlinear.io.pipeline` hands a safetensors file to these two functions (quantize_file with an MX --dtype;
# dequantize_file when the file has MXFP4 pairs and no qlinear metadata).
