"""Argument checks shared by the runtime front-ends (qlinear.tf, qlinear.tflite, qlinear.torch).

Every failure is a TypeError (wrong type) or ValueError (wrong value) whose message starts with the public
function's name (``func``) and names the argument (``name``).
"""

from __future__ import annotations

import operator

import numpy as np

_CHOICE_MESSAGE = "{func}: {name} must be one of {choices}, got {value!r}"


def flag(func: str, name: str, value) -> bool:
    """A Python or NumPy bool, as a Python bool (an int is refused)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{func}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def choice(func: str, name: str, value, choices, *, optional: bool = False, message: str = _CHOICE_MESSAGE):
    """``value`` if it is one of ``choices``.

    A value that is not a string is a TypeError, but with ``optional`` None is of the argument's type and,
    unless it is one of ``choices``, a ValueError like any other value. ``message`` formats that ValueError
    from ``func``, ``name``, ``value`` and ``choices`` (their reprs joined by commas).
    """
    if not isinstance(value, str) and not (optional and value is None):
        raise TypeError(f"{func}: {name} must be a string, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(message.format(func=func, name=name, value=value, choices=", ".join(map(repr, choices))))
    return value


def integer(func: str, name: str, value, expected: str = "an int") -> int:
    """A Python or NumPy integer (anything with ``__index__``) as a Python int; a bool is refused.
    ``expected`` is what the TypeError says the argument must be."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{func}: {name} must be {expected}, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {name} must be {expected}, got {type(value).__name__}") from None


def as_array(func: str, name: str, value, expected: str) -> np.ndarray:
    """``np.asarray(value)``; a value NumPy cannot convert is a TypeError saying ``name`` must be ``expected``."""
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is reported as a TypeError
        raise TypeError(f"{func}: {name} must be {expected}, got {type(value).__name__}") from exc


def first_bad_scale(scales: np.ndarray, *, finite_reciprocal: bool = False) -> int | None:
    """The flat index of the first float32 scale that is not positive and finite (or, with
    ``finite_reciprocal``, whose float32 reciprocal overflows), None when every scale is good."""
    good = (scales > 0) & np.isfinite(scales)
    if finite_reciprocal:
        with np.errstate(all="ignore"):
            good &= np.isfinite(np.float32(1) / scales)
    if good.all():
        return None
    return int(np.flatnonzero(~good)[0])
