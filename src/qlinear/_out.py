"""The ``out=`` argument of the element-wise operators, NumPy's convention, checked in one place.

The operators (`qlinear.ops.quantize_linear`, `qlinear.tf.quantize`) call `check` once they know the
result's shape and dtype, hand the buffer it returns to their kernel, and finish with `deliver`:

- ``out`` must be a numpy.ndarray (a subclass is written through a plain-ndarray view) of exactly the
  result's shape and dtype, writeable, and must share no memory with any array argument: the kernels read
  x, the scale and the zero point while they write out, and an output never has x's dtype, so there is no
  "in place" case to allow.
- A C-contiguous, aligned ``out`` is the buffer: the kernel writes the result straight into it. Any other
  ``out`` (strided, Fortran-ordered, unaligned) is filled by computing the result as usual and copying it
  in, so it works, without the saving.
"""

from __future__ import annotations

import numpy as np

# Exact overlap tests (`np.shares_memory`) are only run when the bounds overlap; this caps their work on
# exotic strides, beyond which the arrays are taken to overlap.
_MAX_WORK = 10_000


def dask_error(func: str, name: str = "x") -> TypeError:
    """The error for ``out=`` with a dask input (argument ``name``), whose result is lazy."""
    return TypeError(
        f"{func}: out= is for NumPy arrays; {name} is a dask array, whose result is a lazy dask array (call "
        f"{func} without out=, then compute or store that result)"
    )


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    if not np.may_share_memory(a, b):  # bounds only: cheap, and enough for the common case
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=_MAX_WORK))
    except np.exceptions.TooHardError:
        return True


def check(func: str, out, shape: tuple, dtype: np.dtype, inputs: dict, dtype_rule: str = "") -> np.ndarray | None:
    """Validate ``out`` for a result of ``shape`` and ``dtype``; return the buffer a kernel writes into
    directly (``out`` as a plain C-contiguous ndarray), or None when ``out`` must be filled by a copy.

    ``inputs`` maps argument names to the values the call reads (non-arrays are skipped); ``dtype_rule``
    says what sets the output type, for the dtype error."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{func}: out must be a numpy.ndarray, got {type(out).__name__}")
    shape = tuple(shape)
    if out.shape != shape:
        raise ValueError(f"{func}: out must have the result's shape {shape}, got shape {out.shape}")
    if out.dtype != dtype:
        rule = f" ({dtype_rule})" if dtype_rule else ""
        raise TypeError(f"{func}: out must have the result's dtype {dtype}, got dtype {out.dtype}{rule}")
    if not out.flags.writeable:
        raise ValueError(f"{func}: out must be writeable, got a read-only array")
    for name, value in inputs.items():
        if isinstance(value, np.ndarray) and _overlaps(out, value):
            raise ValueError(
                f"{func}: out must not share memory with {name} (the result is written while {name} is read); "
                f"pass a separate array"
            )
    if out.flags.c_contiguous and out.flags.aligned:
        return out if type(out) is np.ndarray else out.view(np.ndarray)
    return None


def deliver(out: np.ndarray, buffer: np.ndarray | None, result: np.ndarray) -> np.ndarray:
    """``out`` holding ``result``: nothing to do when the kernel wrote into ``buffer`` (``result is buffer``),
    else ``result`` (any array of out's size and dtype, e.g. the reference's) is copied in."""
    if result is not buffer:
        np.copyto(out, result.reshape(out.shape), casting="no")
    return out
