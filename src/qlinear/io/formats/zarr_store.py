"""zarr stores: read as dask arrays, written chunk by chunk (`qlinear.io.streaming` computes them).

INPUT is a directory ending in .zarr holding one array, or a group of named arrays (nested groups
included). The output is a zarr group with, per quantized tensor NAME, the array NAME, NAME.scale
(float32) and NAME.zero_point, and in the group's attributes under "qlinear" the same metadata as the
tensor files (`tensor_files.tensor_metadata`). Quantized values are stored one element per byte, never
packed, so that every chunk stays independently readable and writable: int4/uint4/int2/uint2 as
int8/uint8 values, float8/float6/float4 codes as their bit patterns in uint8. The output is written
to a hidden temporary store beside OUTPUT and renamed at the end (`qlinear.io.atomic.atomic_store`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UserError
from ..extras import require_zarr
from ..plan import Found


class StoreReader:
    """The arrays of a zarr store by path name, in order, with the store's attributes."""

    def __init__(self, source: Path):
        zarr = require_zarr("reading .zarr stores")
        try:
            node = zarr.open(str(source), mode="r")
        except Exception as error:  # noqa: BLE001 (zarr raises several types for a folder that is not a store)
            raise UserError(f"{source}: not a zarr store ({type(error).__name__}: {error})") from None
        if isinstance(node, zarr.Array):
            arrays, self.root_array = {source.stem: node}, True
        else:
            arrays = {path: array for path, array in sorted(node.arrays(), key=lambda item: item[0])}
            for path, group in node.groups():  # nested groups: arrays under "group/name"
                for sub, array in _arrays_under(group, path):
                    arrays[sub] = array
            self.root_array = False
        self.arrays = arrays
        self.metadata = dict(node.attrs)
        self.entries = [Found(name, np.dtype(array.dtype), tuple(array.shape), array.nbytes, location="zarr array",
                              type_name=str(np.dtype(array.dtype)))
                        for name, array in arrays.items()]

    def array(self, found: Found):
        return self.arrays[found.name]

    def lazy(self, found: Found):
        import dask.array as da

        return da.from_zarr(self.arrays[found.name])


def _arrays_under(group, prefix):
    for name, array in sorted(group.arrays(), key=lambda item: item[0]):
        yield f"{prefix}/{name}", array
    for name, sub in group.groups():
        yield from _arrays_under(sub, f"{prefix}/{name}")


class StoreWriter:
    """Arrays created in a (temporary) store, filled from dask arrays."""

    def __init__(self, folder: Path, root_array: bool = False):
        self.zarr = require_zarr("writing .zarr stores")
        self.folder = folder
        self.group = None if root_array else self.zarr.open_group(str(folder), mode="w")

    def create(self, name: str, shape, chunks, dtype, attributes=None):
        if self.group is None:  # the output is a single array at the store's root
            array = self.zarr.create_array(str(self.folder), shape=tuple(shape), chunks=tuple(chunks) if shape else (),
                                           dtype=dtype, fill_value=0, overwrite=True)
        else:
            array = self.group.create_array(name, shape=tuple(shape), chunks=tuple(chunks) if shape else (),
                                            dtype=dtype, fill_value=0)
        if attributes:
            array.attrs.update(attributes)
        return array

    def put(self, name: str, data: np.ndarray):
        self.group.create_array(name, data=data)

    def attributes(self, values: dict):
        (self.group.attrs if self.group is not None else self.zarr.open_array(str(self.folder), mode="r+").attrs).update(values)


def store(array, target, extra=()):
    """Store dask ``array`` into zarr ``target`` (chunks made to match the target's) with ``extra`` lazy
    values computed in the same pass; returns their values."""
    import dask
    import dask.array as da

    if array.ndim and array.chunks != da.core.normalize_chunks(target.chunks, array.shape):
        array = array.rechunk(target.chunks)
    stored = da.store(array, target, lock=False, compute=False)
    return dask.compute(stored, *extra)[1:]


def regular(chunks) -> tuple[int, ...]:
    """One chunk shape from dask's chunks (their first sizes)."""
    return tuple(int(c[0]) if c else 1 for c in chunks)


def storage_dtype(qtype) -> np.dtype:
    """The dtype zarr stores ``qtype`` as (one element per byte for the sub-byte and float types)."""
    if not qtype.is_integer:
        return np.dtype(np.uint8)
    if qtype.bits < 8:
        return np.dtype(np.int8) if qtype.qmin < 0 else np.dtype(np.uint8)
    return np.dtype(qtype.dtype)


def to_storage(q, qtype):
    if not qtype.is_integer:
        return q.view(np.uint8)
    return q.astype(storage_dtype(qtype))


def from_storage(stored, qtype):
    if not qtype.is_integer:
        return stored.view(qtype.dtype)
    return stored.astype(qtype.dtype)
