"""The optional dependencies, imported when a feature needs them: a UserError says what to install."""

from __future__ import annotations

from .errors import UserError


def require_dask(what: str):
    try:
        import dask.array as da
    except ImportError:
        raise UserError(f"{what} needs dask: pip install 'qlinear[dask]'") from None
    return da


def require_zarr(what: str):
    require_dask(what)
    try:
        import zarr
    except ImportError:
        raise UserError(f"{what} needs zarr: pip install 'qlinear[dask]'") from None
    return zarr


def import_onnx():
    try:
        import onnx
    except ImportError:
        raise UserError("reading .onnx models needs the onnx package: pip install 'qlinear[onnx]'") from None
    return onnx
