"""Argument checks shared by the QLinearConv / QLinearMatMul families.

Every failure is a TypeError (wrong type) or ValueError (wrong shape or value) whose message starts with the
public function's name and names the argument and the rule.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from qlinear.errors import AccumulatorOverflowError  # re-exported for the operators

INT8_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _dtype_names(dtypes) -> str:
    return " or ".join(str(np.dtype(d)) for d in dtypes)


def quantized_tensor(func: str, name: str, value, allowed=INT8_TYPES) -> np.ndarray:
    """An array whose dtype is one of ``allowed`` (numpy arrays only: a Python list has no quantized type)."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{func}: {name} must be a numpy array of {_dtype_names(allowed)}, got {type(value).__name__}")
    value = np.asarray(value)
    if value.dtype not in allowed:
        raise TypeError(f"{func}: {name} must have dtype {_dtype_names(allowed)}, got {value.dtype}")
    return value


def zero_point(func: str, name: str, value, dtype, partner: str) -> np.ndarray:
    """A zero point whose type must be ``dtype`` (the type of ``partner``); None means 0.

    A Python int is accepted and converted when it is in range; numpy arrays must already have ``dtype``
    ("each input and its related zero point must have same type").
    """
    dtype = np.dtype(dtype)
    if value is None:
        return np.zeros((), dtype=dtype)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.generic)):
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{func}: {name} must be in [{info.min}, {info.max}] (the range of {partner}'s {dtype}), got {value}")
        return np.asarray(value, dtype=dtype)
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{func}: {name} must be a numpy array of {dtype} (the type of {partner}), got {type(value).__name__}")
    value = np.asarray(value)
    if value.dtype != dtype:
        raise TypeError(f"{func}: {name} must have the dtype of {partner} ({dtype}), got {value.dtype}")
    return value


def output_zero_point(func: str, name: str, value, allowed=INT8_TYPES) -> np.ndarray:
    """The output zero point: its dtype (one of ``allowed``) is the output type, so it must be a numpy value."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(
            f"{func}: {name} must be a numpy array of {_dtype_names(allowed)} (its dtype sets the output type), "
            f"got {type(value).__name__}"
        )
    value = np.asarray(value)
    if value.dtype not in allowed:
        raise TypeError(f"{func}: {name} must have dtype {_dtype_names(allowed)}, got {value.dtype}")
    return value


def scale(func: str, name: str, value, allowed) -> np.ndarray:
    """A scale: a numpy array of one of ``allowed`` float types, or a Python float (taken as float32).

    Scales must be positive and finite: a zero, negative, NaN or infinite scale has no quantized meaning.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.generic)):
        value = np.asarray(value, dtype=np.float32)
    elif isinstance(value, (np.ndarray, np.generic)):
        value = np.asarray(value)
        if value.dtype not in [np.dtype(d) for d in allowed]:
            raise TypeError(f"{func}: {name} must have dtype {_dtype_names(allowed)}, got {value.dtype}")
    else:
        raise TypeError(f"{func}: {name} must be a numpy array of {_dtype_names(allowed)} or a Python float, got {type(value).__name__}")
    if not _positive_finite(value):
        raise ValueError(f"{func}: {name} must be positive and finite, got {value.tolist()}")
    return value


def _positive_finite(value: np.ndarray) -> bool:
    """Every element > 0 and finite (NaN fails both). Scalars through Python floats, arrays through one min and
    one max: this runs three times per convolution call, and the float64 copy and isfinite/all reductions it
    replaced took 15-20 us per scale."""
    if value.size == 1:
        v = float(value.reshape(-1)[0])
        return 0.0 < v < math.inf
    if value.size == 0:
        return True
    return bool(float(value.min()) > 0.0) and math.isfinite(float(value.max()))


def check_multiplier(func: str, multiplier: np.ndarray, names: str) -> None:
    """The requantization multiplier ``names`` (x_scale * w_scale / y_scale, say) must be finite: one reduction
    (NaN propagates through max; the float64 copy and isfinite/all it replaced cost ~10 us a call)."""
    if multiplier.size and not math.isfinite(float(np.max(np.abs(multiplier)))):
        raise ValueError(f"{func}: {names} overflows {multiplier.dtype}; the requantization multiplier must be finite")


def is_per_tensor(value: np.ndarray) -> bool:
    """A scalar, or a 1-D tensor of one element (ONNX models often store scalars as shape (1,))."""
    return value.ndim == 0 or (value.ndim == 1 and value.shape[0] == 1)


def require_per_tensor(func: str, name: str, value: np.ndarray) -> np.ndarray:
    if not is_per_tensor(value):
        raise ValueError(f"{func}: {name} must be a scalar or a 1-element 1-D tensor (per-tensor), got shape {value.shape}")
    return value.reshape(())


def int_list(func: str, name: str, value, length: int, minimum: int) -> tuple[int, ...] | None:
    """An INTS attribute: None, or a sequence of ``length`` integers each >= ``minimum``."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{func}: {name} must be a sequence of integers, got {type(value).__name__}")
    items = list(value)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items):
        raise TypeError(f"{func}: {name} must be a sequence of integers, got {items!r}")
    items = [int(v) for v in items]
    if len(items) != length:
        raise ValueError(f"{func}: {name} must have {length} values, got {len(items)}: {items}")
    if any(v < minimum for v in items):
        raise ValueError(f"{func}: {name} must be >= {minimum} everywhere, got {items}")
    return tuple(items)


def check_int32(func: str, acc: np.ndarray, what: str) -> None:
    """The specs accumulate in int32: an exact sum outside int32 is reported, never wrapped."""
    if acc.size == 0:
        return
    low, high = int(acc.min()), int(acc.max())
    if low < INT32_MIN or high > INT32_MAX:
        bad = high if high > INT32_MAX else low
        raise AccumulatorOverflowError(f"{func}: the exact accumulator ({what}) leaves the int32 range: {bad}", bad)


def int32_kernel(func: str, what: str, kernel, *args, **kwargs):
    """Run an integer kernel; its overflow report is re-raised naming the public function and the sum."""
    try:
        return kernel(*args, **kwargs)
    except AccumulatorOverflowError as error:
        raise AccumulatorOverflowError(
            f"{func}: the exact accumulator ({what}) leaves the int32 range: {error.value}", error.value
        ) from None


class NoKey(Exception):
    """An argument a repeated call's key cannot hold (the checked path takes the call)."""


def fingerprint(value):
    """``value`` as part of a repeated call's key, with its exact type, so that equal fingerprints pass the same
    checks (the operators keep what a call prepared under the key of its arguments); `NoKey` for anything else."""
    kind = type(value)
    if kind is np.ndarray:
        return value.dtype, value.shape, value.tobytes()
    if kind is float or kind is int or kind is str or value is None:
        return kind, value
    if isinstance(value, np.generic):  # its type names its dtype
        return kind, value.tobytes()
    if (kind is list or kind is tuple) and all(type(v) is int for v in value):
        return kind, tuple(value)
    raise NoKey


_integer_gemm = None


def call_key(head: tuple, arguments) -> tuple | None:
    """The key of a repeated call: ``head`` (the operator, the data's shapes and dtypes), the kernel path in use
    and every argument's `fingerprint`; None where an argument has none. (`fingerprint` written out in one loop:
    the key of a small convolution's 14 arguments took 11 us as a call per argument.)"""
    global _integer_gemm
    if _integer_gemm is None:
        from qlinear.kernels import integer_gemm  # the operators' kernels are loaded by then

        _integer_gemm = integer_gemm
    parts = []
    add = parts.append
    for value in arguments:
        kind = type(value)
        if kind is np.ndarray:
            add((value.dtype, value.shape, value.tobytes()))
        elif kind is float or kind is int or kind is str or value is None:
            add((kind, value))
        elif kind in _SCALAR_TYPES:
            add((kind, value.tobytes()))
        else:
            try:
                add(fingerprint(value))
            except NoKey:
                return None
    return head + (_integer_gemm.current_path(), tuple(parts))


# NumPy's scalar types, by identity (an isinstance test per argument costs more)
_SCALAR_TYPES = frozenset(np.dtype(c).type for c in "?bBhHiIlLqQefdg")


class LastCall:
    """A repeated call's arguments as objects, with what is needed to tell that a later call passes the same:
    its ndarrays' dtype, shape and bytes (arrays change in place), its lists' and tuples' contents, its
    scalars' types and values. Checking a call against it costs ~3 us where building its key costs ~10 (a
    small convolution's 14 arguments)."""

    __slots__ = ("head", "path", "arguments", "arrays", "lists", "value")

    def __init__(self, head: tuple, path: str, arguments: tuple, value):
        self.head, self.path, self.arguments, self.value = head, path, arguments, value
        self.arrays = tuple((i, a.dtype, a.shape, a.tobytes()) for i, a in enumerate(arguments)
                            if type(a) is np.ndarray)
        self.lists = tuple((i, tuple(a)) for i, a in enumerate(arguments) if type(a) in (list, tuple))

    def matches(self, head: tuple, arguments: tuple):
        """``value`` when ``arguments`` are the same objects, or new ones of the same types, holding the same
        contents and ``head`` and the kernel path are the same, else None."""
        if len(arguments) != len(self.arguments):
            return None
        # A new object of the same type and value serves too (a caller writing pads=[1, 1, 1, 1] or
        # np.int8(0) in each call): arrays, lists and tuples are compared below, a scalar here.
        for a, b in zip(reversed(arguments), reversed(self.arguments)):
            if a is b:
                continue
            kind = type(a)
            if kind is not type(b):
                return None
            if kind in _SCALAR_TYPES:
                if a.tobytes() != b.tobytes():
                    return None
            elif kind is float or kind is int or kind is str:
                if a != b:
                    return None
            elif kind is not np.ndarray and kind is not list and kind is not tuple:
                return None
        if head != self.head:
            return None
        for i, dtype, shape, data in self.arrays:
            a = arguments[i]
            if a.dtype != dtype or a.shape != shape or a.tobytes() != data:
                return None
        for i, values in self.lists:
            a = arguments[i]
            if len(a) != len(values) or tuple(a) != values or any(type(v) is not int for v in a):
                return None  # (call_key takes lists of ints only: 1.0 == 1 would pass a float)
        if _integer_gemm.current_path() != self.path:
            return None
        return self.value


def keep(store: dict, key, value, limit: int) -> None:
    """``store[key] = value``, ``store`` emptied first when it holds ``limit`` entries (memory stays bounded
    when the arguments keep changing)."""
    if key is not None:
        if len(store) >= limit:
            store.clear()
        store[key] = value
