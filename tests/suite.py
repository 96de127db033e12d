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
    users get), the portable AVX2 one and the BLAS fallback, which between them cover both instruction
    families (VNNI dot products and pmaddwd pairs)."""
    if FULL:
        return available
    return tuple(p for i, p in enumerate(available) if i == 0 or p in ("avx2", "blas"))


def tf_types(all_types):
    """TensorFlow's quantized types to test: all five in the full run; by default quint8 (TensorFlow's classic),
    qint16 (a signed 16-bit one) and qint32 (the one that wraps): each type compiles its own kernels, about 50 s
    of a cold run per type. ``all_types`` is a list, or a dict by type name."""
    keep = all_types if FULL else [t for t in all_types if t in ("quint8", "qint16", "qint32")]
    return {t: all_types[t] for t in keep} if isinstance(all_types, dict) else list(keep)
