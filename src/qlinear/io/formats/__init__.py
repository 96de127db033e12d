"""Format adapters: each reads one kind of input into `plan.Found` tensors and writes the output.

- `tensor_files`: NumPy .npy/.npz and safetensors;
- `zarr_store`: zarr stores, through dask;
- `onnx_model` (with `onnx_weights`, the search for a model's weights): ONNX models.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError


def format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    formats = {".npy": "npy", ".npz": "npz", ".safetensors": "safetensors", ".onnx": "onnx", ".zarr": "zarr"}
    if suffix not in formats:
        raise UserError(f"{path}: unknown format {suffix or '(no extension)'!r}; qlinear reads .npy, .npz, "
                        f".safetensors and .onnx files and .zarr stores")
    return formats[suffix]
