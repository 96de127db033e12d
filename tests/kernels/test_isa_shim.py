"""benchmarks/isa_shim.c, which `benchmarks/cpu_goals.py --isa` preloads so that onnxruntime and qlinear run the
kernels of a CPU with fewer instructions: its modes do what they say in a fresh process, and a wrong mode stops
the process with a message. Skipped without Linux on x86-64 and a C compiler (and, for the avx2 mode, without a
CPU that can make CPUID fault)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parents[2] / "benchmarks" / "isa_shim.c"
COMPILER = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64" or COMPILER is None,
                                reason="the shim is for Linux on x86-64 and is built with a C compiler")


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("isa_shim") / "isa_shim.so"
    subprocess.run([COMPILER, "-O2", "-shared", "-fPIC", "-o", str(built), str(SHIM), "-ldl"], check=True)
    return built


def _run(shim: Path, mode: str, script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_PRELOAD=str(shim), ISA_SHIM=mode)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=300)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_avx512vnni_mode_refuses_the_amx_request_alone(shim):
    done = _run(shim, "avx512vnni", """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        refused = libc.syscall(ctypes.c_long(158), ctypes.c_long(0x1023), ctypes.c_long(18))
        print(refused, ctypes.get_errno(), libc.syscall(ctypes.c_long(39)) == os.getpid())  # 39: getpid
        from qlinear.kernels import _amx
        print(_amx.available())
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    # EPERM is the shim's answer: a kernel without AMX says EINVAL, one with it grants the request
    assert done.stdout.split() == ["-1", "1", "True", "False"]


@pytest.mark.skipif("cpuid_fault" not in _cpu_flags(), reason="this CPU or kernel cannot make CPUID fault")
def test_avx2_mode_hides_avx512_vnni_and_amx_from_cpuid(shim):
    done = _run(shim, "avx2", """
        import llvmlite.binding as ll
        features = ll.get_host_cpu_features()
        print(sorted(f for f, on in features.items() if on and (f.startswith("avx512") or "vnni" in f
                                                                  or f.startswith("amx"))))
        print(features.get("avx2", False), bool(ll.get_host_cpu_name()))
        from qlinear.kernels import integer_gemm
        print(integer_gemm.default_path())
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    hidden, avx2, path = done.stdout.strip().splitlines()
    assert hidden == "[]"
    assert avx2 == ("True True" if "avx2" in _cpu_flags() else "False True")
    assert path in ("avx2ub", "blas")


def test_a_wrong_mode_stops_the_process_with_a_message(shim):
    done = _run(shim, "sse", "print('ran')")
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "ISA_SHIM must be avx512vnni or avx2, got sse" in done.stderr
