"""How much of the suite runs: the default run checks every kernel family on this CPU's fastest path and the
portable one, with randomized runs sized to keep `uv run pytest` near five minutes on two cores;
``uv run pytest --full`` (or ``QLINEAR_FULL_TESTS=1``) runs every kernel path the CPU offers, the full
randomized budgets and the probes that compile every kernel from scratch (about 30 minutes).

Test modules read this after conftest.py has seen the command line (``--full`` sets the environment
variable before any test module is imported).
"""

from __future__ import annotations

import os

FULL = os.environ.get("QLINEAR_FULL_TESTS", "").lower() in ("1", "true", "yes")


def examples(n: int) -> int:
    """A hypothesis budget: ``n`` in the full run, a quarter of it (at least 10) by default."""
    return n if FULL else max(10, n // 4)


def kernel_paths(available: tuple[str, ...]) -> tuple[str, ...]:
    """The integer GEMM paths to test: every available one in the full run; by default the fastest (the one
    users get) and the BLAS fallback (the portable path). Each path compiles its own kernels cold, 30-50 s of a
    CI run each: the AVX2 and the other VNNI paths run every case with ``--full``; AVX2 a few by default
    (`other_paths`)."""
    if FULL:
        return available
    return tuple(p for i, p in enumerate(available) if i == 0 or p == "blas")


def other_paths(available: tuple[str, ...]) -> tuple[str, ...]:
    """Of the paths `kernel_paths` leaves out of the default run, AVX2 (what every x86-64-v3 CPU without VNNI
    runs: AMD before Zen 4, Intel before Ice Lake): by default it meets its oracle on a few cases
    (`test_other_paths_*` in the GEMM and convolution tests), ``--full`` runs every case on it and on the other
    VNNI paths (this is then empty). Each path costs ~45 s of compiling; all three would take the default run
    past 10 minutes on 2 cores."""
    chosen = kernel_paths(available)
    return tuple(p for p in available if p not in chosen and p == "avx2")


def tf_types(all_types):
    """TensorFlow's quantized types whose kernels to test: all five in the full run; by default quint8
    (TensorFlow's classic): each type compiles its own kernels, about 70 s of a cold run per type. Every type's
    semantics is still checked in every run, on the NumPy reference (`kernels_for`): the official test vectors
    and the quirks against TensorFlow. ``all_types`` is a list, or a dict by type name."""
    keep = all_types if FULL else [t for t in all_types if t in DEFAULT_TF_TYPES]
    return {t: all_types[t] for t in keep} if isinstance(all_types, dict) else list(keep)


DEFAULT_TF_TYPES = ("quint8",)


def kernels_for(tf_type: str):
    """A context in which qlinear.tf runs its kernels if ``tf_type``'s kernels are tested in this run, else its
    NumPy reference (the kernels' equality with it is then left to the full run)."""
    import contextlib

    from qlinear.kernels.quantize_linear import use_kernels

    return contextlib.nullcontext() if FULL or tf_type in DEFAULT_TF_TYPES else use_kernels(False)


OUT_GARBAGE = 0xA5  # what an out= array holds before the call: an element the call does not write is caught


def out_layouts(shape, dtype):
    """[(layout, out, untouched)] for the out= tests: a C-contiguous out, and a strided one (every other column of
    a wider array) whose neighbours, ``untouched``, must keep their bytes (OUT_GARBAGE)."""
    import numpy as np

    contiguous = np.empty(shape, dtype)
    contiguous.view(np.uint8).fill(OUT_GARBAGE)
    wide = np.empty(tuple(shape[:-1]) + (2 * shape[-1],), dtype)
    wide.view(np.uint8).fill(OUT_GARBAGE)
    return [("C", contiguous, None), ("strided", wide[..., ::2], wide[..., 1::2])]
