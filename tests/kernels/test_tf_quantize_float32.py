"""The QuantizeV2/Dequantize kernels compute in float32, as TensorFlow's kernel does.

numba silently promotes to float64 (a Python float literal, an int mixed with a float32, a NumPy scalar
function), and a float64 intermediate rounds differently from TensorFlow's float32 one. The kernels are
compiled in a fresh process with an empty cache (a cached function has no IR to inspect) after running every
mode, per-tensor and per-axis, for the narrowest and the widest type; then every compiled function of
`qlinear.kernels._tf_quantize_numba`, and the bfloat16 Dequantize of `_tf_quantize_extra_numba` (its
strict kernels are float64 by definition), is checked for float64 arithmetic in its LLVM IR. The per-tensor loops
are also checked for packed float32 multiplies (they are vectorised) on x86.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

# Compiles every kernel from scratch in a fresh process (1-2 minutes on 2 cores): the full suite only.
pytestmark = pytest.mark.full

pytest.importorskip("numba")

_PROBE = textwrap.dedent(
    r"""
    import json, re, sys
    import numpy as np
    import qlinear.tf
    from qlinear.kernels import _tf_quantize_extra_numba as extra
    from qlinear.kernels import _tf_quantize_numba as nb

    x = (np.random.default_rng(0).standard_normal((4, 8)) * 3).astype(np.float32)
    for T in ("qint8", "qint32"):
        for mode in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
            for axis in ((-1,) if mode == "MIN_FIRST" else (-1, 0, 1)):
                mn = np.float32(-1) if axis < 0 else np.full(x.shape[axis], -1, np.float32)
                mx = np.float32(2) if axis < 0 else np.full(x.shape[axis], 2, np.float32)
                for rm in (("HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN") if mode == "SCALED" else ("HALF_AWAY_FROM_ZERO",)):
                    q = qlinear.tf.quantize_v2(x, mn, mx, T, mode=mode, axis=axis, round_mode=rm)[0]
                qlinear.tf.dequantize(q, mn, mx, mode=mode, axis=axis)
                if mode == "MIN_COMBINED":
                    qlinear.tf.dequantize(q, mn, mx, mode=mode, axis=axis, dtype="bfloat16")

    # float64 arithmetic, conversions to float64 and float64 intrinsics. Boxing a float32 result for the
    # Python-callable wrapper (fpext + PyFloat_FromDouble) is not arithmetic and is not matched.
    double_op = re.compile(
        r"= (fadd|fsub|fmul|fdiv|frem|fneg|fcmp \w+)( \w+)* double|"
        r"= (sitofp|uitofp) [^\n]* to double|@llvm\.\w+\.f64\("
    )
    found, vector_mul = {}, {}
    # the strict kernels compute in float64 on purpose; the bfloat16 Dequantize is the float32 kernel
    functions = [(name, getattr(nb, name)) for name in dir(nb)] + [("dequantize_bf16", extra.dequantize_bf16)]
    for name, fn in functions:
        for sig in getattr(fn, "signatures", None) or ():
            key = f"{name}{sig}"
            hits = [line.strip() for line in fn.inspect_llvm(sig).splitlines()
                    if double_op.search(line) and "declare" not in line]
            found[key] = hits[:3]
            if name in ("quantize_serial", "dequantize_serial", "dequantize_bf16"):
                vector_mul[key] = bool(re.search(r"\bvmulps\b[^\n]*[yz]mm", fn.inspect_asm(sig)))
    print(json.dumps({"double": found, "vector_mul": vector_mul}))
    """
)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path_factory.mktemp("numba_cache")))
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kernel_was_compiled(compiled):
    names = {key.split("(")[0] for key in compiled["double"]}
    assert {"quantize_serial", "dequantize_serial", "dequantize_bf16"} <= names, sorted(names)


def test_no_float64_arithmetic_in_the_kernels(compiled):
    promoted = {key: hits for key, hits in compiled["double"].items() if hits}
    assert not promoted, promoted


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 vector registers")
def test_element_loops_are_vectorised(compiled):
    scalar_only = [key for key, vectorised in compiled["vector_mul"].items() if not vectorised]
    assert compiled["vector_mul"] and not scalar_only, scalar_only
