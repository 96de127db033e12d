"""Tensor files: NumPy .npy/.npz and safetensors, read lazily and written as a stream.

Readers list a file's tensors (name, dtype, shape) without reading their data, and give each tensor
as an array that is read when sliced: a memory map for .npy and safetensors, so a large checkpoint is
never loaded whole. Writers take the tensors one after another, each as a sequence of chunks, so the
output is never held whole in memory either.

safetensors is read and written here directly (the format is an 8-byte little-endian header length,
a JSON header giving each tensor's dtype, shape and byte range, then the bytes): the `safetensors`
package loads or saves whole dictionaries, while a stream needs the byte ranges. The tests check the
files against the `safetensors` package itself.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ...dtypes import ElementType
from ...granularity import Granularity
from ..errors import UserError
from ..plan import FORMAT_VERSION, Found, min_opset
from ..storage import stored_size
from . import format_of

SAFETENSORS_DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16), "U32": np.dtype(np.uint32), "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F32": np.dtype(np.float32), "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
SAFETENSORS_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16))
_MAX_HEADER = 100 << 20


def _found(name: str, dtype, shape, nbytes: int, code: str | None = None) -> Found:
    return Found(name, dtype, tuple(shape), nbytes, code=code, type_name=str(code or dtype))


# ----------------------------------------------------------------------------------------------------
# Readers


def page_releaser(array, entry: Found):
    """For a memory-mapped tensor, a function ``release(start_row, stop_row)`` that lets the kernel drop
    the pages of those rows from this process (they are read again from the file if touched), so that
    the resident memory of a pass over a large tensor stays near one chunk; None for other arrays."""
    mapped = array
    while mapped is not None and not isinstance(mapped, np.memmap):
        mapped = mapped.base
    handle = getattr(mapped, "_mmap", None)
    if handle is None or not hasattr(handle, "madvise") or not hasattr(mmap, "MADV_DONTNEED") or not entry.shape:
        return None
    row_bytes = entry.nbytes // max(1, entry.shape[0])
    # np.memmap maps from the allocation-granularity boundary below its offset
    start_in_map = mapped.offset % mmap.ALLOCATIONGRANULARITY + (array.__array_interface__["data"][0] - mapped.__array_interface__["data"][0])
    page = mmap.PAGESIZE

    def release(start_row: int, stop_row: int) -> None:
        begin = (start_in_map + start_row * row_bytes) // page * page
        end = start_in_map + stop_row * row_bytes
        if end > begin:
            try:
                handle.madvise(mmap.MADV_DONTNEED, begin, end - begin)
            except (OSError, ValueError):
                pass

    return release


class NpyReader:
    def __init__(self, path: Path):
        self.path = path
        self.metadata: dict[str, str] = {}
        try:
            self._array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise UserError(f"{path}: not a readable .npy file ({_reason(error)})") from None
        self.entries = [_found(path.stem, self._array.dtype, tuple(self._array.shape), self._array.nbytes)]

    def array(self, entry: Found):
        return self._array

    def close(self):
        self._array = None


class NpzReader:
    def __init__(self, path: Path):
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
            self.entries = []
            for info in self._zip.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with self._zip.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
                    elif version == (2, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
                    else:
                        raise ValueError(f"member {info.filename!r} has .npy format version {version}")
                if dtype.hasobject:
                    raise ValueError(f"member {info.filename!r} holds Python objects")
                name = info.filename[: -len(".npy")]
                self.entries.append(_found(name, dtype, tuple(shape), math.prod(shape) * dtype.itemsize))
        except UserError:
            raise
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as error:
            raise UserError(f"{path}: not a readable .npz file ({_reason(error)})") from None
        self.metadata = {}
        for entry in list(self.entries):
            if entry.name == NPZ_METADATA:
                self.metadata = {"qlinear": str(self.array(entry)[()])}
                self.entries.remove(entry)

    def array(self, entry: Found):
        try:
            mapped = self._mapped(entry)
            if mapped is not None:
                return mapped
            with self._zip.open(entry.name + ".npy") as member:
                return np.lib.format.read_array(member, allow_pickle=False)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
            raise UserError(f"{self.path}: tensor {entry.name!r} cannot be read ({_reason(error)})") from None

    def _mapped(self, entry: Found):
        """An uncompressed member (np.savez writes them so) is a plain .npy inside the zip file: map it
        like a .npy file. Compressed members (np.savez_compressed) return None and are read whole."""
        info = self._zip.getinfo(entry.name + ".npy")
        if info.compress_type != zipfile.ZIP_STORED or entry.size == 0:
            return None
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename!r} has no local header")
            name_length, extra_length = struct.unpack("<HH", local[26:30])
            f.seek(info.header_offset + 30 + name_length + extra_length)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                return None
            offset = f.tell()
        if fortran or dtype.hasobject or tuple(shape) != entry.shape or offset + entry.nbytes > self.path.stat().st_size:
            return None
        return np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=tuple(shape))

    def close(self):
        self._zip.close()


class SafetensorsReader:
    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError("shorter than the 8-byte header length")
                (length,) = struct.unpack("<Q", head)
                if length > min(size - 8, _MAX_HEADER):
                    raise ValueError(f"header length {length} does not fit the file ({size} bytes)")
                header = json.loads(f.read(length).decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
        except (ValueError, OSError, UnicodeDecodeError) as error:
            raise UserError(f"{path}: not a readable safetensors file ({_reason(error)})") from None
        self._data_start = 8 + length
        data_size = size - self._data_start
        self.metadata = header.pop("__metadata__", None) or {}
        self.entries = []
        self._offsets = {}
        for name, info in header.items():
            try:
                code, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise UserError(f"{path}: corrupt safetensors header: tensor {name!r} lacks dtype/shape/data_offsets") from None
            dtype = SAFETENSORS_DTYPES.get(code)
            if not (0 <= begin <= end <= data_size) or any(d < 0 for d in shape):
                raise UserError(f"{path}: corrupt safetensors file: tensor {name!r} has byte range [{begin}, {end}) "
                                f"outside the {data_size} data bytes")
            if dtype is not None and (end - begin) != math.prod(shape) * dtype.itemsize:
                raise UserError(f"{path}: corrupt safetensors file: tensor {name!r} of {code} {list(shape)} needs "
                                f"{math.prod(shape) * dtype.itemsize} bytes, its byte range has {end - begin}")
            self.entries.append(_found(name, dtype, shape, end - begin, code))
            self._offsets[name] = (begin, end)
        self.entries.sort(key=lambda e: self._offsets[e.name][0])

    def raw(self, entry: Found) -> np.ndarray:
        begin, end = self._offsets[entry.name]
        if end == begin:
            return np.zeros(0, np.uint8)
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._data_start + begin, shape=(end - begin,))

    def array(self, entry: Found):
        raw = self.raw(entry)
        if entry.dtype is None:
            return raw
        return raw.view(entry.dtype).reshape(entry.shape)

    def close(self):
        pass


def open_tensor_file(path: Path):
    kind = format_of(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a folder, not a file")
    return {"npy": NpyReader, "npz": NpzReader, "safetensors": SafetensorsReader}[kind](path)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# ----------------------------------------------------------------------------------------------------
# Writers

NPZ_METADATA = "__qlinear__"


@dataclass
class Planned:
    """A tensor to write: its name, NumPy dtype (or safetensors code for raw copies), shape."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int, ...]
    nbytes: int
    code: str | None = None


def safetensors_code(planned: Planned) -> str:
    if planned.code is not None:
        return planned.code
    try:
        return SAFETENSORS_CODES[planned.dtype]
    except KeyError:
        raise UserError(f"tensor {planned.name!r} has dtype {planned.dtype}, which safetensors cannot hold") from None


class SafetensorsWriter:
    """Writes the header for all planned tensors first, then their bytes in the planned order."""

    def __init__(self, f, plan: list[Planned], metadata: dict[str, str]):
        self._f = f
        header = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        for p in plan:
            header[p.name] = {"dtype": safetensors_code(p), "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
            offset += p.nbytes
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the safetensors package writes it
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        self._plan = iter(plan)
        self._current = None
        self._written = 0

    def begin(self, name: str):
        self._current = next(self._plan)
        assert self._current.name == name, (self._current.name, name)
        self._written = 0

    def write(self, array: np.ndarray):
        data = np.ascontiguousarray(array)
        self._f.write(data.reshape(-1).view(np.uint8).data if data.size else b"")
        self._written += data.nbytes

    def end(self):
        assert self._written == self._current.nbytes, (self._current.name, self._written, self._current.nbytes)

    def close(self):
        pass


class NpzWriter:
    """An uncompressed .npz (as np.savez writes), each member streamed in chunks."""

    def __init__(self, f, plan: list[Planned], metadata: dict[str, str]):
        self._zip = zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True)
        self._plan = {p.name: p for p in plan}
        self._member = None
        if "qlinear" in metadata:
            with self._zip.open(NPZ_METADATA + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.array(metadata["qlinear"]), allow_pickle=False)

    def begin(self, name: str):
        planned = self._plan[name]
        if planned.dtype is None:
            raise UserError(f"tensor {name!r} has safetensors type {planned.code}, which a .npz cannot hold")
        self._member = self._zip.open(name + ".npy", "w", force_zip64=True)
        header = {"descr": np.lib.format.dtype_to_descr(planned.dtype), "fortran_order": False,
                  "shape": tuple(planned.shape)}
        np.lib.format.write_array_header_2_0(self._member, header)

    def write(self, array: np.ndarray):
        data = np.ascontiguousarray(array)
        if data.size:
            self._member.write(data.reshape(-1).view(np.uint8).data)

    def end(self):
        self._member.close()
        self._member = None

    def close(self):
        self._zip.close()

    def abort(self):
        """Release the zip after an error (its file is about to be deleted)."""
        try:
            if self._member is not None:
                self._member.close()
            self._zip.close()
        except Exception:
            pass


class NpyWriter:
    def __init__(self, f, plan: list[Planned], metadata: dict[str, str]):
        if len(plan) != 1:
            raise UserError(f"a .npy file holds one array, and there are {len(plan)} tensors; write a .npz")
        self._f = f
        self._plan = plan[0]

    def begin(self, name: str):
        header = {"descr": np.lib.format.dtype_to_descr(self._plan.dtype), "fortran_order": False,
                  "shape": tuple(self._plan.shape)}
        np.lib.format.write_array_header_2_0(self._f, header)

    def write(self, array: np.ndarray):
        data = np.ascontiguousarray(array)
        if data.size:
            self._f.write(data.reshape(-1).view(np.uint8).data)

    def end(self):
        pass

    def close(self):
        pass


WRITERS = {"npy": NpyWriter, "npz": NpzWriter, "safetensors": SafetensorsWriter}


def copy_raw(reader, entry: Found, writer, chunk_bytes: int = 64 << 20) -> None:
    """Copy a tensor through unchanged, chunk by chunk."""
    writer.begin(entry.name)
    if isinstance(reader, SafetensorsReader):
        raw = reader.raw(entry)
        release = page_releaser(raw, _found(entry.name, np.dtype(np.uint8), (raw.size,), raw.size))
        for start in range(0, raw.size, chunk_bytes):
            stop = min(raw.size, start + chunk_bytes)
            writer.write(np.asarray(raw[start:stop]))
            if release is not None:
                release(start, stop)
        del raw
    else:
        writer.write(np.asarray(reader.array(entry)))
    writer.end()


def file_size(path) -> int:
    return os.path.getsize(path)


# ----------------------------------------------------------------------------------------------------
# What a quantized tensor becomes in a file: NAME, NAME.scale, NAME.zero_point, and metadata


def storage(qtype: ElementType, shape) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape a file stores a quantized array of ``shape`` as."""
    if qtype.packs:
        return np.dtype(np.uint8), (stored_size(qtype, shape),)
    if not qtype.is_integer:
        return np.dtype(np.uint8), tuple(shape)
    return qtype.dtype, tuple(shape)


def quantized_plan(name: str, shape, qtype: ElementType, gran: Granularity) -> list[Planned]:
    """The three tensors a quantized tensor is written as."""
    stored_dtype, stored_shape = storage(qtype, shape)
    param_shape = gran.param_shape if shape else ()
    zp_dtype, zp_shape = storage(qtype, param_shape)
    return [
        Planned(name, stored_dtype, stored_shape, stored_size(qtype, shape)),
        Planned(name + ".scale", np.dtype(np.float32), param_shape, 4 * math.prod(param_shape)),
        Planned(name + ".zero_point", zp_dtype, zp_shape, stored_size(qtype, param_shape)),
    ]


def tensor_metadata(found: Found, qtype: ElementType, gran: Granularity, symmetric: bool) -> dict:
    """What `qlinear dequantize` needs to restore one tensor (the same for zarr stores)."""
    kind = gran.kind if found.shape else "tensor"
    return {
        "dtype": qtype.onnx_name, "shape": list(found.shape), "source_dtype": found.dtype.name,
        "granularity": kind, "axis": gran.axis, "block_size": gran.block_size, "symmetric": symmetric,
        "packed": qtype.packs, "scale": found.name + ".scale", "zero_point": found.name + ".zero_point",
        "opset": min_opset(qtype, kind),
    }


def file_metadata(metadata: dict[str, str], tensors: dict, copied: list[str]) -> dict[str, str]:
    """The input's metadata with qlinear's added (one JSON string, as safetensors metadata must be)."""
    return {**metadata, "qlinear": json.dumps({"format": FORMAT_VERSION, "tensors": tensors, "copied": copied})}


def read_metadata(path: Path, metadata: dict) -> dict:
    """The "tensors" section of the qlinear metadata of a file `qlinear quantize` wrote."""
    if "qlinear" not in metadata:
        raise UserError(f"{path}: has no qlinear metadata; it was not written by qlinear quantize")
    try:
        meta = metadata["qlinear"]
        meta = json.loads(meta) if isinstance(meta, str) else meta
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown format {meta.get('format')!r}")
        return meta
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path}: corrupt qlinear metadata ({error})") from None
